# %% [markdown]
# # Masked softmax, additive and dot-product attention, Nadaraya–Watson
#
# Attention as d2l teaches it: a softmax that ignores padded positions, two scoring
# layers, and the oldest attention of all, Nadaraya–Watson kernel regression, fitted
# to noisy data and drawn as heatmaps.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import torch

import attnkit
from attnkit import masks
from attnkit.nn import AdditiveAttention, DotProductAttention, NadarayaWatson

_ = torch.manual_seed(0)  # the same numbers on every run

# %% [markdown]
# ## The masked softmax
#
# `valid_lens` gives, per sequence (B,) or per query (B, L), how many keys are real.
# The softmax of logits X over the first `valid_len` keys is the weights of an
# attention call whose logits are X: a dot score of zero queries and keys (every
# product 0), with X as an additive bias.


# %%
def masked_softmax(X, valid_lens):
    B, L, S = X.shape
    zeros_q, zeros_k = X.new_zeros(B, L, 1), X.new_zeros(B, S, 1)
    mask = masks.bias(X) & masks.valid_lens(valid_lens)
    _, w = attnkit.attention(
        zeros_q, zeros_k, X.new_zeros(B, S, 1), score="dot", mask=mask, return_weights=True
    )
    return w


X = torch.rand(2, 2, 4)
print(masked_softmax(X, torch.tensor([2, 3])).round(decimals=4))
print(masked_softmax(X, torch.tensor([[1, 3], [2, 4]])).round(decimals=4))

# %% [markdown]
# ## Additive attention
#
# Queries of 20 features, keys of 2, a hidden layer of 8: w_vᵀ tanh(W_q q + W_k k).
# With identical keys every valid key scores the same, so the weights are uniform over
# the valid ones and the output is the mean of the valid values.

# %%
queries, keys = torch.normal(0, 1, (2, 1, 20)), torch.ones((2, 10, 2))
values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
valid_lens = torch.tensor([2, 6])
additive = AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1).eval()
print(additive(queries, keys, values, valid_lens))


def show_heatmaps(matrices, title):
    """d2l's show_heatmaps: a grid of (rows, columns, queries, keys) weight matrices.

    attnkit.viz.heatmaps returns a matplotlib Figure without opening a window; a
    notebook draws it when it is a cell's last value.
    """
    fig = attnkit.viz.heatmaps(matrices, xlabel="Keys", ylabel="Queries")
    fig.suptitle(title)
    return fig


show_heatmaps(additive.attention_weights.reshape(1, 1, 2, 10), "additive attention")

# %% [markdown]
# ## Scaled dot-product attention
#
# When queries and keys have the same size, their scaled dot product needs no
# parameters.

# %%
dot = DotProductAttention(dropout=0.5).eval()
print(dot(torch.normal(0, 1, (2, 1, 2)), keys, values, valid_lens))
show_heatmaps(dot.attention_weights.reshape(1, 1, 2, 10), "dot-product attention")

# %% [markdown]
# ## Nadaraya–Watson kernel regression
#
# Predict y at x by averaging the observed yᵢ, weighted by how close xᵢ is to x: the
# weights are a softmax of −(x − xᵢ)²/2. Three observations: at 57, the prediction is
# halfway between the two close neighbours' values.

# %%
model = NadarayaWatson("gaussian", sigma=1.0)
print(
    model(torch.tensor([57.0]), torch.tensor([51.0, 56.0, 58.0]), torch.tensor([40.0, 43.0, 48.0]))
)
print(model.attention_weights)

# %% [markdown]
# Fifty noisy samples of f(x) = 2 sin(x) + x^0.8. With the bandwidth fixed at 1 the
# fit is smooth and flattens the curve's bends; a learnable bandwidth, trained on each
# point's prediction from the other 49 (so that no point can simply copy itself),
# shrinks: the fit follows the bends, and the noise a little more too, and each test
# point's weights gather on fewer samples.


# %%
def f(x):
    return 2 * torch.sin(x) + x**0.8


n = 50
x_train = torch.sort(torch.rand(n) * 5).values
y_train = f(x_train) + torch.normal(0.0, 0.5, (n,))
x_test = torch.arange(0, 5, 0.1)

fixed = NadarayaWatson("gaussian", sigma=1.0)
y_fixed = fixed(x_test, x_train, y_train)
fixed_weights = fixed.attention_weights

learned = NadarayaWatson("gaussian", sigma=1.0, learnable=True)
others = ~torch.eye(n, dtype=torch.bool)
keys_loo = x_train.repeat(n, 1)[others].reshape(n, n - 1)  # each point's neighbours
values_loo = y_train.repeat(n, 1)[others].reshape(n, n - 1)
optimizer = torch.optim.SGD(learned.parameters(), lr=0.01)
for _ in range(20):
    optimizer.zero_grad()
    loss = ((learned(x_train, keys_loo, values_loo) - y_train) ** 2).sum() / 2
    loss.backward()
    optimizer.step()
print("bandwidth after training:", [p.item() for p in learned.parameters()])
with torch.no_grad():
    y_learned = learned(x_test, x_train, y_train)

plt.plot(x_test, f(x_test), label="truth")
plt.plot(x_test, y_fixed, label="fixed bandwidth")
plt.plot(x_test, y_learned, label="learned bandwidth")
plt.plot(x_train, y_train, "o", alpha=0.5, label="samples")
plt.legend()
plt.show()

# %% [markdown]
# The weights of every test point (rows) over the training samples (columns, sorted
# by x): a broad band with the fixed bandwidth, a narrow one once it is learned.

# %%
show_heatmaps(
    torch.stack([fixed_weights, learned.attention_weights])[None],
    "weights of each test point over the samples",
)
