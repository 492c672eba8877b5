"""The attention viewer built from Python for a Hugging Face transformers model.

``attnkit.viz.show(model, tokenizer, text)`` runs a transformers model on the text
with the same streaming capture as ``attnkit show``: each layer's exact weights
are reduced while the model runs, and the result is a :class:`attnkit.viz.Page`
(head, matrix, model, statistics, rollout and neuron views) that Jupyter shows
inline and ``.save(path)`` writes as one self-contained HTML file.

Here the model is a tiny GPT-2 with random weights built from a config, and the
tokenizer a word-level one built from a vocabulary written below, so nothing is
downloaded and the script runs offline in a few seconds. With a real checkpoint,
``AutoModelForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)``
take their place (or pass the folder itself: ``viz.show(DIR, None, text)``).
Needs ``pip install "attnkit[transformers]"``.

Run: ``python examples/viewer_for_a_transformers_model.py [OUT.html]``
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import attnkit

TEXT = "the animal did not cross the street because it was too tired"


def tiny_gpt2() -> tuple[Any, Any]:
    """A 3-layer, 4-head GPT-2 (random weights) and a word-level tokenizer for TEXT."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = sorted(set(TEXT.split()))
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words])}
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(vocab), n_embd=32, n_layer=3, n_head=4, n_positions=64,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # sharper heads, closer to a trained model's
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, : 2 * config.n_embd] *= 4
    words_only = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words_only.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words_only, unk_token="[UNK]", pad_token="[PAD]"
    )
    return model, tokenizer


def main(path: str | Path | None = None) -> dict[str, Any]:
    """Build the page for TEXT and write it to ``path`` (default: a temporary folder)."""
    model, tokenizer = tiny_gpt2()
    page = attnkit.viz.show(model, tokenizer, TEXT, title="A tiny GPT-2 on one sentence")
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="attnkit-viewer-")) / "gpt2.html"
    written = page.save(path)
    size = written.stat().st_size
    print(f"wrote {written} ({size:,} bytes): open it in a browser")
    return {"path": written, "bytes": size, "tokens": len(TEXT.split())}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
