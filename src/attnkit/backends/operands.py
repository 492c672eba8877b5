"""One lowering of scores: a call's score becomes the operands every kernel reads.

:func:`lower_score` turns the call's score into a :class:`ScoreOperands` record:

- kind "dot" (every dot-reducible score): ``logits = scale * (q' · k' + key_bias)``
  plus a per-query ``row_constant`` that softmax ignores (Gaussian: ``-‖q - c‖²/2σ²``);
- kind "additive" (Bahdanau): ``logits = scale * w · tanh(q' + k')`` over the hidden
  dim, with ``q' = W_q q`` and ``k' = W_k k``.

The projections run under autograd here, once, so gradients reach the score's
parameters through them whatever kernel computes the attention; a kernel's backward
only needs the gradients of the operands. The log-sum-exp a kernel computes is that
of the lowered logits; :meth:`ScoreOperands.finish_lse` adds the row constant back
(an empty row stays -inf), :meth:`ScoreOperands.lowered_lse` removes it from a given
lse (a backward from a context-parallel ring's global lse).

Non-finite keys: a score's dot form may mix keys (the Gaussian centres on their
mean), so unless the keys are known finite (read on the host for free) the dot form
gets them with non-finite rows zeroed, and those rows are put back after it: a NaN
key row as NaN, an inf Gaussian key as infinitely far (``excluded``: its logit is
-inf by construction).

Half precision: with ``upcast`` the dot form is computed in the compute dtype
(float32), so terms such as the Gaussian's ``-‖k‖²/2σ²`` are not rounded to half
first. The score's parameters are cast without touching the module (:func:`cast_score`
builds a shallow copy), so a score shared by threads is never changed under them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
from torch import nn

from .._host import readable
from .._inputs import AttentionInputs
from .._layout import ONE_HEAD, HeadLayout
from ..mods import ALiBi, PositionMod, Softcap
from ..scores import Additive, Dot, Score
from ._common import (
    all_finite,
    clean_keys,
    clean_rows,
    nan_rows,
    restore_nonfinite_keys,
)

__all__ = ["ScoreOperands", "alibi_folds", "cast_score", "lower_score"]


def cast_score(score: Score, dtype: torch.dtype) -> Score:
    """``score`` with its parameters in ``dtype``, differentiably (gradients flow back to
    the original parameters in their own dtype), as a shallow copy: the module itself,
    which other threads may be using, is never modified. Buffers keep their dtype (a
    fixed Gaussian bandwidth stays float64; the score casts it where it is used)."""
    if all(p.dtype == dtype for p in score.parameters()):
        return score
    return _cast_module(score, dtype)  # type: ignore[return-value]


def _cast_module(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    clone = copy.copy(module)  # a new object sharing the tensors; the dicts are replaced below
    params = {n: (None if p is None else p.to(dtype)) for n, p in module._parameters.items()}
    clone.__dict__["_parameters"] = params
    clone.__dict__["_modules"] = {
        n: (None if m is None else _cast_module(m, dtype)) for n, m in module._modules.items()
    }
    return clone


@dataclass(frozen=True)
class ScoreOperands:
    """A call's score as kernel operands (see the module docstring).

    Attributes:
        kind: "dot" or "additive".
        q: (..., L, E') q' (dot) or W_q q (additive).
        k: (..., S, E') k' (dot) or W_k k (additive).
        key_bias: None or (..., 1, S), unscaled by ``scale`` (dot only).
        w: None or (hidden,), the Additive score's w_v.
        row_constant: None or (..., L), unscaled; softmax ignores it.
        excluded: None or (..., S) bool: keys whose logit is -inf by construction.
        scale: multiplier of the logits.
        pos: None or (H, L + S - 1) float32: the position biases (ALiBi, T5's) by
            relative position, ``pos[h, j - i + L - 1]`` added to head h's scaled logits;
            differentiable in the modifiers' parameters.
        softcaps: the caps, in order: each maps ``s -> cap * tanh(s / cap)``, after the
            position bias.
        layout: the call's :class:`HeadLayout`.

    Head layout: ``key_bias`` and ``excluded`` have the key's heads, or the query's
    (a per-head scale, a folded ALiBi); :meth:`attnkit._layout.HeadLayout.query_heads`
    brings either to the query's.
    """

    kind: str
    q: torch.Tensor
    k: torch.Tensor
    key_bias: torch.Tensor | None
    w: torch.Tensor | None
    row_constant: torch.Tensor | None
    excluded: torch.Tensor | None
    scale: float
    pos: torch.Tensor | None = None
    softcaps: tuple[float, ...] = ()
    layout: HeadLayout = ONE_HEAD

    def finish_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """The lse of the score's logits from the lse of the lowered ones, (..., L): the
        row constant added back; an empty row stays -inf whatever its query holds."""
        if self.row_constant is None:
            return lse
        shifted = lse + (self.row_constant.to(lse.dtype) * self.scale).expand_as(lse)
        return torch.where(torch.isneginf(lse), lse, shifted)

    def row_constant_pairs(
        self, lse: torch.Tensor, row_grad: torch.Tensor | None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(tensor, gradient) pairs through which the logits' gradient reaches the score's
        row constant (and so the query and the score's parameters). ``row_grad``: each
        row's sum over this call's keys of the gradient of the (scaled) logits, shaped
        like the lse (for a whole call, that is the lse's gradient). Empty when there is
        no row constant; empty rows (lse -inf) take none."""
        rc = self.row_constant
        if rc is None or row_grad is None or not rc.requires_grad:
            return []
        g = row_grad.to(rc.dtype).masked_fill(torch.isneginf(lse), 0.0) * self.scale
        while g.ndim > rc.ndim:
            g = g.sum(0)
        dims = [d for d, n in enumerate(rc.shape) if n == 1 and g.shape[d] != 1]
        return [(rc, g.sum(dim=dims, keepdim=True) if dims else g)]

    def with_key_bias_feature(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q'', k'') with the key bias carried as one more feature, for kernels that take
        no bias: ``q'·k' + b == [q', 1]·[k', b]``; (q', k') without a key bias. A key bias
        per query head (a per-head scale under grouped-query attention) brings the keys
        to the query's heads with it (:meth:`HeadLayout.has_query_heads` then says so)."""
        q, k, kb = self.q, self.k, self.key_bias
        if kb is None:
            return q, k
        if self.layout.has_query_heads(kb, 2):
            k = self.layout.query_heads(k, 2)  # (..., H, S, E')
        kbt = kb.transpose(-2, -1)  # (..., S, 1)
        lead = torch.broadcast_shapes(k.shape[:-1], kbt.shape[:-1])
        k = torch.cat([k.expand(*lead, k.shape[-1]), kbt.expand(*lead, 1)], -1)  # (..., S, E'+1)
        q = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1)  # (..., L, E'+1)
        return q, k

    def lowered_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`finish_lse`: a given lse in the lowered logits' frame."""
        if self.row_constant is None:
            return lse
        shifted = lse - (self.row_constant.to(lse.dtype) * self.scale).expand_as(lse)
        return torch.where(torch.isneginf(lse), lse, shifted)


def lower_score(
    inputs: AttentionInputs,
    *,
    upcast: bool,
    row_constant: bool,
    query: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    fold_alibi: bool = False,
) -> ScoreOperands:
    """The call's score as :class:`ScoreOperands`.

    Args:
        inputs: the validated call.
        upcast: compute the operands in the compute dtype (float32 for half inputs);
            else in the inputs' dtype.
        row_constant: compute the row constant (only needed when an lse is returned).
        query, key: replace the call's query (..., L, E) and key (..., S, Ek), e.g.
            leaves of a recomputation.
        fold_alibi: fold ALiBi into the key bias and the row constant where that is
            exact (:func:`alibi_folds`), for kernels without a position table.
    """
    score = inputs.score
    q = inputs.query if query is None else query
    key = inputs.key if key is None else key
    dtype = inputs.compute_dtype if upcast else q.dtype
    sc = cast_score(score, dtype)
    q, key = q.to(dtype), key.to(dtype)
    if isinstance(score, Additive):
        assert isinstance(sc, Additive)
        guard = inputs.check_finite and not (readable(q) and all_finite(q.detach(), key.detach()))
        if guard:  # project finite rows only (see clean_rows), non-finite rows back as NaN
            (q, bad_q), (key, bad_k) = clean_rows(q), clean_rows(key)
        qa, ka = sc.project(q, key)  # (..., L, h), (..., S, h)
        if guard:
            qa, ka = nan_rows(qa, bad_q), nan_rows(ka, bad_k)
        w = sc.w_v.weight.reshape(-1)  # (h,)
        ops = ScoreOperands("additive", qa, ka, None, w, None, None, inputs.scale,
                            layout=inputs.layout)  # fmt: skip
        return _with_mods(inputs, ops, fold_alibi=False)
    far: torch.Tensor | None = None
    nan_keys: torch.Tensor | None = None
    q_bad: torch.Tensor | None = None
    if (
        inputs.check_finite
        and type(score).dot_form is not Dot.dot_form
        and not (readable(key) and all_finite(q.detach(), key.detach()))
    ):
        key, far, nan_keys = clean_keys(key)
        q, q_bad = clean_rows(q)
    qd, kd, kb = sc.dot_form(q, key)
    rc = sc.row_constant(q, key) if row_constant else None
    excluded: torch.Tensor | None = None
    if far is not None and nan_keys is not None:
        kd, kb, excluded = restore_nonfinite_keys(kd, kb, far, nan_keys)
    if q_bad is not None:  # a non-finite query row scores NaN against every key
        qd = nan_rows(qd, q_bad)
        if rc is not None:
            rc = torch.where(q_bad, float("nan"), rc)  # (..., L)
    if inputs.head_scale is not None:  # (hs q')·k' + hs b: the scale folds into the operands
        layout = inputs.layout
        hs = inputs.head_scale.to(qd.dtype)  # (H,) or (1,)
        qd = qd * layout.per_head(hs, 2)  # (..., H, L, E')
        if kb is not None:  # per query head from here on
            kb = layout.query_heads(kb, 2) * layout.per_head(hs, 2)  # (..., H, 1, S)
        if rc is not None:
            rc = rc * layout.per_head(hs, 1)  # (..., H, L)
    ops = ScoreOperands("dot", qd, kd, kb, None, rc, excluded, inputs.scale, layout=inputs.layout)
    return _with_mods(inputs, ops, fold_alibi=fold_alibi)


def alibi_folds(inputs: AttentionInputs, mod: ALiBi) -> bool:
    """True when ALiBi is exactly a key bias plus a row constant for this call: its
    causal form always; the symmetric form when the mask keeps only keys at or before
    each query's position (a causal band aligned with the ALiBi positions); and no
    softcap after it (which would not ignore the row constant)."""
    if any(m.kind == "softcap" for m in inputs.mods):
        return False
    if mod.causal:
        return True
    if inputs.mask is None:
        return False
    band = inputs.block_plan().band()
    if band is None or band[0] is not None or band[1] is None:
        return False
    pos = mod.positions(inputs.L, inputs.S)
    return band[1] + pos.k0 - pos.q0 <= 0  # every kept key at or before its query


def _with_mods(inputs: AttentionInputs, ops: ScoreOperands, *, fold_alibi: bool) -> ScoreOperands:
    """The call's score modifiers added to its operands, in the order given: folded ALiBi
    in the key bias and row constant, other position biases in one table (biases add,
    so several of a kind sum), each softcap in turn."""
    if not inputs.mods:
        return ops
    L, S, dev, layout = inputs.L, inputs.S, ops.q.device, inputs.layout
    heads = torch.arange(inputs.heads, device=dev)
    kb, rc = ops.key_bias, ops.row_constant
    pos: torch.Tensor | None = None
    softcaps: list[float] = []
    for m in inputs.mods:
        if isinstance(m, Softcap):
            softcaps.append(m.cap)
        elif isinstance(m, ALiBi) and fold_alibi and alibi_folds(inputs, m):
            # -slope (p_i - p_j) = slope r_j (per key) - slope r_i (per query), r relative
            key, row = m.folded(heads, L, S, ops.q.dtype)  # (H, S), (H, L)
            key_term = layout.per_head((key / ops.scale).to(ops.q.dtype), 2)  # (H, 1, S)
            row_term = layout.per_head((row / ops.scale).to(ops.q.dtype), 1)  # (H, L)
            kb = key_term if kb is None else layout.query_heads(kb, 2) + key_term
            rc = row_term if rc is None else rc + row_term
        elif isinstance(m, PositionMod):
            table = m.bias_table(heads, L, S, dev)  # (H, L + S - 1)
            pos = table if pos is None else pos + table
    return replace(ops, key_bias=kb, row_constant=rc, pos=pos, softcaps=tuple(softcaps))
