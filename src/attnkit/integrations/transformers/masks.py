"""The ``"attnkit"`` mask function of transformers' ``AttentionMaskInterface``.

transformers builds a model's masks once per forward through the mask function
registered for the model's attention implementation. It receives the sizes of
the call (``q_length``, ``kv_length``), the global positions of the first query
and key (``q_offset``, ``kv_offset``: a KV cache puts the queries after the
cached keys), the 2-D padding mask, and a ``mask_function(batch, head, q_idx,
kv_idx)`` composed from a few factories of ``transformers.masking_utils``
(causal, sliding window, chunks, packed sequences, block ids, and/or).

:func:`attnkit_mask` reads that composition back into attnkit masks: a causal
band or a window at the call's positions, ``key_padding`` for padding,
``document`` ids for packed sequences and chunks, combined with ``&`` and ``|``.
It returns a :class:`SymbolicMask`, which the model hands to the attention
function unchanged, so no (B, 1, L, S) tensor is built. A pattern it does not
recognize (a custom ``or_mask_function``, say) is evaluated exactly by
transformers' own ``sdpa_mask`` and passed as ``masks.keep``: slower, never
wrong (``SymbolicMask.symbolic`` is then False).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import torch

from ... import masks

__all__ = ["SymbolicMask", "attnkit_mask"]


class SymbolicMask:
    """The mask of one kind of attention in one forward, as attnkit masks.

    Attributes:
        mask: the attnkit mask over (q_length, kv_length), broadcasting over heads,
            or None when every query sees every key.
        q_offset, kv_offset: global positions of the first query and the first key.
        symbolic: False when the pattern was not recognized and ``mask`` holds it
            densely (``masks.keep`` of a (B, 1, L, S) tensor).

    ``shape`` and ``ndim`` describe the 4-D mask it stands for, (B, 1, L, S), and
    ``contiguous()`` returns it unchanged, so code of transformers that prepares
    masks ahead of a compiled or static-cache forward passes it along.
    """

    ndim = 4

    def __init__(
        self,
        mask: masks.Mask | None,
        *,
        batch_size: int,
        q_length: int,
        kv_length: int,
        q_offset: int,
        kv_offset: int,
        symbolic: bool = True,
    ) -> None:
        self.mask = mask
        self.batch_size = batch_size
        self.q_length = q_length
        self.kv_length = kv_length
        self.q_offset = q_offset
        self.kv_offset = kv_offset
        self.symbolic = symbolic

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch_size, 1, self.q_length, self.kv_length)

    def contiguous(self) -> SymbolicMask:
        return self

    def for_call(self, L: int, S: int) -> masks.Mask | None:
        """The mask of an attention call with L queries and S keys.

        A call may see fewer keys than the mask describes (a model that trims unused
        cache slots): the mask is then restricted to the first S keys.

        Raises:
            ValueError: L differs from ``q_length`` or S exceeds ``kv_length``.
        """
        if L != self.q_length or S > self.kv_length:
            raise ValueError(
                f"attention_mask: the attnkit mask was built for {self.q_length} queries and "
                f"{self.kv_length} keys, but the attention call has {L} queries and {S} keys"
            )
        if self.mask is None or S == self.kv_length:
            return self.mask
        return self.mask.shard(0, 0, L, S, L, self.kv_length)

    def __repr__(self) -> str:
        return (
            f"SymbolicMask({self.mask!r}, shape={self.shape}, q_offset={self.q_offset}, "
            f"kv_offset={self.kv_offset}, symbolic={self.symbolic})"
        )


# ----------------------------------------------------------------------------- patterns


@dataclass(frozen=True)
class _Call:
    """Sizes and positions of the call a mask is built for."""

    B: int
    L: int
    S: int
    q0: int
    k0: int
    device: torch.device


@dataclass
class _Term:
    """A conjunction: key position kv kept for query position q when
    ``q - left <= kv <= q + right`` (None: unbounded) and every mask in ``parts`` keeps it."""

    left: int | None = None
    right: int | None = None
    banded: bool = False
    parts: list[masks.Mask] = field(default_factory=list)


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else (a if b is None else min(a, b))


def _and(terms: list[_Term]) -> _Term:
    out = _Term()
    for t in terms:
        if t.banded:
            out.left, out.right = _tighter(out.left, t.left), _tighter(out.right, t.right)
            out.banded = True
        out.parts.extend(t.parts)
    return out


def _band_mask(t: _Term, c: _Call) -> masks.Mask | None:
    delta = c.q0 - c.k0  # query row i sits at key column i + delta
    keeps_first = t.left is None or c.L - 1 + delta - t.left <= 0  # the last row keeps key 0
    keeps_last = t.right is None or c.S - 1 <= delta + t.right  # the first row keeps key S - 1
    if not t.banded or (keeps_first and keeps_last):
        return None  # every query sees every key (e.g. one new token against its cache)
    if delta == c.S - c.L:
        where: dict[str, Any] = {"align": "bottom_right"}  # queries are the last positions
    elif delta == 0:
        where = {"align": "top_left"}
    else:
        where = {"align": "top_left", "q_offset": c.q0, "k_offset": c.k0}
    if t.left is None and t.right == 0:
        return masks.causal(**where)
    return masks.window(t.left, t.right, **where)


def _to_mask(t: _Term, c: _Call) -> masks.Mask | None:
    out = _band_mask(t, c)
    for p in t.parts:
        out = p if out is None else out & p
    return out


def _or(terms: list[_Term], c: _Call) -> _Term:
    out: masks.Mask | None = None
    for t in terms:
        m = _to_mask(t, c)
        if m is None:
            return _Term()  # one side keeps everything
        out = m if out is None else out | m
    return _Term(parts=[] if out is None else [out])


def _window_size(val: object) -> int | None:
    ok = isinstance(val, int) and not isinstance(val, bool) and val > 0
    return int(val) if ok else None  # type: ignore[call-overload]


def _ids(t: object, c: _Call) -> masks.Mask | None:
    """Ids per global position, (B, N): a query keeps the keys of its own id (>= 0)."""
    if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.dtype.is_floating_point:
        return None
    if t.shape[-1] < max(c.q0 + c.L, c.k0 + c.S) or t.shape[0] not in (1, c.B):
        return None
    q_ids = t[:, c.q0 : c.q0 + c.L]  # (B, L)
    if c.q0 == c.k0 and c.L == c.S:
        return masks.document(q_ids)
    return masks.document(q_ids, key_ids=t[:, c.k0 : c.k0 + c.S])  # (B, L), (B, S)


def _chunks(size: object, left_padding: object, c: _Call) -> masks.Mask | None:
    """Chunked attention: positions (after each row's left padding) in blocks of ``size``."""
    n = _window_size(size)
    if n is None or not isinstance(left_padding, torch.Tensor) or left_padding.ndim != 1:
        return None
    pos = torch.arange(max(c.q0 + c.L, c.k0 + c.S), device=c.device)  # (N,)
    shift = pos.shape[0] // n + 1  # keeps every id >= 0 (a negative id means padding)
    ids = torch.div(
        pos.view(1, -1) - left_padding.view(-1, 1).to(c.device), n, rounding_mode="floor"
    )
    return _ids(ids + shift, c)  # (B, N)


def _key_padding(padding: object, c: _Call) -> masks.Mask | None:
    """A 2-D mask over key positions, True = attend (transformers' convention)."""
    if not isinstance(padding, torch.Tensor) or padding.ndim != 2:
        return None
    keep = padding.to(device=c.device, dtype=torch.bool)
    short = c.k0 + c.S - keep.shape[-1]
    if short > 0:  # positions past the mask (static cache slots) are padding
        keep = torch.nn.functional.pad(keep, (0, short), value=False)
    keep = keep[:, c.k0 : c.k0 + c.S]  # (B, S)
    if keep.shape[0] != c.B:
        keep = keep.expand(c.B, -1)
    if keep.device.type == "cpu" and not torch.compiler.is_compiling() and bool(keep.all()):
        return None  # no padding: nothing to mask (free to check on the CPU)
    return masks.key_padding(~keep)


@functools.cache
def _factories() -> dict[CodeType, str]:
    """The code object of each mask factory of transformers.masking_utils -> its kind.

    A factory missing from the installed transformers is left out: its closures are
    then unknown patterns, evaluated densely."""
    import transformers.masking_utils as mu

    probe = torch.zeros(1, 1, dtype=torch.long)
    makers: dict[str, Callable[[], Any]] = {
        "and": lambda: mu.and_masks(mu.causal_mask_function),
        "or": lambda: mu.or_masks(mu.causal_mask_function),
        "sliding": lambda: mu.sliding_window_overlay(1),
        "sliding_bidirectional": lambda: mu.sliding_window_bidirectional_overlay(1),
        "chunked": lambda: mu.chunked_overlay(1, probe[0]),
        "packed": lambda: mu.packed_sequence_mask_function(probe),
        "remap": lambda: mu.remap_positions_for_packed_sequence(mu.causal_mask_function, probe),
        "blockwise": lambda: mu.blockwise_overlay(probe),
        "padding": lambda: mu.padding_mask_function(probe.bool()),
    }
    out: dict[CodeType, str] = {}
    for kind, make in makers.items():
        try:
            out[make().__code__] = kind
        except (AttributeError, TypeError):
            continue
    return out


def _kind(fn: object) -> str | None:
    code = getattr(fn, "__code__", None)
    return _factories().get(code) if isinstance(code, CodeType) else None


def _closure(fn: Any) -> dict[str, Any]:
    names = fn.__code__.co_freevars
    return {n: cell.cell_contents for n, cell in zip(names, fn.__closure__ or (), strict=False)}


def _read(fn: object, c: _Call, packed: bool = False) -> _Term | None:
    """The pattern of a transformers mask function, or None if unknown.

    ``packed``: inside a conjunction with a packed-sequence (document) mask, where a
    band on per-document positions equals the same band on global positions."""
    import transformers.masking_utils as mu

    if fn is mu.causal_mask_function:
        return _Term(right=0, banded=True)
    if fn is mu.bidirectional_mask_function:
        return _Term()
    kind = _kind(fn)
    if kind is None:
        return None
    env = _closure(fn)
    if kind in ("and", "or"):
        fns = env.get("mask_functions")
        if not isinstance(fns, tuple) or not fns:
            return None
        inner = packed or (kind == "and" and any(_kind(f) == "packed" for f in fns))
        terms = [_read(f, c, inner) for f in fns]
        if any(t is None for t in terms):
            return None
        got = [t for t in terms if t is not None]
        return _and(got) if kind == "and" else _or(got, c)
    if kind in ("sliding", "sliding_bidirectional"):
        w = _window_size(env.get("sliding_window"))
        if w is None:
            return None
        if kind == "sliding":
            return _Term(left=w - 1, banded=True)  # kv > q - w
        return _Term(left=w, right=w, banded=True)  # |q - kv| <= w
    if kind == "remap":
        # Positions restart at each packed document and rise by one inside it, so a
        # band (causal, window) on them is the same band on global positions there.
        t = _read(env.get("mask_function"), c)
        return t if packed and t is not None and not t.parts else None
    found: masks.Mask | None = None
    if kind == "packed":
        found = _ids(env.get("packed_sequence_mask"), c)
    elif kind == "blockwise":
        found = _ids(env.get("block_sequence_ids"), c)
    elif kind == "chunked":
        found = _chunks(env.get("chunk_size"), env.get("left_padding"), c)
    elif kind == "padding":
        pad = env.get("padding_mask")
        if isinstance(pad, torch.Tensor) and pad.ndim == 2:
            found = _key_padding(pad, c)
            return _Term(parts=[] if found is None else [found])
    return None if found is None else _Term(parts=[found])


def _offset(val: object, name: str) -> int:
    if isinstance(val, torch.Tensor) and val.numel() == 1:
        return int(val)  # a static cache keeps its position in a tensor
    if isinstance(val, int) and not isinstance(val, bool):
        return val
    raise TypeError(f"{name}: expected an int, got {val!r}")


def attnkit_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int | torch.Tensor = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | SymbolicMask | None = None,
    device: torch.device | str = "cpu",
    use_vmap: bool = False,
    **kwargs: Any,
) -> SymbolicMask:
    """The mask function registered as ``"attnkit"`` (same arguments as transformers'
    ``sdpa_mask``; the extra ones it passes are ignored).

    Args:
        batch_size, q_length, kv_length: the call's B, L and S.
        q_offset, kv_offset: global positions of the first query and key.
        mask_function: the pattern, ``(batch, head, q_idx, kv_idx) -> bool`` at global
            positions (default: causal).
        attention_mask: (B, >= kv_offset + kv_length) bool, True = attend; or a
            SymbolicMask prepared ahead of the forward, returned as it is.
        device: where index tensors are built.
        use_vmap: passed to ``sdpa_mask`` when a pattern is evaluated densely.

    Returns:
        a :class:`SymbolicMask`.
    """
    if isinstance(attention_mask, SymbolicMask):
        return attention_mask
    import transformers.masking_utils as mu

    fn = mu.causal_mask_function if mask_function is None else mask_function
    c = _Call(batch_size, q_length, kv_length, _offset(q_offset, "q_offset"),
              _offset(kv_offset, "kv_offset"), torch.device(device))  # fmt: skip
    term = _read(fn, c)
    if term is None:
        dense = mu.sdpa_mask(
            batch_size=c.B, q_length=c.L, kv_length=c.S, q_offset=c.q0, kv_offset=c.k0,
            mask_function=fn, attention_mask=attention_mask, allow_is_causal_skip=False,
            allow_is_bidirectional_skip=False, use_vmap=use_vmap, device=c.device,
        )  # fmt: skip
        keep = None if dense is None else masks.keep(dense)  # (B, 1, L, S)
        return _carrier(keep, c, symbolic=False)
    if attention_mask is not None:
        pad = _key_padding(attention_mask, c)
        if pad is not None:
            term.parts.append(pad)
    return _carrier(_to_mask(term, c), c)


def _carrier(mask: masks.Mask | None, c: _Call, symbolic: bool = True) -> SymbolicMask:
    return SymbolicMask(mask, batch_size=c.B, q_length=c.L, kv_length=c.S, q_offset=c.q0,
                        kv_offset=c.k0, symbolic=symbolic)  # fmt: skip
