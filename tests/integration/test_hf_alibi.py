"""ALiBi against BLOOM's own formula.

BLOOM and MPT compute their attention themselves in transformers (they do not
call the AttentionInterface), so attn_implementation="attnkit" cannot reach
them. Instead attnkit's ``mods.alibi`` is held to BLOOM's definition: its slopes
(the ALiBi paper's geometric sequence, and what BLOOM's public ``build_alibi_tensor``
puts at key position 1) and its bias (``build_alibi_tensor``: slope * key position,
counted over the unpadded keys) added to the scaled logits under a causal and
padding mask, for a prefill and for new queries against a KV cache.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks, mods

from tolerance import FLOAT32_ULPS_REL, FLOAT64_REL, assert_close_to_scale

modeling_bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")


def _paper_slopes(heads: int) -> list[float]:
    """ALiBi's slopes (Press et al., 2022): for n heads, a power of two, the geometric
    sequence 2^(-8/n), 2^(-16/n), ...; otherwise those of the largest power of two
    below n, then every other slope of twice that many heads."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    p = 2 ** math.floor(math.log2(heads))
    return geometric(p) + geometric(2 * p)[0::2][: heads - p]


@pytest.mark.parametrize("heads", [1, 3, 4, 6, 8, 12, 16])
def test_standard_slopes_are_blooms(heads: int) -> None:
    want = torch.tensor(_paper_slopes(heads), dtype=torch.float64)
    assert_close_to_scale(mods.alibi_slopes(heads).double(), want, rel=FLOAT32_ULPS_REL)
    # BLOOM's bias at key position 1 of an unpadded row is the slope itself
    blooms = modeling_bloom.build_alibi_tensor(torch.ones(1, 2), heads, torch.float32)
    assert_close_to_scale(
        mods.alibi_slopes(heads).float(), blooms.view(heads, 2)[:, 1], rel=FLOAT32_ULPS_REL
    )


@pytest.mark.parametrize("L", [11, 3], ids=["prefill", "cached"])
def test_causal_alibi_is_blooms_attention(L: int) -> None:
    B, H, S, E = 2, 6, 11, 8
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, E, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, S, E, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, S, E, generator=g, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(B, S, dtype=torch.long)
    keep[1, :4] = 0  # left padding
    scale = E**-0.5

    # BLOOM: alibi (B*H, 1, S) + scale * q·k, then its causal and padding mask, softmax.
    alibi = modeling_bloom.build_alibi_tensor(keep, H, torch.float64).view(B, H, 1, S)
    logits = alibi + q @ k.transpose(-1, -2) * scale  # (B, H, L, S)
    rows = torch.arange(L).view(L, 1) + (S - L)  # queries are the last positions
    allowed = (torch.arange(S).view(1, S) <= rows) & keep.bool().view(B, 1, 1, S)
    blocked = torch.finfo(logits.dtype).min  # BLOOM's mask value: padded rows stay finite
    want_w = torch.softmax(logits.masked_fill(~allowed, blocked), dim=-1)
    want = want_w @ v

    mask = masks.causal("bottom_right") & masks.key_padding(keep == 0)
    alibi_mod = mods.alibi(H, causal=True, align="bottom_right")  # the standard slopes
    out, w = attnkit.attention(q, k, v, mask=mask, scale=scale, mods=alibi_mod,
                               return_weights=True)  # fmt: skip
    real = allowed.any(-1).view(B, 1, L).expand(B, H, L)  # rows with a key to attend
    assert_close_to_scale(w[real], want_w[real], rel=FLOAT64_REL)
    assert_close_to_scale(out[real], want[real], rel=FLOAT64_REL)
    grad = torch.randn(out[real].shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out[real] * grad).sum(), (q, k, v))
    exp = torch.autograd.grad((want[real] * grad).sum(), (q, k, v))
    for a, e in zip(got, exp, strict=True):
        assert_close_to_scale(a, e, rel=FLOAT64_REL)
