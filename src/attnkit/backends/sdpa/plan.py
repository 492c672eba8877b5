"""How a call maps onto SDPA calls: decisions on shapes, dtypes and mask kinds only.

Nothing here touches tensor values: each function answers from the call's
metadata, so dispatch and ``explain()`` can ask freely.

- :func:`is_direct`: the plain call torch's SDPA takes as it is;
- :func:`causal_shift`: the shift of a mask that is one causal band, from the plan;
- :func:`causal_route`: how a lone causal mask reaches the kernel ("symbolic",
  "none" when every query sees every key, "lower_right" for torch's lower-right
  causal bias, "dense" for an (L, S) mask);
- :func:`half_needs_float32`: half inputs whose dot form or bias must be computed
  in float32;
- :func:`materialized_masks`: the parts of the mask this backend would build as a
  dense (L, S) tensor, for dispatch.
"""

from __future__ import annotations

from typing import Literal

from ..._inputs import AttentionInputs
from ...scores import Dot, ScaledDot
from .. import varlen
from .run import HAS_GQA, has_lower_right

__all__ = [
    "DECODE_ROWS",
    "DIRECT_SCORES",
    "causal_route",
    "causal_shift",
    "half_needs_float32",
    "is_direct",
    "materialized_masks",
    "sees_all",
]

DECODE_ROWS = 64
"""A shifted causal mask over fewer queries than keys (bottom-right: new tokens against
a KV cache) with at most this many query rows is cheap as a dense (L, S) mask (at most
64 * S booleans, less than one key head of E >= 64): SDPA keeps it (decoding, chunked
prefill), and on CUDA it is torch's lower-right causal bias, with no mask at all."""

DIRECT_SCORES = (Dot, ScaledDot)

CausalRoute = Literal["symbolic", "none", "lower_right", "dense"]


def causal_shift(inputs: AttentionInputs) -> int | None:
    """``shift`` when the call's whole mask is ``j <= i + shift`` (a causal mask of any
    alignment or offset), read off its block plan; None for anything else."""
    if inputs.mask is None:
        return None
    band = inputs.block_plan().band()
    if band is None or band[0] is not None or band[1] is None:
        return None
    return band[1]


def sees_all(shift: int, S: int) -> bool:
    """True when every query of a causal mask with this shift sees every key (e.g. one
    new token against its whole KV cache): the mask is then no mask at all."""
    return shift >= S - 1


def causal_route(inputs: AttentionInputs, shift: int) -> CausalRoute:
    """How a causal mask (``j <= i + shift``) that is the call's whole mask reaches the
    kernel."""
    L, S = inputs.L, inputs.S
    if shift == 0:
        return "symbolic"
    if sees_all(shift, S):
        return "none"
    lower_right = (
        inputs.device.type == "cuda"
        and has_lower_right()
        and L < S
        and shift == S - L
        and not (inputs.return_lse or inputs.return_weights or inputs.needs_grad)
    )
    return "lower_right" if lower_right else "dense"


def half_needs_float32(inputs: AttentionInputs) -> bool:
    """Half inputs whose dot form or bias would lose range or precision in half: a score
    other than (scaled) dot, or an additive bias mask."""
    return (
        type(inputs.score) not in DIRECT_SCORES
        or "bias" in inputs.mask_kinds
        or bool(inputs.mods)
        or inputs.head_scale is not None
    )


def is_direct(inputs: AttentionInputs) -> bool:
    """True for the plain call torch's SDPA takes as it is: a dot or scaled-dot score,
    4-D inputs with equal leading dims (or grouped K/V heads where torch has
    enable_gqa), one head size, no weights or lse, and no mask, a top-left causal mask,
    or a causal mask under which every query sees every key (decoding)."""
    if inputs.return_weights or inputs.return_lse or type(inputs.score) not in DIRECT_SCORES:
        return False
    if inputs.mods or inputs.head_scale is not None:
        return False
    q, k = inputs.query, inputs.key
    if q.ndim != 4 or inputs.E != inputs.Ev:
        return False
    if q.shape[:-2] != k.shape[:-2] and not (
        HAS_GQA and inputs.groups > 1 and q.shape[0] == k.shape[0]
    ):
        return False
    if inputs.mask is None:
        return True
    shift = causal_shift(inputs)
    return shift is not None and causal_route(inputs, shift) in ("symbolic", "none", "lower_right")


def materialized_masks(inputs: AttentionInputs) -> list[str]:
    """Mask parts SDPA would build as a dense (L, S) tensor ([] when all stay symbolic)."""
    if inputs.mask is None:
        return []
    plan = inputs.block_plan()
    L, S = inputs.L, inputs.S
    out: list[str] = []
    ragged = varlen.can_unpad(inputs)
    shift = causal_shift(inputs)
    if shift is not None:
        decoding = L <= DECODE_ROWS and L < S
        if shift != 0 and not decoding and not sees_all(shift, S):
            out.append("a shifted (bottom-right, L != S, or offset) causal mask")
        return out
    if len(plan.clauses) > 1:
        out.append("a combination of masks with | or ~")
    for c in plan.clauses:
        if c.has_band and c.lo is not None:
            out.append("a window mask")
        elif c.has_band and not ragged:
            out.append("a causal mask combined with another mask")
        if c.docs and not ragged:
            out.append("a document mask")
    for c in plan.clauses if not ragged and L > DECODE_ROWS else ():
        # a (B0, L) key bound, or query and key bounds together, keep an (L, S) pattern
        if c.row_lo is not None or c.row_hi is not None:
            out.append(
                "per-query key ranges (valid_lens of shape (B, L), or a causal or window "
                "offset that is a tensor)"
            )
        elif (c.query_lo is not None or c.query_hi is not None) and any(
            t is not None for t in (c.key_lo, c.key_hi, c.key_keep)
        ):
            out.append("query and key lengths together")
    padded = any(
        t is not None
        for c in plan.clauses
        for t in (c.key_lo, c.key_hi, c.query_lo, c.query_hi, c.key_keep)
    )
    if padded and inputs.device.type != "cpu" and not ragged:
        if not varlen.torch_varlen_route(inputs):
            out.append("padding (unpadding would read lengths on the host)")
    return list(dict.fromkeys(out))
