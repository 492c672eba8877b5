"""One lowering of scores: a call's score becomes the operands every kernel reads.

:func:`lower_score` turns the call's score into a :class:`ScoreOperands` record:

- kind "dot" (every dot-reducible score): ``logits = scale * (q' · k' + key_bias)``
  plus a per-query ``row_constant`` that softmax ignores (Gaussian: ``-‖q - c‖²/2σ²``);
- kind "additive" (Bahdanau): ``logits = scale * w · tanh(q' + k')`` over the hidden
  dim, with ``q' = W_q q`` and ``k' = W_k k``;
- kind "distance" (the Gaussian where its dot form would cancel, see below):
  ``logits = -scale * w * ‖q - k‖²`` with ``w = 1/2σ²`` (per head with a per-head scale).

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

Gaussian: its dot form ``q·k/σ² - ‖k‖²/2σ²`` evaluates a logit of the size of
``‖q - k‖²/2σ²`` (small for the keys that matter) as the difference of terms of the
size of ``‖q - c‖²/2σ²`` and ``‖k - c‖²/2σ²``, c the keys' mean: where the inputs
span many bandwidths (a small σ, a large input scale) those terms are large and close,
and their float rounding swamps the logit. No shared centre avoids that (a query far
from c and its nearest keys are all far from it), and the dropped per-query constant
does not either (it is the size of the terms, and softmax ignores it anyway).
:func:`gaussian_form` measures that loss on the host: where it exceeds
:data:`DOT_FORM_LIMIT` units of the plain computation's rounding, the score is lowered
to kind "distance" (``logits = -scale * w * ‖q - k‖²``, the differences formed first),
which the chunked tiles and the reference backend compute and the dot-product kernels
decline.

Half precision: with ``upcast`` the dot form is computed in the compute dtype
(float32), so terms such as the Gaussian's ``-‖k‖²/2σ²`` are not rounded to half
first. The score's parameters are cast without touching the module
(:meth:`attnkit.scores.Score.cast` builds a shallow copy), so a score shared by threads
is never changed under them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from .._host import readable
from .._inputs import AttentionInputs
from .._layout import ONE_HEAD, HeadLayout
from ..mods import ALiBi, PositionMod, Softcap
from ..scores import Additive, Dot, Gaussian, is_shared_score
from ._common import (
    all_finite,
    clean_keys,
    clean_rows,
    nan_rows,
    restore_nonfinite_keys,
)

__all__ = [
    "DOT_FORM_GRAD_TERMS",
    "DOT_FORM_LIMIT",
    "ScoreOperands",
    "alibi_folds",
    "alibi_forms",
    "dot_form_grads_at_risk",
    "gaussian_dot_terms",
    "gaussian_form",
    "lower_score",
]

DOT_FORM_LIMIT = 8.0
"""The largest loss of the Gaussian's dot form, in units of the plain computation's
rounding, at which it still runs on a dot-product kernel (see :func:`gaussian_form`).
At 8 the dot form's output keeps plain float32's error and its gradients stay within
about 6x of it (1-D Nadaraya–Watson on [0, 5] at σ = 0.7); the differences keep 1-2x."""

DOT_FORM_GRAD_TERMS = 64.0
"""The largest term of the Gaussian's dot form, ``g·max(‖q_i - c‖², ‖k_j - c‖²)`` in units
of the logits (:func:`gaussian_dot_terms`), up to which a fused kernel's backward gives
the gradients of q, k and σ. A fused backward forms the logits' gradient as
``p * (dP - rowsum(dO * O))``, its row term rounded at ``eps * |dO| |v|`` where the true
row term cancels ``dP`` of the keys that hold the row; in the dot form that rounding
reaches q, k and σ multiplied by the dot form's terms (σ's gradient sums ``ds * s'`` over
logits of that size). Beyond a few dozen units rows are held by one key (the true
gradients vanish) while that rounding grows with the terms: the conformance fuzz found
sdpa's gradients off by up to 2.7 of their scale at terms of 5e2 .. 5e7, where ordinary
calls (unit features, σ near 1) stay below 30. Beyond the limit the chunked tiles give the
gradients, their row term summed apart from its estimate."""


@dataclass(frozen=True)
class ScoreOperands:
    """A call's score as kernel operands (see the module docstring).

    Attributes:
        kind: "dot", "additive" or "distance".
        q: (..., L, E') q' (dot), W_q q (additive) or q (distance).
        k: (..., S, E') k' (dot), W_k k (additive) or k (distance).
        key_bias: None or (..., 1, S), unscaled by ``scale`` (dot only).
        w: None, (hidden,) the Additive score's w_v, or (..., 1, 1) the Gaussian's
            ``1/2σ²`` (distance; per head with a per-head scale).
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

    def dot_products_only(self, backend: str) -> ScoreOperands:
        """These operands, for a kernel of dot products and a key bias alone; raises when a
        position table or a softcap remains, which such a kernel would drop: a backend
        chosen for a call it cannot run fails loudly, never with a wrong answer."""
        if self.pos is not None or self.softcaps:
            raise RuntimeError(
                f"attnkit: the {backend} backend was chosen for a call whose scores keep a "
                "position table or a softcap, which its kernel cannot apply (a bug: please "
                "report it); backend='chunked' runs the call meanwhile"
            )
        return self

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


def gaussian_form(inputs: AttentionInputs) -> str:
    """How the call's Gaussian score keeps its precision: "dot" (its dot form is exact
    enough, or the score is not a Gaussian), "distance" (it would cancel: the logits
    must be formed from the differences q - k), or "unknown" (the inputs cannot be read
    on the host without a device sync). Decided once per call (cached on ``inputs``).

    The dot form of query i rounds terms of up to ``g·max(‖q_i - c‖², ‖k - c‖²)``
    (``g = scale/2σ²``, c the keys' mean), where the plain computation rounds logits of
    about ``g·‖q_i - k‖²`` near the row's maximum, and never less than the softmax's own
    rounding (one unit). So the loss of query i is about
    ``ρ_i = g·max(‖q_i - c‖², max_j ‖k_j - c‖²) / max(1, g·min_j ‖q_i - k_j‖²)``; the
    dot form runs while ``max_i ρ_i <= DOT_FORM_LIMIT``. The nearest key's distance is
    only looked for when the numerator alone exceeds the limit (one matrix product,
    in chunks of rows: O(L + S) memory); the mask is ignored (a conservative answer).
    Non-finite inputs keep the dot form (its non-finite policy paths).
    """
    if not isinstance(inputs.score, Gaussian):
        return "dot"
    if inputs.gaussian_form is None:
        inputs.gaussian_form = _gaussian_form(inputs, inputs.score)
    return inputs.gaussian_form


def gaussian_dot_terms(inputs: AttentionInputs) -> float:
    """The largest term of the call's Gaussian dot form in units of the logits,
    ``g·max_i,j max(‖q_i - c‖², ‖k_j - c‖²)`` (``g = scale/2σ²``, c the keys' mean), as
    :func:`gaussian_form` measured it; 0 where it was not measured (not a Gaussian, the
    inputs not readable on the host, empty or not finite)."""
    gaussian_form(inputs)
    return inputs.gaussian_terms or 0.0


def dot_form_grads_at_risk(inputs: AttentionInputs) -> bool:
    """True for a Gaussian call whose dot form has terms beyond
    :data:`DOT_FORM_GRAD_TERMS` (:func:`gaussian_dot_terms`) and whose logits' operands
    need a gradient (the query, the key, σ, a per-head scale or a modifier's tensors):
    a fused backward's row term, rounded at ``eps * |dO| |v|``, would reach them
    multiplied by those terms. Measured on the host only (elsewhere False)."""
    if not isinstance(inputs.score, Gaussian) or not torch.is_grad_enabled():
        return False
    if gaussian_dot_terms(inputs) <= DOT_FORM_GRAD_TERMS:
        return False
    tensors = [inputs.query, inputs.key, *(t for m in inputs.mods for t in m.tensors())]
    if inputs.head_scale is not None:
        tensors.append(inputs.head_scale)
    if not is_shared_score(inputs.score):
        tensors += list(inputs.score.parameters())
    return any(t.requires_grad for t in tensors)


def _gaussian_form(inputs: AttentionInputs, score: Gaussian) -> str:
    q, k = inputs.query, inputs.key
    if not (readable(q) and readable(k)):
        return "unknown"
    if q.numel() == 0 or k.numel() == 0:
        return "dot"
    cd = inputs.compute_dtype
    with torch.no_grad():
        q, k = q.detach().to(cd), k.detach().to(cd)
        if not all_finite(q, k):
            return "dot"
        g = float(score._inv_two_var(q.new_empty((), dtype=torch.float64))) * inputs.scale
        if inputs.head_scale is not None:
            g *= float(inputs.head_scale.detach().abs().amax())
        center = Gaussian._center(q, k)  # (..., 1, E)
        qc = q - center  # (..., L, E)
        kc = inputs.layout.query_heads(k - center, 2)  # (..., Hq, S, E)
        nq = torch.linalg.vecdot(qc, qc)  # (..., L)
        nk = torch.linalg.vecdot(kc, kc)  # (..., S)
        rk = float(nk.amax())
        inputs.gaussian_terms = g * max(float(nq.amax()), rk)
        if not math.isfinite(inputs.gaussian_terms):
            return "distance"  # (a key so far, masked or not, that its terms overflow)
        if inputs.gaussian_terms <= DOT_FORM_LIMIT:
            return "dot"
        size = torch.broadcast_shapes(qc.shape[:-2], kc.shape[:-2])
        step = max(1, (1 << 22) // max(1, math.prod(size) * k.shape[-2]))
        eps = torch.finfo(cd).eps * 4 * q.shape[-1]
        for i in range(0, q.shape[-2], step):
            qi, ni = qc[..., i : i + step, :], nq[..., i : i + step]  # (..., l, E), (..., l)
            far = torch.matmul(qi, kc.transpose(-2, -1)).mul_(-2).add_(nk.unsqueeze(-2))
            far = far.amin(-1)  # (..., l): min_j ‖k_j - c‖² - 2 (q_i - c)·(k_j - c)
            top = torch.clamp(ni, min=rk)  # (..., l): the dot form's largest terms
            near = (ni + far - eps * top).clamp(min=0)  # (..., l): ‖q_i - k‖² at least
            nearest = g * float(near.amax())  # in float64: the largest -logit of a nearest key
            if nearest > torch.finfo(cd).max:
                raise ValueError(
                    f"score: Gaussian sigma {float(score.sigma):g} is too small for these "
                    f"inputs: a query's nearest key has logit -‖q - k‖²·scale/(2σ²) = "
                    f"{-nearest:.3g}, beyond {cd}, so every key of its row would read as "
                    "masked; scale sigma (or the inputs) up, or run in float64"
                )
            rho = (top.double() * g) / (near.double() * g).clamp(min=1.0)  # (..., l)
            if not float(rho.amax()) <= DOT_FORM_LIMIT:  # (NaN too: an overflowing key)
                return "distance"
    return "dot"


def lower_score(
    inputs: AttentionInputs,
    *,
    upcast: bool,
    row_constant: bool,
    query: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    fold_alibi: bool = False,
    differences: bool = False,
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
        differences: lower a Gaussian score to kind "distance" (for kernels that form
            ``q - k``; see :func:`gaussian_form`) instead of its dot form.
    """
    score = inputs.score
    q = inputs.query if query is None else query
    key = inputs.key if key is None else key
    dtype = inputs.compute_dtype if upcast else q.dtype
    sc = score.cast(dtype)
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
    if differences and isinstance(sc, Gaussian):
        return _with_mods(inputs, _distance(inputs, sc, q, key), fold_alibi=False)
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


def _distance(
    inputs: AttentionInputs, score: Gaussian, q: torch.Tensor, key: torch.Tensor
) -> ScoreOperands:
    """The Gaussian as kind "distance": q (..., L, E) and k (..., S, E) as given (no
    centring: ``fl(q - c) - fl(k - c)`` would round at the size of ``q - c``, where
    ``q - k`` rounds at its own), ``w = 1/2σ²`` (..., 1, 1). Under the non-finite
    policy a non-finite query row scores NaN against every key; a key holding an inf
    and no NaN scores -inf by itself (``(q - inf)² = inf``), a NaN key NaN."""
    if inputs.check_finite and not (readable(q) and all_finite(q.detach(), key.detach())):
        q, bad = clean_rows(q)
        q = nan_rows(q, bad)
    w = score._inv_two_var(q).reshape(1, 1)  # (1, 1)
    if inputs.head_scale is not None:
        w = w * inputs.layout.per_head(inputs.head_scale.to(q.dtype), 2)  # (H, 1, 1)
    return ScoreOperands("distance", q, key, None, w, None, None, inputs.scale,
                         layout=inputs.layout)  # fmt: skip


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


def alibi_forms(inputs: AttentionInputs) -> tuple[bool, ...]:
    """Whether each symmetric ALiBi of the call folds (:func:`alibi_folds`), in order;
    () without one. It is read off the mask's band, which a tensor offset makes data
    that the mask's signature does not hold: dispatch keys its cached choice on it."""
    return tuple(
        alibi_folds(inputs, m) for m in inputs.mods if isinstance(m, ALiBi) and not m.causal
    )


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
