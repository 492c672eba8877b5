"""A ragged batch read off a plan: one independent sequence per batch element or document.

What the ragged path may assume about document ids is decided here, once: nothing.
Ids are any integers in any order; a negative id is padding. A document whose
positions form one run (packed sequences, the common case) is a contiguous slice of
queries and keys; a document whose positions are spread (ids interleaved such as
``[0, 1, 0, 1]``, or a padding gap inside it such as ``[3, 3, -1, 3]``) gathers its
positions by index, in ascending order, so a causal mask within it stays top-left
in the gathered order. Each run of equal ids is never taken for a document of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .clause import Clause

__all__ = ["RaggedSeq", "document_sequences", "ragged_layout"]


@dataclass(frozen=True)
class RaggedSeq:
    """One independent sequence of a ragged batch: batch element ``b``, queries
    ``[q0, q0 + q_len)`` or, when ``query_idx`` is given, the queries at those indices
    (q_len,); keys ``[k0, k0 + k_len)`` or, when ``key_idx`` is given, the keys at those
    indices (k_len,). Index lists are ascending."""

    b: int
    q0: int
    q_len: int
    k0: int
    k_len: int
    key_idx: torch.Tensor | None = None
    query_idx: torch.Tensor | None = None


def document_sequences(row: torch.Tensor, b: int, q_hi: int, k_hi: int) -> list[RaggedSeq]:
    """The documents of one batch element's ids ``row`` (N,) on the CPU, in the order of
    their first position: each keeps its queries below ``q_hi`` and its keys below
    ``k_hi``. A document that is one run of positions is a slice; a spread one gathers
    its positions (see the module docstring)."""
    n = row.shape[0]
    change = torch.nonzero(row[1:] != row[:-1]).flatten().add(1).tolist()
    starts, ends = [0, *change], [*change, n]
    runs: dict[int, list[tuple[int, int]]] = {}
    for doc, s, e in zip(row[starts].tolist() if n else [], starts, ends, strict=True):
        if doc >= 0:
            runs.setdefault(doc, []).append((s, e))
    seqs: list[RaggedSeq] = []
    for parts in runs.values():
        if len(parts) == 1:
            s, e = parts[0]
            ql, kl = max(0, min(e, q_hi) - s), max(0, min(e, k_hi) - s)
            seqs.append(RaggedSeq(b, s, ql, s, kl))
            continue
        pos = torch.cat([torch.arange(s, e) for s, e in parts])  # (n_doc,) ascending
        q_idx, k_idx = pos[pos < q_hi], pos[pos < k_hi]  # (q_len,), (k_len,)
        seqs.append(RaggedSeq(b, 0, len(q_idx), 0, len(k_idx), key_idx=k_idx, query_idx=q_idx))
    return seqs


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
            seqs += document_sequences(ids[b], b, int(q_hi[b]), int(k_hi[b]))
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
