"""A Keras self-attention layer and an einsum multi-head attention over any batch axes.

Reproduces seed 000 (Keras ``SelfAttention`` and an einsum ``MultiHeadAttention``).

Two systems:

1. ``SelfAttention(input_dim=3, dim_q_k=4, dim_v=5)`` on ten tokens of three
   features: softmax(Q Kᵀ / sqrt(d_k)) V with Q = x W_q, K = x W_k, V = x W_v.
   The seed writes its projections as ``einsum('...b,bbc->...bc', x, kernel)``
   with a (3, 3, c) kernel: a repeated index reads the kernel's *diagonal*, so
   each feature is scaled on its own and the ten tokens become (10, 3, c)
   arrays; its logits also skip the softmax and the 1/sqrt(d_k). The formula it
   illustrates is the usual one, implemented here.
2. An einsum ``MultiHeadAttention(head_size=3, num_heads=4, output_size=5)``
   with query/key/value feature sizes 6, fed an input of shape (10, 7, 20, 3, 6)
   split into query, key and value of shape (7, 20, 3, 6). Its einsums attend
   over the axis just before the features (N = 3) with (7, 20) as batch dims:
   ``EinsumMultiHeadAttention(..., attention_axes=(2,))``.

Run: ``python examples/keras_einsum_multihead.py``
"""

from __future__ import annotations

import math
from typing import Any

import torch

import attnkit
from attnkit.nn import EinsumMultiHeadAttention


def self_attention(
    x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor
) -> torch.Tensor:
    """x (T, F), w_q/w_k (F, d_k), w_v (F, d_v) -> (T, d_v)."""
    return attnkit.attention(x @ w_q, x @ w_k, x @ w_v)  # scale 1/sqrt(d_k) by default


@torch.no_grad()
def main() -> dict[str, Any]:
    torch.manual_seed(0)
    # 1. self-attention, input_dim=3, dim_q_k=4, dim_v=5, ten tokens of ones
    x = torch.ones(10, 3)
    w_q, w_k, w_v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 5)
    out = self_attention(x, w_q, w_k, w_v)
    print("self-attention output:", tuple(out.shape))  # (10, 5)
    # What the seed's diagonal einsum computes instead: one (3, c) array per token.
    diag = torch.einsum("...b,bbc->...bc", x, torch.randn(3, 3, 5))
    print("seed's '...b,bbc->...bc' result:", tuple(diag.shape), "(reads the kernel diagonal)")
    # Identical tokens attend uniformly: every output row is the same value row.
    uniform = bool(torch.allclose(out, (x @ w_v)[:1].expand(10, 5), atol=1e-6))

    # 2. einsum multi-head attention over arbitrary batch dims
    inputs = torch.randn(10, 7, 20, 3, 6)
    query, key, value = inputs[0], inputs[1], inputs[2]
    mha = EinsumMultiHeadAttention(
        num_heads=4, key_dim=3, output_shape=5, attention_axes=(2,), query_features=6
    )
    y, scores = mha(query, value, key, return_attention_scores=True)
    print("multi-head output:", tuple(y.shape), "scores:", tuple(scores.shape))

    # The seed's einsum chain written out with the layer's weights (the seed keeps
    # kernels as (H, I, O); attnkit as Keras does, (I, H, O)); biases start at 0.
    q = torch.einsum("...NI,IHO->...NHO", query, mha.query_kernel) / math.sqrt(3)
    k = torch.einsum("...MI,IHO->...MHO", key, mha.key_kernel)
    v = torch.einsum("...MI,IHO->...MHO", value, mha.value_kernel)
    coef = torch.einsum("...NHO,...MHO->...HNM", q, k).softmax(-1)
    heads = torch.einsum("...HNM,...MHI->...NHI", coef, v)
    ref = torch.einsum("...NHI,HIO->...NO", heads, mha.output_kernel)
    assert mha.output_bias is not None
    max_diff = float((y - (ref + mha.output_bias)).abs().max())
    print(f"max |attnkit - seed einsums| = {max_diff:.2e}")
    return {
        "self_attention_shape": tuple(out.shape),
        "seed_diagonal_shape": tuple(diag.shape),
        "uniform_rows": uniform,
        "mha_shape": tuple(y.shape),
        "scores_shape": tuple(scores.shape),
        "max_diff_vs_einsums": max_diff,
        "pair_vs_einsums": (y, ref + mha.output_bias),
    }


if __name__ == "__main__":
    main()
