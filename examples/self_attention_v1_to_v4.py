"""Four hand-written self-attention variants (V1–V4) as one attnkit layer.

Reproduces seed 003 (PyTorch self-attention V1–V4: separate or fused projections,
dropout, padding masks, output projection).

``attnkit.nn.SelfAttention`` covers the four versions with its options:

- V1: separate q/k/v projections, softmax(Q Kᵀ / sqrt(d)) V
  -> ``SelfAttention(d, fused_qkv=False, out_proj=False)``
- V2: one fused projection split into Q, K, V
  -> ``SelfAttention(d, fused_qkv=True, out_proj=False)``.
  The seed divides by sqrt(d) *after* the softmax, so its weights sum to
  1/sqrt(d) instead of 1; the scale belongs inside, on the logits.
- V3: fused projection, attention dropout, a (B, S) padding mask expanded to
  (B, L, S), output projection -> ``SelfAttention(d, dropout=p)``
- V4: separate projections with dropout and a mask
  -> ``SelfAttention(d, fused_qkv=False, dropout=p, out_proj=False)``

The submodules carry the seed's names (``q``, ``k``, ``v``, ``proj``,
``output_proj``), so the seed's state_dicts load as they are. Masks with
``masked_fill(mask == 0, -inf)`` turn a fully masked row into NaN; attnkit
returns 0 there.

Run: ``python examples/self_attention_v1_to_v4.py``
"""

from __future__ import annotations

import math
from typing import Any

import torch

import attnkit
from attnkit.nn import SelfAttention


@torch.no_grad()
def main() -> dict[str, Any]:
    torch.manual_seed(0)
    results: dict[str, Any] = {}

    # V1: separate projections, no output projection.
    x = torch.rand(3, 2, 4)
    v1 = SelfAttention(4, fused_qkv=False, out_proj=False)
    results["v1_shape"] = tuple(v1(x).shape)
    print("V1 output:", results["v1_shape"])

    # V2: fused projection. Weights with the scale on the logits vs after the softmax.
    v2 = SelfAttention(4, fused_qkv=True, out_proj=False)
    _, w2 = v2(x, return_weights=True)
    assert v2.proj is not None
    q, k, _ = v2.proj(x).split(4, dim=-1)
    _, unscaled = attnkit.attention(q, k, k, score="dot", return_weights=True)
    seed_v2 = unscaled / math.sqrt(4)  # the seed's order: softmax first, then divide
    results["v2_row_sums"] = w2.sum(-1)
    results["seed_v2_row_sums"] = seed_v2.sum(-1)
    print(
        "V2 rows sum to", float(w2.sum(-1).mean()), "; the seed's to", float(seed_v2.sum(-1).mean())
    )

    # V3: fused, dropout on the weights, output projection, a (B, S) mask.
    x3 = torch.rand(3, 4, 2)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    v3 = SelfAttention(2, dropout=0.8).eval()  # eval: dropout is off, results repeatable
    out3, w3 = v3(x3, mask, return_weights=True)
    # The seed expands the mask to (B, L, S) first; both forms are accepted.
    out3b = v3(x3, mask.unsqueeze(1).repeat(1, 4, 1))
    results["v3_shape"] = tuple(out3.shape)
    results["v3_same_with_expanded_mask"] = bool(torch.equal(out3, out3b))
    results["v3_weights"] = w3
    print("V3 output:", results["v3_shape"], "weights of batch 1:")
    print(w3[1, 0].numpy().round(3))

    # V4: separate projections, dropout, no output projection; shapes the seed prints.
    v4 = SelfAttention(2, fused_qkv=False, dropout=0.8, out_proj=False).eval()
    out4, w4 = v4(x3, mask, return_weights=True)
    results["v4_shape"] = tuple(out4.shape)
    results["v4_weights_shape"] = tuple(w4[:, 0].shape)
    print("V4 output:", results["v4_shape"], "weights:", results["v4_weights_shape"])

    # A fully masked sequence: zeros, where masked_fill(-inf) + softmax gives NaN.
    dead = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    out_dead = v4(x3, dead)
    results["dead_row"] = out_dead[0]
    print("fully masked sequence ->", out_dead[0].tolist())
    return results


if __name__ == "__main__":
    main()
