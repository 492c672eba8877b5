"""TensorFlow's "1 = masked" padding and look-ahead masks, and per-head weights.

Reproduces seed 002 (the TensorFlow tutorial's ``scaled_dot_product_attention`` and
``split_heads`` multi-head layer).

The tutorial adds ``mask * -1e9`` to the logits, so its masks say 1 where a
key is hidden. In attnkit that convention has a named constructor,
``masks.tf(t)``; padding and look-ahead masks combine with ``&``. The
tutorial's multi-head layer (``split_heads`` to (batch, heads, seq, depth),
per-head weights) is ``attnkit.nn.MultiheadAttention`` with per-head weights.

One deliberate difference: a query whose keys are all masked still gets a
mix of the values in the tutorial (every logit is near -1e9, and the softmax
normalizes whatever is left) and an output of 0 in attnkit.

Run: ``python examples/tensorflow_mask_convention.py``
"""

from __future__ import annotations

from typing import Any

import torch

import attnkit
from attnkit import masks
from attnkit.nn import MultiheadAttention


def padding_mask(seq: torch.Tensor) -> torch.Tensor:
    """(B, S) token ids -> (B, 1, 1, S), 1 where the token is padding (id 0)."""
    return (seq == 0).float()[:, None, None, :]


def look_ahead_mask(size: int) -> torch.Tensor:
    """(S, S), 1 above the diagonal: query i may not see keys after i."""
    return torch.ones(size, size).triu(1)


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial's signature: mask broadcastable to (..., Lq, Lk), 1 = masked."""
    return attnkit.attention(
        q, k, v, mask=None if mask is None else masks.tf(mask), return_weights=True
    )


@torch.no_grad()
def main() -> dict[str, Any]:
    torch.manual_seed(0)
    # One query that matches the third of four keys exactly.
    k = torch.tensor([[0.0, 0, 8], [0, 8, 0], [8, 0, 0], [8, 0, 0.1]])
    v = torch.tensor([[1.0, 2], [3, 4], [5, 6], [7, 8]])
    q = torch.tensor([[8.0, 0, 0]])
    out, w = scaled_dot_product_attention(q, k, v, None)
    print("weights:", [round(float(x), 3) for x in w[0]], "output:", out.tolist())
    # Hide the last key: the query falls on the third alone.
    out_m, w_m = scaled_dot_product_attention(q, k, v, torch.tensor([[0.0, 0, 0, 1]]))
    print("with key 3 masked:", [round(float(x), 3) for x in w_m[0]], out_m.tolist())

    # Padding and look-ahead masks, combined as the tutorial's decoder does.
    seq = torch.tensor([[7, 6, 0, 0, 1], [1, 2, 3, 0, 0]])  # (B, S) token ids, 0 = padding
    x = torch.randn(2, 2, 5, 8)  # (batch, heads, seq, depth)
    combined = masks.tf(padding_mask(seq)) & masks.tf(look_ahead_mask(5))
    _, w_dec = attnkit.attention(x, x, x, mask=combined, return_weights=True)
    print("decoder weights of batch 0, head 0 (rows = queries):")
    print(w_dec[0, 0].numpy().round(2))

    # A fully masked row: attnkit gives 0, the -1e9 trick still mixes the values.
    hidden = torch.ones(1, 4)
    out_dead, _ = scaled_dot_product_attention(q, k, v, hidden)
    tutorial = torch.softmax(q @ k.T / 3**0.5 + hidden * -1e9, dim=-1) @ v
    print("every key masked: attnkit", out_dead.tolist(), "tutorial", tutorial.tolist())

    # The tutorial's multi-head layer: d_model=128, 8 heads, (1, 11, 128) in and out.
    mha = MultiheadAttention(128, 8, batch_first=True)
    tokens = torch.randn(1, 11, 128)
    y, per_head = mha(tokens, tokens, tokens, average_attn_weights=False)
    assert per_head is not None
    print("multi-head output:", tuple(y.shape), "per-head weights:", tuple(per_head.shape))
    return {
        "weights": w[0],
        "output": out[0],
        "masked_weights": w_m[0],
        "decoder_weights": w_dec,
        "dead_row_output": out_dead[0],
        "tutorial_dead_row_output": tutorial[0],
        "mha_shape": tuple(y.shape),
        "per_head_shape": tuple(per_head.shape),
    }


if __name__ == "__main__":
    main()
