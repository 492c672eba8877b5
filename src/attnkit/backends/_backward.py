"""The generic backward from (out, lse): the materialized definition, differentiated.

For a call that is one part of a larger attention (a block of keys of a
context-parallel ring) whose normalized output is ``out`` with log-sum-exp ``lse``,
the gradients of this part are those of

    f = sum_ij p_ij (d_out_i · v_j) - sum_i D_i sum_j p_ij,   p_ij = exp(s_ij - lse_i),
    D_i = rowsum(d_out_i * out_i) - d_lse_i   (lse and D held constant),

since ``d f / d s_ij = p_ij (d_out_i · v_j - D_i)`` is the softmax backward and
``d f / d v_j = sum_i p_ij d_out_i``. For a whole call, pass its own (out, lse). Every
score and mask works here; memory is O(L·S) per call (backends with their own
backward avoid that).

Non-finite inputs follow the policy of :mod:`._materialized`: a pair that is not used
adds nothing to any gradient; the gradients that rows using a non-finite input reach
are NaN, and so are those of rows whose given output gradient or ``D`` is not finite
(their global output is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from .. import _lse
from .._far_rows import lost_rows
from .._host import readable
from .._inputs import AttentionInputs
from ._materialized import materialized
from .records import BackwardCall, InputGrads

__all__ = ["leaf_call", "materialized_backward", "pull_back"]


def _maybe(rows: torch.Tensor) -> torch.Tensor | None:
    """``rows`` when one of them is set (read where that is free), else None."""
    if readable(rows) and not bool(rows.any()):
        return None
    return rows


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``t`` that requires grad. An inference tensor (made under
    ``torch.inference_mode()``) cannot require grad outside inference mode: it is cloned
    into a normal tensor there (inside inference mode no graph is recorded anyway)."""
    if (
        not torch.compiler.is_compiling()  # (dynamo cannot trace is_inference)
        and t.is_inference()
        and not torch.is_inference_mode_enabled()
    ):
        t = t.clone()
    return t.detach().requires_grad_(True)


def leaf_call(
    inputs: AttentionInputs, **changes: Any
) -> tuple[list[torch.Tensor], AttentionInputs]:
    """Detached copies of the call's query, key and value that require grad, and the call
    on them (with ``changes`` to other fields): what a backward differentiates through."""
    leaves = [_leaf(t) for t in (inputs.query, inputs.key, inputs.value)]
    return leaves, replace(inputs, query=leaves[0], key=leaves[1], value=leaves[2], **changes)


def pull_back(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    leaves: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
) -> InputGrads:
    """Gradients of the leaves and params from (tensor, gradient) pairs of tensors computed
    from them (a kernel's operands and their gradients): zeros for a leaf nothing reached.
    A pair whose tensor is a constant (no leaf or parameter reaches it: the Gaussian's
    ``1/2σ²`` when σ is a plain number, say) carries no gradient and is left out."""
    pairs = [(t, g) for t, g in pairs if t.requires_grad]
    got: Sequence[torch.Tensor | None] = (None,) * (len(leaves) + len(params))
    if pairs:
        got = torch.autograd.grad([t for t, _ in pairs], [*leaves, *params],
                                  [g for _, g in pairs], allow_unused=True)  # fmt: skip
    dq, dk, dv = (
        torch.zeros_like(t) if g is None else g for t, g in zip(leaves, got, strict=False)
    )
    return dq, dk, dv, list(got[3:])


def materialized_backward(call: BackwardCall) -> InputGrads:
    """Gradients of this call's share (see the module docstring).

    ``call.given``: out (*batch, L, Ev), lse (*batch, L) (-inf for rows with no key
    anywhere), grad_out like out, grad_lse like lse or None; ``call.params``: score
    parameters to differentiate too.
    """
    inputs, given = call.inputs, call.given
    cd = inputs.compute_dtype
    d_out = given.grad_out.detach().to(cd)
    D = (d_out * given.out.detach().to(cd)).sum(-1)  # (*batch, L)
    if given.grad_lse is not None:
        D = D - given.grad_lse.detach().to(cd)
    # rows whose output gradient is not finite (their global output is NaN) pass a NaN to
    # the pairs they use, and nothing through the others
    odd = ~(torch.isfinite(D) & torch.isfinite(d_out).all(dim=-1))  # (*batch, L)
    with torch.enable_grad():
        leaves, rec = leaf_call(inputs, dropout_p=0.0)
        m = materialized(rec, extra_rows=_maybe(odd))
        logits = m.logits  # (*batch, L, S), -inf where blocked
        lse_c = given.lse.detach().to(cd)
        dead = torch.isneginf(lse_c)
        p = torch.exp(logits - _lse.safe_max(lse_c).unsqueeze(-1))  # (*batch, L, S)
        lost = lost_rows(inputs, lse_c)  # (*batch, L): far rows, their lse rounded away
        if lost is not None:  # normalized by their own (constant) max and sum instead
            top = logits.detach().amax(dim=-1, keepdim=True)  # (*batch, L, 1)
            top = _lse.safe_max(top.squeeze(-1)).unsqueeze(-1)
            own = torch.exp(logits - top)  # (*batch, L, S)
            own = own / own.detach().sum(dim=-1, keepdim=True).clamp(min=1.0)
            p = torch.where(lost.unsqueeze(-1), own, p)
        zero = torch.zeros((), dtype=p.dtype, device=p.device)
        p = torch.where(dead.unsqueeze(-1) | torch.isneginf(logits), zero, p)  # blocked: 0
        if m.reached is not None:  # their gradients are NaN already; drop their d_out
            d_out = torch.where(m.reached.unsqueeze(-1), 0.0, d_out)
            D = torch.where(m.reached, 0.0, D)
        f = ((p @ m.value) * d_out).sum() - (p.sum(-1) * D).sum()
    return pull_back([(f, torch.ones((), dtype=f.dtype))], leaves, call.params)
