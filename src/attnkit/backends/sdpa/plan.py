"""How a call maps onto SDPA calls: decisions on shapes, dtypes and mask kinds only.

Nothing here touches tensor values: each function answers from the call's
metadata, so dispatch and ``explain()`` can ask freely.

- :func:`is_direct`: the plain call torch's SDPA takes as it is;
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

from ... import masks as _masks
from ..._inputs import AttentionInputs
from ...scores import Dot, ScaledDot
from .. import varlen
from .run import HAS_GQA, HAS_LOWER_RIGHT

__all__ = [
    "DECODE_ROWS",
    "DIRECT_SCORES",
    "causal_route",
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


def sees_all(mask: _masks.CausalMask, L: int, S: int) -> bool:
    """True when every query of this causal mask sees every key (e.g. one new token
    against its whole KV cache): the mask is then no mask at all."""
    return mask.offset(L, S) >= S - 1


def _is_bottom_right(mask: _masks.CausalMask, L: int, S: int) -> bool:
    """True when row i keeps keys 0 .. i + S - L (torch's lower-right causal bias)."""
    return mask.offset(L, S) == S - L


def causal_route(inputs: AttentionInputs, mask: _masks.CausalMask) -> CausalRoute:
    """How a causal mask that is the call's whole mask reaches the kernel."""
    L, S = inputs.L, inputs.S
    if mask.symbolic_causal(L, S):
        return "symbolic"
    if sees_all(mask, L, S):
        return "none"
    lower_right = (
        HAS_LOWER_RIGHT
        and inputs.device.type == "cuda"
        and L < S
        and _is_bottom_right(mask, L, S)
        and not (inputs.return_lse or inputs.return_weights or inputs.needs_grad)
    )
    return "lower_right" if lower_right else "dense"


def half_needs_float32(inputs: AttentionInputs) -> bool:
    """Half inputs whose dot form or bias would lose range or precision in half: a score
    other than (scaled) dot, or an additive bias mask."""
    return type(inputs.score) not in DIRECT_SCORES or any(
        p.kind == "bias" for p in inputs.mask_parts
    )


def is_direct(inputs: AttentionInputs) -> bool:
    """True for the plain call torch's SDPA takes as it is: a dot or scaled-dot score,
    4-D inputs with equal leading dims (or grouped K/V heads where torch has
    enable_gqa), one head size, no weights or lse, and no mask, a top-left causal mask,
    or a causal mask under which every query sees every key (decoding)."""
    if inputs.return_weights or inputs.return_lse or type(inputs.score) not in DIRECT_SCORES:
        return False
    q, k = inputs.query, inputs.key
    if q.ndim != 4 or inputs.E != inputs.Ev:
        return False
    if q.shape[:-2] != k.shape[:-2] and not (
        HAS_GQA and inputs.groups > 1 and q.shape[0] == k.shape[0]
    ):
        return False
    mask = inputs.mask
    if mask is None:
        return True
    return isinstance(mask, _masks.CausalMask) and causal_route(inputs, mask) in (
        "symbolic",
        "none",
        "lower_right",
    )


def materialized_masks(inputs: AttentionInputs) -> list[str]:
    """Mask parts SDPA would build as a dense (L, S) tensor ([] when all stay symbolic)."""
    parts = inputs.mask_parts
    if not parts:
        return []
    out: list[str] = []
    L, S = inputs.L, inputs.S
    for p in parts:
        if isinstance(p, _masks.CausalMask):
            decoding = L <= DECODE_ROWS and L < S
            if not p.symbolic_causal(L, S) and not decoding and not sees_all(p, L, S):
                out.append("a shifted (bottom-right, L != S, or offset) causal mask")
            elif len(parts) > 1 and not varlen.can_unpad(inputs):
                out.append("a causal mask combined with another mask")
        elif isinstance(p, _masks.WindowMask):
            out.append("a window mask")
    padded = any(p.kind in ("valid_lens", "key_padding") for p in parts)
    if padded and inputs.device.type != "cpu" and not varlen.can_unpad(inputs):
        if not varlen.torch_varlen_route(inputs):
            out.append("padding (unpadding would read lengths on the host)")
    return out
