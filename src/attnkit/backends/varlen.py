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
- :func:`take_keys`: one element's kept keys, zero-padded to its group's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import masks as _masks
from .._host import readable
from .._inputs import AttentionInputs

__all__ = ["CALL_COST", "Lengths", "can_unpad", "group_lengths", "lengths", "take_keys"]


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
