"""Vision transformers from local transformers checkpoints: a picture's attention, offline.

The families below compute their attention through transformers'
``AttentionInterface`` on every supported transformers version, so each layer's
exact weights reach attnkit (``attn_implementation="attnkit"``, streaming
capture, as for text models in :mod:`attnkit.models.hf`). Their tokens are a
few non-patch tokens, then the patches row by row (:class:`~attnkit.viz.image.ImageLayout`).

=========================  ===========================  ============================
family                     ``model_type``               non-patch tokens
=========================  ===========================  ============================
ViT (and DINO v1)          ``vit``                      ``[CLS]``
DeiT (distilled)           ``deit``                     ``[CLS]``, ``[DIST]``
DINOv2                     ``dinov2``                   ``[CLS]``
DINOv2 with registers      ``dinov2_with_registers``    ``[CLS]``, ``[REG0]`` ...
DINOv3                     ``dinov3_vit``               ``[CLS]``, ``[REG0]`` ...
ViT-MSN                    ``vit_msn``                  ``[CLS]``
I-JEPA                     ``ijepa``                    none
=========================  ===========================  ============================

Others are refused with the reason (:data:`NOT_SUPPORTED`). Pictures are
prepared from the checkpoint's ``preprocessor_config.json``
(:mod:`attnkit.models.image_input`). Nothing is downloaded and no code from the
folder runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..viz.image import ImageLayout, ImageSetReducer
from ..viz.reduce import Budget, ReducedSet
from ..viz.stream import Progress, Router
from .config_json import ConfigError
from .hf import CheckpointError, _first_line, _int_field, read_checkpoint_config
from .hf_run import _forward
from .image_input import ImageInput, read_image_input
from .weights import HeaderError, layer_counts, read_shapes, safetensors_files

__all__ = [
    "FAMILIES",
    "NOT_SUPPORTED",
    "ImageCheckpoint",
    "ImageRun",
    "VisionFamily",
    "attend_image",
    "attend_model",
    "family_of",
    "image_input_of",
    "supported_families",
]


@dataclass(frozen=True)
class VisionFamily:
    """A family of vision transformers whose tokens lie on a patch grid.

    Attributes:
        name: the family's usual name.
        cls: a ``[CLS]`` token comes first.
        distillation: DeiT's distillation token ``[DIST]`` follows ``[CLS]``.
        registers: ``config.num_register_tokens`` register tokens follow ``[CLS]``.
    """

    name: str
    cls: bool = True
    distillation: bool = False
    registers: bool = False

    def prefix(self, config: Any) -> tuple[str, ...]:
        """The labels of the non-patch tokens, in the order the model puts them first."""
        out = ["[CLS]"] if self.cls else []
        if self.distillation:
            out.append("[DIST]")
        if self.registers:
            n = getattr(config, "num_register_tokens", 0) or 0
            out += [f"[REG{i}]" for i in range(int(n))]
        return tuple(out)


FAMILIES: dict[str, VisionFamily] = {
    "vit": VisionFamily("ViT"),  # DINO (v1) checkpoints are ViT ones
    "deit": VisionFamily("DeiT", distillation=True),
    "dinov2": VisionFamily("DINOv2"),
    "dinov2_with_registers": VisionFamily("DINOv2 with registers", registers=True),
    "dinov3_vit": VisionFamily("DINOv3", registers=True),
    "vit_msn": VisionFamily("ViT-MSN"),
    "ijepa": VisionFamily("I-JEPA", cls=False),
}
"""Supported ``model_type`` values."""

_BIAS_IN_MASK = (
    "its relative position bias is added to the attention mask, which attnkit's "
    "transformers integration does not take yet"
)
NOT_SUPPORTED: dict[str, str] = {
    "swin": "it attends within shifted windows, not over one grid of patches",
    "swinv2": "it attends within shifted windows, not over one grid of patches",
    "beit": _BIAS_IN_MASK,
    "data2vec-vision": _BIAS_IN_MASK,
    "vit_mae": "it shuffles and drops patches at random",
}
"""Vision families that are refused, and why."""


def supported_families() -> str:
    """``ViT (vit, also DINO v1), DeiT (deit), ...`` for messages."""
    parts = [f"{f.name} ({t}{', also DINO v1' if t == 'vit' else ''})" for t, f in FAMILIES.items()]
    return ", ".join(parts)


def family_of(model_type: Any, where: str) -> VisionFamily:
    """The family of a ``model_type``; CheckpointError saying why and what is supported."""
    family = FAMILIES.get(str(model_type))
    if family is not None:
        return family
    why = NOT_SUPPORTED.get(str(model_type))
    what = (
        f"a {model_type!r} model is not supported: {why}"
        if why
        else f"a {model_type!r} model is not a vision transformer attnkit reads"
    )
    raise CheckpointError(f"{where}: {what}; supported: {supported_families()}")


def _patch_size(config: Any, where: str) -> tuple[int, int]:
    value = getattr(config, "patch_size", None)
    sides = list(value) if isinstance(value, (list, tuple)) else [value, value]
    ok = [s for s in sides if isinstance(s, int) and not isinstance(s, bool) and s >= 1]
    if len(sides) != 2 or len(ok) != 2:
        raise CheckpointError(f"{where}: patch_size must be a positive integer, got {value!r}")
    return ok[0], ok[1]


@dataclass
class ImageRun:
    """The attention of one picture, ready for :func:`attnkit.viz.to_html` (``image=layout``).

    Attributes:
        sets: one reduced set (the encoder's self-attention).
        tokens: the token labels (non-patch tokens, then ``p(r,c)``).
        layout: where each token lies on the picture the model saw.
        notes: facts about the run for the page.
    """

    sets: list[ReducedSet]
    tokens: list[str]
    layout: ImageLayout
    notes: list[str] = field(default_factory=list)


def attend_image(
    model: nn.Module,
    image_input: ImageInput,
    image: Any,
    *,
    prefix: Sequence[str],
    patch: tuple[int, int],
    n_layers: int,
    n_heads: int,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: Budget | None = None,
) -> ImageRun:
    """Run a vision transformer once on a picture and reduce its attention.

    Args:
        model: a transformers vision model (eval mode), base or with a task head.
        image_input: how the checkpoint prepares a picture.
        image: an RGB ``PIL.Image``.
        prefix: labels of the non-patch tokens (see :class:`VisionFamily`).
        patch: (height, width) of a patch in pixels.
        n_layers, n_heads: the model's layers and heads.
        layers, heads: what to show (default all).
        budget: what the page keeps.
    """
    picture = image_input.picture(image)  # (H, W, 3) uint8
    H, W = picture.shape[:2]
    rows, cols = H // patch[0], W // patch[1]
    if rows < 1 or cols < 1:
        raise ValueError(
            f"image: the model's input is {H} × {W} px, smaller than one {patch[0]} × "
            f"{patch[1]} px patch; check preprocessor_config.json"
        )
    layout = ImageLayout(picture, rows, cols, patch, tuple(prefix))
    L = layout.n_tokens
    reducer = ImageSetReducer(
        "self-attention",
        n_layers,
        n_heads,
        L,
        L,
        prefix=len(prefix),
        layers=layers,
        heads=heads,
        budget=budget,
    )
    inputs: dict[str, Any] = {"pixel_values": image_input.pixels(picture)}  # (1, 3, H, W)
    size = getattr(model.config, "image_size", None)
    trained = (size, size) if isinstance(size, int) else tuple(size) if size else None
    takes = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    if takes and trained != (H, W):
        inputs["interpolate_pos_encoding"] = True  # a position table made for another size
    progress = Progress(n_layers, "layer")
    router = Router({"self": reducer}, progress=progress)
    try:
        _forward(model, router, **inputs)
    except ValueError as exc:
        if "do not fit" not in str(exc):
            raise
        raise ValueError(
            f"the model's attention is not over {layout.describe()} "
            f"({L} tokens): {_first_line(exc)}"
        ) from None
    finally:
        progress.close()
    s = reducer.finish()
    s.tokens = layout.tokens()
    return ImageRun([s], s.tokens, reducer.finish_layout(layout, s))


class ImageCheckpoint:
    """A local vision transformer checkpoint, checked on construction, loaded on first use.

    The directory holds ``config.json`` (a family of :data:`FAMILIES`),
    ``model.safetensors`` (or shards) and ``preprocessor_config.json``.

    Attributes:
        directory, name: the folder and its name.
        family: the :class:`VisionFamily`.
        num_layers, num_heads: the encoder's layers and heads.
        patch: a patch's (height, width) in pixels.
        prefix: labels of the non-patch tokens.
        image_input: how a picture is prepared.
    """

    kind = "vision encoder"

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.name = self.directory.name
        where = str(self.directory)
        data = read_checkpoint_config(self.directory)
        config_path = self.directory / "config.json"
        self.family = family_of(data.get("model_type", "unknown"), where)
        try:
            self.image_input = read_image_input(self.directory)
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from None
        try:
            files = safetensors_files(self.directory)
            shapes: dict[str, tuple[int, ...]] = {}
            for f in files:
                shapes.update(read_shapes(f))
        except HeaderError as exc:
            raise CheckpointError(str(exc)) from None
        if not files:
            raise CheckpointError(
                f"{where}: missing model.safetensors (or a sharded model.safetensors.index.json)"
            )
        try:
            from transformers import AutoConfig
        except ImportError:
            raise CheckpointError(
                f"{where}: a vision transformer needs the package transformers "
                "(pip install 'transformers>=5', attnkit's `transformers` extra)"
            ) from None
        try:
            self.config = AutoConfig.from_pretrained(
                where, local_files_only=True, trust_remote_code=False
            )
        except Exception as exc:  # transformers raises many types for a bad config
            raise CheckpointError(
                f"{config_path}: transformers cannot read it ({_first_line(exc)})"
            ) from None
        layers = _int_field(self.config, ("num_hidden_layers",))
        heads = _int_field(self.config, ("num_attention_heads",))
        if layers is None or heads is None or layers < 1 or heads < 1 or heads > 4096:
            raise CheckpointError(
                f"{config_path}: expected positive layer and head counts, got "
                f"num_hidden_layers {layers!r}, num_attention_heads {heads!r}"
            )
        held = sorted(set(layer_counts(list(shapes)).values()))
        if layers not in held:
            said = ", ".join(map(str, held)) or "no numbered layers"
            raise CheckpointError(
                f"{config_path}: num_hidden_layers is {layers} but the weights hold stacks of {said}"
            )
        self.num_layers, self.num_heads = layers, heads
        self.patch = _patch_size(self.config, str(config_path))
        self.prefix = self.family.prefix(self.config)
        self._model: Any = None
        self._head = False  # the built model has its classification head

    def load(self, *, head: bool = False) -> None:
        """Build the model (eager attention, eval mode); idempotent.

        Args:
            head: build it with its image classification head (its config names a
                ``...ForImageClassification``), which :func:`attnkit.viz.explain_image`
                attributes; the page's forward runs its encoder as it runs the base model's,
                so one model serves both.
        """
        if self._model is not None and (self._head or not head):
            return
        import transformers
        from transformers import AutoModel, AutoModelForImageClassification

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        auto: Any = AutoModelForImageClassification if head else AutoModel
        try:
            self._model = auto.from_pretrained(
                str(self.directory),
                local_files_only=True,
                attn_implementation="eager",
                trust_remote_code=False,
            ).eval()
        except Exception as exc:  # shapes, missing keys, unsupported architectures
            raise CheckpointError(
                f"{self.directory}: transformers cannot load it ({_first_line(exc)})"
            ) from None
        self._head = head

    @property
    def model(self) -> nn.Module:
        """The built model (see :meth:`load`)."""
        self.load()
        return self._model

    def attend(
        self,
        image: Any,
        *,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        budget: Budget | None = None,
    ) -> ImageRun:
        """Run the model on a picture (an RGB ``PIL.Image``) and reduce its attention."""
        return attend_image(
            self.model,
            self.image_input,
            image,
            prefix=self.prefix,
            patch=self.patch,
            n_layers=self.num_layers,
            n_heads=self.num_heads,
            layers=layers,
            heads=heads,
            budget=budget,
        )


def image_input_of(processor: Any) -> ImageInput:
    """An :class:`ImageInput` from a checkpoint folder, a ``preprocessor_config.json`` dict,
    a transformers image processor (its ``to_dict()``), or an ImageInput itself."""
    if isinstance(processor, ImageInput):
        return processor
    if isinstance(processor, (str, Path)):
        return read_image_input(Path(processor))
    if isinstance(processor, dict):
        return ImageInput.from_config(processor, "processor")
    to_dict = getattr(processor, "to_dict", None)
    if callable(to_dict):
        return ImageInput.from_config(to_dict(), type(processor).__name__)
    raise TypeError(
        "processor: expected the checkpoint folder, its preprocessor_config.json as a dict, or "
        f"a transformers image processor, got {type(processor).__name__}"
    )


def attend_model(
    model: nn.Module,
    image: Any,
    processor: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: Budget | None = None,
) -> ImageRun:
    """:func:`attend_image` for a transformers vision model you hold (family from its config)."""
    cfg = getattr(model, "config", None)
    family = family_of(getattr(cfg, "model_type", type(model).__name__), "model")
    if processor is None:
        raise TypeError(
            "processor: a vision model needs how its pictures are prepared: the checkpoint "
            "folder, or its image processor"
        )
    n_layers = int(getattr(cfg, "num_hidden_layers", 0))
    n_heads = int(getattr(cfg, "num_attention_heads", 0))
    model.eval()
    return attend_image(
        model,
        image_input_of(processor),
        image,
        prefix=family.prefix(cfg),
        patch=_patch_size(cfg, "model.config"),
        n_layers=n_layers,
        n_heads=n_heads,
        layers=layers,
        heads=heads,
        budget=budget,
    )
