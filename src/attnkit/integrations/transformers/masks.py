"""The ``"attnkit"`` mask function of transformers' ``AttentionMaskInterface``.

transformers builds a model's masks once per forward through the mask function
registered for the model's attention implementation. It passes the sizes of the
call and the positions of its queries and keys (``q_length``/``q_offset`` in the
newer releases, the query positions ``cache_position`` in the older ones; see
:mod:`.features`), the 2-D padding mask, a ``mask_function(batch, head, q_idx,
kv_idx)``, and hints: the window or chunk size (``local_size``), the model's
``config``, and whether the mask may be skipped (``allow_is_causal_skip``: False
when it feeds a compiled static-cache forward).

:func:`attnkit_mask` turns that into attnkit masks: a causal band or a window at the
call's positions, ``key_padding`` for padding, ``document`` ids for packed sequences
and chunks, combined with ``&`` and ``|`` (see :mod:`.patterns` for how a mask
function is recognised, exactly, without reading its code). It returns a
:class:`SymbolicMask`, which the model hands to the attention function unchanged, so
no (B, 1, L, S) tensor reaches the kernels. A pattern it does not recognise (a custom
``or_mask_function``, say) is evaluated by transformers' own ``sdpa_mask`` and passed
as ``masks.keep``: slower, never wrong (``SymbolicMask.symbolic`` is then False).

A mask prepared for a compiled forward keeps its structure from one decode step to
the next: its positions stay 0-d tensors (copied when the mask is made), and no part
is left out because its values happen to keep everything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import masks
from ..._torch_features import check_compiling
from ...masks.bands import Offset
from .features import FEATURES, family_reason
from .patterns import Call, Hints, band_mask, recognise

__all__ = ["SymbolicMask", "TensorUseError", "attnkit_mask"]


class SymbolicMask:
    """The mask of one kind of attention in one forward, as attnkit masks.

    Attributes:
        mask: the attnkit mask over (q_length, kv_length), broadcasting over heads,
            or None when every query sees every key.
        q_offset, kv_offset: global positions of the first query and the first key
            (ints, or 0-d tensors in a mask prepared for a compiled forward).
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
        q_offset: Offset,
        kv_offset: Offset,
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

    # A model that computes with its mask as a tensor (adds ALiBi to it, indexes it, moves
    # it, reads its size or dtype) cannot take a symbolic one: it gets this error instead
    # of torch's or Python's.
    def _as_tensor(self, *args: Any, **kwargs: Any) -> Any:
        raise TensorUseError(_TENSOR_USE)

    __getitem__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _as_tensor
    to = masked_fill = float = bool = _as_tensor

    def __getattr__(self, name: str) -> Any:
        """Any other tensor attribute (``size``, ``dtype``, ``device``, ``dim``, ...): the
        same error, an AttributeError too (``hasattr`` answers False)."""
        if name.startswith("__"):
            raise AttributeError(name)
        raise TensorUseError(f"{_TENSOR_USE} (it read .{name})")


_TENSOR_USE = (
    "attention_mask: this model computes with its attention mask as a tensor, "
    'which attn_implementation="attnkit"\'s symbolic mask is not; its attention '
    'does not go through attnkit: use attn_implementation="sdpa" or "eager" for it'
)


class TensorUseError(TypeError, AttributeError):
    """A model used the symbolic mask as a tensor (a TypeError; an AttributeError too, so
    that ``hasattr(mask, name)`` answers False)."""


# ----------------------------------------------------------------------------- the call


def _position(val: object, name: str, as_tensor: bool, device: torch.device) -> Offset:
    """An offset as an int, or (``as_tensor``) as a 0-d tensor made or copied now: data a
    compiled graph reads, never a value it guards on (a static cache passes its own
    length counter, which moves during the forward: the mask keeps its own copy)."""
    if isinstance(val, torch.Tensor) and val.numel() == 1 and not val.is_floating_point():
        return val.reshape(()).clone() if as_tensor else int(val)
    if isinstance(val, int) and not isinstance(val, bool):
        return torch.tensor(val, device=device) if as_tensor else val
    raise TypeError(f"{name}: expected an int or an integer tensor of one element, got {val!r}")


def _regular(cache_position: torch.Tensor) -> bool:
    """True when the query positions are consecutive (read on the host)."""
    n = cache_position.shape[0]
    steps = torch.arange(n, device=cache_position.device) + cache_position[:1]
    return bool(torch.equal(cache_position, steps))


def _sizes(*vals: object) -> tuple[int, ...]:
    out: list[int] = []
    for v in vals:
        if isinstance(v, int) and not isinstance(v, bool) and v > 0 and v not in out:
            out.append(v)
    return tuple(out)


def _key_keep(padding: torch.Tensor, c: Call) -> torch.Tensor:
    """(B, S) bool: which of the call's keys the 2-D padding mask keeps; positions past
    its end (static cache slots) are padding, as transformers pads it."""
    if isinstance(c.k0, int):
        keep = padding.to(device=c.device, dtype=torch.bool)
        short = c.k0 + c.S - keep.shape[-1]
        if short > 0:
            keep = torch.nn.functional.pad(keep, (0, short), value=False)
        keep = keep[:, c.k0 : c.k0 + c.S]  # (B, S)
    else:  # a tensor offset: the same columns by index, no host read
        # (no padding op: inductor's CPU code for a bool mask padded and then selected
        # does not compile; columns past the end are dropped by a comparison instead)
        values = padding.to(c.device)  # (B, N)
        cols = torch.arange(c.S, device=c.device) + c.k0.to(c.device)  # (S,)
        inside = cols < values.shape[-1]  # (S,)
        picked = values.index_select(-1, cols.clamp(max=values.shape[-1] - 1))  # (B, S)
        keep = (picked != 0) & inside  # (B, S)
    return keep.expand(c.B, c.S) if keep.shape[0] != c.B else keep


def _key_padding(padding: object, c: Call) -> masks.Mask | None:
    """The padding part: ``key_padding`` of the keys the mask drops; None when there is
    none to drop and the structure may depend on values."""
    if not isinstance(padding, torch.Tensor) or padding.ndim != 2:
        return None
    keep = _key_keep(padding, c)
    if not c.stable and not torch.compiler.is_compiling() and bool(keep.all()):
        return None  # no padding: nothing to mask
    return masks.key_padding(~keep)


def _dense(
    fn: Callable[..., Any],
    c: Call,
    given: tuple[object, object, torch.Tensor | None],
    padding: torch.Tensor | None,
    use_vmap: bool,
) -> torch.Tensor:
    """(B, 1, L, S) bool: transformers' own evaluation of ``fn`` for this call, with the
    offsets as the call gave them (``given``: q_offset, kv_offset, cache_position)."""
    import transformers.masking_utils as mu

    q_offset, kv_offset, positions = given
    kw: dict[str, Any] = {
        "batch_size": c.B,
        "kv_length": c.S,
        "kv_offset": kv_offset,
        "mask_function": fn,
        "attention_mask": padding,
        "allow_is_causal_skip": False,
        "allow_is_bidirectional_skip": False,
        "use_vmap": use_vmap,
    }
    if FEATURES.mask_positions == "offsets":
        if positions is not None:
            if not _regular(positions):
                raise ValueError(
                    "cache_position: the queries' positions are not consecutive, which "
                    f"transformers {FEATURES.version}'s masks (q_offset) cannot express"
                )
            q_offset = positions[0]
        kw.update(q_length=c.L, q_offset=q_offset, device=c.device)
    else:
        if positions is None:
            positions = torch.arange(c.L, device=c.device) + torch.as_tensor(q_offset)
        kw["cache_position"] = positions
    if "allow_torch_fix" in FEATURES.sdpa_mask_parameters:
        kw["allow_torch_fix"] = False  # (rows with no key stay so: attnkit's own policy)
    out = mu.sdpa_mask(**kw)
    if out is None:
        return torch.ones(c.B, 1, c.L, c.S, dtype=torch.bool, device=c.device)
    return out.expand(c.B, 1, c.L, c.S)


def attnkit_mask(
    batch_size: int,
    q_length: int | None = None,
    kv_length: int | None = None,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int | torch.Tensor = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | SymbolicMask | None = None,
    *,
    cache_position: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    use_vmap: bool = False,
    device: torch.device | str | None = None,
    config: object = None,
    **kwargs: Any,
) -> SymbolicMask:
    """The mask function registered as ``"attnkit"``: the arguments of transformers'
    ``sdpa_mask`` in either form a release passes (the extra ones are ignored).

    Args:
        batch_size, q_length, kv_length: the call's B, L and S (``q_length`` defaults
            to the length of ``cache_position``).
        q_offset, kv_offset: global positions of the first query and key (an int, or a
            tensor of one element: a static cache's position).
        mask_function: the pattern, ``(batch, head, q_idx, kv_idx) -> bool`` at global
            positions (default: causal).
        attention_mask: (B, >= kv_offset + kv_length) bool, True = attend; or a
            SymbolicMask prepared ahead of the forward, returned as it is.
        cache_position: (L,) the queries' positions (older releases, instead of
            ``q_length``/``q_offset``).
        local_size: the window or chunk size of a sliding-window or chunked mask.
        allow_is_causal_skip, allow_is_bidirectional_skip: both False when the mask
            feeds a compiled forward: its structure then never depends on values.
        use_vmap: passed to ``sdpa_mask`` when a pattern is evaluated densely.
        device: where index tensors are built (default: the positions' device).
        config: the model's config (its ``sliding_window``, ``attention_chunk_size``).

    Returns:
        a :class:`SymbolicMask`.
    """
    check_compiling()
    if isinstance(attention_mask, SymbolicMask):
        return attention_mask
    model_type = getattr(config, "model_type", None)
    reason = family_reason(model_type) if isinstance(model_type, str) else None
    if reason is not None:
        raise ValueError(f'{reason}; use attn_implementation="sdpa" or "eager" for it')
    import transformers.masking_utils as mu

    if kv_length is None or (q_length is None and cache_position is None):
        raise TypeError(
            "attnkit_mask: expected kv_length and either q_length or cache_position "
            f"(transformers {FEATURES.version} passes "
            + ("q_length)" if FEATURES.mask_positions == "offsets" else "cache_position)")
        )
    compiling = torch.compiler.is_compiling()
    stable = not (allow_is_causal_skip or allow_is_bidirectional_skip)
    as_tensor = stable or compiling  # (inside a compiled graph a read would break it)
    if device is None:
        ref = cache_position if cache_position is not None else attention_mask
        device = ref.device if isinstance(ref, torch.Tensor) else "cpu"
    dev = torch.device(device)
    regular = True  # the queries sit at consecutive positions from q0
    if cache_position is not None:
        L = cache_position.shape[0] if q_length is None else q_length
        q0 = _position(cache_position[:1], "cache_position", as_tensor, dev)
        if not compiling:
            regular = _regular(cache_position)
        elif L > 1:
            regular = False  # (unknown without a read: taken as irregular, so exact)
    else:
        assert q_length is not None
        L = q_length
        q0 = _position(q_offset, "q_offset", as_tensor, dev)
    k0 = _position(kv_offset, "kv_offset", as_tensor, dev)
    c = Call(batch_size, L, kv_length, q0, k0, dev, stable)
    padding = attention_mask if isinstance(attention_mask, torch.Tensor) else None
    fn = mu.causal_mask_function if mask_function is None else mask_function

    found: tuple[bool, masks.Mask | None] = (False, None)
    if fn is mu.causal_mask_function and regular:
        found = (True, band_mask(None, 0, c))
    elif fn is mu.bidirectional_mask_function and regular:
        found = (True, None)
    elif not compiling and regular:
        given = (q_offset, kv_offset, cache_position)
        grid = _dense(fn, c, given, None, use_vmap)  # (B, 1, L, S) without the padding
        hints = Hints(
            windows=_sizes(local_size), chunks=_sizes(local_size),
            config_windows=_sizes(getattr(config, "sliding_window", None)),
            config_chunks=_sizes(getattr(config, "attention_chunk_size", None)),
        )  # fmt: skip
        found = recognise(grid, c, hints, padding)
        if not found[0]:
            dense = grid if padding is None else grid & _key_keep(padding, c).view(c.B, 1, 1, -1)
            return _carrier(masks.keep(dense), c, symbolic=False)  # (B, 1, L, S)
    if not found[0]:  # compiling, or irregular positions: transformers' own evaluation
        dense = _dense(fn, c, (q_offset, kv_offset, cache_position), padding, use_vmap)
        return _carrier(masks.keep(dense), c, symbolic=False)
    mask = found[1]
    pad = _key_padding(padding, c)
    if pad is not None:
        mask = pad if mask is None else mask & pad
    return _carrier(mask, c)


def _carrier(mask: masks.Mask | None, c: Call, symbolic: bool = True) -> SymbolicMask:
    return SymbolicMask(mask, batch_size=c.B, q_length=c.L, kv_length=c.S, q_offset=c.q0,
                        kv_offset=c.k0, symbolic=symbolic)  # fmt: skip
