"""A ragged batch read off a plan: one independent sequence per batch element or document."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .clause import Clause

__all__ = ["RaggedSeq", "ragged_layout"]


@dataclass(frozen=True)
class RaggedSeq:
    """One independent sequence of a ragged batch: batch element ``b``, queries
    ``[q0, q0 + q_len)``, keys ``[k0, k0 + k_len)`` or, when ``key_idx`` is given, the
    keys at those indices (S_b,)."""

    b: int
    q0: int
    q_len: int
    k0: int
    k_len: int
    key_idx: torch.Tensor | None = None


def ragged_layout(c: Clause, B0: int, L: int, S: int) -> tuple[list[RaggedSeq], bool]:
    """The sequences of a ragged batch described by one clause (see
    :meth:`attnkit.blockplan.BlockPlan.ragged`) and whether each is top-left causal."""
    q_hi = c.query_hi.expand(B0).tolist() if c.query_hi is not None else [L] * B0
    k_hi = c.key_hi.expand(B0).tolist() if c.key_hi is not None else [S] * B0
    causal = c.has_band
    seqs: list[RaggedSeq] = []
    if c.docs:
        ids = c.docs[0].q_ids.expand(B0, L).cpu()
        for b in range(B0):
            row = ids[b]
            change = torch.nonzero(row[1:] != row[:-1]).flatten().add(1).tolist()
            starts = [0, *change]
            ends = [*change, L]
            for s, e in zip(starts, ends, strict=True):
                if int(row[s]) < 0:
                    continue
                ql = max(0, min(e, int(q_hi[b])) - s)
                kl = max(0, min(e, int(k_hi[b])) - s)
                seqs.append(RaggedSeq(b, s, ql, s, kl))
        return seqs, causal
    idx: list[torch.Tensor | None] = [None] * B0
    k_len = [max(0, min(S, int(x))) for x in k_hi]
    if c.key_keep is not None:
        j = torch.arange(S)
        kept = c.key_keep.expand(B0, S).cpu() & (j < torch.tensor(k_len).unsqueeze(-1))  # (B0, S)
        n_kept = kept.sum(dim=1)  # (B0,)
        prefix = (kept == (j < n_kept.unsqueeze(-1))).all(dim=1)  # (B0,) kept keys a prefix
        order = torch.argsort((~kept).to(torch.int8), dim=1, stable=True)  # kept first, in order
        k_len = n_kept.tolist()
        dev = c.key_keep.device
        for b in (~prefix).nonzero().flatten().tolist():
            idx[b] = order[b, : int(n_kept[b])].to(dev)  # (S_b,)
    for b in range(B0):
        seqs.append(RaggedSeq(b, 0, max(0, min(L, int(q_hi[b]))), 0, int(k_len[b]), idx[b]))
    return seqs, causal
