"""Where the viewer's attention comes from: every model behind one :class:`Source` protocol.

- :class:`Source`: the protocol (sizes before a model is built, ``load``,
  ``attend`` with streaming capture, what explain attributes); :class:`TextSource`
  adds the tokenizer's facts (positions, special tokens, vocabulary).
- :func:`open_source`: the source of a checkpoint folder, the default
  checkpoint or a model in memory; ``attnkit show`` and :func:`attnkit.viz.show`
  both resolve their model here.
- :class:`BertSource` (attnkit's own encoder), :class:`TransformersSource` (any
  other local checkpoint), :class:`ModelSource` (a transformers model in memory).
- :func:`open_image_source`: a vision transformer (folder, or a model and its
  processor) as an :class:`ImageSource`, whose input is a picture.
- The runs behind ``attend``: :mod:`.text_run` (a transformers model, one forward or a
  generation), :mod:`.bert_run` (attnkit's BERT), :mod:`.image_run` (a vision
  transformer), each with the streaming capture of :mod:`.streaming`. The models
  themselves (checked and built) live in :mod:`attnkit.models`, which imports nothing
  from the viewer.

Nothing here imports :mod:`attnkit.commands`: errors are the models' own
(``CheckpointError``, ``ConfigError``) or :class:`SourceError`, and the command
line words them with its flags.
"""

from __future__ import annotations

from .base import Source, SourceError, TextSource
from .checkpoint import BertSource, TransformersSource
from .image import ImageSource, open_image_source
from .module import ModelSource, hf_kind
from .resolve import open_source

__all__ = [
    "BertSource",
    "ImageSource",
    "ModelSource",
    "Source",
    "SourceError",
    "TextSource",
    "TransformersSource",
    "hf_kind",
    "open_image_source",
    "open_source",
]
