"""attention(): validate -> normalize mask and score -> dispatch -> backend."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, Never, ParamSpec, TypedDict, TypeVar, Unpack, overload

import torch
from torch.compiler import is_compiling

from . import _plans, _recording
from . import masks as _masks
from ._autocast import any_autocast, autocast_dtype
from ._autocast import operands as autocast_operands
from ._backward_inputs import check_backward_tensors
from ._far_rows import check_given_lse
from ._inputs import AttentionInputs, validate_inputs
from ._keywords import refuse_unknown, sdpa_mask
from ._masked_softmax import masked_softmax
from ._plans import traced_call
from ._torch_features import available, check_compiling, missing
from .backends._common import graph_link
from .backends.dispatch import Explanation, explain_inputs, normalize_backend_arg, select_backend
from .backends.records import AttentionResult, BackwardCall, OutputGrads
from .mods import Mod, PositionMod, Sinks, Softcap
from .scores import Score, ScoreName

__all__ = ["attention", "attention_backward", "explain", "masked_softmax"]

ScoreArg = ScoreName | Score
MaskArg = _masks.Mask | torch.Tensor | None
BackendArg = str | Sequence[str] | None
ModsArg = Mod | Sequence[Mod] | None

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _same_parameters(
    source: Callable[_P, Any], shown: Callable[..., Any]
) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """A decorator: the function takes ``source``'s parameters, declared once there, and
    keeps its own return type. Type checkers read them through the ``ParamSpec``;
    ``inspect.signature``, ``help()`` and the reference (``docs/hooks/griffe_attnkit.py``)
    show each of ``shown``'s (the same parameters, spelt out) with its annotation."""

    def apply(func: Callable[..., _R]) -> Callable[_P, _R]:
        own = inspect.signature(func).return_annotation
        shared = inspect.signature(shown).replace(return_annotation=own)
        setattr(func, "__signature__", shared)  # noqa: B010
        return func

    return apply


def _sdpa_keywords(
    func: str,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: MaskArg,
    is_causal: bool,
    attn_mask: torch.Tensor | None,
    enable_gqa: bool | None,
    unexpected: dict[str, Any],
) -> MaskArg:
    """The call's mask with SDPA's keywords folded in; TypeError for a keyword ``func``
    does not take (see :mod:`attnkit._keywords`)."""
    if unexpected:
        refuse_unknown(func, unexpected, _KEYWORDS)
    return sdpa_mask(query, key, mask, is_causal, attn_mask, enable_gqa)  # type: ignore[return-value]


_TRACE_REFUSED = (
    "attention: torch.jit.trace is not supported: a trace keeps one call's host reads (the "
    "lengths of a mask, the backend chosen for these shapes) as constants, and would give "
    "wrong numbers for other inputs; "
    + (
        "use torch.compile or torch.export instead"
        if available("compile")
        else f"run it eagerly ({missing('compile')})"
    )
)


class _Options(TypedDict, total=False):
    """attention()'s keywords other than the two that decide what it returns (for its
    overloads: a type checker reads the result's type from ``return_weights`` and
    ``return_lse``)."""

    score: ScoreArg
    mask: MaskArg
    scale: float | torch.Tensor | None
    dropout_p: float
    backend: BackendArg
    mods: ModsArg
    check_finite: bool
    is_causal: bool
    attn_mask: torch.Tensor | None
    enable_gqa: bool | None


_Weights = Literal[True, "mean"]


@overload
def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    return_weights: Literal[False] = False, return_lse: Literal[False] = False,
    **options: Unpack[_Options],
) -> torch.Tensor: ...  # fmt: skip
@overload
def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    return_weights: _Weights, return_lse: Literal[False] = False, **options: Unpack[_Options],
) -> tuple[torch.Tensor, torch.Tensor]: ...  # fmt: skip
@overload
def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    return_weights: Literal[False] = False, return_lse: Literal[True],
    **options: Unpack[_Options],
) -> tuple[torch.Tensor, torch.Tensor]: ...  # fmt: skip
@overload
def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    return_weights: _Weights, return_lse: Literal[True], **options: Unpack[_Options],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...  # fmt: skip
@overload
def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    return_weights: bool | Literal["mean"] = False, return_lse: bool = False,
    **options: Unpack[_Options],
) -> torch.Tensor | tuple[torch.Tensor, ...]: ...  # fmt: skip


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    score: ScoreArg = "scaled_dot",
    mask: MaskArg = None,
    scale: float | torch.Tensor | None = None,
    dropout_p: float = 0.0,
    return_weights: bool | Literal["mean"] = False,
    return_lse: bool = False,
    backend: BackendArg = None,
    mods: ModsArg = None,
    check_finite: bool = True,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    enable_gqa: bool | None = None,
    **unexpected: Never,
) -> Any:
    """Exact attention with any score and any mask convention.

    Args:
        query: (..., L, E). Leading dims broadcast against key/value's.
        key: (..., S, Ek); Ek == E unless the score maps dims (Bilinear, Additive).
            Grouped-query attention: dim -3 of query may be g times key's; key
            head j serves query heads j*g .. j*g+g-1.
        value: (..., S, Ev).
        score: "scaled_dot" (default), "dot", "gaussian", or a
            :mod:`attnkit.scores` object (Bilinear, Additive, Gaussian(sigma), ...).
            "bilinear" and "additive" (names ``attnkit explain --score`` knows) hold
            learned weights, so as strings they are refused with the object to pass.
        mask: an :mod:`attnkit.masks` object (``masks.keep``, ``masks.causal()``,
            ``masks.valid_lens(lens)``, combinations with ``&``), or a float
            tensor (..., L, S) added to the logits. A raw bool tensor is refused:
            use ``masks.keep`` (True = attend) or ``masks.block`` (True = masked).
        scale: multiplier of the logits, a positive finite float; None = the score's
            default (1/sqrt(E) for scaled_dot, 1 otherwise); a (H,) tensor: one per query
            head. Zero and negative scales are refused (SDPA takes them).
            A scale whose logits would overflow the compute dtype is refused (a tensor
            by its largest value, where it can be read on the host).
        dropout_p: dropout on the attention weights, in [0, 1).
        return_weights: also return the weights (..., L, S) the output used
            (before dropout), in float32 for half inputs; ``"mean"``: the weights
            averaged over the head dim (-3), shape (..., L, S) without it, computed
            tile by tile where the backend can (never holding every head's weights).
        return_lse: also return the log-sum-exp of the logits, (..., L).
        backend: None (automatic), a name ("sdpa", "reference", ...) or a list
            of names tried in order; a forced backend raises if it cannot run.
        mods: score modifiers (:mod:`attnkit.mods`: ALiBi, T5's relative position
            bias, softcap, sinks), one or a list, applied in order after the scale and
            before the mask.
        check_finite: True (default): the non-finite policy holds (a NaN or inf in a
            position a row does not use never reaches it), at the cost of checking the
            inputs. False: the caller guarantees finite inputs (like scipy's
            ``check_finite=False``); the checks are skipped and non-finite inputs give
            whatever the kernel gives.
        is_causal: SDPA's keyword: True = ``mask=masks.causal()`` (top-left aligned, as
            SDPA: query i keeps keys j <= i). With ``mask=`` or ``attn_mask`` it is that
            mask ``& masks.causal()`` (SDPA takes that pair on some kernels and torch
            versions and refuses it on others).
        attn_mask: SDPA's keyword: a bool tensor (..., L, S) in SDPA's polarity (True =
            may attend, ``masks.keep(attn_mask)``) or a float tensor added to the logits
            (``masks.bias(attn_mask)``). Refused together with ``mask=``.
        enable_gqa: SDPA's keyword. None (default): the query's head dim (-3) may be a
            multiple of the key's (grouped-query attention). True: the same. False:
            SDPA's default rule, the head dims must broadcast (equal, or either one 1).

    From :func:`torch.nn.functional.scaled_dot_product_attention`, every keyword works
    and gives SDPA's numbers: ``attn_mask``, ``dropout_p`` (its own random draws),
    ``is_causal``, ``scale`` (None = 1/sqrt(E), as SDPA; positive, where SDPA also takes
    0 and negative scales) and ``enable_gqa``. A row whose
    mask keeps no key gives 0 here on every path (SDPA gives 0 or NaN, by kernel). In
    attnkit's own terms:

    ==========================  ==============================================
    SDPA                        attnkit
    ==========================  ==============================================
    ``attn_mask=b`` (bool)      ``mask=masks.keep(b)``
    ``attn_mask=f`` (float)     ``mask=f`` or ``mask=masks.bias(f)``
    ``is_causal=True``          ``mask=masks.causal()`` (``"top_left"``)
    ``enable_gqa=True``         always on: query heads a multiple of key heads
    ``dropout_p``, ``scale``    the same
    ==========================  ==============================================

    Under ``torch.autocast``, as SDPA under it: float32, float16 and bfloat16 query,
    key and value (and a learned score's parameters) are used in autocast's dtype, and
    the call runs with autocast off, as for inputs given in that dtype (see the
    environments guide, "Mixed precision").

    A keyword ``attention()`` does not take raises TypeError naming the close ones
    (``is_casual`` -> ``is_causal``) and, for other libraries' names (``causal``,
    ``softmax_scale``, ``key_padding_mask``, ...), attnkit's equivalent.

    Returns:
        output (..., L, Ev); with ``return_weights``/``return_lse`` a tuple
        ``(output, weights?, lse?)`` in that order. A query row with no key to
        attend gives output 0, weights 0 and lse -inf (never NaN).

    Raises:
        attnkit.FeatureUnavailableError: under ``torch.compile`` on a torch older than
            the compile floor (:mod:`attnkit._torch_features`), with one line naming it.
        RuntimeError: under ``torch.jit.trace``, which would keep this call's host
            reads (mask lengths, the backend chosen) as constants of the trace.
    """
    if not is_compiling() and torch.jit.is_tracing():
        raise RuntimeError(_TRACE_REFUSED)
    if any_autocast():
        low = autocast_dtype(query)
        if low is not None:  # the call in autocast's dtype, run with autocast off
            q, k, v, low_score = autocast_operands(low, query, key, value, score)
            with torch.autocast(query.device.type, enabled=False):
                return attention(
                    q, k, v, score=low_score, mask=mask, scale=scale, dropout_p=dropout_p,
                    return_weights=return_weights, return_lse=return_lse, backend=backend,
                    mods=mods, check_finite=check_finite, is_causal=is_causal,
                    attn_mask=attn_mask, enable_gqa=enable_gqa, **unexpected,
                )  # fmt: skip
    if is_causal is not False or attn_mask is not None or enable_gqa is not None or unexpected:
        mask = _sdpa_keywords(
            "attention", query, key, mask, is_causal, attn_mask, enable_gqa, unexpected
        )
    plan_key = None
    if return_weights is False and return_lse is False and mods is None:
        # one op chosen at trace time, or the full path (names imported one by one: a
        # module reached as an attribute too costs the compiled call an alias guard)
        if is_compiling():
            traced = traced_call(
                query, key, value, score, mask, scale, dropout_p, backend, check_finite
            )
            if traced is not None:  # (only on a torch that compiles attention())
                return traced
        plan_key = _plans.plan_key(
            query, key, value, score, mask, scale, dropout_p, backend, check_finite
        )
        if plan_key is not None and _recording.ACTIVE.get() is None:
            plan = _plans.lookup(plan_key)
            if plan is not None:  # validated and dispatched before: same shapes and flags
                if plan.runner is not None:
                    return plan.runner(query, key, value)
                run = plan.inputs(query, key, value, mask)  # type: ignore[arg-type]
                return plan.backend.forward(run).output
    check_compiling()  # (before any tensor work; not on the traced path, which guards less)
    inputs = validate_inputs(
        query,
        key,
        value,
        score=score,
        mask=mask,
        scale=scale,
        dropout_p=dropout_p,
        return_weights=return_weights,
        return_lse=return_lse,
        mods=mods,
        check_finite=check_finite,
    )
    core, sinks = _split_sinks(inputs)
    core, common = _split_common(core)
    chosen = select_backend(core, normalize_backend_arg(backend))
    empty = inputs.L == 0 or inputs.S == 0 or math.prod(inputs.batch_shape) == 0
    if plan_key is not None and not empty:
        _plans.remember(plan_key, inputs, chosen)
    result = _empty_result(core) if empty else chosen.forward(core)
    if common and result.lse is not None and not empty:
        result = replace(result, lse=_add_common(core, result.lse, common))
    if sinks:
        result = _join_sinks(inputs, result, sinks)
    if inputs.weights_mean and (empty or sinks or not chosen.averages_heads):
        assert result.weights is not None
        w = result.weights  # (..., H, L, S)
        result = replace(result, weights=w.sum(dim=-3) / max(w.shape[-3], 1))  # (..., L, S)
    # -- recording hook (attnkit.viz.capture); off: one ContextVar lookup --
    # Dynamo cannot trace ContextVar.get: compiled code records nothing.
    recorder = None if torch.compiler.is_compiling() else _recording.ACTIVE.get()
    if recorder is not None:
        recorder.record(inputs, result, chosen)
    # -- end recording hook --
    return _pack(inputs, result)


def _any_call(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
    return_weights: bool | Literal["mean"] = False, return_lse: bool = False,
    **options: Unpack[_Options],
) -> None:  # fmt: skip
    """attention()'s parameters in one signature, for a type checker: its last overload's,
    where both flags are any value (what explain() takes)."""


@_same_parameters(_any_call, shown=attention)
def explain(*args: Any, **kwargs: Any) -> Explanation:
    """Which backend :func:`attention` would run for these arguments, and why.

    Takes the same arguments as :func:`attention` and computes nothing. The
    result's ``reasons`` maps every backend to its reasons not to run (an empty
    list means it can); ``chosen`` is the one that would run (None if none).

    The arguments are validated exactly as :func:`attention` validates them, and the
    flags that change which backend can run (``return_weights``, ``return_lse``,
    ``dropout_p``, ``mods``, ``scale`` as a tensor, ``check_finite``) count as they would
    in the call. What differs:

    - no attention is computed and no plan is cached: only the inputs' shapes, dtypes,
      devices and flags are read (and, for a Gaussian score, whether its dot form
      would lose precision);
    - when no backend can run the call, the result says so (``chosen`` None) where
      :func:`attention` raises :class:`attnkit.BackendNotSupportedError`;
    - attention sinks (:func:`attnkit.mods.sinks`) are left out of the call the
      backends are asked about: they join the softmax after any backend, from its
      (out, lse), so the call described also returns the lse;
    - the ``torch.compile`` version check of :func:`attention` is not made, and called
      outside a compiled function it describes the eager call: inside one, chunked
      declines (its tiles do not trace) and a Gaussian score runs from the differences
      q - k (the inputs cannot be measured there), so a compiled call may run another
      backend than the one named here;
    - with an empty query or key (L or S of 0) it names the backend that would be
      chosen, though :func:`attention` returns the empty result without running one.

    Args:
        query: (..., L, E), as for :func:`attention`.
        key: (..., S, Ek), as for :func:`attention`.
        value: (..., S, Ev), as for :func:`attention`.
        score: as for :func:`attention` (default ``"scaled_dot"``).
        mask: as for :func:`attention` (default None).
        scale: as for :func:`attention` (default None); a (H,) tensor rules out
            the backends without a per-head scale.
        dropout_p: as for :func:`attention` (default 0.0).
        return_weights: as for :func:`attention` (default False): True or ``"mean"``
            rules out the backends that cannot return weights.
        return_lse: as for :func:`attention` (default False).
        backend: as for :func:`attention` (default None, automatic); names given
            here are the only candidates and appear in ``forced``.
        mods: as for :func:`attention` (default None).
        check_finite: as for :func:`attention` (default True).
        is_causal: SDPA's keyword, as for :func:`attention` (default False).
        attn_mask: SDPA's keyword, as for :func:`attention` (default None).
        enable_gqa: SDPA's keyword, as for :func:`attention` (default None).

    Returns:
        An :class:`attnkit.Explanation` (``str()`` of it prints one line per backend):

        - ``chosen``: the name of the backend :func:`attention` would run, or None
          when no candidate can run the call.
        - ``candidates``: the names considered, in order: the ones forced
          (``backend=`` or :func:`attnkit.use_backend`), else the device type's
          ranking (on CPU ``("sdpa", "chunked", "reference")``).
        - ``reasons``: for every registered backend, candidate or not, the list of
          reasons it cannot run the call; empty when it can. A backend that could run
          but that automatic dispatch passes over for a later one (one that keeps a
          mask symbolic where it would build a dense (L, S) mask) has that
          preference as its reason.
        - ``forced``: the tuple of names forced by ``backend=`` or by the innermost
          :func:`attnkit.use_backend`, or None in automatic dispatch.
        - ``note``: how the chosen backend will compute the call (for example which
          kernel runs the Additive score's tiles), or ``""``.

    Raises:
        TypeError, ValueError: for the arguments :func:`attention` refuses (shapes,
            dtypes, devices, a raw bool mask, an unknown keyword, an unknown backend
            name), with the same message.

    Examples:
        >>> import torch, attnkit
        >>> q = k = v = torch.randn(2, 4, 16, 32)
        >>> ex = attnkit.explain(q, k, v, backend="reference", return_weights=True)
        >>> ex.chosen, ex.forced, ex.reasons["reference"]
        ('reference', ('reference',), [])
    """
    try:
        bound = _PARAMETERS.bind(*args, **kwargs)
    except TypeError as e:  # a missing or repeated argument, too many positional ones
        raise TypeError(f"explain(): {e}") from None
    bound.apply_defaults()
    a = bound.arguments
    query, key, mask, unexpected = a["query"], a["key"], a["mask"], a["unexpected"]
    is_causal, attn_mask, enable_gqa = a["is_causal"], a["attn_mask"], a["enable_gqa"]
    if is_causal is not False or attn_mask is not None or enable_gqa is not None or unexpected:
        mask = _sdpa_keywords(
            "explain", query, key, mask, is_causal, attn_mask, enable_gqa, unexpected
        )
    options = {name: a[name] for name in _VALIDATED}
    value, low = a["value"], autocast_dtype(query)
    if low is not None:  # described as attention() runs it: in autocast's dtype
        query, key, value, options["score"] = autocast_operands(
            low, query, key, value, options["score"]
        )
    inputs = validate_inputs(query, key, value, **{**options, "mask": mask})
    core = _split_common(_split_sinks(inputs)[0])[0]
    return explain_inputs(core, normalize_backend_arg(a["backend"]))


_PARAMETERS = inspect.signature(attention)
"""The parameters of attention() and explain(), declared once (attention's)."""

_KEYWORDS = tuple(name for name in _PARAMETERS.parameters if name not in ("unexpected",))
"""The keyword names attention() and explain() take (named in the error for any other)."""

_VALIDATED = (
    "score", "mask", "scale", "dropout_p", "return_weights", "return_lse", "mods", "check_finite"
)  # fmt: skip
"""The keyword arguments of validate_inputs(), named as in attention()."""


def _split_common(inputs: AttentionInputs) -> tuple[AttentionInputs, tuple[PositionMod, ...]]:
    """The call a backend runs, with each position bias that grows with distance
    (ALiBi) and no softcap after it run without its part shared by every pair
    (:meth:`attnkit.mods.PositionMod.without_common`), and those mods: softmax ignores
    that part, so it is added to the lse alone (:func:`_add_common`), and no kernel
    holds a number that grows with the distance of the positions. A softcap after a
    bias does not ignore it: such a bias keeps it."""
    mods = list(inputs.mods)
    split: list[PositionMod] = []
    for n, m in enumerate(mods):
        if isinstance(m, PositionMod) and m.grows_with_distance:
            if not any(isinstance(after, Softcap) for after in mods[n + 1 :]):
                mods[n] = m.without_common()
                split.append(m)
    if not split:
        return inputs, ()
    return replace(inputs, mods=tuple(mods)), tuple(split)


def _add_common(inputs: AttentionInputs, lse: torch.Tensor, split: Sequence[PositionMod]
                ) -> torch.Tensor:  # fmt: skip
    """``lse`` (*batch, L) with the common part of each mod of ``split`` added per head
    (differentiably, so the parameters' gradient through it is exact); a row with no
    key stays -inf."""
    heads = torch.arange(inputs.heads, device=lse.device)
    common = sum(m.common_bias(heads, inputs.L, inputs.S) for m in split)  # (H,)
    assert isinstance(common, torch.Tensor)
    shifted = lse + inputs.layout.per_head(common.to(lse.dtype), 1)  # (*batch, L)
    return torch.where(torch.isneginf(lse), lse, shifted)


def _split_sinks(inputs: AttentionInputs) -> tuple[AttentionInputs, tuple[Sinks, ...]]:
    """The call a backend runs, and its sinks: sinks join the softmax after any backend's
    (out, lse), so the backend is asked for the lse and sees the other mods only."""
    sinks = tuple(m for m in inputs.mods if isinstance(m, Sinks))
    if not sinks:
        return inputs, ()
    rest = tuple(m for m in inputs.mods if not isinstance(m, Sinks))
    # per-head weights: each head's sink takes its own share before any head mean
    return replace(inputs, mods=rest, return_lse=True, weights_mean=False), sinks


def _join_sinks(
    inputs: AttentionInputs, result: AttentionResult, sinks: tuple[Sinks, ...]
) -> AttentionResult:
    """Each sink joins the softmax in turn: several sinks are several logits with no value,
    ``exp(lse) / (exp(lse) + sum exp(sink))`` of the keys' share left."""
    out, lse, weights = result.output, result.lse, result.weights
    for sink in sinks:
        assert lse is not None
        if weights is not None:
            weights = sink.weights(weights, lse)  # (*batch, L, S)
        out, lse = sink.join(out, lse)
    return AttentionResult(out, weights, lse if inputs.return_lse else None)


def attention_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor | None = None,
    *,
    score: ScoreArg = "scaled_dot",
    mask: MaskArg = None,
    scale: float | torch.Tensor | None = None,
    backend: BackendArg = None,
    params: Sequence[torch.Tensor] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
    """Gradients of ``attention(query, key, value, ...)`` as one part of a larger
    attention whose output is ``out`` with log-sum-exp ``lse``.

    For a context-parallel ring or any split of the keys into blocks: each block, given
    the global (out, lse) and their gradients, returns its share, and the shares add
    up to the whole call's gradients. For a whole call pass its own (out, lse). The
    backend that :func:`attention` would pick for the forward (with ``return_lse``)
    computes it, from its own backward where it has one (no forward recomputation).

    Args:
        query: (..., L, E), this part's queries.
        key: (..., S, Ek), this part's keys.
        value: (..., S, Ev), this part's values.
        out: (*batch, L, Ev) the global output of these queries, in the query's dtype
            (what :func:`attention` returns), on the query's device.
        lse: (*batch, L) the global log-sum-exp (-inf for rows with no key anywhere), in
            the compute dtype (float32 for half inputs, else the query's).
        grad_out: the gradient of ``out``, shaped like it.
        grad_lse: the gradient of ``lse``, shaped like it, or None.
        score, mask, scale, backend: as for :func:`attention` (the mask of this part).
        params: score parameters to differentiate too (tensors that require grad).

    ``*batch`` is the call's broadcast batch shape (the query's heads under grouped-query
    attention), as in the output of :func:`attention`.

    Under ``torch.autocast`` it runs as :func:`attention` ran the forward (query, key,
    value and a learned score in autocast's dtype, autocast off), so it takes the
    (out, lse) that call returned; the gradients come back in the inputs' dtypes.

    Returns:
        ``(d query, d key, d value, [d param for each of params])``.

    Raises:
        TypeError, ValueError: before any compute, naming the argument, what it received
        and what was expected (as :func:`attention` does for its own arguments);
        ValueError also for a row whose bias is far from 0 (``-1e30``) and whose given
        lse is far too: rounding lost its log-sum, so its weights cannot be recovered
        from it (see :mod:`attnkit._far_rows`; differentiate :func:`attention` instead).
    """
    low = autocast_dtype(query)
    if low is not None:  # as attention() ran it: in autocast's dtype, autocast off
        q, k, v, low_score = autocast_operands(low, query, key, value, score)
        with torch.autocast(query.device.type, enabled=False):
            dq, dk, dv, dp = attention_backward(
                q, k, v, out, lse, grad_out, grad_lse, score=low_score, mask=mask,
                scale=scale, backend=backend, params=params,
            )  # fmt: skip
        return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), dp
    with torch.no_grad():
        inputs = validate_inputs(
            query, key, value, score=score, mask=mask, scale=scale, return_lse=True
        )
        out, lse, grad_out, grad_lse, wrt = check_backward_tensors(
            inputs, out, lse, grad_out, grad_lse, params
        )
        check_given_lse(inputs, lse)
        chosen = select_backend(inputs, normalize_backend_arg(backend))
        if inputs.L == 0 or inputs.S == 0 or math.prod(inputs.batch_shape) == 0:
            # no pair: every gradient is 0, as attention()'s empty result gives
            zeros = [torch.zeros_like(t) for t in (query, key, value)]
            return zeros[0], zeros[1], zeros[2], [torch.zeros_like(p) for p in wrt]
    return chosen.backward(BackwardCall(inputs, OutputGrads(out, lse, grad_out, grad_lse), wrt))


def _empty_result(inputs: AttentionInputs) -> AttentionResult:
    """An empty batch, L == 0 or S == 0: no work; rows with no keys follow the fully-masked policy."""
    batch, L, S = inputs.batch_shape, inputs.L, inputs.S
    dev = inputs.device
    out = torch.zeros(*batch, L, inputs.Ev, dtype=inputs.dtype, device=dev)
    # Keep the graph connected so backward gives zero gradients, not None.
    link = graph_link(inputs.query, inputs.key, inputs.value)  # 0 even for NaN inputs
    out = out + link.to(out.dtype)
    weights = torch.zeros(*batch, L, S, dtype=inputs.compute_dtype, device=dev)
    lse = torch.full((*batch, L), float("-inf"), dtype=inputs.compute_dtype, device=dev)
    return AttentionResult(output=out, weights=weights, lse=lse)


def _pack(inputs: AttentionInputs, result: AttentionResult) -> Any:
    if not (inputs.return_weights or inputs.return_lse):
        return result.output
    out: list[torch.Tensor] = [result.output]
    if inputs.return_weights:
        assert result.weights is not None
        out.append(result.weights)
    if inputs.return_lse:
        assert result.lse is not None
        out.append(result.lse.contiguous())  # (SDPA's kernels return a transposed one)
    return tuple(out)


from ._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
