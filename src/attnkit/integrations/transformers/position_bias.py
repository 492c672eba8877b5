"""T5's ``position_bias`` as an attnkit score modifier instead of an (B, H, L, S) tensor.

T5 (and the models built on its attention: mT5, UMT5, ...) passes the attention
function a dense ``position_bias``. The first layer of a stack computes it from
its ``relative_attention_bias`` table (an ``nn.Embedding`` of shape
(num_buckets, heads)) and the following layers receive the same tensor object;
a module without a table (T5's cross-attention) passes zeros.

:func:`position_bias_mod` turns that into :func:`attnkit.mods.relative_position_bias`
over the module's own table (so the table gets its gradient through attnkit), and
remembers the answer for that tensor object, so the later layers of the stack,
given the same object, reuse it without reading the tensor. Zeros become no
modifier. Any other bias is kept as it is, as an additive ``masks.bias``: the
modifier stands in for the tensor only where the module's table, read as T5 reads
it, gives that tensor (checked once per tensor), so a module that looks like T5's
but buckets or adds otherwise (Pix2Struct's one-way decoder, UDOP's layout bias)
keeps its own bias.
"""

from __future__ import annotations

import functools
import weakref

import torch
from torch import nn

from ... import masks, mods
from ...masks.bands import Offset

__all__ = ["position_bias_mod"]

# id(position_bias) -> (a weak reference to it, its version then, its modifier or None
# for zeros): an in-place edit of the bias is read again
_SEEN: dict[int, tuple[weakref.ref[torch.Tensor], int, mods.Mod | None]] = {}


def _forget(key: int, _ref: object) -> None:
    _SEEN.pop(key, None)


def _table_mod(module: nn.Module, q0: int, k0: int) -> mods.Mod | None:
    """The relative position bias of a T5-style module with its own table, else None."""
    table = getattr(module, "relative_attention_bias", None)
    if not getattr(module, "has_relative_attention_bias", False) or not isinstance(
        table, nn.Embedding
    ):
        return None
    buckets = getattr(module, "relative_attention_num_buckets", None)
    distance = getattr(module, "relative_attention_max_distance", None)
    if not isinstance(buckets, int) or not isinstance(distance, int):
        return None
    bidirectional = not bool(getattr(module, "is_decoder", False))
    try:
        return mods.relative_position_bias(
            table.weight, buckets, distance, bidirectional, q_offset=q0, k_offset=k0
        )
    except (TypeError, ValueError):  # settings T5's bucketing cannot take: the model's bias
        return None


def _made_by(mod: mods.Mod, bias: torch.Tensor) -> bool:
    """Whether ``bias`` (1 or B, H, L, S) is the bias ``mod`` makes: a module that looks
    like T5's (a table, buckets, a distance) may bucket otherwise (one way without an
    ``is_decoder`` flag: Pix2Struct's text decoder) or add more to the table's bias
    (UDOP's layout distances); read once per bias tensor."""
    H, L, S = bias.shape[-3:]
    with torch.no_grad():
        zeros = bias.new_zeros((1, H, L, S))  # (1, H, L, S)
        made = mod.logits(zeros, L, S)  # (1, H, L, S)
        scale = float(bias.abs().amax()) if bias.numel() else 0.0
        return (
            bool((made - bias).abs().amax() <= 1e-6 * max(scale, 1e-30))
            if scale
            else (not bool(made.any()))
        )


def position_bias_mod(
    module: nn.Module, position_bias: torch.Tensor, S: int, q0: Offset, k0: Offset
) -> tuple[mods.Mod | None, masks.Mask | None]:
    """The modifier (or, failing that, the additive mask) for a call's ``position_bias``.

    Args:
        module: the attention module that made the call.
        position_bias: (1 or B, H, L, >= S) float, what the model passed.
        S: the call's number of keys.
        q0, k0: global positions of the call's first query and key (0-d tensors from a
            mask prepared for a compiled forward, read here). Inside torch.compile the
            bias is kept as the tensor it is (no value is read there).

    Returns:
        (modifier, None) for a table-made bias or zeros (modifier None), else
        (None, ``masks.bias`` of the tensor).
    """
    if torch.compiler.is_compiling():  # (reading the bias would break the graph)
        return None, masks.bias(position_bias[..., :S])  # (1 or B, H, L, S)
    if isinstance(q0, torch.Tensor) or isinstance(k0, torch.Tensor):
        q0, k0 = int(q0), int(k0)
    key = id(position_bias)
    # (an inference-mode tensor keeps no version: read once, as made in that forward)
    version = -1 if position_bias.is_inference() else position_bias._version
    seen = _SEEN.get(key)
    if seen is not None and seen[0]() is position_bias and seen[1] == version:
        return seen[2], None
    mod = _table_mod(module, q0, k0)
    if mod is not None and not _made_by(mod, position_bias[..., :S]):
        return None, masks.bias(position_bias[..., :S])  # (1 or B, H, L, S)
    if mod is None:
        with torch.no_grad():
            zero = not bool(position_bias.any())
        if not zero:
            return None, masks.bias(position_bias[..., :S])  # (1 or B, H, L, S)
    ref = weakref.ref(position_bias, functools.partial(_forget, key))
    _SEEN[key] = (ref, version, mod)
    return mod, None
