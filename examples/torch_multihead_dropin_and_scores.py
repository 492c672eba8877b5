"""A drop-in for torch.nn.MultiheadAttention, and the four classic score functions.

Reproduces seed 001 (``torch.nn.MultiheadAttention`` and additive, dot, scaled-dot and
bilinear scores).

1. ``attnkit.nn.MultiheadAttention`` is a drop-in for torch's layer: the same
   constructor and state_dict, inputs (L, N, E), weights (N, L, S). Here it
   loads a torch layer's weights and gives the same numbers, then runs the
   options the seed lists (kdim/vdim, add_bias_kv, add_zero_attn,
   key_padding_mask, attn_mask).
2. The score functions s(k, q): additive vᵀ tanh(W k + U q), dot kᵀ q,
   scaled dot kᵀ q / sqrt(d) and bilinear kᵀ W q, each one ``score=`` of
   :func:`attnkit.attention`.

Run: ``python examples/torch_multihead_dropin_and_scores.py``
"""

from __future__ import annotations

from typing import Any

import torch

import attnkit
from attnkit import scores
from attnkit.nn import MultiheadAttention


@torch.no_grad()
def main() -> dict[str, Any]:
    torch.manual_seed(0)
    L, N, E, S = 3, 4, 10, 6
    theirs = torch.nn.MultiheadAttention(embed_dim=E, num_heads=10)
    ours = MultiheadAttention(embed_dim=E, num_heads=10)
    ours.load_state_dict(theirs.state_dict())
    query, key, value = torch.rand(L, N, E), torch.rand(S, N, E), torch.rand(S, N, E)
    out, weights = ours(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None)
    ref, ref_weights = theirs(query, key, value)
    assert weights is not None and ref_weights is not None
    print("attn_output:", tuple(out.shape), "(L, N, E)")
    print("attn_output_weights:", tuple(weights.shape), "(N, L, S)")
    max_diff = max(float((out - ref).abs().max()), float((weights - ref_weights).abs().max()))
    print(f"max |attnkit - torch| = {max_diff:.2e}")

    # Every option of the seed's constructor and forward.
    rich = MultiheadAttention(E, 2, kdim=7, vdim=5, add_bias_kv=True, add_zero_attn=True)
    padding = torch.zeros(N, S, dtype=torch.bool)
    padding[:, -2:] = True  # the last two keys of every sequence are padding
    causal = torch.ones(L, S, dtype=torch.bool).triu(1)  # True = masked, torch's polarity
    _, w2 = rich(
        query, torch.rand(S, N, 7), torch.rand(S, N, 5), key_padding_mask=padding, attn_mask=causal
    )
    assert w2 is not None
    print("with bias_kv and zero_attn the weights cover S + 2 keys:", tuple(w2.shape))

    # The four score functions on one batch of keys.
    q = torch.rand(1, 2, 8)  # (B, L, d)
    k = torch.rand(1, 5, 8)  # (B, S, d)
    v = torch.rand(1, 5, 3)  # (B, S, dv)
    score_fns: dict[str, Any] = {
        "additive": scores.Additive(query_dim=8, key_dim=8, hidden_dim=16),
        "dot": "dot",
        "scaled_dot": "scaled_dot",
        "bilinear": scores.Bilinear(query_dim=8, key_dim=8),
    }
    rows: dict[str, torch.Tensor] = {}
    for name, score in score_fns.items():
        _, w = attnkit.attention(q, k, v, score=score, return_weights=True)
        rows[name] = w[0, 0]
        print(f"{name:>10} weights of query 0:", [round(float(x), 3) for x in w[0, 0]])
    return {
        "output_shape": tuple(out.shape),
        "weights_shape": tuple(weights.shape),
        "max_diff_vs_torch": max_diff,
        "pairs_vs_torch": [(out, ref), (weights, ref_weights)],
        "extra_keys_weights_shape": tuple(w2.shape),
        "padding_weight": float(w2[:, :, S - 2 : S].abs().max()),
        "score_weights": rows,
    }


if __name__ == "__main__":
    main()
