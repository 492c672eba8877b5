# %% [markdown]
# # Masks: TensorFlow's convention, padding and look-ahead
#
# A mask says which keys each query may see. Libraries disagree on how to say it:
# TensorFlow's tutorials write 1 where a key is *hidden* and add `mask * -1e9` to the
# logits; torch's `MultiheadAttention` writes True where a key is hidden; SDPA writes
# True where a key is *kept*. attnkit keeps one polarity inside (True = may attend)
# and takes every other one through a constructor that names it.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import torch

import attnkit
from attnkit import masks
from attnkit.nn import MultiheadAttention

_ = torch.manual_seed(0)  # the same numbers on every run

# %% [markdown]
# ## One query, four keys
#
# The query points along the third key; the fourth leans off it in a direction the query
# does not see, so both give the same dot product, 64, and share the weight.

# %%
k = torch.tensor([[0.0, 0, 8], [0, 8, 0], [8, 0, 0], [8, 0, 0.1]])
v = torch.tensor([[1.0, 2], [3, 4], [5, 6], [7, 8]])
q = torch.tensor([[8.0, 0, 0]])
out, w = attnkit.attention(q, k, v, return_weights=True)
print(w.round(decimals=3), out)

# %% [markdown]
# TensorFlow's "1 = masked" is `masks.tf`. Hiding the fourth key leaves the third:

# %%
hidden = torch.tensor([[0.0, 0, 0, 1]])
out, w = attnkit.attention(q, k, v, mask=masks.tf(hidden), return_weights=True)
print(w.round(decimals=3), out)

# %% [markdown]
# ## Padding and look-ahead
#
# A batch of token ids padded with 0. The padding mask hides padded keys, shaped
# `(B, 1, 1, S)` to broadcast over heads and queries; the look-ahead mask hides the
# future, `(S, S)` with 1 above the diagonal. A decoder uses both: `&` keeps a key
# only where both keep it.

# %%
seq = torch.tensor([[7, 6, 0, 0, 1], [1, 2, 3, 0, 0]])  # (B, S), 0 = padding
padding = (seq == 0).float()[:, None, None, :]  # (B, 1, 1, S), 1 = masked
look_ahead = torch.ones(5, 5).triu(1)  # (S, S), 1 = masked
decoder = masks.tf(padding) & masks.tf(look_ahead)
x = torch.randn(2, 2, 5, 8)  # (B, heads, S, depth)
_, w = attnkit.attention(x, x, x, mask=decoder, return_weights=True)

fig, axes = plt.subplots(1, 3, figsize=(9, 3))
for ax, grid, title in zip(
    axes,
    [decoder.to_dense(5, 5, (2, 1))[0, 0], w[0, 0], w[1, 0]],  # to_dense: True = kept
    ["kept pairs, batch 0", "weights, batch 0", "weights, batch 1"],
    strict=True,
):
    ax.imshow(grid.float(), cmap="Blues")
    ax.set_title(title)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
fig.tight_layout()
plt.show()

# %% [markdown]
# The same masks by other names, with no tensor built: the padding is
# `masks.key_padding(seq == 0)` and the look-ahead `masks.causal()`.

# %%
same = masks.key_padding(seq == 0) & masks.causal()
print(
    torch.allclose(attnkit.attention(x, x, x, mask=same), attnkit.attention(x, x, x, mask=decoder))
)

# %% [markdown]
# ## A query with nothing to see
#
# With every key hidden, `mask * -1e9` leaves every logit near -1e9, and the softmax
# still gives the query a mix of the values. Which mix depends on rounding: floats near
# 1e9 lie 64 apart in float32, so each logit rounds to a multiple of 64, and the keys
# whose q·k rounds highest take the whole row (here the third and fourth, as without the
# mask). attnkit gives 0.

# %%
all_hidden = torch.ones(1, 4)
out, _ = attnkit.attention(q, k, v, mask=masks.tf(all_hidden), return_weights=True)
tutorial_style = torch.softmax(q @ k.T / 3**0.5 + all_hidden * -1e9, dim=-1) @ v
print("attnkit:", out, "  -1e9:", tutorial_style)

# %% [markdown]
# ## Per-head weights
#
# A multi-head layer with 8 heads over 128 features returns each head's weights with
# `average_attn_weights=False`.

# %%
mha = MultiheadAttention(128, 8, batch_first=True)
tokens = torch.randn(1, 11, 128)
with torch.no_grad():
    y, per_head = mha(tokens, tokens, tokens, average_attn_weights=False)
print(y.shape, per_head.shape)  # (1, 11, 128), (1, 8, 11, 11)
