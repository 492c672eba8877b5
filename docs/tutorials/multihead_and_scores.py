# %% [markdown]
# # torch's MultiheadAttention and the four classic score functions
#
# `torch.nn.MultiheadAttention` takes sequences as `(L, N, E)` (length first) unless
# `batch_first=True`, and returns the output with the attention weights averaged over
# heads, `(N, L, S)`. attnkit's layer of the same name is a drop-in: the same
# arguments, the same state_dict, the same numbers. Then: the four score functions
# a query and a key can be compared with.

# %%
import math

import torch

import attnkit
from attnkit import scores
from attnkit.nn import MultiheadAttention

_ = torch.manual_seed(0)  # the same numbers on every run

# %% [markdown]
# ## The drop-in
#
# Three queries, six keys, a batch of four, ten features split over two heads.

# %%
L, S, N, E = 3, 6, 4, 10
theirs = torch.nn.MultiheadAttention(embed_dim=E, num_heads=2)
ours = MultiheadAttention(embed_dim=E, num_heads=2)
ours.load_state_dict(theirs.state_dict())
query, key, value = torch.rand(L, N, E), torch.rand(S, N, E), torch.rand(S, N, E)
with torch.no_grad():
    out, weights = ours(query, key, value)
    ref, ref_weights = theirs(query, key, value)
print(out.shape, weights.shape)  # (L, N, E), (N, L, S)
print(torch.allclose(out, ref, atol=1e-6), torch.allclose(weights, ref_weights, atol=1e-6))

# %% [markdown]
# Keys and values of other sizes (`kdim`, `vdim`), a learned extra key and value
# (`add_bias_kv`), a zero key and value (`add_zero_attn`), padding and a mask: both
# extras add a key, so the weights cover S + 2 keys.

# %%
rich = MultiheadAttention(E, 2, kdim=7, vdim=5, add_bias_kv=True, add_zero_attn=True)
padding = torch.zeros(N, S, dtype=torch.bool)
padding[:, -2:] = True  # True = padding (torch's polarity)
future = torch.ones(L, S, dtype=torch.bool).triu(1)  # True = masked
with torch.no_grad():
    _, w = rich(
        query, torch.rand(S, N, 7), torch.rand(S, N, 5), key_padding_mask=padding, attn_mask=future
    )
print(w.shape)
print(w[0].round(decimals=3))  # the padded keys get 0

# %% [markdown]
# ## Four ways to score a query against a key
#
# - **additive** (Bahdanau): w_vᵀ tanh(W_q q + W_k k), a small network;
# - **dot**: q · k;
# - **scaled dot**: q · k / √d, which keeps the logits' spread independent of d;
# - **bilinear** (Luong's "general"): q W k, a learned matrix between them.

# %%
q = torch.rand(1, 2, 8)  # (B, L, d)
k = torch.rand(1, 5, 8)  # (B, S, d)
v = torch.rand(1, 5, 3)  # (B, S, dv)
additive = scores.Additive(query_dim=8, key_dim=8, hidden_dim=16)
bilinear = scores.Bilinear(query_dim=8, key_dim=8)
with torch.no_grad():
    for name, score in [
        ("additive", additive),
        ("dot", "dot"),
        ("scaled_dot", "scaled_dot"),
        ("bilinear", bilinear),
    ]:
        _, w = attnkit.attention(q, k, v, score=score, return_weights=True)
        print(f"{name:>10}", w[0, 0].round(decimals=3).tolist())

# %% [markdown]
# Each written out, to see that the call computes the formula:

# %%
with torch.no_grad():
    features = torch.tanh(additive.W_q(q)[:, :, None] + additive.W_k(k)[:, None])  # (B, L, S, h)
    by_hand = {
        "additive": additive.w_v(features).squeeze(-1),
        "dot": q @ k.transpose(1, 2),
        "scaled_dot": q @ k.transpose(1, 2) / math.sqrt(8),
        "bilinear": (q @ bilinear.weight) @ k.transpose(1, 2),
    }
    for name, score in [
        ("additive", additive),
        ("dot", "dot"),
        ("scaled_dot", "scaled_dot"),
        ("bilinear", bilinear),
    ]:
        out = attnkit.attention(q, k, v, score=score)
        print(name, torch.allclose(out, torch.softmax(by_hand[name], -1) @ v, atol=1e-6))

# %% [markdown]
# The additive score never builds the (B, L, S, hidden) tensor above inside attnkit: it
# runs tile by tile. The other three reduce to a dot product and run on the fused
# kernels; `explain` says which runs:

# %%
for score in (additive, bilinear):
    print(type(score).__name__, attnkit.explain(q, k, v, score=score).chosen)
