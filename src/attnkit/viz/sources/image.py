"""A vision transformer as a source: its input is a picture, its tokens the picture's patches.

:func:`open_image_source` resolves a checkpoint folder
(:class:`~attnkit.models.hf_vision.ImageCheckpoint`) or a transformers vision model
you hold with its processor; ``attnkit show --image`` and
:func:`attnkit.viz.show_image` both go through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ImageSource", "open_image_source"]


class ImageSource:
    """A vision transformer (ViT, DeiT, DINOv2, ...) and how its pictures are prepared.

    Made by :func:`open_image_source`. It has the :class:`~.base.Source` protocol's
    sizes, ``load``, ``attend`` and ``explain_model``; the tokenizer's methods
    (``content_tokens``, ``vocabulary``) belong to text sources only.

    Attributes:
        name: the folder's name, or the model's class name.
        kind: ``"vision encoder"``.
        num_layers, num_heads: the encoder's layers and heads per layer.
        checkpoint: the :class:`~attnkit.models.hf_vision.ImageCheckpoint`, or None for
            a model you hold.
    """

    kind = "vision encoder"

    def __init__(self, checkpoint: Any = None, model: Any = None, processor: Any = None) -> None:
        self.checkpoint = checkpoint
        self.model = model
        self.processor = processor
        if checkpoint is not None:
            self.name = checkpoint.name
            self.num_layers, self.num_heads = checkpoint.num_layers, checkpoint.num_heads
        else:
            cfg = getattr(model, "config", None)
            self.name = type(model).__name__
            self.num_layers = int(getattr(cfg, "num_hidden_layers", 0))
            self.num_heads = int(getattr(cfg, "num_attention_heads", 0))

    @property
    def family(self) -> Any:
        """The checkpoint's :class:`~attnkit.models.hf_vision.VisionFamily`; None for a model
        you hold."""
        return None if self.checkpoint is None else self.checkpoint.family

    def load(self, generate: bool = False, head: bool = False) -> None:
        """Build the checkpoint's model (once); ``head``: with its image classification
        head, which :func:`attnkit.viz.explain_image` attributes, so the weights are read
        once. A model you hold is built already."""
        if self.checkpoint is not None:
            self.checkpoint.load(head=head)

    def explain_model(self, directory: Path) -> tuple[Any, Any]:
        """What ``--explain`` attributes: the checkpoint (its model built by :meth:`load`),
        and no tokenizer."""
        return self.checkpoint, None

    def attend(
        self,
        picture: Any,
        pair: None = None,
        *,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        budget: Any = None,
    ) -> Any:
        """Run the model on an RGB ``PIL.Image`` and reduce its attention.

        Args:
            picture: the picture (prepared as the checkpoint prepares its own).
            pair: None (a picture has no second sentence).
            layers, heads: what to show (default all), increasing.
            budget: what the page keeps (:class:`~attnkit.viz.reduce.Budget`).

        Returns:
            An :class:`~attnkit.viz.sources.image_run.ImageRun`: the sets (per layer × head,
            (T, T) over the T = prefix + patch tokens), the tokens and the layout.
        """
        from .image_run import attend_checkpoint, attend_model

        if self.checkpoint is not None:
            return attend_checkpoint(
                self.checkpoint, picture, layers=layers, heads=heads, budget=budget
            )
        return attend_model(
            self.model, picture, self.processor, layers=layers, heads=heads, budget=budget
        )


def open_image_source(model: str | Path | Any, processor: Any = None) -> ImageSource:
    """The source of a vision transformer: checked, not built.

    Args:
        model: a checkpoint folder (str or Path) of a family
            :mod:`attnkit.models.hf_vision` supports, or a transformers vision model.
        processor: for a model you hold, how its pictures are prepared (its folder,
            its image processor or its ``preprocessor_config.json`` as a dict); None
            for a folder, which brings its own.

    Raises:
        TypeError: a processor with a folder.
        attnkit.models.hf.CheckpointError: a folder that is not a supported vision
            checkpoint (one line).
    """
    from ...models import hf_vision

    if isinstance(model, (str, Path)):
        if processor is not None:
            raise TypeError("processor: a checkpoint folder brings its own; pass processor=None")
        return ImageSource(checkpoint=hf_vision.ImageCheckpoint(model))
    return ImageSource(model=model, processor=processor)
