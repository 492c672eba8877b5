"""Non-finite inputs on the fused kernel, handled with tensor operations only.

attnkit's policy (the same on every backend): a NaN or inf in a position that is used
propagates to the rows that use it; a position masked out never contributes,
whatever it holds. torch's kernels do not follow it by themselves: on the CPU a
query row of NaN comes back as zeros, so does a row whose every key is NaN, and a
masked-out NaN key or value reaches the row through ``NaN + (-inf)`` or ``0 * NaN``.

So every SDPA call of this backend:

1. under a mask, replaces non-finite query, key and value rows by zeros
   (:func:`sanitize`), so a masked-out one cannot reach any row;
2. runs the kernel;
3. makes NaN (:func:`apply`) the rows that use a non-finite position: a query row
   holding a NaN or an inf, the rows whose mask keeps a non-finite key (their output
   and lse) or a non-finite value (their output only: values do not enter the lse).

Gradients follow the same policy: the kernel only ever sees finite inputs, so its
backward sends nothing from a pair it does not use into any gradient (no ``0 * NaN``),
and the NaN rows of step 3 are selected with ``torch.where``, so their output gradient
(NaN itself under most losses) never enters the kernel's backward. Every gradient entry
that no non-finite input reaches is then exactly that of the same call with those
inputs zeroed. The entries one reaches have no promise: under a mask they get the
zeroed call's value less the reached rows' share (finite); without one, the kernel's
own NaN propagation (every row uses every key).

Flags are carried as addends that are NaN where a row is poisoned and 0 elsewhere
(a cumulative sum carries a NaN forward: the rows of a causal mask that see it); the
output takes them by a select.
They are built with ``isnan``/``isfinite``, never as ``x * 0``: torch.compile
simplifies ``x * 0`` to 0, which would lose every flag. Without a mask every key is used by every row,
so the kernel's own propagation is kept, and only what it drops is put back: NaN
query rows, and a NaN in the first key (which every row uses), for the rows the
kernel returns as zeros when every key is NaN (:func:`unmasked_addend`); this reads
O(L·E) values, not the keys. Nothing here reads a value on the host or makes a
shape depend on data, so the same code runs on accelerators and under
torch.compile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "Poison",
    "apply",
    "flags_for_call",
    "rows_keeping",
    "rows_using",
    "sanitize",
    "to_query_heads",
    "unmasked_addend",
]


@dataclass(frozen=True)
class Poison:
    """NaN-or-0 addends of one call's rows, broadcastable to (..., L): ``scores`` (the
    row's scores hold a NaN: output and lse) and ``values`` (the row uses a non-finite
    value: output only)."""

    scores: torch.Tensor
    values: torch.Tensor | None = None


def _row_addend(t: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (..., N): NaN where the row holds a NaN or an inf, else 0.

    A float max reduction (it propagates NaN, and cannot overflow), which vectorizes
    where a boolean ``isfinite(t).all()`` does not. A row of no entries (a zero-width
    value, as a call that only wants its weights passes) holds nothing non-finite."""
    if t.shape[-1] == 0:
        return t.new_zeros(t.shape[:-1])  # (..., N)
    return torch.where(torch.isfinite(t.abs().amax(dim=-1)), 0.0, float("nan"))


def _nan_addend(t: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (..., N): NaN where the row holds a NaN, else 0 (an inf in a query
    makes no promise for its row; a sum that overflows is inf, not NaN)."""
    return torch.where(torch.isnan(t.sum(dim=-1)), float("nan"), 0.0)


def to_query_heads(flags: torch.Tensor, heads: int) -> torch.Tensor:
    """Key-head flags (..., Hk, S) for ``heads`` query heads (..., Hq, S), as enable_gqa."""
    if flags.ndim < 2 or flags.shape[-2] == heads or flags.shape[-2] == 1:
        return flags
    return flags.repeat_interleave(heads // flags.shape[-2], dim=-2)  # (..., Hq, S)


def sanitize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    excluded: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Zero the non-finite rows of a masked call's queries, keys and values.

    Args:
        q: (..., L, E) queries; k: (..., S, E) keys; v: (..., S, Ev) values.
        excluded: None or (..., S) bool, keys whose score is ``-inf`` by construction
            (a Gaussian key infinitely far away, carried as a ``-inf`` bias feature):
            they keep their -inf and are not counted as non-finite, and neither are their
            values, which no row uses (weight 0, whatever they hold).

    Returns:
        q, k and v cleaned, and three NaN-or-0 addends: non-finite query rows (..., L),
        keys (..., S) and values (..., S). The kernel then sees finite inputs only, so
        its backward sends no ``0 * NaN`` from a pair it does not use into a gradient.
    """
    q_add = _row_addend(q)  # (..., L)
    k_add = _row_addend(k)  # (..., S)
    v_add = _row_addend(v)  # (..., S)
    # a flagged row is zeroed whole (a row that uses it becomes NaN anyway); one select per
    # element, which torch.compile fuses with the flags' reductions
    zero = torch.zeros((), dtype=k.dtype, device=k.device)
    q = torch.where(torch.isnan(q_add).unsqueeze(-1), zero, q)  # (..., L, E)
    v = torch.where(torch.isnan(v_add).unsqueeze(-1), zero, v)  # (..., S, Ev)
    if excluded is not None:  # an excluded key keeps its -inf; its value is never used
        k_add = torch.where(excluded, 0.0, k_add)  # (..., S)
        v_add = torch.where(excluded, 0.0, v_add)  # (..., S)
    k = torch.where(torch.isnan(k_add).unsqueeze(-1), zero, k)  # (..., S, E)
    return q, k, v, q_add, k_add, v_add


def rows_using(
    addend: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    L: int,
    causal_offset: int = 0,
) -> torch.Tensor:
    """Per row (..., L or 1): NaN when the row's mask keeps a flagged key, else 0.

    Args:
        addend: (..., S) NaN-or-0 per key (already per query head).
        attn_mask: None, or SDPA's mask (..., L or 1, S or 1): bool (True keeps) or
            float (``-inf`` removes).
        is_causal: a causal mask: row i keeps keys 0 .. i + ``causal_offset`` (0: SDPA's
            top-left ``is_causal``; S - L: torch's lower-right causal bias).
        L: number of query rows.
    """
    S = addend.shape[-1]
    if attn_mask is not None:
        keep = attn_mask if attn_mask.dtype == torch.bool else attn_mask > float("-inf")
        keep = keep.expand(*keep.shape[:-1], S)  # (..., L or 1, S): a mask of (L, 1) too
        bad = torch.isnan(addend).to(torch.float32).unsqueeze(-1)  # (..., S, 1)
        hits = torch.matmul(keep.to(torch.float32), bad).squeeze(-1)  # (..., L or 1)
        return torch.where(hits > 0, float("nan"), 0.0)
    if is_causal:
        seen = torch.cumsum(addend, dim=-1)  # (..., S): NaN from the first flagged key on
        if causal_offset == 0 and L <= S:  # row i sees keys 0 .. i
            return seen[..., :L]  # (..., L)
        seen = torch.cat([seen.new_zeros(*seen.shape[:-1], 1), seen], dim=-1)  # (..., 1 + S)
        last = torch.arange(L, device=addend.device) + causal_offset  # (L,) last key row i sees
        return seen.index_select(-1, (last + 1).clamp(0, S))  # (..., L)
    return addend.sum(dim=-1, keepdim=True)  # (..., 1): every row keeps every key


def rows_keeping(
    kept: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool, L: int, offset: int
) -> torch.Tensor:
    """Rows (..., L or 1) bool whose mask keeps at least one of the ``kept`` keys (..., S)."""
    marks = torch.where(kept, float("nan"), 0.0)  # (..., S)
    return torch.isnan(rows_using(marks, attn_mask, is_causal, L, offset))


def unmasked_addend(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """NaN-or-0 per row (..., L) of an unmasked call: what the kernel may drop.

    q (..., L, E), k (..., S, E) as given to the kernel (k with fewer heads under
    GQA). Every row uses every key, so a NaN in the first key poisons every row (the
    kernel returns zeros when every key is NaN); NaN in other keys propagates through
    the kernel itself. Reads O(L·E) values.
    """
    q_add = _nan_addend(q)  # (..., L)
    if k.shape[-2] == 0:
        return q_add
    heads = q.shape[-3] if q.ndim >= 3 else 1
    first = to_query_heads(_nan_addend(k[..., :1, :]), heads)  # (..., H, 1)
    return q_add + first


def apply(
    out: torch.Tensor, lse: torch.Tensor | None, poison: Poison
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Make NaN the rows of out (..., L, Ev) and lse (..., L) the addends flag."""
    rows = poison.scores if poison.values is None else poison.scores + poison.values
    nan = torch.full((), float("nan"), dtype=out.dtype, device=out.device)
    # a select, not an addition: the output gradient of a NaN row (often NaN itself)
    # does not reach the kernel's backward
    out = torch.where(torch.isnan(rows).unsqueeze(-1), nan, out)  # (..., L, Ev)
    if lse is not None:
        lse = lse + poison.scores.to(lse.dtype)  # (..., L)
    return out, lse


def flags_for_call(
    q: torch.Tensor,
    k_add: torch.Tensor,
    v_add: torch.Tensor,
    q_add: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    heads: int,
    causal_offset: int = 0,
    split: bool = True,
) -> Poison:
    """The :class:`Poison` addends of a masked call from :func:`sanitize`'s addends.

    ``split=False`` (no lse wanted): keys and values poison the output alike, so
    their flags are added and spread over the rows once."""
    L = q.shape[-2]
    if not split:
        kv_add = to_query_heads(k_add + v_add, heads)  # (..., S)
        return Poison(scores=q_add + rows_using(kv_add, attn_mask, is_causal, L, causal_offset))
    kv = torch.stack(
        [to_query_heads(k_add, heads), to_query_heads(v_add, heads)], dim=0
    )  # (2, ..., S)
    mask = attn_mask.unsqueeze(0) if attn_mask is not None else None  # (1, ..., L or 1, S)
    used = rows_using(kv, mask, is_causal, L, causal_offset)  # (2, ..., L or 1)
    return Poison(scores=q_add + used[0], values=used[1])
