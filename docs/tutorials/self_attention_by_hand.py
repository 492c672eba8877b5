# %% [markdown]
# # Self-attention by hand, then with attnkit and Keras' layer
#
# Self-attention turns a sequence of vectors into another of the same length: every
# position asks a question (its *query*), every position offers an answer key and a
# value, and each output is the values mixed by how well the keys answer the query.
# This tutorial writes it with matrix products, then with `einsum` over any number of
# batch dims, then as one `attnkit.attention` call, and finally as a multi-head layer
# equal to Keras' `MultiHeadAttention`.

# %%
import math
import os

import torch

import attnkit
from attnkit.nn import EinsumMultiHeadAttention

_ = torch.manual_seed(0)  # the same numbers on every run

# %% [markdown]
# ## By hand
#
# Five tokens of three features each. Three weight matrices project them to queries
# and keys of size 4 and values of size 2.

# %%
x = torch.randn(5, 3)  # (L, input features)
w_q, w_k, w_v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 2)
q, k, v = x @ w_q, x @ w_k, x @ w_v  # (L, 4), (L, 4), (L, 2)
logits = q @ k.T / math.sqrt(4)  # (L, L): how well key j answers query i
weights = torch.softmax(logits, dim=-1)  # each row sums to 1
by_hand = weights @ v  # (L, 2)
print(weights.sum(-1))
print(by_hand)

# %% [markdown]
# ## As one call
#
# `attnkit.attention` is the last three lines: the scaled dot product is its default
# score.

# %%
out = attnkit.attention(q, k, v)
print(torch.allclose(out, by_hand, atol=1e-6))

# %% [markdown]
# ## With einsum, over any batch dims
#
# With several leading dims (here a (2, 3) grid of sequences) the same projections
# are `einsum`s that name the feature dims and leave the rest alone. The projection
# of one token is `'...i,io->...o'`: contract the input features `i`. (An expression
# that repeats an index on one operand, such as `'...b,bbc->...bc'`, reads the
# diagonal of that operand instead of projecting.)

# %%
xs = torch.randn(2, 3, 5, 3)  # (batch..., L, input features)
qs = torch.einsum("...li,io->...lo", xs, w_q)
ks = torch.einsum("...li,io->...lo", xs, w_k)
vs = torch.einsum("...li,io->...lo", xs, w_v)
scores = torch.einsum("...lo,...mo->...lm", qs, ks) / math.sqrt(4)
manual = torch.einsum("...lm,...mo->...lo", scores.softmax(-1), vs)
print(manual.shape, torch.allclose(attnkit.attention(qs, ks, vs), manual, atol=1e-6))

# %% [markdown]
# ## Several heads: Keras' MultiHeadAttention
#
# A multi-head layer runs several small attentions side by side, each with its own
# projections (`num_heads` heads of `key_dim` features), then projects their
# concatenation to the output size. Keras keeps its kernels as `(input, heads,
# head_size)`; attnkit's `EinsumMultiHeadAttention` keeps the same layout and the same
# call, and attends over chosen axes: here axis 2 of a (7, 20, 3, 6) input, every
# other dim a batch dim.

# %%
query = torch.randn(7, 20, 3, 6)
value = torch.randn(7, 20, 3, 6)
layer = EinsumMultiHeadAttention(
    num_heads=4, key_dim=3, output_shape=5, attention_axes=(2,), query_features=6
)
y, w = layer(query, value, return_attention_scores=True)
print(y.shape, w.shape)  # (7, 20, 3, 5), (7, 20, 4, 3, 3)

# %% [markdown]
# The layer written out with its own kernels: project, attend per head, project back.

# %%
with torch.no_grad():
    q4 = torch.einsum("...ni,iho->...nho", query, layer.query_kernel) + layer.query_bias
    k4 = torch.einsum("...mi,iho->...mho", value, layer.key_kernel) + layer.key_bias
    v4 = torch.einsum("...mi,iho->...mho", value, layer.value_kernel) + layer.value_bias
    coef = torch.einsum("...nho,...mho->...hnm", q4, k4).div(math.sqrt(3)).softmax(-1)
    heads = torch.einsum("...hnm,...mho->...nho", coef, v4)
    again = torch.einsum("...nho,hoj->...nj", heads, layer.output_kernel) + layer.output_bias
    print(torch.allclose(again, y, atol=1e-5))

# %% [markdown]
# ## The same numbers as Keras
#
# `from_keras` copies a built Keras layer. Keras runs on its torch backend here.

# %%
os.environ.setdefault("KERAS_BACKEND", "torch")
import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(0)
theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
a = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
expected = keras.ops.convert_to_numpy(theirs(a, a))
ours = EinsumMultiHeadAttention.from_keras(theirs)
got = ours(torch.from_numpy(a), torch.from_numpy(a)).detach().numpy()
print(f"largest difference: {np.abs(got - expected).max():.1e}")
