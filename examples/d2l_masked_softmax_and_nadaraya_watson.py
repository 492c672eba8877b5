"""d2l's masked softmax, additive and dot-product attention, and Nadaraya–Watson regression.

Reproduces seed 004 (d2l's attention chapter: ``masked_softmax`` with ``valid_lens``,
``AdditiveAttention``, ``DotProductAttention``, Gaussian-kernel attention).

- ``masked_softmax(X, valid_lens)``: ``masks.valid_lens`` (one length per
  sequence, (B,), or per query, (B, L)) with the scores given as an additive
  bias, so the softmax itself is attnkit's.
- ``AdditiveAttention(key_size, query_size, num_hiddens, dropout)`` and
  ``DotProductAttention(dropout)`` with d2l's forward and ``.attention_weights``.
  (The seed's additive layer ends with ``out.squeeze(1)``; d2l's returns
  (batch, queries, value size), as attnkit does.)
- Nadaraya–Watson with a Gaussian kernel: waists 51, 56, 58 -> weights 40,
  43, 48; a waist of 57 predicts 45.5. Boxcar and Epanechnikov kernels too.

One deliberate difference from d2l: a valid length of 0 gives 0, not a
uniform average of every value.

Run: ``python examples/d2l_masked_softmax_and_nadaraya_watson.py``
"""

from __future__ import annotations

from typing import Any

import torch

import attnkit
from attnkit import masks
from attnkit.nn import AdditiveAttention, DotProductAttention, NadarayaWatson


def masked_softmax(X: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """Softmax of X (B, L, S) over keys j < valid length; lens (B,) or (B, L)."""
    B, L, S = X.shape
    zeros_q, zeros_k = X.new_zeros(B, L, 1), X.new_zeros(B, S, 1)  # logits 0 + bias X
    mask = masks.bias(X) if valid_lens is None else masks.bias(X) & masks.valid_lens(valid_lens)
    _, weights = attnkit.attention(
        zeros_q, zeros_k, X.new_zeros(B, S, 1), score="dot", mask=mask, return_weights=True
    )
    return weights


@torch.no_grad()
def main() -> dict[str, Any]:
    torch.manual_seed(0)
    X = torch.rand(2, 2, 4)
    per_seq = masked_softmax(X, torch.tensor([2, 3]))
    per_query = masked_softmax(X, torch.tensor([[1, 3], [2, 4]]))
    print("masked_softmax, lens [2, 3]:\n", per_seq.numpy().round(4))
    print("masked_softmax, lens [[1, 3], [2, 4]]:\n", per_query.numpy().round(4))

    queries, keys = torch.normal(0, 1, (2, 1, 20)), torch.ones((2, 10, 2))
    values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
    valid_lens = torch.tensor([2, 6])
    additive = AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1).eval()
    out_add = additive(queries, keys, values, valid_lens)
    print("additive attention:", out_add.tolist())
    assert additive.attention_weights is not None
    print("its weights:\n", additive.attention_weights.numpy().round(4))

    dot = DotProductAttention(dropout=0.5).eval()
    out_dot = dot(torch.normal(0, 1, (2, 1, 2)), keys, values, valid_lens)
    print("dot-product attention:", out_dot.tolist())

    # Nadaraya–Watson: waist (key) -> weight (value); predict the weight of waist 57.
    waist, weight = torch.tensor([51.0, 56.0, 58.0]), torch.tensor([40.0, 43.0, 48.0])
    nw = NadarayaWatson("gaussian", sigma=1.0)
    f57 = nw(torch.tensor([57.0]), waist, weight)
    assert nw.attention_weights is not None
    print("f(57) =", round(float(f57), 4), "weights", nw.attention_weights.numpy().round(4))
    compact = {
        name: float(NadarayaWatson(name, sigma=1.5)(torch.tensor([57.0]), waist, weight))
        for name in ("boxcar", "epanechnikov")
    }
    print("boxcar / Epanechnikov (σ = 1.5):", compact)

    # Two-feature sample: (waist, chest) -> (weight, height), queries (57, 83) and (55, 76).
    keys2 = torch.tensor([[51.0, 70.0], [56.0, 82.0], [56.0, 82.0]])
    values2 = torch.tensor([[40.0, 155.0], [43.0, 159.0], [48.0, 162.0]])
    queries2 = torch.tensor([[57.0, 83.0], [55.0, 76.0]])
    f2 = NadarayaWatson("gaussian", sigma=3.0)(queries2, keys2, values2)
    print("two-feature predictions (σ = 3):", f2.numpy().round(2).tolist())
    return {
        "masked_softmax_per_sequence": per_seq,
        "masked_softmax_per_query": per_query,
        "additive_output": out_add,
        "dot_output": out_dot,
        "nw_57": float(f57),
        "nw_weights": nw.attention_weights,
        "compact_kernels": compact,
        "two_feature": f2,
    }


if __name__ == "__main__":
    main()
