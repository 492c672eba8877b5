"""One SDPA call on equal leading dims: 4-D views, equal head sizes, the lse op.

torch's fused CPU kernels take 4-D inputs with one head size; anything else runs
torch's plain math. So inputs are viewed as 4-D, unequal query and value head
sizes are zero-padded to one size (zeros are free in the products), and the lse
op gets contiguous tensors, as the public entry point would give it.

Every call also follows attnkit's non-finite policy (:mod:`.poison`) and, when an
input needs a gradient, is differentiable twice (:mod:`.grad`).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ... import _torch_features as _features
from ..._far_rows import FAR
from ..._host import readable, strict
from ...kernels import _native_ops
from ...kernels._ops import LIBRARY, define_op
from ...kernels.finite import rows_settled
from .._common import all_finite, expand_kv
from . import poison
from .flash import FlashCall, can_flash, flash_attention
from .grad import fused_twice_differentiable, math_attention
from .lse import lse_call

__all__ = [
    "HAS_GQA",
    "call",
    "causal_lower_right",
    "checked_op_name",
    "direct",
    "direct_runner",
    "has_lower_right",
    "to4d",
    "traced_direct",
]

# SDPA's enable_gqa (every torch from the package floor has it), taken only where it runs
# the fused kernel that the lse op runs too (_torch_features.SDPA_GROUPED_HEADS_FLOOR);
# below, heads are expanded. (Read from the version, not from SDPA's docstring, which
# ``python -OO`` strips.)
HAS_GQA = _features.INSTALLED.release >= _features.SDPA_GROUPED_HEADS_FLOOR


@functools.cache
def causal_lower_right() -> Any:
    """torch's lower-right causal bias (torch >= 2.2), or None; imported on first use:
    ``torch.nn.attention.bias`` pulls in ``torch._dynamo``, seconds at start-up."""
    try:
        from torch.nn.attention.bias import causal_lower_right as bias
    except ImportError:  # pragma: no cover - older torch
        return None
    return bias


def has_lower_right() -> bool:
    """True when torch has the lower-right causal bias."""
    return causal_lower_right() is not None


def to4d(t: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (B', H, N, D) for the 4-D flash op."""
    if t.ndim == 4:
        return t
    if t.ndim < 4:
        return t.reshape(*([1] * (4 - t.ndim)), *t.shape)  # (1.., H, N, D)
    return t.reshape(-1, *t.shape[-3:])  # (B', H, N, D)


def call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    want_lse: bool,
    excluded: torch.Tensor | None = None,
    lower_right: bool = False,
    assume_finite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SDPA on equal leading dims: out (..., L, Ev) and, with ``want_lse``, lse (..., L).

    q (..., L, E), k (..., S, E), v (..., S, Ev) (k and v with fewer heads when
    ``gqa``); ``attn_mask`` None or (..., L or 1, S), bool (True keeps) or float;
    ``excluded`` None or (..., S) bool: keys whose score is -inf by construction
    (carried in k), which no row counts as kept; ``lower_right``: a causal mask
    aligned to the bottom-right corner, given to the kernel as torch's lower-right
    causal bias (needs :func:`has_lower_right`, no ``attn_mask`` and no lse).
    Non-finite inputs follow the policy of :mod:`.poison`, unless ``assume_finite``
    (the caller guarantees finite inputs: ``check_finite=False``).
    """
    heads = q.shape[-3] if q.ndim >= 3 else 1
    L, S = q.shape[-2], k.shape[-2]
    offset = S - L if lower_right else 0
    masked = attn_mask is not None or is_causal or excluded is not None or lower_right
    if excluded is None and (
        assume_finite
        or (
            readable(q)
            and (
                all_finite(q.detach(), k.detach(), v.detach())
                if masked
                else _finite_for_kernel(q.detach(), k.detach(), v.detach(), is_causal=False)
            )
        )
    ):  # nothing for the policy to do (on the CPU, where the check reads for free)
        if lower_right:
            return _lower_right(q, k, v, dropout_p=dropout_p, scale=scale, gqa=gqa), None
        return _kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                       dropout_p=dropout_p, scale=scale, gqa=gqa, want_lse=want_lse)  # fmt: skip
    if masked:
        q, k, v, q_bad, k_bad, v_bad = poison.sanitize(q, k, v, excluded)
    causal = is_causal or lower_right
    alive: torch.Tensor | None = None
    policy_mask = attn_mask  # the call's own mask, for the flags
    if excluded is not None:
        # rows whose every kept key is excluded (infinitely far) are empty rows
        kept = poison.to_query_heads(~excluded, heads)  # (..., S)
        alive = poison.rows_keeping(kept, attn_mask, causal, L, offset)  # (..., L or 1)
        if attn_mask is None:
            # the excluded keys leave through a mask, never as -inf in k: CUDA's kernels
            # turn a -inf logit into NaN rows; the causal structure joins that mask
            attn_mask = _structure_mask(L, S, causal, offset, q.device)  # (L or 1, S)
            is_causal = lower_right = False
        attn_mask, k = _exclude_by_mask(attn_mask, k, kept, excluded, alive)
    if lower_right:
        out, lse = _lower_right(q, k, v, dropout_p=dropout_p, scale=scale, gqa=gqa), None
    else:
        out, lse = _kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                           dropout_p=dropout_p, scale=scale, gqa=gqa, want_lse=want_lse)  # fmt: skip
    if not masked:
        return poison.apply(out, lse, poison.Poison(scores=poison.unmasked_addend(q, k)))
    if alive is not None:
        out = torch.where(alive.unsqueeze(-1), out, torch.zeros((), dtype=out.dtype))
        if lse is not None:
            lse = torch.where(alive, lse, float("-inf"))
        q_bad = torch.where(alive, q_bad, 0.0)  # an empty row, whatever its query holds
    flags = poison.flags_for_call(
        q, k_bad, v_bad, q_bad, policy_mask, causal, heads, offset, split=lse is not None
    )
    return poison.apply(out, lse, flags)


def _structure_mask(
    L: int, S: int, causal: bool, offset: int, device: torch.device
) -> torch.Tensor:
    """The keep mask of a call without ``attn_mask``: (L, S) causal (key j kept for
    query i when j <= i + offset), or a (1, S) row keeping every key."""
    if not causal:
        return torch.ones(1, S, dtype=torch.bool, device=device)  # (1, S)
    rows = torch.arange(L, device=device).unsqueeze(-1)  # (L, 1)
    return torch.arange(S, device=device) <= rows + offset  # (L, S)


def _exclude_by_mask(
    attn_mask: torch.Tensor,
    k: torch.Tensor,
    kept: torch.Tensor,
    excluded: torch.Tensor,
    alive: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Excluded keys leave through the mask instead of their -inf feature in k, and rows
    with no key left attend everywhere (their output is zeroed after): the kernel then
    never sees a row of -inf logits, whose backward is NaN.

    attn_mask (..., L or 1, S) bool or float; k (..., S, E'); kept (..., S) per query
    head; excluded (..., S) per key head; alive (..., L or 1). Returns (attn_mask, k).
    """
    gone = ~kept.unsqueeze(-2)  # (..., 1, S)
    dead = ~alive.unsqueeze(-1)  # (..., L or 1, 1)
    if attn_mask.dtype == torch.bool:
        attn_mask = (attn_mask & ~gone) | dead  # (..., L or 1, S)
    else:
        attn_mask = attn_mask.masked_fill(gone, float("-inf")).masked_fill(dead, 0.0)
    k = torch.where(excluded.unsqueeze(-1), torch.zeros((), dtype=k.dtype), k)  # (..., S, E')
    return attn_mask, k


def direct(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool,
    lower_right: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    assume_finite: bool = False,
) -> torch.Tensor:
    """A call torch's SDPA takes as it is: 4-D q (B, H, L, E), k and v (B, Hk, S, E),
    no mask, ``is_causal`` or (``lower_right``) torch's lower-right causal bias.
    Returns out (B, H, L, E).

    Finite inputs that can be read on the host and need no gradient go straight to
    the kernel (see :func:`_finite_for_kernel`); anything else goes through
    :func:`call`, which applies the non-finite policy with tensor operations and the
    twice-differentiable wrapper.
    """
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not (lower_right or needs_grad) and (
        assume_finite or (readable(q) and _finite_for_kernel(q, k, v, is_causal))
    ):
        return _sdpa(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale, gqa=gqa)
    if _traced_host_check(q, needs_grad, dropout_p, lower_right):
        if checked_op_name() == "sdpa_settled":  # SDPA chooses its kernel per call here
            return torch.ops.attnkit.sdpa_settled.default(q, k, v, is_causal, scale, gqa, False)
        return _checked_op(q, k, v, is_causal, scale, gqa)
    out, _ = call(q, k, v, attn_mask=None, is_causal=is_causal, dropout_p=dropout_p,
                  scale=scale, gqa=gqa, want_lse=False, lower_right=lower_right,
                  assume_finite=assume_finite)  # fmt: skip
    return out


def direct_runner(
    *,
    is_causal: bool,
    lower_right: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    head_dim: int,
    readable_no_grad: bool,
    whole_keys: bool,
    assume_finite: bool = False,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """:func:`direct` for repeated calls of one plan with query head size ``head_dim``,
    (q, k, v) -> out. With ``readable_no_grad`` (the plan's tensors are host-readable
    and need no gradient, as every call of the plan) those checks are not repeated per
    call: the kernel runs first, and :func:`kernel_followed_policy` decides whether
    its output is the answer, reading every key when ``whole_keys`` (the plan's
    :func:`reads_whole_keys`) and else the first."""
    slow = functools.partial(direct, is_causal=is_causal, lower_right=lower_right,
                             dropout_p=dropout_p, scale=scale, gqa=gqa,
                             assume_finite=assume_finite)  # fmt: skip
    if lower_right or not readable_no_grad:
        return slow
    sdpa = F.scaled_dot_product_attention
    options: dict[str, Any] = {}  # only what differs from torch's defaults (faster to pass)
    if dropout_p > 0:
        options["dropout_p"] = dropout_p
    if is_causal:
        options["is_causal"] = True
    if scale != 1.0 / math.sqrt(head_dim):  # torch's default scale, computed the same way
        options["scale"] = scale
    if gqa:
        options["enable_gqa"] = True

    if assume_finite:  # the caller guarantees finite inputs: the op and nothing else
        return functools.partial(sdpa, **options) if options else sdpa
    if dropout_p > 0:
        # A second draw of the dropout pattern would differ from the first: the inputs
        # are checked before the kernel runs (the checks of _finite_for_kernel).
        def run_checked_first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if _finite_for_kernel(q, k, v, is_causal):
                return sdpa(q, k, v, **options)
            return slow(q, k, v)

        return run_checked_first

    # kernel_followed_policy written out, its choices made once for the plan's shapes
    isfinite, f32 = math.isfinite, torch.float32
    if whole_keys:

        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = sdpa(q, k, v, **options)  # (B, H, L, Ev)
            if rows_settled(out):
                return out
            read = out.sum(dtype=f32).item() + q.sum(dtype=f32).item()
            return out if isfinite(read + k.sum(dtype=f32).item()) else slow(q, k, v)

        return run

    def run_first_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = sdpa(q, k, v, **options)  # (B, H, L, Ev)
        if rows_settled(out):
            return out
        read = out.sum(dtype=f32).item() + q.sum(dtype=f32).item()
        first = k.narrow(-2, 0, 1)  # (B, Hk, 1, E)
        return out if isfinite(read + first.sum(dtype=f32).item()) else slow(q, k, v)

    return run_first_key


def traced_direct(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool,
    lower_right: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    assume_finite: bool = False,
) -> tuple[str, str, tuple[object, ...], tuple[tuple[str, object], ...]] | None:
    """The one op :func:`direct` is when ``torch.compile`` traces it for inputs like q
    (B, H, L, E), k and v (B, Hk, S, E) that need no gradient (their values are not
    read), as (namespace, name, args, keyword items) after (q, k, v) (see
    :meth:`attnkit.backends.base.Backend.traced_call`); None where the trace holds more
    than one op (torch's lower-right bias, dropout, another device than the CPU,
    :func:`attnkit._host.device_semantics`). Decided at trace time: ``assume_finite``
    gives torch's SDPA op, else the checked op of :func:`checked_op_name`; the C++ one is
    told whether SDPA would choose its CPU flash kernel for such inputs, as compiled
    SDPA decides at trace time, and then calls it directly."""
    if lower_right or dropout_p > 0 or q.device.type != "cpu" or strict():
        return None
    if assume_finite:
        keywords = (("scale", scale), ("enable_gqa", True)) if gqa else (("scale", scale),)
        return ("aten", "scaled_dot_product_attention", (None, 0.0, is_causal), keywords)
    name = checked_op_name()
    if name != "sdpa_settled":
        return ("attnkit", name, (is_causal, scale, gqa), ())
    return (
        "attnkit",
        name,
        (is_causal, scale, gqa, _chooses_flash(q, k, v, is_causal, scale, gqa)),
        (),
    )


def _chooses_flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float, gqa: bool
) -> bool:
    """Whether torch's SDPA would run its CPU flash kernel for inputs like these (shapes,
    dtypes and torch's kernel switches; no value is read), asked of torch itself; never
    for grouped heads, which SDPA prepares before its kernel."""
    from torch.nn.attention import SDPBackend

    if gqa:
        return False
    choice = torch.ops.aten._fused_sdp_choice(q, k, v, None, 0.0, is_causal, scale=scale)
    return bool(choice == SDPBackend.FLASH_ATTENTION.value)


def _traced_host_check(
    q: torch.Tensor, needs_grad: bool, dropout_p: float, lower_right: bool
) -> bool:
    """True when a traced (``torch.compile``) direct call takes a checked op
    (:func:`checked_op_name`): a CPU call without gradient, dropout or torch's lower-right
    bias, outside :func:`attnkit._host.device_semantics`."""
    return (
        not (needs_grad or lower_right or dropout_p > 0)
        and q.device.type == "cpu"
        and torch.compiler.is_compiling()
        and not strict()
    )


def _checked_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float, gqa: bool
) -> torch.Tensor:
    """A direct CPU call without gradient, as an opaque op of a compiled graph.

    Inside ``torch.compile`` nothing can be read on the host, so the non-finite policy
    would run as tensor operations: zeroed copies of q, k and v and their flags (about
    40 % of the kernel's time at (1, 8, 128, 64)). Run as one op, the call reads on the
    host again, as an eager call of a plain plan does: the kernel, then
    :func:`_settle_call`. q (B, H, L, E), k and v (B, Hk, S, E or Ev); returns out
    (B, H, L, Ev), a new row-major tensor. Where the compiled C++ ops load, the graph
    runs ``attnkit::sdpa_settled`` instead (:func:`checked_op_name`), the same steps
    without Python.
    """
    out = _sdpa(q, k, v, dropout_p=0.0, is_causal=is_causal, scale=scale, gqa=gqa)
    # row-major, as the fake kernel says: a compiled graph asserts its buffers' strides
    return _settle_call(out.contiguous(), q, k, v, is_causal, scale, gqa)  # (B, H, L, Ev)


def _settle_call(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    scale: float,
    gqa: bool,
) -> torch.Tensor:
    """The checked call's answer from torch's kernel output ``out`` (B, H, L, Ev),
    row-major: ``out`` itself where :func:`kernel_followed_policy` shows the kernel gave
    the policy's answer, else the call computed again by the policy's path
    (:func:`call`), row-major. q (B, H, L, E), k and v (B, Hk, S, E or Ev).

    Also the op ``attnkit::sdpa_settle``, which the C++ op ``attnkit::sdpa_settled``
    calls when its own one-pass read does not settle the output (never in a graph)."""
    if kernel_followed_policy(out, q, k):
        return out
    out, _ = call(q, k, v, attn_mask=None, is_causal=is_causal, dropout_p=0.0,
                  scale=scale, gqa=gqa, want_lse=False)  # fmt: skip
    return out.contiguous()  # (B, H, L, Ev)


def _checked_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float, gqa: bool
) -> torch.Tensor:
    """The shape of :func:`_checked_call`'s output: (B, H, L, Ev), q's dtype."""
    return q.new_empty(*q.shape[:-1], v.shape[-1])  # (B, H, L, Ev)


def _settled_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    scale: float,
    gqa: bool,
    flash: bool,
) -> torch.Tensor:
    """The shape of the C++ op ``attnkit::sdpa_settled``'s output: (B, H, L, Ev)."""
    return q.new_empty(*q.shape[:-1], v.shape[-1])  # (B, H, L, Ev)


def _settle_fake(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    scale: float,
    gqa: bool,
) -> torch.Tensor:
    """The shape of :func:`_settle_call`'s output: ``out``'s."""
    return torch.empty_like(out)  # (B, H, L, Ev)


# Plain library ops (see attnkit.kernels._ops), reached from the dispatcher directly.
_checked_op = define_op(
    "sdpa_checked(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, bool gqa) -> Tensor",
    _checked_call,
    _checked_fake,
    dispatch_key="CPU",
)
_settle_op = define_op(
    "sdpa_settle(Tensor out, Tensor q, Tensor k, Tensor v, bool is_causal, float scale, "
    "bool gqa) -> Tensor",
    _settle_call,
    _settle_fake,
    dispatch_key="CPU",
)


@_features.constant_under_compile
def checked_op_name() -> str:
    """The op of the ``attnkit`` namespace a compiled graph runs for a checked direct
    call: ``"sdpa_settled"`` (C++, :mod:`attnkit.kernels._native_ops`, built here on
    first use) where it loads, else ``"sdpa_checked"`` (:func:`_checked_call`). Both
    take (q, k, v, is_causal, scale, gqa), the C++ one also ``flash`` (see
    :func:`traced_direct`), and they give the same numbers.

    Asked while ``torch.compile`` traces a call: dynamo runs it as it stands, outside the
    trace, and keeps its answer as a constant of the graph (no guard)."""
    if not _native_ops.loaded():
        return "sdpa_checked"
    with _SETTLED_FAKE_LOCK:  # (threads may trace at once)
        if not _SETTLED_FAKE:
            torch.library.register_fake("attnkit::sdpa_settled", lib=LIBRARY)(_settled_fake)
            _SETTLED_FAKE.append(True)
    return "sdpa_settled"


_SETTLED_FAKE: list[bool] = []
"""Holds one entry once the C++ op's fake kernel is registered (once per process)."""
_SETTLED_FAKE_LOCK = threading.Lock()


def kernel_followed_policy(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> bool:
    """True when torch's kernel output ``out`` (..., L, Ev) is the non-finite policy's
    answer for q (..., L, E) and k (..., S, E), read after the kernel ran (a call with
    no mask, or torch's causal mask, where every row keeps at least one key).

    A NaN or inf that reaches a row through the products makes that row non-finite; one
    that reaches no row (a masked-out key the kernel skipped, a key of weight exactly 0)
    changes nothing the policy returns. The kernel can drop a NaN or inf only from a row
    whose every kept score is inf or NaN: a query row holding one, or a row whose every
    key it sees holds one (every row sees the first key, so that key does then). Each
    weight of such a row is the exp of inf or NaN minus its max, 0, inf or NaN, so the
    row comes out non-finite or all zeros, never finite and nonzero.

    So first the output alone is read (:func:`attnkit.kernels.finite.rows_settled`, one
    pass): every value finite and no row all zeros shows that the kernel followed the
    policy. Otherwise (or where that read does not run) the output, the queries and the
    first key are read (three sums, in float32: a half sum overflows at 65504; see
    :func:`reads_whole_keys`): a row of zeros with finite inputs is the kernel's answer
    too. When they are not all finite (a non-finite input, or finite inputs beyond the
    kernel's range), the caller computes the call again on the policy's own path, which
    gives the same rows where the kernel was right.
    """
    if rows_settled(out):
        return True
    f32 = torch.float32
    probe = k if reads_whole_keys(q, k) else k.narrow(-2, 0, 1)  # (..., S or 1, E)
    return math.isfinite(
        out.sum(dtype=f32).item() + q.sum(dtype=f32).item() + probe.sum(dtype=f32).item()
    )


def reads_whole_keys(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether :func:`kernel_followed_policy` reads every key, not only the first: when
    there are no more of them than queries (one sum instead of a slice and a sum; a
    non-finite key the kernel did not use then sends the call to the policy's path,
    which answers the same), and never the long KV cache of a decoding step."""
    return k.shape[-2] <= q.shape[-2]


def _finite_for_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> bool:
    """True when torch's kernel alone follows the non-finite policy for these inputs.

    Under a causal mask every input must be finite (the kernel lets a masked-out NaN
    reach a row through ``0 * NaN``). Without a mask the kernel itself propagates a
    NaN or inf in a key or value to every row (each uses all of them), except when
    every key is NaN, so the queries and the first key decide (see
    :func:`.poison.unmasked_addend`); the whole keys are read instead when there are no
    more of them than queries (one sum instead of a slice and a sum), never the long
    KV cache of a decoding step. Only for host-readable tensors that need no gradient;
    the sums of :func:`attnkit.backends._common.all_finite`, written out. A plain
    plan's repeated calls (:func:`direct_runner`) read the output instead.
    """
    if is_causal:
        return math.isfinite(q.sum().item() + k.sum().item() + v.sum().item())
    probe = k if k.shape[-2] <= q.shape[-2] else k.narrow(-2, 0, 1)  # (..., S or 1, E)
    return math.isfinite(q.sum().item() + probe.sum().item())


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dropout_p: float,
    is_causal: bool,
    scale: float,
    gqa: bool,
) -> torch.Tensor:
    """torch's public SDPA on 4-D inputs (grouped K/V heads with ``gqa``)."""
    if gqa:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    return F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )


def _lower_right(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float, scale: float, gqa: bool
) -> torch.Tensor:
    """SDPA with torch's lower-right causal bias: out (..., L, Ev). On CUDA the bias
    reaches the efficient kernel without an (L, S) mask; elsewhere torch builds one."""
    make_bias = causal_lower_right()
    assert make_bias is not None
    if gqa:
        g = q.shape[-3] // k.shape[-3]
        k, v = expand_kv(k, g), expand_kv(v, g)  # (..., Hq, S, D): the bias takes no enable_gqa
    lead = q.shape[:-2]
    q4, k4, v4 = to4d(q), to4d(k), to4d(v)  # (B', H, N, D)
    bias = make_bias(q4.shape[-2], k4.shape[-2])
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias, dropout_p=dropout_p,
                                         scale=scale)  # fmt: skip
    return out.reshape(*lead, *out.shape[-2:])  # (..., L, Ev)


def _kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    want_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused call on equal head sizes, twice differentiable when a gradient is needed."""
    E, Ev = q.shape[-1], v.shape[-1]
    if E != Ev:  # the fused CPU kernels need one head size (else: plain math); zeros are free
        if E > Ev:
            v = F.pad(v, (0, E - Ev))  # (..., S, E)
        else:
            q, k = F.pad(q, (0, Ev - E)), F.pad(k, (0, Ev - E))  # (..., L or S, Ev)
        out, lse = _kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                           dropout_p=dropout_p, scale=scale, gqa=gqa, want_lse=want_lse)  # fmt: skip
        # (a copy of the Ev columns: a view of the padded buffer would keep it alive, and a
        # caller's .view() of the output would fail on its strides)
        return out[..., :Ev].contiguous(), lse  # (..., L, Ev)
    run = functools.partial(_fused, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                            gqa=gqa, want_lse=want_lse)  # fmt: skip
    tensors = (q, k, v) if attn_mask is None else (q, k, v, attn_mask)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if needs_grad and dropout_p == 0 and not torch.compiler.is_compiling():
        groups = q.shape[-3] // k.shape[-3] if gqa else 1
        recompute = functools.partial(math_attention, is_causal=is_causal, scale=scale,
                                      groups=groups)  # fmt: skip
        if _far_bias_rows(attn_mask):
            # the fused backward would take these rows' weights from an lse float32 rounded
            # away (attnkit._far_rows): differentiable math instead, the lse apart
            lse = None
            if want_lse:
                with torch.no_grad():
                    _, lse = run(q, k, v, attn_mask)
            return recompute(q, k, v, attn_mask), lse
        if not want_lse and q.ndim == 4 and can_flash(q, k, v, attn_mask):
            # torch's fused ops directly: no inner graph, no nested autograd.grad
            flash = FlashCall(is_causal, scale, q.shape[-3] // k.shape[-3], recompute)
            return flash_attention(flash, q, k, v, attn_mask), None
        return fused_twice_differentiable(run, recompute, q, k, v, attn_mask)
    return run(q, k, v, attn_mask)


def _far_bias_rows(attn_mask: torch.Tensor | None) -> bool:
    """Whether a readable float ``attn_mask`` (..., L or 1, S) has a row whose largest
    kept value is finite and beyond ±FAR (:mod:`attnkit._far_rows`)."""
    if attn_mask is None or attn_mask.dtype == torch.bool or not readable(attn_mask):
        return False
    top = attn_mask.detach().amax(dim=-1)  # (..., L or 1)
    return bool((torch.isfinite(top) & (top.abs() > FAR)).any())


def _fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    *,
    is_causal: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    want_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch's fused kernel (public SDPA, or the lse op when the lse is wanted)."""
    mask_grad = attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled()
    if want_lse and (mask_grad or dropout_p > 0):
        # The lse kernel takes no gradient for attn_mask (a Gaussian key bias has one) and
        # no dropout: the output through the public path, the lse (of the logits before
        # dropout, never differentiated) apart.
        out, _ = _fused(q, k, v, attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                        scale=scale, gqa=gqa, want_lse=False)  # fmt: skip
        with torch.no_grad():
            _, lse = _fused(q, k, v, attn_mask, is_causal=is_causal, dropout_p=0.0,
                            scale=scale, gqa=gqa, want_lse=True)  # fmt: skip
        return out, lse
    if want_lse and math.prod(q.shape[:-2]) == 0:
        # An empty batch: nothing to compute, and the lse op would divide by zero (SIGFPE).
        out, _ = _fused(q, k, v, attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                        scale=scale, gqa=gqa, want_lse=False)  # fmt: skip
        return out, q.new_zeros(q.shape[:-1])  # (..., L): no rows
    if want_lse:
        if gqa:
            g = q.shape[-3] // k.shape[-3]
            k, v = expand_kv(k, g), expand_kv(v, g)  # (..., Hq, S, D)
        lead = q.shape[:-2]
        m4 = None
        if attn_mask is not None:
            full = attn_mask.expand(*lead, *attn_mask.shape[-2:])  # (..., L or 1, S)
            m4 = to4d(full)  # (B', H, L or 1, S)
        q4, k4, v4 = (to4d(t) for t in (q, k, v))  # (B', H, N, D)
        out, lse = lse_call(q4, k4, v4, m4, is_causal=is_causal, scale=scale)
        out = out.reshape(*lead, *out.shape[-2:])  # (..., L, Ev)
        return out, lse.reshape(*lead, lse.shape[-1])  # (..., L)
    kwargs = {"enable_gqa": True} if gqa else {}
    lead = q.shape[:-2]
    if q.ndim != 4:  # torch's fused CPU kernels take 4-D inputs only; others run plain math
        if attn_mask is not None and (q.ndim > 4 or attn_mask.ndim > q.ndim):
            attn_mask = to4d(attn_mask.expand(*lead, *attn_mask.shape[-2:]))  # (B', H, L, S)
        q, k, v = to4d(q), to4d(k), to4d(v)  # (B', H, N, D)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        **kwargs,
    )  # fmt: skip
    return out.reshape(*lead, *out.shape[-2:]), None  # (..., L, Ev)
