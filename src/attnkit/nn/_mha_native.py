"""torch's fused multi-head attention op, taken where torch's own layer takes it.

``torch.nn.MultiheadAttention`` runs inference calls that meet its fast-path
conditions as one native op, ``torch._native_multi_head_attention`` (input
projection, attention and output projection in C++, with no Python between them).
:class:`~attnkit.nn.MultiheadAttention` takes the same op under the same conditions,
so on any CPU it runs at torch's speed and gives torch's numbers. On top of the op,
attnkit's policy holds:

- **Non-finite inputs** (README, "Non-finite inputs"): the op lets a NaN behind a
  padding or attention mask reach the rows that do not use it (``0 * NaN``). So the
  input is checked first (one sum read on the host, in float32 for half inputs); a NaN
  or inf in it sends the call to :func:`attnkit.attention`, which applies the policy.
- **Fully masked rows give 0** (then ``out_proj``'s bias), where the op gives NaN. A
  call whose masks leave a row with no key takes :func:`attnkit.attention` too.
- **is_causal works on its own.** torch's fast path ignores ``is_causal`` (a hint
  that ``attn_mask`` is causal, so without one it attends everywhere); here the op
  gets the causal mask, combined with the ``attn_mask`` when there is one (both apply
  in attnkit).
- **Past a size** (:data:`MAX_SCORES`) attnkit's kernels are faster than the op, which
  holds every score: larger calls take :func:`attnkit.attention`.

The two checks read values on the host, which on an accelerator would wait for the
device, so the op is taken on the CPU only. Nested inputs keep the layer's own ragged
path, and anything attnkit's :func:`~attnkit.attention` is asked to see (a
:func:`attnkit.viz.capture` recording, :func:`attnkit.use_backend`,
:func:`attnkit.nn.attention_override`) keeps the call on it.

:func:`blocker` is the one list of conditions: the layer's forward asks it, and
:meth:`MultiheadAttention.explain_path <attnkit.nn.MultiheadAttention.explain_path>`
reports its answer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .. import _recording
from .._host import strict
from ..backends import dispatch
from ._common import MhaLayer, override_active

if TYPE_CHECKING:
    from ..masks import Mask

__all__ = ["NATIVE_OP", "blocker", "metadata_blocker", "native_forward", "op_mask"]

NATIVE_OP = getattr(torch, "_native_multi_head_attention", None)
"""torch's fused op (in every torch attnkit supports; looked up, never assumed)."""

_FASTPATH_SWITCH = getattr(getattr(torch.backends, "mha", None), "get_fastpath_enabled", None)

MAX_SCORES = {"plain": 2**17, "causal": 2**14, "masked": 2**16}
"""The largest call (N·H·L·S scores) given to the fused op, per kind of mask. The op
holds every score of the call (matmul, softmax, matmul) where attnkit's kernels stream
them (SDPA's flash kernel skips the blocks a causal mask hides), so past these sizes
attnkit's own path is the faster one; below them the op, with no Python between its
steps, wins. Where the two cross was measured with one thread on a 2-core AMD EPYC
(E = 64 and 256, 8 heads, N = 1 and 4): without a mask near 2^17 scores, causal near
2^14, with a padding mask near 2^16 (there the alternative is the general path, which
turns torch's masks into attnkit's)."""

_CAUSAL: dict[tuple[int, torch.device], torch.Tensor] = {}
"""(L, L) bool causal masks (True = masked) by (L, device), for ``is_causal``."""
_CAUSAL_MAX = 64


def _causal(L: int, device: torch.device) -> torch.Tensor:
    key = (L, device)
    mask = _CAUSAL.get(key)
    if mask is None:
        if len(_CAUSAL) >= _CAUSAL_MAX:
            _CAUSAL.clear()
        mask = torch.ones(L, L, dtype=torch.bool, device=device).triu(1)  # (L, L)
        _CAUSAL[key] = mask
    return mask


def blocker(
    layer: MhaLayer,
    query: object,
    key: object,
    value: object,
    key_padding_mask: object,
    attn_mask: object,
    is_causal: object,
    *,
    read_values: bool = True,
) -> str | None:
    """Why this call does not take torch's fused op, or None when it does.

    torch's own fast-path conditions (``torch.nn.MultiheadAttention.forward``, the
    same from torch 2.4 to 2.13), then attnkit's. With ``read_values`` the input and
    the masks are read (a non-finite input, a fully masked row); without, only their
    metadata is.
    """
    reason = metadata_blocker(layer, query, key, value, key_padding_mask, attn_mask, is_causal)
    if reason is not None or not read_values:
        return reason
    return op_mask(layer, query, key_padding_mask, attn_mask, is_causal)[0]  # type: ignore[arg-type]


def metadata_blocker(
    layer: MhaLayer,
    query: object,
    key: object,
    value: object,
    key_padding_mask: object,
    attn_mask: object,
    is_causal: object,
) -> str | None:
    """The conditions of :func:`blocker` on types, shapes, flags and state (no values)."""
    if query is not key or key is not value:
        return "not self-attention (query, key and value are not one tensor)"
    if type(query) is not torch.Tensor or query.is_nested or query.layout is not torch.strided:
        return "the input is not a plain dense tensor (nested inputs take the ragged path)"
    x = query
    if x.ndim != 3:
        return f"the input is not batched (3-D), got {x.ndim}-D"
    if x.numel() == 0:
        return "an empty input (the op returns no weights for it)"
    if not layer.batch_first:
        return "batch_first is False"
    if layer.training:
        return "the layer is training"
    if layer.num_heads % 2:
        return "num_heads is odd (torch's fused op needs an even number)"
    params = layer._parameters
    w, b = params.get("in_proj_weight"), params.get("in_proj_bias")
    if w is None or b is None:
        return "no in_proj_weight or no in_proj_bias (kdim/vdim differ, or bias=False)"
    if layer.bias_k is not None or layer.add_zero_attn:  # (a parametrized one too)
        return "add_bias_kv or add_zero_attn"
    out_proj = layer._modules["out_proj"]
    if isinstance(out_proj, torch.jit.ScriptModule):
        return "out_proj is a TorchScript module"
    out_params = out_proj._parameters  # type: ignore[union-attr]
    ow, ob = out_params.get("weight"), out_params.get("bias")
    if ow is None or ob is None:
        return "out_proj has no bias"
    if not (x.is_cpu and w.is_cpu and b.is_cpu and ow.is_cpu and ob.is_cpu):
        return "a tensor is not on the CPU (the policy's checks would read it on the host)"
    if torch.compiler.is_compiling() or strict():  # what readable() adds to the CPU
        return "code being traced, or accelerator semantics (no host reads)"
    if x.shape[-1] != layer.embed_dim or not (
        w.dtype == b.dtype == ow.dtype == ob.dtype == x.dtype
    ):
        return "the input's features or dtype differ from the parameters'"
    if torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or b.requires_grad or ow.requires_grad
        or ob.requires_grad
    ):  # fmt: skip
        return "gradients are on and the input or a parameter requires them"
    if NATIVE_OP is None:
        return "this torch has no torch._native_multi_head_attention"
    if _FASTPATH_SWITCH is not None and not _FASTPATH_SWITCH():
        return "torch.backends.mha.get_fastpath_enabled() is False"
    if torch.is_autocast_enabled():
        return "autocast is on"
    if torch.overrides.has_torch_function((x, w, b, ow, ob)):
        return "a tensor argument overrides torch functions (a subclass or a mode)"
    if _recording.ACTIVE.get() is not None:
        return "an attnkit.viz recording is active"
    if override_active() or dispatch.forced_backends():
        return "an attention override or attnkit.use_backend is active"
    kind = "plain"
    if key_padding_mask is not None or attn_mask is not None or is_causal is not False:
        masked = _masks_blocker(layer, key_padding_mask, attn_mask, is_causal, x)
        if masked is not None:
            return masked
        kind = "causal" if key_padding_mask is None and attn_mask is None else "masked"
    N, L = x.shape[0], x.shape[1]
    scores = N * layer.num_heads * L * L
    if scores > MAX_SCORES[kind]:
        return (
            f"N·H·L·S = {scores} scores: above {MAX_SCORES[kind]} ({kind}), attnkit's kernels "
            f"are faster than the fused op, which holds every score"
        )
    return None


def _masks_blocker(
    layer: MhaLayer,
    key_padding_mask: object,
    attn_mask: object,
    is_causal: object,
    x: torch.Tensor,
) -> str | None:
    """Why the masks do not go to the op (their types, shapes and devices), or None."""
    N, L = x.shape[0], x.shape[1]
    if not (is_causal is False or is_causal is True):
        return "is_causal is not a bool"
    if key_padding_mask is not None:
        if type(key_padding_mask) is not torch.Tensor or key_padding_mask.dtype != torch.bool:
            return "key_padding_mask is not a bool tensor (torch's fused op takes bool masks)"
        if key_padding_mask.shape != (N, L):
            return "key_padding_mask is not (N, S)"
    if attn_mask is not None:
        if type(attn_mask) is not torch.Tensor or attn_mask.dtype != torch.bool:
            return "attn_mask is not a bool tensor (torch's fused op takes bool masks)"
        if attn_mask.shape not in ((L, L), (N * layer.num_heads, L, L)):
            return "attn_mask is not (L, S) or (N·H, L, S)"
    for m in (key_padding_mask, attn_mask):
        if m is not None and m.device != x.device:
            return "a mask is on another device than the input"
    return None


def _finite(x: torch.Tensor) -> bool:
    """``torch.isfinite(x).all()``, from one sum read on the host where the sum is finite.

    A half-precision input is summed in float32: in float16 the sum of finite inputs of
    ordinary size passes 65504. A sum that is still not finite (a NaN or an inf, or
    finite values near the dtype's largest adding up past it) is confirmed element by
    element, which costs only calls that leave the op anyway or hold such values.
    """
    wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    if math.isfinite(x.sum(dtype=wide).item()):
        return True
    return bool(torch.isfinite(x).all())


def op_mask(
    layer: MhaLayer,
    x: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | Mask | None,
    is_causal: bool,
) -> tuple[str | None, torch.Tensor | None, int | None]:
    """``(reason, mask, mask_type)``: why the values keep the call off the op (a
    non-finite input, a fully masked row), or None with the mask the op takes, merged
    as torch's layer merges it: (N, S) type 1 for a padding mask alone, (N, H, L, S)
    type 2 otherwise (bool, True = masked), or None without masks."""
    if not _finite(x):
        return "the input holds a NaN or an inf (attnkit's non-finite policy)", None, None
    assert attn_mask is None or isinstance(attn_mask, torch.Tensor)  # (metadata_blocker)
    given = key_padding_mask is not None or attn_mask is not None
    if is_causal:  # both apply; (L, L) or (N·H, L, L), True = masked
        causal = _causal(x.shape[1], x.device)  # (L, L)
        attn_mask = causal if attn_mask is None else attn_mask | causal
    mask, mask_type = layer.merge_masks(attn_mask, key_padding_mask, x)
    # (a causal mask alone leaves every row its own key)
    if given and mask is not None and mask.all(dim=-1).any().item():
        return "a query row has no key to attend (attnkit gives 0 there, the op NaN)", None, None
    return None, mask, mask_type


def native_forward(
    layer: MhaLayer,
    x: torch.Tensor,
    mask: torch.Tensor | None,
    mask_type: int | None,
    need_weights: bool,
    average_attn_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch's fused op on ``x`` (N, L, E) with the mask of :func:`op_mask`, where
    :func:`blocker` said it runs.

    Returns ``(output (N, L, E), weights)``: weights (N, L, S) averaged or
    (N, H, L, S) per head with ``need_weights``, else None.
    """
    assert NATIVE_OP is not None
    params = layer._parameters
    out_params = layer._modules["out_proj"]._parameters  # type: ignore[union-attr]
    out, weights = NATIVE_OP(
        x, x, x, layer.embed_dim, layer.num_heads,
        params["in_proj_weight"], params["in_proj_bias"],
        out_params["weight"], out_params["bias"],
        mask, need_weights, average_attn_weights, mask_type,
    )  # fmt: skip
    return out, (weights if need_weights else None)
