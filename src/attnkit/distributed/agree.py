"""The argument agreement of a context-parallel call: one all_gather, before anything moves.

Every rank condenses its call into one int64 row and the ranks exchange their rows
in a single ``all_gather`` (:func:`attnkit.distributed.comm.exchange_rows`). A row
holds

- the rank's **status**: 0, or 1 with the rank's reason (UTF-8, up to
  :data:`MESSAGE_BYTES` bytes) when it cannot make the call: its own arguments are
  bad, or the backend it asks for (or automatic dispatch) cannot run its attention
  blocks, forward or, when gradients are needed, backward. Each rank asks
  :func:`attnkit.explain` about a stand-in block (its own shards, the mask
  restricted to them) in the grad mode of each phase;
- the shapes of query, key and value, the dtype, layout, strategy, backend names,
  which inputs need gradients (the backward is a collective too) and the scale
  (its float64 bits, exact for any float; for a per-head tensor scale, its shape and
  dtype, its values being checksummed like a score parameter's);
- fingerprints of the score (kind, settings, parameter shapes) and of the mask's
  structure (:func:`attnkit.distributed.blocks.mask_fingerprint`);
- **value checksums** (:mod:`.checksum`) of the score's parameters and buffers, of
  a tensor scale and of every mask tensor (keep, bias, lengths, padding), computed as
  tensor ops on
  the tensors' devices and gathered in the same collective, so an accelerator is
  read once, for the whole row.

From the gathered rows every rank reaches the same verdict and raises the same
:class:`ContextParallelError` (naming the ranks at fault) when any rank failed or
any field differs, before a single block is computed or sent.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from .. import masks as _masks
from .._inputs import normalize_mask as normalize_call_mask
from ..backends.dispatch import Explanation, get_backend
from ..functional import explain as _explain
from ..scores import Gaussian, Score, is_shared_score, resolve_score
from .blocks import mask_fingerprint, stable_hash
from .checksum import combine, tensor_checksum
from .comm import exchange_rows, metadata_device
from .errors import ContextParallelError
from .layout import LAYOUTS

__all__ = [
    "DTYPES",
    "MAX_DIMS",
    "MESSAGE_BYTES",
    "Agreed",
    "agree",
    "refuse",
    "score_fingerprint",
]

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_DIMS = 8
MESSAGE_BYTES = 384
STRATEGIES: tuple[str, ...] = ("ring", "all_to_all")

_SHAPE = MAX_DIMS + 1  # (ndim, *shape, -1 padding)
_FIELDS: tuple[tuple[str, int], ...] = (
    ("status", 1),
    ("message", MESSAGE_BYTES // 8),
    ("query", _SHAPE),
    ("key", _SHAPE),
    ("value", _SHAPE),
    ("dtype", 1),
    ("layout", 1),
    ("strategy", 1),
    ("backend", 1),
    ("gradients", 1),
    ("scale", 2),
    ("score", 1),
    ("mask", 1),
    # computed on the device, last:
    ("score values", 2),
    ("scale values", 2),
    ("mask values", 2),
)
_SLICES: dict[str, slice] = {}
_at = 0
for _name, _width in _FIELDS:
    _SLICES[_name] = slice(_at, _at + _width)
    _at += _width
_HOST_WIDTH = _SLICES["mask"].stop
_HUGE = 2**62  # stand-in full length: any block of the rank's own size lies inside it
_GRAD_NAMES = ("query", "key", "value", "score parameters", "the scale")


def score_fingerprint(score: Score) -> int:
    """An int that equals on two ranks whose scores have the same kind, settings and
    parameter/buffer names, shapes and dtypes (values are checksummed separately)."""
    settings = sorted(
        (k, v.hex() if isinstance(v, float) else v)
        for k, v in vars(score).items()
        if not k.startswith("_") and k != "training" and isinstance(v, (bool, int, float, str))
    )
    tensors = [
        (name, tuple(t.shape), str(t.dtype))
        for name, t in [*score.named_parameters(), *score.named_buffers()]
    ]
    return stable_hash([type(score).__module__, type(score).__qualname__, settings, tensors])


def _score_tensors(score: Score) -> list[torch.Tensor]:
    if is_shared_score(score):
        return []
    return [t for _, t in sorted([*score.named_parameters(), *score.named_buffers()])]


def _mask_tensors(mask: _masks.Mask | None) -> list[torch.Tensor]:
    """Every tensor the mask holds, those inside ``|`` and ``~`` too (only the parts of
    its top-level ``&`` were compared: a different padding inside ``window | padding``
    went unseen, 0.18 off, or left the ranks planning different ring steps)."""
    if mask is None:
        return []
    return list(mask.tensors())


def _encode_message(text: str) -> list[int]:
    raw = text.encode("utf-8")[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, b"\0")
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8)]


def _decode_message(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return raw.rstrip(b"\0").decode("utf-8", errors="ignore")


def _padded(shape: Sequence[int]) -> list[int]:
    return [len(shape), *shape, *([-1] * (MAX_DIMS - len(shape)))]


def _shape(words: Sequence[int]) -> tuple[int, ...]:
    return tuple(words[1 : 1 + words[0]])


def normalize_mask(mask: object) -> _masks.Mask | None:
    """A mask object, a float tensor (a bias) or None, as a mask or None (the same rules
    and messages as :func:`attnkit.attention`'s ``mask=``)."""
    return normalize_call_mask(mask)


def _trainable(score: Score) -> bool:
    return not is_shared_score(score) and any(p.requires_grad for p in score.parameters())


def _gradient_bits(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score: Score, scale: object = None
) -> int:
    if not torch.is_grad_enabled():
        return 0
    learnable_scale = isinstance(scale, torch.Tensor) and scale.requires_grad
    flags = (q.requires_grad, k.requires_grad, v.requires_grad, _trainable(score),
             learnable_scale)  # fmt: skip
    return sum(1 << i for i, f in enumerate(flags) if f)


def _cannot_run(ex: Explanation, phase: str) -> str:
    asked = f"backend={list(ex.forced)}" if ex.forced else "automatic dispatch"
    detail = "; ".join(
        f"{n}: {', '.join(ex.reasons.get(n) or ['passed over'])}" for n in ex.candidates
    )
    return f"backend: {asked} cannot run this rank's attention blocks {phase}: {detail}"


def _backend_problem(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score: Score,
    mask: _masks.Mask | None,
    scale: Any,
    backend: Any,
    strategy: object = None,
) -> tuple[str | None, Explanation]:
    """Why the attention calls this rank will make cannot run (None when they can).

    The blocks of a call differ only in their sizes and the mask's offsets, which no
    backend's reasons depend on, so one stand-in block answers for all: the rank's
    own shards with the mask restricted to them. It is asked without gradients (the
    ring's forward, whose backend also gives the ring's backward from (out, lse)) and,
    for the all-to-all's single call when gradients are needed, with them. Raises for
    bad arguments."""
    stand_in = None
    if mask is not None:
        try:
            stand_in = mask.shard(0, 0, q.shape[-2], k.shape[-2], _HUGE, _HUGE)
        except (TypeError, ValueError, IndexError, RuntimeError):
            stand_in = None  # checked against the full sizes once the ranks agree
    phases = [("in the forward", False)]
    if strategy == "all_to_all" and _gradient_bits(q, k, v, score, scale):
        phases.append(("with gradients (the backward)", True))
    ex: Explanation | None = None
    for phase, grad in phases:
        with torch.set_grad_enabled(grad):
            kw = {"score": score, "scale": scale, "return_lse": True, "backend": backend}
            try:
                ex = _explain(q, k, v, mask=stand_in, **kw)
            except (TypeError, ValueError):
                if stand_in is None:
                    raise
                stand_in = None  # the mask does not fit a stand-in: judged on the full sizes
                ex = _explain(q, k, v, **kw)
        if ex.chosen is None:
            return _cannot_run(ex, phase), ex
    assert ex is not None
    if (
        isinstance(score, Gaussian)
        and ex.forced
        and not any(get_backend(name).gaussian_differences for name in ex.forced)
    ):
        return (
            f"backend: backend={list(ex.forced)} runs the Gaussian score in its dot form, "
            "which it declines where the inputs span many bandwidths; that depends on "
            "the other ranks' queries and keys, so a block could be declined on one rank "
            "in the middle of the call: add 'chunked' or 'reference' (which form the "
            "differences q - k), or leave backend=None"
        ), ex
    return None, ex


def _check_local(
    q: object, k: object, v: object, *, score: object, mask: object, scale: object,
    layout: object, strategy: object, backend: object,
) -> tuple[Score, _masks.Mask | None, Explanation]:  # fmt: skip
    """This rank's own checks, with the core's messages where it has them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'zigzag' or 'contiguous', got {layout!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected 'ring', 'all_to_all' or None, got {strategy!r}")
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.ndim > MAX_DIMS:
            raise ValueError(f"{name}: at most {MAX_DIMS} dims are supported, got {t.ndim}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
    assert isinstance(v, torch.Tensor)
    sc = resolve_score(score)  # type: ignore[arg-type]
    m = normalize_mask(mask)
    problem, ex = _backend_problem(q, k, v, sc, m, scale, backend, strategy)
    if problem is not None:
        raise ContextParallelError(problem)
    return sc, m, ex


def refuse(problem: Exception, group: dist.ProcessGroup | None) -> NoReturn:
    """Take part in the agreement of a call this rank cannot make, so every rank raises
    the same :class:`ContextParallelError` (this one included, chained to ``problem``)."""
    agree(
        None, None, None, group=group, score=None, mask=None, scale=None, layout=None,
        strategy=None, backend=None, problem=problem,
    )  # fmt: skip
    raise AssertionError("unreachable: the agreement raises for a rank with a problem")


def _scale_words(scale: object) -> list[int]:
    """[kind, word]: None; a float and its float64 bits; or a per-head tensor and the
    fingerprint of its shape and dtype (its values go to the "scale values" checksum)."""
    if scale is None:
        return [0, 0]
    if isinstance(scale, torch.Tensor):
        return [2, stable_hash([tuple(scale.shape), str(scale.dtype)])]
    bits = struct.unpack("<q", struct.pack("<d", float(scale)))[0]  # type: ignore[arg-type]
    return [1, bits]


def _scale_text(words: Sequence[int]) -> str:
    if not words[0]:
        return "None"
    if words[0] == 2:
        return "a per-head tensor"
    return repr(struct.unpack("<d", struct.pack("<q", words[1]))[0])


class Agreed:
    """What the ranks agreed on: the score and mask objects of this rank and every
    rank's row (``rows[r]``), read through :meth:`shape`."""

    def __init__(self, score: Score, mask: _masks.Mask | None, rows: list[list[int]]) -> None:
        self.score = score
        self.mask = mask
        self.rows = rows

    def shape(self, rank: int, which: str) -> tuple[int, ...]:
        """Rank ``rank``'s shape of ``which`` ("query", "key" or "value")."""
        return _shape(self.rows[rank][_SLICES[which]])


def agree(
    q: object,
    k: object,
    v: object,
    *,
    group: dist.ProcessGroup | None,
    score: object,
    mask: object,
    scale: object,
    layout: object,
    strategy: object,
    backend: object,
    problem: Exception | None = None,
) -> Agreed:
    """Check this rank's call, exchange every rank's row in one all_gather and raise the
    same :class:`ContextParallelError` on every rank unless all ranks can run the call
    and agree on every argument (a collective; nothing else is sent before it).

    ``problem``: an error the caller already found with this rank's call; the rank
    then takes part as a failing rank (its arguments are not looked at)."""
    device = metadata_device(group, q)
    local_error: Exception | None = problem
    if problem is None:
        try:  # any failure here is shipped, so no rank is left alone in the all_gather
            sc, m, ex = _check_local(
                q, k, v, score=score, mask=mask, scale=scale, layout=layout,
                strategy=strategy, backend=backend,
            )  # fmt: skip
            host, sums = _good_row(q, k, v, sc, m, ex, scale, layout, strategy, device)
        except Exception as exc:
            local_error = exc
    if local_error is not None:
        kind = "" if isinstance(local_error, ContextParallelError) else type(local_error).__name__
        host = [1, *_encode_message(f"{kind}: {local_error}" if kind else str(local_error))]
        host += [0] * (_HOST_WIDTH - len(host))
        sums = [torch.zeros(2, dtype=torch.int64, device=device)] * 3
    row = torch.cat([torch.tensor(host, dtype=torch.int64, device=device), *sums])
    rows = exchange_rows(row, group)
    _verdict(rows, local_error)
    assert local_error is None
    return Agreed(sc, m, rows)


def _good_row(
    q: Any, k: Any, v: Any, sc: Score, m: _masks.Mask | None, ex: Explanation, scale: object,
    layout: object, strategy: object, device: torch.device,
) -> tuple[list[int], list[torch.Tensor]]:  # fmt: skip
    """(the host words, the two device checksums) of a rank that can make the call."""
    host = [0, *_encode_message("")]
    host += _padded(q.shape) + _padded(k.shape) + _padded(v.shape)
    host += [
        DTYPES.index(q.dtype) if q.dtype in DTYPES else -1,
        LAYOUTS.index(str(layout)),
        -1 if strategy is None else STRATEGIES.index(str(strategy)),
        stable_hash(list(ex.forced or ())),
        _gradient_bits(q, k, v, sc, scale),
        *_scale_words(scale),
        score_fingerprint(sc),
        mask_fingerprint(m),
    ]
    scale_tensors = [scale.detach()] if isinstance(scale, torch.Tensor) else []
    sums = [
        combine([tensor_checksum(t) for t in _score_tensors(sc)], device),
        combine([tensor_checksum(t) for t in scale_tensors], device),
        combine([tensor_checksum(t) for t in _mask_tensors(m)], device),
    ]
    return host, sums


def _verdict(rows: list[list[int]], local_error: Exception | None) -> None:
    """Raise the same error on every rank unless every rank can run and all agree."""
    failed = [r for r, row in enumerate(rows) if row[0] != 0]
    if failed:
        by_reason: dict[str, list[int]] = {}
        for r in failed:
            by_reason.setdefault(_decode_message(rows[r][_SLICES["message"]]), []).append(r)
        reasons = "; ".join(f"{_ranks(rs)}: {why}" for why, rs in by_reason.items())
        who = _ranks(failed)
        raise ContextParallelError(
            f"context_parallel_attention: {who} cannot make this call, so no rank computed or "
            f"sent anything: {reasons}",
            ranks=failed,
        ) from local_error
    first = rows[0]
    for name in ("query", "key", "value"):
        a = _shape(first[_SLICES[name]])
        shapes = [_shape(row[_SLICES[name]]) for row in rows]
        odd = [
            r
            for r, b in enumerate(shapes)
            if len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-1]
        ]
        if odd:
            raise ContextParallelError(
                f"{name}: rank 0 has a shard of shape {a} and {_ranks(odd)} "
                f"{shapes[odd[0]]}; expected the same shape on every rank except the sequence "
                "dim (-2)",
                ranks=odd,
            )
    for name, _ in _FIELDS[5:]:
        want = first[_SLICES[name]]
        odd = [r for r, row in enumerate(rows) if row[_SLICES[name]] != want]
        if odd:
            raise ContextParallelError(_disagreement(name, rows, odd), ranks=odd)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {list(ranks)}"


def _disagreement(name: str, rows: list[list[int]], odd: list[int]) -> str:
    """The message for ranks ``odd`` whose field ``name`` differs from rank 0's."""
    r = odd[0]
    who = _ranks(odd)
    same = "; every rank must pass the same arguments (the mask and score of the full sequence)"

    def words(rank: int) -> list[int]:
        return rows[rank][_SLICES[name]]

    if name == "dtype":
        d0, d1 = (DTYPES[words(x)[0]] if words(x)[0] >= 0 else "?" for x in (0, r))
        return f"dtype: rank 0 passes {d0} tensors and {who} {d1}" + same
    if name in ("layout", "strategy"):
        names = LAYOUTS if name == "layout" else STRATEGIES
        n0, n1 = (names[words(x)[0]] if words(x)[0] >= 0 else None for x in (0, r))
        return f"{name}: rank 0 passes {n0!r} and {who} {n1!r}" + same
    if name == "scale":
        if words(0)[0] == words(r)[0] == 2:
            return (
                f"scale: rank 0 and {who} pass per-head tensor scales of different shapes or "
                "dtypes" + same
            )
        return (
            f"scale: rank 0 passes {_scale_text(words(0))} and {who} {_scale_text(words(r))}" + same
        )
    if name == "backend":
        return (
            f"backend: {who} asks for other backends (backend= or attnkit.use_backend) than "
            "rank 0" + same
        )
    if name == "gradients":

        def needs(rank: int) -> str:
            got = [n for i, n in enumerate(_GRAD_NAMES) if words(rank)[0] >> i & 1]
            return ", ".join(got) or "nothing"

        return (
            f"gradients: rank 0 needs gradients for {needs(0)} and {who} for {needs(r)}; the "
            "backward exchanges blocks between the ranks, so every rank must build the same "
            "graph (the same requires_grad flags, grad mode and score parameters)"
        )
    if name == "score":
        return (
            f"score: {who} passes another score (kind, settings or parameter shapes) than rank 0"
            + same
        )
    if name == "mask":
        return (
            f"mask: {who} passes another mask (kinds, bands, offsets or tensor shapes) "
            "than rank 0" + same
        )
    if name == "score values":
        return (
            f"score: the values of its parameters or buffers differ between rank 0 and {who} "
            "(their checksums differ); initialize them from the same seed or broadcast them "
            "from one rank, and sum their gradients across the ranks "
            "(attnkit.distributed.all_reduce_grads, or DDP) so they stay equal"
        )
    if name == "scale values":
        return (
            f"scale: the values of the per-head scale differ between rank 0 and {who} (their "
            "checksums differ); every rank must pass the same scale, and sum its gradient "
            "across the ranks when it is learned"
        )
    assert name == "mask values"
    return (
        f"mask: the values of its tensors (keep, bias, lengths or padding) differ between rank 0 "
        f"and {who} (their checksums differ); every rank must pass the same mask of the full "
        "sequence"
    )
