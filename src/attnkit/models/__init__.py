"""Real checkpoints and their attention, read from local files only.

- :mod:`attnkit.models.bert`: BERT-family encoders on attnkit's own attention;
  ``bert.load()`` gives all-MiniLM-L6-v2 (the default checkpoint), ``load(path)``
  any local BERT-family checkpoint directory.
- :mod:`attnkit.models.hf`: any other local Hugging Face checkpoint (encoders,
  decoders, encoder-decoders) through transformers with eager attention.
- :mod:`attnkit.models.weights`: a checkpoint's tensor shapes from its
  safetensors headers, to check a config before building anything.

``hf`` is imported on first use: it needs the optional transformers package.
"""

from . import bert

__all__ = ["bert"]
