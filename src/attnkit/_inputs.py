"""AttentionInputs: one validated record of an ``attention()`` call.

Everything a backend needs to decide whether it can run, and to run, is checked
and computed here once, before any compute: shapes, dtypes, device, the
canonical score and mask objects, the resolved scale and the flags.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import SupportsFloat, TypeGuard

import torch

from . import masks as _masks
from ._args import shape_text as _shape
from ._host import readable
from ._layout import HeadLayout
from ._score_names import check_score_name
from ._strided import check_strided
from .blockplan import BlockPlan, build_plan
from .mods.base import Mod, as_list
from .scores import Score, is_shared_score, resolve_score

__all__ = ["AttentionInputs", "normalize_mask", "validate_inputs"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(slots=True)
class AttentionInputs:
    """A validated attention call.

    Shapes: query (*Bq, L, E), key (*Bk, S, Ek), value (*Bk, S, Ev); the output
    has shape (*batch_shape, L, Ev). ``groups`` > 1 means grouped-query attention:
    dim -3 of query is ``groups`` times dim -3 of key and value.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    score: Score
    mask: _masks.Mask | None
    scale: float
    dropout_p: float
    return_weights: bool
    return_lse: bool
    weights_mean: bool
    batch_shape: tuple[int, ...]
    L: int
    S: int
    E: int
    Ev: int
    groups: int
    mods: tuple[Mod, ...] = ()
    head_scale: torch.Tensor | None = None
    """(H,) per-head multipliers of the logits when ``scale=`` was a tensor (``scale``
    is then 1.0), else None."""
    check_finite: bool = True
    """False when the caller guarantees finite inputs (``check_finite=False``): the
    non-finite policy's checks and cleaning are skipped."""
    gaussian_form: str | None = None
    """How a Gaussian score is computed for these inputs, once decided
    (:func:`attnkit.backends.operands.gaussian_form`): None until then."""
    gaussian_terms: float | None = None
    """The largest term of a Gaussian score's dot form in units of the logits, measured
    when its form is decided (:func:`attnkit.backends.operands.gaussian_dot_terms`);
    None until then, or where it was not measured."""
    _plan: BlockPlan | None = field(default=None, init=False, repr=False, compare=False)
    """:meth:`block_plan`'s answer once asked (dispatch, the backend's reasons and its
    kernel each ask); not carried over by ``dataclasses.replace``."""
    far_rows_at_risk: bool | None = field(default=None, init=False, repr=False, compare=False)
    """:func:`attnkit._far_rows.far_rows_at_risk`'s answer once asked; None until then."""

    @property
    def mod_kinds(self) -> frozenset[str]:
        """The kinds of the call's score modifiers ("alibi", "softcap", ...)."""
        return frozenset(m.kind for m in self.mods)

    @property
    def heads(self) -> int:
        """Query heads: dim -3 of the query (1 without leading dims)."""
        return self.batch_shape[-1] if self.batch_shape else 1

    @property
    def layout(self) -> HeadLayout:
        """How the leading dims map to (batch, heads): the one place per-head parameters
        and grouped-query key heads are broadcast (:class:`attnkit._layout.HeadLayout`)."""
        return HeadLayout(self.batch_shape, self.groups)

    @property
    def dtype(self) -> torch.dtype:
        return self.query.dtype

    @property
    def device(self) -> torch.device:
        return self.query.device

    @property
    def compute_dtype(self) -> torch.dtype:
        """float32 for half inputs (softmax accumulates in float32), else the input dtype."""
        return torch.float32 if self.dtype in (torch.float16, torch.bfloat16) else self.dtype

    @property
    def mask_parts(self) -> tuple[_masks.Mask, ...]:
        return () if self.mask is None else self.mask.parts()

    @property
    def mask_kinds(self) -> frozenset[str]:
        """Every kind in the mask: its leaves' kinds, plus "or"/"not" where they appear."""
        return frozenset() if self.mask is None else self.mask.kinds()

    @property
    def mask_needs_grad(self) -> bool:
        """True when a mask tensor (a learnable bias) needs a gradient."""
        return (
            self.mask is not None
            and torch.is_grad_enabled()
            and any(t.requires_grad for t in self.mask.tensors())
        )

    def block_plan(self) -> BlockPlan:
        """The call's mask lowered once (:func:`attnkit.blockplan.build_plan`, cached),
        with the logits in the compute dtype. Tile sizes are the caller's to set."""
        if self._plan is None:
            self._plan = build_plan(
                self.mask, self.L, self.S, self.batch_shape, self.device, dtype=self.compute_dtype
            )
        return self._plan

    @property
    def needs_grad(self) -> bool:
        if not torch.is_grad_enabled():
            return False
        if self.query.requires_grad or self.key.requires_grad or self.value.requires_grad:
            return True
        if self.head_scale is not None and self.head_scale.requires_grad:
            return True  # (a learnt per-head scale: its gradient goes through the lse too)
        if any(t.requires_grad for m in self.mods for t in m.tensors()):
            return True  # (ALiBi slopes, a T5 table, sink logits)
        return not is_shared_score(self.score) and any(
            p.requires_grad for p in self.score.parameters()
        )

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (*self.batch_shape, self.L, self.Ev)

    def signature(self) -> tuple[object, ...]:
        """Everything a backend's reasons depend on, as a hashable key (no tensor data):
        dtype, device type, shapes, score type, the mask's structure, the flags and the
        grad mode. Dispatch caches its choice under it."""
        score = self.score
        return (
            self.dtype,
            self.device.type,
            self.batch_shape,
            self.L,
            self.S,
            self.E,
            self.Ev,
            self.groups,
            type(score),
            score.dot_reducible,
            None if self.mask is None else self.mask.signature(self.L, self.S),
            self.return_weights,
            self.return_lse,
            self.weights_mean,
            self.dropout_p > 0,
            torch.is_grad_enabled(),
            self.needs_grad,
            tuple(m.signature() for m in self.mods),
            self.check_finite,
            None if self.head_scale is None else tuple(self.head_scale.shape),
        )


_NESTED_HINT = {
    "query": (
        "(N, L_max, E), drop the output's padded rows, and give the keys' lengths as "
        "mask=masks.valid_lens(lengths) (queries=True when they are the queries' too); "
        "attnkit.nn.MultiheadAttention takes nested inputs as they are"
    ),
    "key": (
        "(N, S_max, E) and give its lengths (key.offsets().diff() for a jagged key) as "
        "mask=masks.valid_lens(lengths); attnkit.nn.MultiheadAttention takes nested inputs "
        "as they are"
    ),
}
_NESTED_HINT["value"] = (
    _NESTED_HINT["key"]
    .replace("(N, S_max, E)", "(N, S_max, Ev)")
    .replace("key.offsets", "value.offsets")
)
"""What to do after padding a nested query, key or value (the lengths become a mask)."""


def _check_tensor(name: str, t: object, layout: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name}: expected a torch.Tensor of shape {layout}, got {type(t).__name__}"
        )
    check_strided("", name, t, nested_hint=_NESTED_HINT[name])
    if t.ndim < 2:
        raise ValueError(f"{name}: expected shape {layout} with at least 2 dims, got {_shape(t)}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name}: expected a floating-point tensor (float16, bfloat16, float32, float64), "
            f"got dtype {t.dtype}"
        )
    return t


def _broadcast_batch(
    q_batch: tuple[int, ...], kv_batch: tuple[int, ...]
) -> tuple[tuple[int, ...], int]:
    """Broadcast leading dims of query and key/value; returns (batch_shape, groups)."""
    if q_batch == kv_batch:
        return q_batch, 1
    groups = 1
    kv = list(kv_batch)
    if len(q_batch) >= 1 and len(kv) >= 1:
        hq, hk = q_batch[-1], kv[-1]
        if hq != hk and hk != 1 and hq != 1:
            if hq % hk != 0:
                raise ValueError(
                    f"key: the head dim (-3) of query is {hq} and of key is {hk}; for "
                    f"grouped-query attention the query's must be a multiple of the key's, "
                    f"otherwise both must be equal or 1"
                )
            groups = hq // hk
            kv[-1] = hq
    try:
        shape = torch.broadcast_shapes(torch.Size(q_batch), torch.Size(kv))
    except RuntimeError:
        raise ValueError(
            f"query, key: leading (batch) dims do not broadcast: query has {_shape(q_batch)}, "
            f"key/value have {_shape(kv_batch)}"
        ) from None
    return tuple(int(d) for d in shape), groups


def normalize_mask(mask: object) -> _masks.Mask | None:
    """``mask=`` of :func:`attnkit.attention`: a mask object, a float tensor (an additive
    bias) or None, as a mask or None; anything ambiguous is refused, naming the fix."""
    if mask is None or isinstance(mask, _masks.Mask):
        return mask
    if isinstance(mask, torch.Tensor):
        check_strided("", "mask", mask)
        if mask.dtype == torch.bool:
            raise TypeError(
                "mask: a raw bool tensor is ambiguous; wrap it as masks.keep(t) (True = may "
                "attend) or masks.block(t) (True = masked, torch.nn.MultiheadAttention's "
                "convention)"
            )
        if mask.is_floating_point():
            return _masks.bias(mask)
        raise TypeError(
            f"mask: a {mask.dtype} tensor is ambiguous; use masks.tf(t) (1 = masked), "
            "masks.keep(t.bool()) or masks.block(t.bool())"
        )
    raise TypeError(
        f"mask: expected an attnkit mask (masks.keep, masks.block, masks.causal, ...) or a float "
        f"tensor (additive bias), got {type(mask).__name__}"
    )


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return value


def _check_weights_flag(value: object, batch_shape: tuple[int, ...]) -> tuple[bool, bool]:
    """``return_weights``: True, False or "mean"; returns (return_weights, weights_mean)."""
    if value == "mean" and isinstance(value, str):
        if not batch_shape:
            raise ValueError(
                'return_weights: "mean" averages over the head dim (-3) of the query, which '
                "has no leading dims; expected a query of shape (..., H, L, E)"
            )
        return True, True
    if not isinstance(value, bool):
        raise TypeError(f'return_weights: expected True, False or "mean", got {value!r}')
    return value, False


def validate_inputs(
    query: object,
    key: object,
    value: object,
    *,
    score: object = "scaled_dot",
    mask: object = None,
    scale: object = None,
    dropout_p: object = 0.0,
    return_weights: object = False,
    return_lse: object = False,
    mods: object = None,
    check_finite: object = True,
) -> AttentionInputs:
    """Check every argument of ``attention()`` and return the canonical record."""
    q = _check_tensor("query", query, "(..., L, E)")
    k = _check_tensor("key", key, "(..., S, E)")
    v = _check_tensor("value", value, "(..., S, Ev)")
    qs, ks, vs = q.shape, k.shape, v.shape
    device = q.device
    if not (device == k.device == v.device):
        raise ValueError(
            f"query, key, value: must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"query, key, value: dtypes must match, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if ks[-2] != vs[-2]:
        raise ValueError(
            f"key, value: must have the same number of keys S (dim -2), got key {_shape(k)} "
            f"and value {_shape(v)}"
        )
    if ks[:-2] != vs[:-2]:
        raise ValueError(
            f"key, value: leading dims must match, got key {_shape(k)} and value {_shape(v)}"
        )
    L, E = qs[-2], qs[-1]
    S, Ek, Ev = ks[-2], ks[-1], vs[-1]
    if E == 0 or Ek == 0:
        raise ValueError(
            f"query, key: feature dim must be >= 1, got query {_shape(q)}, key {_shape(k)}"
        )

    sc = resolve_score(check_score_name(score))  # type: ignore[arg-type]
    qd, kd = sc.query_dim(), sc.key_dim()
    if qd is None and kd is None:
        if E != Ek:
            raise ValueError(
                f"query, key: score {sc.name!r} needs equal feature dims, got query {_shape(q)} "
                f"(E={E}) and key {_shape(k)} (E={Ek})"
            )
    else:
        if qd is not None and E != qd:
            raise ValueError(
                f"query: score {sc.name!r} expects query feature dim {qd}, got {_shape(q)}"
            )
        if kd is not None and Ek != kd:
            raise ValueError(
                f"key: score {sc.name!r} expects key feature dim {kd}, got {_shape(k)}"
            )
    for pname, p in () if is_shared_score(sc) else sc.named_parameters():
        if p.dtype != q.dtype or p.device != device:
            raise TypeError(
                f"score: parameter {pname!r} of {sc.name!r} is {p.dtype} on {p.device}, but the "
                f"inputs are {q.dtype} on {q.device}; move the score with .to(...)"
            )
    if not is_shared_score(sc):
        sc.check_parameters(q.dtype)

    batch_shape, groups = _broadcast_batch(tuple(qs[:-2]), tuple(ks[:-2]))

    heads = batch_shape[-1] if batch_shape else 1
    head_scale: torch.Tensor | None = None
    if scale is None:
        scale_f = sc.default_scale(E)
        if scale_f > SCALE_READ_ABOVE:  # a score's own scale (ScaledDot(scale=...))
            _check_scale_range(scale_f, q, k, sc, what=f"score: the scale of {sc.name!r}:")
    elif isinstance(scale, torch.Tensor):
        head_scale = _check_head_scale(scale, heads, device)
        scale_f = 1.0
        if readable(head_scale) and head_scale.numel():  # its largest multiplier, as a
            # float scale is checked (no heads: nothing to check)
            _check_scale_range(float(head_scale.detach().max()), q, k, sc)
    else:
        if not isinstance(scale, (int, float)) and _other_real(scale):
            scale = float(scale)  # a NumPy float (1 / np.sqrt(E)), as SDPA takes it
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(
                f"scale: expected a positive finite float, a (H,) tensor or None, got {scale!r}"
            )
        try:
            scale_f = float(scale)
        except OverflowError:  # an int beyond any float (10**400)
            scale_f = math.inf
        if not 0 < scale_f < math.inf:  # NaN too (comparisons, not math.isfinite(): a
            # compiled call whose scale is a dynamic float traces them)
            raise ValueError(f"scale: expected a positive finite float or None, got {scale!r}")
        _check_scale_range(scale_f, q, k, sc)
    mod_list = _check_mods(mods, heads, device)

    if type(dropout_p) not in (int, float) or dropout_p != 0.0:
        if not isinstance(dropout_p, (int, float)) and _other_real(dropout_p):
            dropout_p = float(dropout_p)  # a NumPy float
        if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
            raise TypeError(f"dropout_p: expected a float in [0, 1), got {dropout_p!r}")
        if not (0.0 <= float(dropout_p) < 1.0):
            raise ValueError(f"dropout_p: expected a float in [0, 1), got {dropout_p!r}")

    m = normalize_mask(mask)
    if m is not None:
        for t in m.tensors():
            check_strided("mask", "a tensor t it holds", t, var="t")
        m.validate(batch_shape, L, S)
        if device.type != "meta" and any(t.device.type == "meta" for t in m.tensors()):
            kind, shape = _meta_leaf(m)
            where = "the CPU" if device.type == "cpu" else f"{device} or the CPU"
            raise ValueError(
                f"mask: its {kind} part holds a tensor of shape {shape} on the meta device "
                f"(shapes only, no values), but the query is on {device}; build the mask "
                f"from tensors on {where}"
            )
        for t in m.dense_tensors():
            if t.device != device:
                raise ValueError(
                    f"mask: is on {t.device} but the query is on {q.device}; expected one device"
                )

    want_weights, weights_mean = _check_weights_flag(return_weights, batch_shape)
    return AttentionInputs(
        query=q,
        key=k,
        value=v,
        score=sc,
        mask=m,
        scale=scale_f,
        dropout_p=float(dropout_p),
        return_weights=want_weights,
        return_lse=_check_flag("return_lse", return_lse),
        weights_mean=weights_mean,
        batch_shape=batch_shape,
        L=L,
        S=S,
        E=E,
        Ev=Ev,
        groups=groups,
        mods=mod_list,
        head_scale=head_scale,
        check_finite=_check_flag("check_finite", check_finite),
    )


def _meta_leaf(mask: _masks.Mask) -> tuple[str, str]:
    """The kind of the first mask inside ``mask`` that holds a meta tensor, and that
    tensor's shape, for the error message."""
    for t in mask._tensors():
        if t.device.type == "meta":
            return mask.kind, _shape(t)
    for child in mask.children():
        if any(t.device.type == "meta" for t in child.tensors()):
            return _meta_leaf(child)
    raise AssertionError("no meta tensor in the mask")  # pragma: no cover


def _check_mods(mods: object, heads: int, device: torch.device) -> tuple[Mod, ...]:
    out = tuple(m for m in as_list(mods) if not m.identity)  # softcap(inf): no cap
    for m in out:
        m.check(heads, "mods")
        for t in m.tensors():
            if t.device != device and device.type != "meta":
                raise ValueError(
                    f"mods: mods.{m.kind} holds a tensor on {t.device}, but the query is on "
                    f"{device}; move it with .to({str(device)!r})"
                )
    return out


def _other_real(value: object) -> TypeGuard[SupportsFloat]:
    """A real number that is not a Python int, float or bool, nor a tensor (NumPy's)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, torch.Tensor))


def _check_head_scale(scale: torch.Tensor, heads: int, device: torch.device) -> torch.Tensor:
    check_strided("", "scale", scale)
    if scale.ndim == 0 and scale.is_floating_point():  # one multiplier for every head,
        scale = scale.reshape(1)  # (1,), as a float scale (and differentiable)
    # (!=, not `in`: dynamo's `in` misses a dynamic size equal to an int)
    n = scale.shape[0] if scale.ndim == 1 else 0
    if scale.ndim != 1 or not scale.is_floating_point() or (n != 1 and n != heads):
        raise ValueError(
            f"scale: a tensor scale is one multiplier per query head, shape ({heads},) "
            f"(or (1,) or 0-d), floating point; got shape {_shape(scale)} and dtype {scale.dtype}"
        )
    if scale.device != device and device.type != "meta":
        raise ValueError(f"scale: is on {scale.device} but the query is on {device}")
    if readable(scale) and not bool(torch.isfinite(scale).all() & (scale > 0).all()):
        raise ValueError(f"scale: every per-head scale must be positive and finite, got {scale}")
    return scale


SCALE_READ_ABOVE = 1e4
"""A float ``scale`` above this is checked against the inputs' values where they can be
read for free (:func:`_check_scale_range`); calls with such a scale are not planned
(a plan skips validation, and the check depends on the values)."""


def scale_ceiling(dtype: torch.dtype) -> float:
    """The largest float ``scale`` accepted for logits computed in ``dtype`` (the compute
    dtype: float32 for half inputs): the square root of the dtype's largest value, so the
    scale takes at most half of its exponent range and the scores the other half."""
    return math.sqrt(torch.finfo(dtype).max)


def _check_scale_range(
    scale: float, q: torch.Tensor, k: torch.Tensor, score: Score, what: str = "scale:"
) -> None:
    """Refuse a scale whose logits would overflow the compute dtype (they would give NaN,
    or -inf everywhere for the Gaussian: a row treated as empty).

    Two checks: a scale above :func:`scale_ceiling` is refused on every path (the same
    answer eagerly, compiled and on any device); above :data:`SCALE_READ_ABOVE`, where
    the inputs can be read on the host for free (CPU tensors, outside torch.compile), the
    largest unscaled logit is bounded from the inputs (:func:`_logit_bound`) and a scale
    that takes it past the dtype's range / 64 is refused, naming the largest usable one.
    Where the inputs cannot be read (an accelerator, torch.compile) scales up to the
    ceiling are taken on trust: there, logits that overflow give NaN rows."""
    cd = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    ceiling = scale_ceiling(cd)
    if scale > ceiling:
        raise ValueError(
            f"{what} expected at most {ceiling:.3g} for logits computed in {cd} (the square "
            f"root of its range, the rest being the scores'), got {scale:g}; fold part of "
            "it into the query, or use float64 inputs"
        )
    if scale <= SCALE_READ_ABOVE or not (readable(q) and readable(k)):
        return
    bound = _logit_bound(q, k, score)
    limit = torch.finfo(cd).max / 64
    if bound is not None and math.isfinite(bound) and bound > 0 and scale * bound > limit:
        raise ValueError(
            f"{what} {scale:g} would overflow the logits, computed in {cd}: the score's "
            f"largest |logit| for these inputs is up to {bound:.3g} before scaling, and "
            f"scale x {bound:.3g} must stay below {limit:.3g}; the largest usable scale for "
            f"these inputs is about {limit / bound:.3g}"
        )


def _logit_bound(q: torch.Tensor, k: torch.Tensor, score: Score) -> float | None:
    """An upper bound of the unscaled |logit| (float64, on the host), or None where the
    score gives no way to bound it (a score that only materializes its logits).

    Dot-reducible scores: from the dot form, ``E' max|q'| max|k'| + max|key bias| +
    max|row constant|`` (for the Gaussian that bounds ``‖q - k‖²/2σ²`` too); Additive:
    ``sum |w_v|`` (its tanh is bounded). Non-finite inputs give a non-finite bound (the
    non-finite policy handles them)."""
    from .scores import Additive

    with torch.no_grad():
        if isinstance(score, Additive):
            return float(score.w_v.weight.detach().double().abs().sum())
        if not score.dot_reducible:
            return None
        sc = score.cast(torch.float64)
        q64, k64 = q.detach().double(), k.detach().double()
        qd, kd, kb = sc.dot_form(q64, k64)
        rc = sc.row_constant(q64, k64)
        bound = qd.shape[-1] * _amax(qd) * _amax(kd) + _amax(kb) + _amax(rc)
    return bound


def _amax(t: torch.Tensor | None) -> float:
    """max |t| as a float, 0 for None or an empty tensor."""
    if t is None or t.numel() == 0:
        return 0.0
    return float(t.abs().amax())
