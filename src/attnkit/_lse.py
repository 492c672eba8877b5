"""One fully-masked-row policy and one merge of attention partials by log-sum-exp.

Every path of attnkit (the reference softmax, the chunked tiles, the unpadded SDPA
calls, GPU kernels, context-parallel ring steps) ends a softmax the same way:

- the running row maximum used to shift ``exp`` is replaced by 0 where it is not
  finite (:func:`safe_max`), so a row whose every logit is ``-inf`` computes
  ``exp(-inf - 0) = 0`` instead of ``exp(-inf + inf) = NaN``;
- a row whose normalizer is 0 (no key to attend) gives output 0 and lse ``-inf``
  (:func:`finish`), with zero gradients;
- returned weights are divided by their own row sums (:func:`normalize_rows_`): an
  lse is one float rounded by about ``|lse| * eps``, so ``exp(s - lse)`` alone sums to
  1 only within that, which large logits make visible;
- partial results over disjoint sets of keys combine exactly through their lse
  (:func:`merge`, :func:`merge_all`): with ``lse = logaddexp(lse_a, lse_b)``,
  ``out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b``.

NaN is never produced by the policy itself; a NaN that is in the inputs of a used
position propagates (``max`` of a row holding NaN is NaN, and NaN is "not finite"
only for the shift, never for the sum).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["empty_lse", "finish", "merge", "merge_all", "normalize_rows_", "safe_max"]


def safe_max(m: torch.Tensor) -> torch.Tensor:
    """Row maxima with ``-inf``/``+inf`` replaced by 0: a shift ``exp`` can always use.

    m: (...,) any float dtype. NaN stays NaN, so a used NaN propagates.
    """
    return torch.where(torch.isinf(m), torch.zeros((), dtype=m.dtype, device=m.device), m)


def normalize_rows_(weights: torch.Tensor, sums: torch.Tensor | None = None) -> torch.Tensor:
    """Divide each row of ``weights`` (..., L, S) by its sum, in place; return it.

    Args:
        weights: non-negative entries (..., L, S), 0 where blocked.
        sums: (..., L) the row sums when already computed (as
            :func:`attnkit.kernels.softmax.exp_rows_` gives them), else summed here.

    A row summing to 0 (fully masked) stays 0 and a NaN row stays NaN (its blocked
    entries stay 0): both are divided by 1. Afterwards no entry exceeds 1 and a row
    sums to 1 within ``S * eps``.
    """
    if sums is None:
        sums = weights.sum(dim=-1)  # (..., L)
    one = torch.ones((), dtype=sums.dtype, device=sums.device)
    return weights.div_(torch.where(sums > 0, sums, one).unsqueeze(-1).to(weights.dtype))


def finish(
    acc: torch.Tensor, denom: torch.Tensor, m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalize an online-softmax accumulator.

    Args:
        acc: (..., L, Ev) the sum of ``exp(s - m) v`` over the keys seen.
        denom: (..., L) the sum of ``exp(s - m)``.
        m: (..., L) the shift used (already made safe by :func:`safe_max`).

    Returns:
        out (..., L, Ev) = acc / denom, and lse (..., L) = m + log(denom); rows with
        ``denom == 0`` (no key kept) give out 0 and lse ``-inf``.
    """
    dead = denom == 0  # NaN rows are not dead: their NaN propagates to out and lse
    safe = torch.where(dead, torch.ones((), dtype=denom.dtype, device=denom.device), denom)
    out = acc / safe.unsqueeze(-1).to(acc.dtype)
    neg_inf = torch.full((), float("-inf"), dtype=m.dtype, device=m.device)
    lse = torch.where(dead, neg_inf, m + torch.log(safe))
    return out, lse


def merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over the union of two disjoint key sets, from their partials.

    Args:
        out_a, out_b: (..., L, Ev) normalized outputs of each part (0 where a row
            kept no key of that part).
        lse_a, lse_b: (..., L) log-sum-exp of each part's logits (``-inf`` where a
            row kept no key). float32 or float64; half outputs are combined in the
            lse's dtype and cast back.

    Returns:
        (out, lse) of the union; rows with both parts empty give 0 and ``-inf``.
        Differentiable in every input.
    """
    return merge_all((out_a, out_b), (lse_a, lse_b))


def merge_all(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`merge` of any number of partials: out (..., L, Ev), lse (..., L) each."""
    if len(outs) != len(lses) or not outs:
        raise ValueError(
            f"merge_all: expected as many outputs as lses (at least one), got {len(outs)} "
            f"and {len(lses)}"
        )
    if len(outs) == 1:
        return outs[0], lses[0]
    dtype = outs[0].dtype
    lse_stack = torch.stack(torch.broadcast_tensors(*lses))  # (P, ..., L)
    m = safe_max(lse_stack.amax(dim=0))  # (..., L)
    w = torch.exp(lse_stack - m)  # (P, ..., L); exp(-inf) = 0 for empty parts
    total = w.sum(dim=0)  # (..., L)
    out = torch.zeros((), dtype=lse_stack.dtype, device=lse_stack.device)
    for o, wi in zip(outs, w.unbind(0), strict=True):
        out = out + o.to(lse_stack.dtype) * wi.unsqueeze(-1)  # (..., L, Ev)
    merged, lse = finish(out, total, m)
    return merged.to(dtype), lse


def empty_lse(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An lse of rows with no key: ``-inf`` everywhere, shape ``shape``."""
    return torch.full(tuple(shape), float("-inf"), dtype=dtype, device=device)
