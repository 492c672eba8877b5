# %% [markdown]
# # Looking inside a transformers model
#
# A real checkpoint, all-MiniLM-L6-v2 (a 6-layer, 12-head BERT that ships with attnkit's
# `model` extra and loads offline), looked at three ways: the `attnkit show` command,
# transformers' own `output_attentions=True` with attnkit as the attention
# implementation, and the Python viewer inline in this notebook.

# %%
# %matplotlib inline
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import transformers
from transformers import AutoModel, AutoTokenizer

import attnkit.integrations.transformers  # noqa: F401  (registers attn_implementation="attnkit")
from attnkit import viz
from attnkit.models import bert

transformers.utils.logging.disable_progress_bar()  # (no loading bars in the outputs)
checkpoint = bert.default_checkpoint()  # the folder of the packaged checkpoint
text = "The animal didn't cross the street because it was too tired."

# %% [markdown]
# ## From the command line
#
# `attnkit show "TEXT"` runs the model, prints the most focused head of each layer, and
# writes a page (`--out`, default `attention.html`: every view) and a picture (`--png`,
# default `attention.png`: every head). `--model DIR` takes any transformers checkpoint
# folder; without it, this one.

# %%
out_dir = Path(tempfile.mkdtemp())
cmd = [sys.executable, "-m", "attnkit", "show", text, "--quiet",
       "--out", str(out_dir / "attention.html"), "--png", str(out_dir / "attention.png")]  # fmt: skip
result = subprocess.run(cmd, capture_output=True, text=True, check=True)
print(result.stdout)

# %%
picture = plt.imread(out_dir / "attention.png")
fig, ax = plt.subplots(figsize=(12, 6.5))
ax.imshow(picture)
ax.axis("off")
plt.show()

# %% [markdown]
# Each small square is one head: row = query token, column = key token. Layer 0's
# head 2 attends to the previous token; many later heads park their attention on the
# first token, `[CLS]` (an "attention sink").
#
# ## In Python: transformers on attnkit
#
# `attn_implementation="attnkit"` runs every attention of the model as one
# `attnkit.attention` call. Its outputs are those of transformers' own `sdpa` (the
# cell below compares them with `eager`, the implementation that returns weights), and
# `output_attentions=True` returns exact weights without falling back to the slow
# eager path.

# %%
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
batch = tokenizer(text, return_tensors="pt")
model = AutoModel.from_pretrained(checkpoint, attn_implementation="attnkit").eval()
reference = AutoModel.from_pretrained(checkpoint, attn_implementation="eager").eval()
with torch.no_grad():
    ours = model(**batch, output_attentions=True)
    theirs = reference(**batch, output_attentions=True)

hidden_gap = (ours.last_hidden_state - theirs.last_hidden_state).abs().max().item()
weight_gap = max(
    (a - b).abs().max().item() for a, b in zip(ours.attentions, theirs.attentions, strict=True)
)
print(f"{len(ours.attentions)} layers of weights, each {tuple(ours.attentions[0].shape)}")
print(f"largest difference from eager: hidden states {hidden_gap:.1e}, weights {weight_gap:.1e}")

# %% [markdown]
# ## What the heads do
#
# `viz.head_statistics` measures each head: the entropy of its rows (low = focused),
# the mean distance it looks back, and the pattern it matches best.

# %%
weights = torch.stack([a[0] for a in ours.attentions])  # (layers, heads, L, L)
tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
stats = viz.head_statistics(weights)
for layer in range(weights.shape[0]):
    head = int(torch.as_tensor(stats["entropy"][layer]).argmin())
    print(f"layer {layer}: head {head:2d} is the most focused: {stats['class'][layer][head]}")

# %%
# layer 0, heads 0-3, as d2l's show_heatmaps draws them: (rows, columns, L, L)
fig = viz.heatmaps(weights[:1, :4], titles=[f"head {h}" for h in range(4)], figsize=(12, 3.5),
                   xticklabels=tokens, yticklabels=tokens, fontsize=6)  # fmt: skip
plt.show()

# %% [markdown]
# ## The viewer, inline
#
# `viz.show(model, tokenizer, text)` builds the same page as `attnkit show` and shows it
# here: pick a layer and head, hover over a token to see where it looks, switch to the
# matrix, model, statistics, rollout and neuron views. The page is self-contained; it
# loads nothing from the network.

# %%
page = viz.show(model, tokenizer, text, progress=False)
page  # noqa: B018  (a notebook shows its last expression)
