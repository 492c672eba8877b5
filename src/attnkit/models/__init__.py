"""Real checkpoints built from attnkit attention, read from local files only.

``attnkit.models.bert.load()`` gives all-MiniLM-L6-v2 (the default checkpoint);
``load(path)`` any local BERT-family checkpoint directory.
"""

from . import bert

__all__ = ["bert"]
