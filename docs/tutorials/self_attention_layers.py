# %% [markdown]
# # Self-attention layers, version 1 to 4
#
# Four hand-written self-attention modules differ by small choices: separate or fused
# Q/K/V projections, dropout on the weights, a padding mask, an output projection.
# `attnkit.nn.SelfAttention` has each choice as an option. Along the way: where the
# 1/√d scale belongs, and what a fully masked row gives.

# %%
import math

import torch

from attnkit.nn import SelfAttention

torch.manual_seed(0)
x = torch.rand(3, 2, 4)  # (B, S, hidden)

# %% [markdown]
# ## Version 1: three projections
#
# Q, K and V each come from their own linear layer; the output is softmax(QKᵀ/√d)V.

# %%
v1 = SelfAttention(4, fused_qkv=False, out_proj=False)
with torch.no_grad():
    q, k, v = v1.q(x), v1.k(x), v1.v(x)
    by_hand = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(4), dim=-1) @ v
    print(torch.allclose(v1(x), by_hand, atol=1e-6))

# %% [markdown]
# ## Version 2: one fused projection
#
# One linear layer of 3·hidden outputs, split in three: the same function, one matrix
# product instead of three. The scale divides the *logits*. Dividing the weights after
# the softmax instead would leave rows that sum to 1/√d, not 1:

# %%
v2 = SelfAttention(4, fused_qkv=True, out_proj=False)
with torch.no_grad():
    _, w = v2(x, return_weights=True)
    q, k, _ = v2.proj(x).split(4, dim=-1)
    after = torch.softmax(q @ k.transpose(1, 2), dim=-1) / math.sqrt(4)
print(
    "rows sum to",
    w.sum(-1).mean().item(),
    "- scaled after the softmax:",
    after.sum(-1).mean().item(),
)

# %% [markdown]
# ## Version 3: dropout, a padding mask, an output projection
#
# The mask is (B, S), 1 for a real token and 0 for padding (the
# `masked_fill(mask == 0, -inf)` convention); the layer takes it as it is, or
# expanded to (B, S, S).

# %%
x3 = torch.rand(3, 4, 2)
mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
v3 = SelfAttention(2, dropout=0.8).eval()  # eval: no dropout, repeatable
with torch.no_grad():
    out3, w3 = v3(x3, mask, return_weights=True)
    expanded = v3(x3, mask.unsqueeze(1).repeat(1, 4, 1))
print(out3.shape, torch.equal(out3, expanded))
print(w3[1, 0].round(decimals=3))  # batch 1: two real keys

# %% [markdown]
# In training mode the dropout zeroes weights at random and rescales the rest before
# they meet the values, so the output changes from call to call; the weights it returns
# are those before dropout, the same as in eval mode:

# %%
v3.train()
torch.manual_seed(1)
trained, dropped = v3(x3, mask, return_weights=True)
print(torch.equal(dropped, w3), torch.allclose(trained, out3))  # True False

# %% [markdown]
# ## Version 4: separate projections with dropout, no output projection

# %%
v4 = SelfAttention(2, fused_qkv=False, dropout=0.8, out_proj=False).eval()
with torch.no_grad():
    out4, w4 = v4(x3, mask, return_weights=True)
print(out4.shape, w4.shape)

# %% [markdown]
# ## A sequence with no token at all
#
# With `masked_fill(mask == 0, -inf)`, a row of -inf goes through the softmax as
# NaN, and the NaN reaches every gradient. attnkit's layers give 0 there.

# %%
empty = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
with torch.no_grad():
    print(v4(x3, empty)[0])
    logits = (x3[:1] @ x3[:1].transpose(1, 2)).masked_fill(empty[:1, None, :] == 0, float("-inf"))
    print(torch.softmax(logits, -1)[0, 0])

# %% [markdown]
# ## Heads, causality and a cache
#
# The same layer with several heads, a causal mask and grouped K/V heads is a decoder
# block; with a `KVCache` it decodes one token at a time and matches the full forward.

# %%
decoder = SelfAttention(16, num_heads=4, causal=True, num_kv_heads=2).eval()
tokens = torch.randn(1, 6, 16)
cache = decoder.new_cache(batch_size=1, max_len=8)
with torch.no_grad():
    steps = [decoder(tokens[:, i : i + 1], cache=cache) for i in range(6)]
    print(torch.allclose(torch.cat(steps, 1), decoder(tokens), atol=1e-5))
