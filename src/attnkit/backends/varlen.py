"""Variable-length unpadding for ``valid_lens`` and ``key_padding`` masks, shared by backends.

A batch whose elements keep different numbers of queries and keys is split into
groups of similar lengths, each group run on just its kept rows and columns:

- :func:`can_unpad`: whether a call's mask is a ragged batch (the block plan's
  :meth:`~attnkit.blockplan.BlockPlan.ragged`: lengths, key padding, documents of a
  packed batch, at most a top-left causal mask within each sequence) whose lengths
  may be read on the host without a device sync (:func:`attnkit._host.readable`);
- :func:`group_lengths`: sequences grouped to minimize padded work plus a per-call
  cost;
- :func:`take_rows` / :func:`take_queries` / :func:`take_keys`: one sequence's rows
  and kept keys (a slice, or gathered by index), zero-padded to its group's lengths;
- :func:`torch_varlen_route` / :func:`torch_varlen_attention`: on CUDA, lengths that
  live on the device go to torch's variable-length attention (where the installed
  torch has it) without reading them: each element's kept rows and its padding rows
  are two sequences of the padded layout (:func:`padded_sequences`), the padding
  sequences' outputs are discarded, and the longest sequence is bounded by L and S.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .._inputs import AttentionInputs
from ..blockplan import RaggedSeq

__all__ = [
    "CALL_COST",
    "VARLEN_ATTN",
    "can_unpad",
    "group_lengths",
    "padded_sequences",
    "take_keys",
    "take_queries",
    "take_rows",
    "torch_varlen",
    "torch_varlen_attention",
    "torch_varlen_route",
    "varlen_lengths",
]


def can_unpad(inputs: AttentionInputs) -> bool:
    """True when the call's mask is a ragged batch (see
    :meth:`attnkit.blockplan.BlockPlan.ragged`) whose lengths may be read on the host."""
    if not inputs.batch_shape or inputs.mask is None:
        return False
    return inputs.block_plan().ragged_ready()  # (decided without reading the lengths)


def take_rows(
    t: torch.Tensor, start: int, n: int, index: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows [start, start + n) of t (..., N, D), or the rows ``index`` (K,) lists when
    given, zero-padded to n rows: (..., n, D)."""
    if index is None:
        rows = t[..., start : start + n, :]  # (..., <= n, D)
    else:
        rows = t.index_select(-2, index.to(t.device))  # (..., K, D)
    short = n - rows.shape[-2]
    return F.pad(rows, (0, 0, 0, short)) if short else rows


def take_queries(t: torch.Tensor, seq: RaggedSeq, n: int) -> torch.Tensor:
    """A sequence's queries of t (..., L, D) (its index list, or its contiguous run),
    zero-padded to n rows: (..., n, D)."""
    return take_rows(t, seq.q0, n, seq.query_idx)


def take_keys(t: torch.Tensor, seq: RaggedSeq, n: int) -> torch.Tensor:
    """A sequence's keys of t (..., S, D) (its index list, or its contiguous run),
    zero-padded to n rows: (..., n, D)."""
    return take_rows(t, seq.k0, n, seq.key_idx)


CALL_COST = 2.5e7
"""Fixed cost of one kernel call, in multiply-adds (launch, thread barrier): about half a
millisecond of a small CPU. Groups are merged while padding costs less than this."""


def group_lengths(
    members: list[int], q_len: Sequence[int], k_len: Sequence[int], head_work: int
) -> list[list[int]]:
    """Split sequences (batch elements or documents) into groups minimizing padded work
    plus a per-call cost.

    Sorted by key length, then an exact O(B²) dynamic program over contiguous runs:
    a group costs ``count * max(q) * max(k) * head_work + CALL_COST``.
    """
    order = sorted(members, key=lambda b: (k_len[b], q_len[b]))
    n = len(order)
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        qm = km = 0
        for i in range(j, 0, -1):  # group = order[i-1 .. j-1]
            qm = max(qm, q_len[order[i - 1]])
            km = max(km, k_len[order[i - 1]])
            cost = best[i - 1] + (j - i + 1) * qm * km * head_work + CALL_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


_UNSET: Any = object()
VARLEN_ATTN: Any = _UNSET
"""torch's ``varlen_attn`` where the installed torch has it (None where not), imported on
first use: importing it pulls in ``torch._dynamo``, which costs seconds at start-up."""
_VARLEN_DTYPES = (torch.float16, torch.bfloat16)
VARLEN_OPTIONS: frozenset[str] = frozenset()
"""The keyword arguments the installed ``varlen_attn`` takes: its signature grew across
torch releases (``window_size`` and ``enable_gqa`` are missing from older ones)."""


def torch_varlen() -> Any:
    """torch's ``torch.nn.attention.varlen.varlen_attn``, or None on an older torch."""
    global VARLEN_ATTN, VARLEN_OPTIONS
    if VARLEN_ATTN is _UNSET:
        try:  # a recent torch
            from torch.nn.attention.varlen import varlen_attn as found
        except ImportError:
            found = None  # type: ignore[assignment]
        if found is not None:
            VARLEN_OPTIONS = frozenset(inspect.signature(found).parameters)
        VARLEN_ATTN = found
    return VARLEN_ATTN


def torch_varlen_route(inputs: AttentionInputs) -> bool:
    """True when a ragged call runs on torch's variable-length attention: CUDA, half
    precision, 4-D (B, H, L, E) inputs of one head size (a multiple of 8 up to 256) and
    one batch (query, key and value: no broadcast one; grouped key heads where the kernel
    takes them), a dot score with no modifier and one float scale, one 1-D
    ``valid_lens`` mask (with a top-left causal mask only when ``queries=True`` and
    L == S, so each kept block is square), no weights, lse or dropout, and finite inputs
    guaranteed by the caller (``check_finite=False``): the kernel gets no cleaning of
    non-finite values, so a masked NaN value would reach the rows before it and an inf
    key would give finite rows where the policy says NaN."""
    if inputs.device.type != "cuda" or inputs.dtype not in _VARLEN_DTYPES:
        return False
    if inputs.query.ndim != 4 or inputs.E != inputs.Ev or inputs.E % 8 or inputs.E > 256:
        return False
    if inputs.mods or inputs.head_scale is not None:  # (the kernel adds no bias, one scale)
        return False
    if inputs.check_finite:  # (values unread on the device: the policy needs the other paths)
        return False
    q, k, v = inputs.query, inputs.key, inputs.value
    if k.shape[:-2] != v.shape[:-2] or q.shape[0] != k.shape[0]:
        return False
    if q.shape[1] != k.shape[1] and inputs.groups <= 1:
        return False
    if inputs.return_weights or inputs.return_lse or inputs.dropout_p > 0:
        return False
    if inputs.score.name not in ("dot", "scaled_dot") or torch.compiler.is_compiling():
        return False
    if torch_varlen() is None:
        return False
    if inputs.groups > 1 and "enable_gqa" not in VARLEN_OPTIONS:
        return False  # this torch's kernel takes grouped heads only expanded
    lens = varlen_lengths(inputs)
    if lens is None:
        return False
    c = inputs.block_plan().single
    assert c is not None
    if not c.has_band:
        return True
    if not VARLEN_OPTIONS & {"window_size", "is_causal"}:
        return False
    return c.query_hi is not None and inputs.L == inputs.S  # causal: each kept block is square


def varlen_lengths(inputs: AttentionInputs) -> torch.Tensor | None:
    """The (B,) key lengths of a call whose whole mask is one ``valid_lens`` (with
    ``queries=True`` when its query lengths are the same tensor) and at most a top-left
    causal mask, read off the plan; else None. Never reads the lengths' values."""
    plan = inputs.block_plan()
    c = plan.single
    if c is None or plan.biases or c.dense_keep or c.docs or c.key_hi is None:
        return None
    if any(t is not None for t in (c.key_lo, c.query_lo, c.row_lo, c.row_hi, c.key_keep)):
        return None
    if c.query_hi is not None and c.query_hi is not c.key_hi:
        return None
    if c.has_band and not (c.lo is None and c.hi == 0):
        return None
    if c.key_hi.ndim != 1 or c.key_hi.shape[0] != inputs.batch_shape[0]:
        return None
    return c.key_hi


def padded_sequences(
    lens: torch.Tensor, L: int, S: int, queries: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cumulative offsets (2B + 1,) int32 of queries and keys in the padded layout.

    Element b's rows are ``b*L .. b*L + L`` (keys ``b*S ..``); sequence 2b is its kept
    part (the first ``lens[b]`` keys, and queries when ``queries``, else all L) and
    sequence 2b + 1 its padding, whose output is discarded. Tensor operations only.
    """
    B = lens.shape[0]
    idx = torch.arange(B, device=lens.device, dtype=torch.int32)  # (B,)
    k_len = lens.to(torch.int32).clamp(0, S)  # (B,)
    q_len = lens.to(torch.int32).clamp(0, L) if queries else torch.full_like(idx, L)
    zero = torch.zeros(1, dtype=torch.int32, device=lens.device)

    def cuts(n: int, kept: torch.Tensor) -> torch.Tensor:
        starts = idx * n  # (B,)
        inner = torch.stack([starts + kept, starts + n], dim=-1).reshape(-1)  # (2B,)
        return torch.cat([zero, inner])  # (2B + 1,)

    return cuts(L, q_len), cuts(S, k_len)


def torch_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lens: torch.Tensor,
    *,
    queries: bool,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """Attention of a ``valid_lens`` call through torch's variable-length kernel.

    q (B, H, L, E), k and v (B, Hk, S, E), lens (B,) on q's device; returns
    (B, H, L, E) with rows that keep no key (or are beyond ``lens`` when
    ``queries``) set to 0. No value is read on the host: the longest sequences are
    bounded by L and S.
    """
    kernel = torch_varlen()
    assert kernel is not None
    B, H, L, E = q.shape
    Hk, S = k.shape[1], k.shape[2]
    cu_q, cu_k = padded_sequences(lens.to(q.device), L, S, queries)
    qp = q.transpose(1, 2).reshape(B * L, H, E)  # (B*L, H, E)
    kp = k.transpose(1, 2).reshape(B * S, Hk, E)  # (B*S, Hk, E)
    vp = v.transpose(1, 2).reshape(B * S, Hk, v.shape[-1])  # (B*S, Hk, Ev)
    options: dict[str, Any] = {"scale": scale}  # only what this torch's kernel takes
    if causal:
        if "window_size" in VARLEN_OPTIONS:
            options["window_size"] = (-1, 0)
        else:
            options["is_causal"] = True
    if H != Hk:
        options["enable_gqa"] = True
    out = kernel(qp, kp, vp, cu_q, cu_k, L, S, **options)  # (B*L, H, Ev)
    out = out.reshape(B, L, H, -1).transpose(1, 2)  # (B, H, L, Ev)
    k_len = lens.to(q.device).clamp(0, S)  # (B,)
    rows = torch.arange(L, device=q.device)  # (L,)
    alive = (k_len > 0).unsqueeze(-1).expand(B, L)  # (B, L)
    if queries:
        alive = alive & (rows < k_len.unsqueeze(-1))  # (B, L)
    q_nan = torch.isnan(q).any(dim=-1)  # (B, H, L): a used NaN query gives NaN
    keep = alive.unsqueeze(1)  # (B, 1, L)
    out = torch.where(keep.unsqueeze(-1), out, torch.zeros((), dtype=out.dtype, device=out.device))
    return torch.where((keep & q_nan).unsqueeze(-1), float("nan"), out)  # (B, H, L, Ev)
