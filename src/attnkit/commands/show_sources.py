"""The checkpoints ``attnkit show`` reads, through :mod:`attnkit.viz.sources`.

The sources themselves (attnkit's own BERT encoder, or transformers) live in
:mod:`attnkit.viz.sources`, shared with :func:`attnkit.viz.show`; here their
errors become one line naming ``--model``.
"""

from __future__ import annotations

from typing import Any

from ..models.config_json import ConfigError
from ..viz.sources import BertSource, TransformersSource
from ..viz.sources import open_source as _open
from .show_args import UsageError

__all__ = ["BertSource", "TransformersSource", "open_source"]


def open_source(path: str | None) -> Any:
    """The checkpoint, checked (config against weights) but not built.

    Raises:
        UsageError: a folder that is not a checkpoint (prefixed ``--model:`` when
            ``path`` was given).
    """
    from ..models import bert, hf

    where = "--model: " if path is not None else ""
    try:
        return _open(path)
    except ConfigError as exc:
        raise UsageError(f"--model: {exc}") from None
    except (bert.CheckpointError, hf.CheckpointError) as exc:
        raise UsageError(f"{where}{exc}") from None
