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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .config_json import ConfigError
from .hf import CheckpointError, _int_field, first_line, read_checkpoint_config
from .image_input import ImageInput, read_image_input
from .weights import HeaderError, layer_counts, read_shapes, safetensors_files

__all__ = [
    "FAMILIES",
    "NOT_SUPPORTED",
    "ImageCheckpoint",
    "VisionFamily",
    "family_of",
    "image_input_of",
    "patch_size",
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


def patch_size(config: Any, where: str) -> tuple[int, int]:
    value = getattr(config, "patch_size", None)
    sides = list(value) if isinstance(value, (list, tuple)) else [value, value]
    ok = [s for s in sides if isinstance(s, int) and not isinstance(s, bool) and s >= 1]
    if len(sides) != 2 or len(ok) != 2:
        raise CheckpointError(f"{where}: patch_size must be a positive integer, got {value!r}")
    return ok[0], ok[1]


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
                f"{config_path}: transformers cannot read it ({first_line(exc)})"
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
        self.patch = patch_size(self.config, str(config_path))
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
                f"{self.directory}: transformers cannot load it ({first_line(exc)})"
            ) from None
        self._head = head

    @property
    def model(self) -> nn.Module:
        """The built model (see :meth:`load`)."""
        self.load()
        return self._model


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
