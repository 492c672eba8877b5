"""Attention written out over the materialized (L, S) logits: the readable definition.

The reference backend is this module:

    logits  = mods(scale * score(q, k)) + bias, blocked pairs set to -inf  # (..., L, S)
    weights = softmax(logits) over keys (fully masked rows: all 0)          # (..., L, S)
    output  = dropout(weights) @ v                                          # (..., L, Ev)
    lse     = logsumexp(logits) over keys (fully masked rows: -inf)         # (..., L)

Non-finite inputs follow one policy: a NaN (or inf) in a position that is used
propagates to the rows that use it; a position masked out never contributes,
whatever it holds. A pair whose query or key holds a NaN or an inf scores NaN (an
inf makes no promise beyond that), except that under a score whose dot form has a key
bias (the Gaussian) a key holding an inf (and no NaN) is infinitely far: it scores
-inf against every query, so no pair uses it and its value never contributes. A pair
is *used* when its logit is not -inf after the mask. A row is *reached* when it uses
a pair whose query, key or value row is not finite.

- Forward: a blocked pair is -inf whatever its logit, and gets weight exactly 0; the
  values are taken with non-finite rows zeroed, and a reached row's output is NaN.
- Gradients, pair by pair as well: a pair that is not used contributes nothing to any
  gradient, whatever its query, key, value or output gradient holds (no ``0 * NaN``).
  So every gradient entry the non-finite inputs do not reach is that of the same call
  with those inputs zeroed, and the entries they do reach are NaN: the query of a
  reached row, the keys and values that reached rows use, and the score's parameters.
  (A reached row's output is NaN, so its output gradient is not used: it may be NaN.)

The work of that policy is skipped when every input is finite (read on the host where
that is free). Half-precision inputs are computed in float32 and the output cast back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .._host import in_transform, readable
from .._inputs import AttentionInputs
from ._common import all_finite, dense_mask, masked_softmax, score_logits
from .records import AttentionResult

__all__ = ["Materialized", "materialized", "materialized_attention", "materialized_logits"]


@dataclass(frozen=True)
class Materialized:
    """The call's operands, materialized under the non-finite policy.

    Attributes:
        logits: (*batch, L, S) masked, scaled logits in the compute dtype, -inf where
            blocked; their gradient is NaN on the pairs that reached rows use.
        value: (..., Hq, S, Ev) values in the compute dtype, non-finite rows zeroed;
            their gradient is NaN on the keys that reached rows use.
        reached: None when every input is finite, else (*batch, L) bool: rows that use a
            non-finite query, key or value.
    """

    logits: torch.Tensor
    value: torch.Tensor
    reached: torch.Tensor | None


class _Zeroed(torch.autograd.Function):
    """Forward: ``t`` (..., N, D) with the rows ``bad`` (..., N) zeroed. Backward: the
    gradient passes unchanged (a zeroed row still receives what its uses send it), plus
    ``addend`` (..., N), NaN where a row's gradient is to be NaN. (Its context is set
    apart and its vmap rule generated: it runs inside torch.func's transforms too.)"""

    generate_vmap_rule = True

    @staticmethod
    def forward(t: torch.Tensor, bad: torch.Tensor, addend: torch.Tensor | None) -> Any:
        return torch.where(bad.unsqueeze(-1), torch.zeros((), dtype=t.dtype, device=t.device), t)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.bad, ctx.addend = inputs[1], inputs[2]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        if ctx.addend is not None:
            g = g + ctx.addend.unsqueeze(-1).to(g.dtype)
        return g, None, None


class _ZeroedForward(_Zeroed):
    """:class:`_Zeroed` with forward mode, for torch.func's transforms and forward-mode
    AD (dynamo traces no Function that defines ``jvp``: compiled calls take the other)."""

    @staticmethod
    def jvp(ctx: Any, t_dot: torch.Tensor, *_: Any) -> torch.Tensor:
        """The tangent with the same rows zeroed."""
        zero = torch.zeros((), dtype=t_dot.dtype, device=t_dot.device)
        return torch.where(ctx.bad.unsqueeze(-1), zero, t_dot)


class _NanGrad(torch.autograd.Function):
    """Identity forward; backward adds ``addend`` (NaN where the gradient is to be NaN).
    (Runs inside torch.func's transforms too, as :class:`_Zeroed`.)"""

    generate_vmap_rule = True

    @staticmethod
    def forward(t: torch.Tensor, addend: torch.Tensor) -> Any:
        return t.view_as(t)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.addend = inputs[1]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return g + ctx.addend.to(g.dtype), None


class _NanGradForward(_NanGrad):
    """:class:`_NanGrad` with forward mode (see :class:`_ZeroedForward`)."""

    @staticmethod
    def jvp(ctx: Any, t_dot: torch.Tensor, *_: Any) -> torch.Tensor:
        """The tangent as it is (the NaN is the backward's)."""
        return t_dot.view_as(t_dot)


def _zeroed(t: torch.Tensor, bad: torch.Tensor, addend: torch.Tensor | None) -> torch.Tensor:
    return (_ZeroedForward if in_transform() else _Zeroed).apply(t, bad, addend)


def _nan_grad(t: torch.Tensor, addend: torch.Tensor) -> torch.Tensor:
    return (_NanGradForward if in_transform() else _NanGrad).apply(t, addend)


def _nan_where(flags: torch.Tensor) -> torch.Tensor:
    """NaN where ``flags`` is True, 0 elsewhere (float32)."""
    return torch.where(flags, float("nan"), 0.0)


def _bad_rows(t: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (..., N) True where the row holds a NaN or an inf."""
    return ~torch.isfinite(t).all(dim=-1)


def _far_keys(inputs: AttentionInputs, k: torch.Tensor, k_bad: torch.Tensor) -> torch.Tensor | None:
    """Key rows (..., Hk, S) that are infinitely far, or None: under a score whose dot
    form has a key bias (the Gaussian: ``-‖q - k‖²/2σ²``), a key holding an inf but no
    NaN scores -inf against every query, as the kernels compute it."""
    score = inputs.score
    if not score.dot_reducible:
        return None
    probe_q = torch.zeros(1, inputs.E, dtype=k.dtype, device=k.device)  # (1, E)
    probe_k = torch.zeros(1, k.shape[-1], dtype=k.dtype, device=k.device)  # (1, Ek)
    with torch.no_grad():
        _, _, key_bias = score.cast(k.dtype).dot_form(probe_q, probe_k)
    if key_bias is None:
        return None
    return k_bad & ~torch.isnan(k).any(dim=-1)


def _scored(inputs: AttentionInputs, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """mods(scale * score(q, k)) (..., L, S), before the mask."""
    logits = score_logits(inputs, q, k) * inputs.scale  # (..., L, S)
    if inputs.head_scale is not None:  # one scale per query head
        logits = logits * inputs.layout.per_head(inputs.head_scale.to(logits.dtype), 2)
    for mod in inputs.mods:
        logits = mod.logits(logits, inputs.L, inputs.S)
    return logits


def _masked(inputs: AttentionInputs, logits: torch.Tensor) -> torch.Tensor:
    """The mask applied: -inf where blocked, whatever the logit; (*batch, L, S)."""
    dm = dense_mask(inputs)
    bias = dm.bias_in(logits.dtype)
    if bias is not None:
        logits = (logits + bias).masked_fill(bias == float("-inf"), float("-inf"))
    if dm.keep is not None:
        logits = logits.masked_fill(~dm.keep, float("-inf"))
    return logits.expand(*inputs.batch_shape, inputs.L, inputs.S)


def materialized(inputs: AttentionInputs, extra_rows: torch.Tensor | None = None) -> Materialized:
    """The call's logits and values under the non-finite policy (see the module docstring).

    ``extra_rows``: None or (*batch, L) bool, more rows to treat as reached (a backward
    whose output gradient is not finite there)."""
    cd, layout = inputs.compute_dtype, inputs.layout
    q, k = inputs.query.to(cd), inputs.key.to(cd)
    v = layout.query_heads(inputs.value.to(cd), 2)  # (..., Hq, S, Ev)
    if extra_rows is None and readable(q) and all_finite(q.detach(), k.detach(), v.detach()):
        logits = _masked(inputs, _scored(inputs, q, layout.query_heads(k, 2)))
        return Materialized(logits=logits, value=v, reached=None)
    q_bad, k_bad = _bad_rows(q), _bad_rows(k)  # (..., L), (..., Hk, S)
    far = _far_keys(inputs, k, k_bad)  # (..., Hk, S) or None
    if far is not None:
        k_bad = k_bad & ~far
    qc = _zeroed(q, q_bad, None)
    kc = _zeroed(k, _bad_rows(k), None)
    clean = _scored(inputs, qc, layout.query_heads(kc, 2))  # (..., L, S), differentiable
    k_bad = layout.query_heads(k_bad, 1)  # (..., Hq, S)
    v_bad = _bad_rows(v)  # (..., Hq, S)
    bad_pair = q_bad.unsqueeze(-1) | k_bad.unsqueeze(-2)  # (..., L, S)
    logits = clean + _nan_where(bad_pair).to(clean.dtype)  # NaN there, gradient to clean
    if far is not None:  # infinitely far: -inf whatever the query, a pair never used
        far_q = layout.query_heads(far, 1)  # (..., Hq, S)
        logits = logits.masked_fill(far_q.unsqueeze(-2), float("-inf"))
    logits = _masked(inputs, logits)
    used = ~torch.isneginf(logits.detach())  # (*batch, L, S); NaN pairs are used
    reached = (used & (bad_pair | v_bad.unsqueeze(-2))).any(dim=-1)  # (*batch, L)
    if extra_rows is not None:
        reached = reached | extra_rows
    by_reached = used & reached.unsqueeze(-1)  # (*batch, L, S)
    logits = _nan_grad(logits, _nan_where(by_reached))
    keys = by_reached.any(dim=-2)  # (*batch, S): keys a reached row uses
    value = _zeroed(v.expand(*keys.shape, v.shape[-1]), v_bad.expand_as(keys),
                          _nan_where(keys))  # fmt: skip
    return Materialized(logits=logits, value=value, reached=reached)


def materialized_logits(inputs: AttentionInputs) -> torch.Tensor:
    """Masked, scaled logits (*batch, L, S) in the compute dtype; -inf where blocked."""
    return materialized(inputs).logits


def materialized_attention(inputs: AttentionInputs) -> AttentionResult:
    """The whole call, materialized: output, weights and lse (as asked)."""
    m = materialized(inputs)
    weights, lse = masked_softmax(m.logits)
    probs = F.dropout(weights, p=inputs.dropout_p) if inputs.dropout_p > 0 else weights
    out = probs @ m.value  # (*batch, L, Ev)
    if m.reached is not None:  # NaN, and no gradient through it (it may be NaN)
        out = torch.where(m.reached.unsqueeze(-1), float("nan"), out)
    return AttentionResult(
        output=out.to(inputs.dtype),
        weights=weights if inputs.return_weights else None,
        lse=lse if inputs.return_lse else None,
    )
