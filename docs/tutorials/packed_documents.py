# %% [markdown]
# # Packed documents with sliding windows on a long sequence
#
# Training on many short documents wastes compute when each is padded to the longest.
# The usual fix is packing: the documents are laid end to end in one long sequence, and
# the attention mask keeps every token inside its own document. Long-context models
# add a sliding window on top (Mistral, Gemma 2): a token sees only the last few
# hundred tokens of its document. This tutorial builds that mask from three symbolic
# pieces, checks it against attention run on each document alone, and shows what it
# costs at 4,096 tokens on a CPU.

# %%
# %matplotlib inline
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks

_ = torch.manual_seed(0)  # the same numbers on every run

# %% [markdown]
# ## The mask, from three pieces
#
# - `masks.document(lengths=[...])`: a query sees only keys of its own document;
# - `masks.causal()`: and only keys at or before its own position;
# - `masks.window(left)`: and only the `left` keys before it (plus itself).
#
# `&` keeps a key only where every piece keeps it. Every mask in attnkit speaks one
# polarity: it says which keys a query **may** attend to. Nothing here is a tensor of
# size L×S: the pieces stay symbolic, and the backends compute them tile by tile.
# `to_dense` draws one, for a picture.

# %%
small = masks.document(lengths=[10, 20, 18]) & masks.causal() & masks.window(6)
dense = small.to_dense(48, 48)  # (48, 48) bool, True = may attend
fig, ax = plt.subplots(figsize=(4, 4))
ax.imshow(dense, cmap="Blues")
ax.set_xlabel("key position")
ax.set_ylabel("query position")
ax.set_title("documents of 10, 20, 18 tokens\ncausal, window of 6")
plt.show()

# %% [markdown]
# Three triangles, one per document, each cut to a band of width 7 (six keys back and
# the token itself): a token never sees the previous document, however close it is.

# %% [markdown]
# ## A long packed batch
#
# Four heads, 4,096 tokens: three documents of 700, 1,300 and 2,096 tokens, a window
# of 256. `attnkit.explain` says which backend runs the call and why the others do not.

# %%
lengths = [700, 1300, 2096]
N, H, E, window = sum(lengths), 4, 32, 256
mask = masks.document(lengths=lengths) & masks.causal() & masks.window(window)
q, k, v = (torch.randn(1, H, N, E) for _ in range(3))  # (B, H, N, E)
print(attnkit.explain(q, k, v, mask=mask))

# %% [markdown]
# The chunked backend keeps the mask symbolic: it visits only the tiles the band
# touches inside each document, and skips the rest without computing them.
#
# ## Exact, against each document alone
#
# Packing must not change a number: each document's output must equal attention run
# on that document by itself, with a causal sliding window of the same width.

# %%
out = attnkit.attention(q, k, v, mask=mask)  # (1, H, N, E)

pieces, start = [], 0
for n in lengths:
    part = slice(start, start + n)
    alone = masks.causal() & masks.window(window)
    pieces.append(attnkit.attention(q[..., part, :], k[..., part, :], v[..., part, :], mask=alone))
    start += n
one_by_one = torch.cat(pieces, dim=-2)  # (1, H, N, E)
error = (out - one_by_one).abs().max() / one_by_one.abs().max()
print(f"largest difference, relative to the output's scale: {error:.1e}")
assert error < 1e-5

# %% [markdown]
# ## What the dense way costs
#
# The same call with SDPA needs the mask as a dense (N, N) tensor: 16 M booleans here,
# and four times as many at 8,192 tokens. It also computes every one of the N² scores,
# though the band keeps only a few percent of them.

# %%
dense_mask = mask.to_dense(N, N)  # (N, N) bool
kept = dense_mask.float().mean().item()
print(f"dense mask: {dense_mask.numel() / 2**20:.0f} M entries, {kept:.1%} of them kept")


def best_of(fn, repeats=3):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


t_attnkit = best_of(lambda: attnkit.attention(q, k, v, mask=mask))
t_dense = best_of(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask))
print(f"attnkit, symbolic mask: {t_attnkit * 1e3:.0f} ms")
print(f"SDPA, dense mask:       {t_dense * 1e3:.0f} ms")
sdpa_out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask)
print(f"same output: {torch.allclose(out, sdpa_out, rtol=1e-4, atol=1e-5)}")

# %% [markdown]
# (The times depend on the machine; [Performance](../guides/performance.html) has
# measured tables.)
#
# ## Training through it
#
# Gradients take the same path: the backward recomputes each tile's weights from the
# saved log-sum-exp, so nothing of size N×N is kept for it either.

# %%
q.requires_grad_(True)
loss = attnkit.attention(q, k, v, mask=mask).square().mean()
loss.backward()
print(q.grad.shape, bool(torch.isfinite(q.grad).all()))

# %% [markdown]
# ## Documents that start anywhere
#
# With per-token document ids instead of lengths (`masks.document(ids)`), the
# documents need not be contiguous: ids `[0, 0, 1, 1, 0]` put the fifth token back in
# the first document. A batch holds one row of ids per sequence.

# %%
ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 0, 0, 2, 2, 2]])  # (B, N)
spread = masks.document(ids) & masks.causal()
fig, ax = plt.subplots(figsize=(3, 3))
ax.imshow(spread.to_dense(12, 12, (1,))[0], cmap="Blues")
ax.set_title("ids 0 0 0 1 1 1 1 0 0 2 2 2, causal")
plt.show()
