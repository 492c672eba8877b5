"""Variable-length unpadding for ``valid_lens`` and ``key_padding`` masks, shared by backends.

A batch whose elements keep different numbers of queries and keys is split into
groups of similar lengths, each group run on just its kept rows and columns:

- :func:`can_unpad`: whether a call's mask allows it (1-D lengths, key padding,
  at most a plain top-left causal mask beside lengths) and the lengths may be read
  on the host without a device sync (:func:`attnkit._host.readable`);
- :func:`lengths`: per batch element the kept queries, the kept keys and, when the
  kept keys are not a prefix, their indices -- from one transfer per mask tensor,
  with no loop over keys;
- :func:`group_lengths`: batch elements grouped to minimize padded work plus a
  per-call cost;
- :func:`take_keys`: one element's kept keys, zero-padded to its group's length;
- :func:`torch_varlen_route` / :func:`torch_varlen_attention`: on CUDA, lengths that
  live on the device go to torch's variable-length attention (where the installed
  torch has it) without reading them: each element's kept rows and its padding rows
  are two sequences of the padded layout (:func:`padded_sequences`), the padding
  sequences' outputs are discarded, and the longest sequence is bounded by L and S.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .. import masks as _masks
from .._host import readable
from .._inputs import AttentionInputs

__all__ = [
    "CALL_COST",
    "HAS_TORCH_VARLEN",
    "Lengths",
    "can_unpad",
    "group_lengths",
    "lengths",
    "padded_sequences",
    "take_keys",
    "torch_varlen_attention",
    "torch_varlen_route",
]


def can_unpad(inputs: AttentionInputs) -> bool:
    """True when every mask part lets each batch element run on its own kept keys."""
    parts = inputs.mask_parts
    if not parts or not inputs.batch_shape or torch.compiler.is_compiling():
        return False  # (under torch.compile: the lengths would be data-dependent shapes)
    kinds = [p.kind for p in parts]
    if not any(k in ("valid_lens", "key_padding") for k in kinds):
        return False
    for p in parts:
        if isinstance(p, _masks.ValidLensMask):
            if p.lens.ndim != 1 or not readable(p.lens):
                return False
            if p.query_lens is not None and not torch.equal(p.query_lens, p.lens):
                return False
        elif isinstance(p, _masks.CausalMask):
            if p.offset(inputs.L, inputs.S) != 0 or "key_padding" in kinds:
                return False
        elif not isinstance(p, _masks.KeyPaddingMask) or not readable(p.padding):
            return False
    return True


@dataclass
class Lengths:
    """Per batch element b: ``q_len[b]`` kept queries (a prefix), ``k_len[b]`` kept keys,
    ``key_idx[b]`` their indices (None when they are the first ``k_len[b]``), and
    whether a top-left causal mask applies within each element."""

    q_len: list[int]
    k_len: list[int]
    key_idx: list[torch.Tensor | None]
    causal: bool


def lengths(inputs: AttentionInputs, device: torch.device) -> Lengths:
    """The kept queries and keys of every batch element (needs :func:`can_unpad`)."""
    B, L, S = inputs.batch_shape[0], inputs.L, inputs.S
    q_len = torch.full((B,), L, dtype=torch.long)
    k_len = torch.full((B,), S, dtype=torch.long)
    causal = False
    kp_keep: torch.Tensor | None = None
    for p in inputs.mask_parts:
        if isinstance(p, _masks.ValidLensMask):
            lens = p.lens.cpu()
            k_len = torch.minimum(k_len, lens)
            if p.queries:
                q_len = torch.minimum(q_len, lens)
        elif isinstance(p, _masks.KeyPaddingMask):
            keep = ~p.padding.cpu()  # (B, S)
            kp_keep = keep if kp_keep is None else kp_keep & keep
        elif isinstance(p, _masks.CausalMask):
            causal = True
    key_idx: list[torch.Tensor | None] = [None] * B
    if kp_keep is not None:
        j = torch.arange(S)
        kept = kp_keep & (j < k_len.unsqueeze(-1))  # (B, S)
        n_kept = kept.sum(dim=1)  # (B,)
        prefix = (kept == (j < n_kept.unsqueeze(-1))).all(dim=1)  # (B,) kept keys are a prefix
        order = torch.argsort((~kept).to(torch.int8), dim=1, stable=True)  # kept first, in order
        k_len = n_kept
        for b in (~prefix).nonzero().flatten().tolist():
            key_idx[b] = order[b, : int(n_kept[b])].to(device)  # (S_b,)
    return Lengths(q_len.tolist(), k_len.tolist(), key_idx, causal)


def take_keys(t: torch.Tensor, idx: torch.Tensor | None, n: int) -> torch.Tensor:
    """Rows of t (..., S, D) at idx (or the first n), zero-padded to n rows: (..., n, D)."""
    if idx is None:
        return t[..., :n, :]
    rows = t.index_select(-2, idx)  # (..., S_b, D)
    return F.pad(rows, (0, 0, 0, n - rows.shape[-2]))  # (..., n, D)


CALL_COST = 2.5e7
"""Fixed cost of one kernel call, in multiply-adds (launch, thread barrier): about half a
millisecond of a small CPU. Groups are merged while padding costs less than this."""


def group_lengths(
    members: list[int], q_len: list[int], k_len: list[int], head_work: int
) -> list[list[int]]:
    """Split batch elements into groups minimizing padded work + a per-call cost.

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


def _torch_varlen() -> Any:
    try:  # a recent torch: torch.nn.attention.varlen.varlen_attn
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


VARLEN_ATTN = _torch_varlen()
HAS_TORCH_VARLEN = VARLEN_ATTN is not None
_VARLEN_DTYPES = (torch.float16, torch.bfloat16)


def torch_varlen_route(inputs: AttentionInputs) -> bool:
    """True when a ragged call runs on torch's variable-length attention: CUDA, half
    precision, 4-D (B, H, L, E) inputs of one head size (a multiple of 8 up to 256), a
    dot score, one 1-D ``valid_lens`` mask (with a top-left causal mask only when
    ``queries=True`` and L == S, so each kept block is square), no weights, lse or
    dropout."""
    if not HAS_TORCH_VARLEN or inputs.device.type != "cuda" or inputs.dtype not in _VARLEN_DTYPES:
        return False
    if inputs.query.ndim != 4 or inputs.E != inputs.Ev or inputs.E % 8 or inputs.E > 256:
        return False
    if inputs.return_weights or inputs.return_lse or inputs.dropout_p > 0:
        return False
    if inputs.score.name not in ("dot", "scaled_dot") or torch.compiler.is_compiling():
        return False
    lens_parts = [p for p in inputs.mask_parts if isinstance(p, _masks.ValidLensMask)]
    others = [p for p in inputs.mask_parts if not isinstance(p, _masks.ValidLensMask)]
    if len(lens_parts) != 1 or lens_parts[0].lens.ndim != 1:
        return False
    part = lens_parts[0]
    if part.query_lens is not None and part.query_lens is not part.lens:
        return False
    if not others:
        return True
    causal = others[0]
    return (
        len(others) == 1
        and isinstance(causal, _masks.CausalMask)
        and causal.offset(inputs.L, inputs.S) == 0
        and part.queries
        and inputs.L == inputs.S
    )


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
    assert VARLEN_ATTN is not None
    B, H, L, E = q.shape
    Hk, S = k.shape[1], k.shape[2]
    cu_q, cu_k = padded_sequences(lens.to(q.device), L, S, queries)
    qp = q.transpose(1, 2).reshape(B * L, H, E)  # (B*L, H, E)
    kp = k.transpose(1, 2).reshape(B * S, Hk, E)  # (B*S, Hk, E)
    vp = v.transpose(1, 2).reshape(B * S, Hk, v.shape[-1])  # (B*S, Hk, Ev)
    out = VARLEN_ATTN(
        qp,
        kp,
        vp,
        cu_q,
        cu_k,
        L,
        S,
        scale=scale,
        window_size=(-1, 0) if causal else (-1, -1),
        enable_gqa=H != Hk,
    )  # (B*L, H, Ev)
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
