"""Arguments of :class:`~attnkit.nn.MultiheadAttention`: input checks and torch's masks.

- :func:`check_inputs`: types, dims, feature sizes, dtypes and devices of query,
  key and value (memoized per combination of shapes and dtypes);
- :func:`build_mask`: torch's ``key_padding_mask``, ``attn_mask`` and ``is_causal``
  as one :mod:`attnkit.masks` object over (N, H, L, S + extra keys).

Shape errors are :class:`~attnkit.nn.InputShapeError` (a ``ValueError`` and an
``AssertionError``, as torch's layer asserts them). Where torch's layer rejects the
same input, the message carries torch's sentence for it, so code matching torch's
messages keeps working; it always names the shapes received and expected.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import masks
from .._strided import check_strided, is_plain_strided
from ._common import InputShapeError, MhaLayer, check_key_value, check_param_dtype, shape_str

__all__ = ["OWNER", "build_mask", "check_devices", "check_inputs", "check_params"]

OWNER = "MultiheadAttention"


def check_inputs_dtype(
    layer: MhaLayer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> None:
    """Raise unless query, key and value share one dtype, and the parameters the query's
    (see :func:`check_params`)."""
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"{OWNER}: query, key and value must share a dtype, got {query.dtype}, "
            f"{key.dtype}, {value.dtype}"
        )
    check_params(layer, query)


def check_params(layer: MhaLayer, query: torch.Tensor) -> None:
    """Raise unless the parameters share the query's dtype and device.

    ``in_proj_bias`` may have another floating-point dtype (torch's layer runs it):
    the layer casts it to the query's dtype.
    """
    check_param_dtype(OWNER, layer, cast=(layer.in_proj_bias,), query=query)


def check_inputs(layer: MhaLayer, query: object, key: object, value: object) -> bool:
    """Validate shapes and feature sizes of dense inputs; return whether they are batched.

    The checks of the inputs alone depend only on their types, shapes, dtypes and
    devices and the layer's sizes, so a combination seen before skips them; the
    parameters' dtypes and devices are checked on every call (they can change).
    """
    seen = _checked_key(layer, query, key, value)
    if seen is not None and seen in _CHECKED_INPUTS:
        check_params(layer, query)  # type: ignore[arg-type]
        return _CHECKED_INPUTS[seen]
    batched = _check_inputs_once(layer, query, key, value)
    if seen is not None:
        if len(_CHECKED_INPUTS) >= _CHECKED_MAX:
            _CHECKED_INPUTS.clear()
        _CHECKED_INPUTS[seen] = batched
    return batched


def check_devices(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """Raise unless key and value are on the query's device."""
    for name, t in (("key", key), ("value", value)):
        if t.device != query.device:
            raise ValueError(
                f"{OWNER}: {name} is on {t.device} but query is on {query.device}; expected "
                f"query, key and value on one device (move {name} with .to({str(query.device)!r}))"
            )


def check_query_dims(layer: MhaLayer, query: torch.Tensor) -> None:
    """Raise unless ``query`` has 2 or 3 dims."""
    if query.ndim not in (2, 3):
        layout = "(N, L, E)" if layer.batch_first else "(L, N, E)"
        got = "a nested tensor" if query.is_nested else shape_str(query)
        raise InputShapeError(
            f"{OWNER}: query should be unbatched 2D or batched 3D tensor but received "
            f"{query.ndim}-D query tensor; expected 3-D {layout} or 2-D (L, E), got {got}"
        )


def check_features(
    layer: MhaLayer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> None:
    """Raise unless the last dims are embed_dim, kdim and vdim."""
    for name, t, want in (
        ("query", query, layer.embed_dim),
        ("key", key, layer.kdim),
        ("value", value, layer.vdim),
    ):
        if t.shape[-1] != want:
            what = {"query": "embed_dim", "key": "kdim", "value": "vdim"}[name]
            raise InputShapeError(
                f"{OWNER}: {name} has {t.shape[-1]} features (last dim of "
                f"{shape_str(t)}), expected {what}={want}"
            )


def _check_inputs_once(layer: MhaLayer, query: object, key: object, value: object) -> bool:
    """Every check of :func:`check_inputs`, in full."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{OWNER}: {name} must be a torch.Tensor, got {type(t).__name__}")
        check_strided(OWNER, name, t)
        if not t.is_floating_point():
            raise TypeError(f"{OWNER}: {name} must be a floating-point tensor, got dtype {t.dtype}")
    assert isinstance(query, torch.Tensor)
    assert isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
    check_devices(query, key, value)
    check_query_dims(layer, query)
    batched = query.ndim == 3
    if key.ndim != query.ndim or value.ndim != query.ndim:
        raise InputShapeError(
            f"{OWNER}: expected `key` and `value` to be {query.ndim}-D but found {key.ndim}-D "
            f"and {value.ndim}-D tensors respectively, as query is {query.ndim}-D; got query "
            f"{shape_str(query)}, key {shape_str(key)} and value {shape_str(value)}"
        )
    check_features(layer, query, key, value)
    try:
        check_key_value(OWNER, key, value)
    except ValueError as exc:
        raise InputShapeError(str(exc)) from None
    if batched:
        n_dim = 0 if layer.batch_first else 1
        if query.shape[n_dim] != key.shape[n_dim]:
            raise InputShapeError(
                f"{OWNER}: query and key must have the same batch size N (dim {n_dim} with "
                f"batch_first={layer.batch_first}), got query {shape_str(query)} and key "
                f"{shape_str(key)}"
            )
    check_inputs_dtype(layer, query, key, value)
    return batched


def build_mask(
    layer: MhaLayer,
    key_padding_mask: object,
    attn_mask: object,
    is_causal: bool,
    batched: bool,
    N: int,
    L: int,
    S: int,
    extra: int,
) -> masks.Mask | None:
    """Turn torch's mask arguments into one attnkit mask over (N, H, L, S + extra).

    The ``extra`` keys (``bias_k`` and the zero key) are visible to every query,
    as in torch: padded masks keep them.
    """
    H = layer.num_heads
    parts: list[masks.Mask] = []

    if key_padding_mask is not None:
        kpm = _check_mask_tensor("key_padding_mask", key_padding_mask, layer)
        kpm_given = kpm
        want = (N, S) if batched else (S,)
        if kpm.ndim != len(want):
            raise InputShapeError(
                f"{OWNER}: expected `key_padding_mask` to be `None` or {len(want)}-D but found "
                f"{kpm.ndim}-D tensor instead; expected shape {shape_str(want)} "
                f"({'(N, S)' if batched else '(S,) for unbatched inputs'}), got {shape_str(kpm)}"
            )
        if tuple(kpm.shape) != want:
            raise InputShapeError(
                f"{OWNER}: key_padding_mask must have shape {shape_str(want)} "
                f"({'(N, S)' if batched else '(S,) for unbatched inputs'}), got "
                f"{shape_str(kpm)}"
            )
        kpm = kpm.reshape(N, S)  # (N, S)
        if extra:
            kpm = F.pad(kpm, (0, extra))  # (N, S'): the extra keys are never padding
        if kpm.dtype == torch.bool:
            parts.append(masks.key_padding(kpm))
        else:
            kpm = kpm.view(N, 1, 1, S + extra)  # (N, 1, 1, S')
            parts.append(_named_bias("key_padding_mask", kpm, kpm_given))

    if attn_mask is not None:
        if isinstance(attn_mask, masks.Mask):
            if extra:
                # Densified in the computation's dtype (the parameters', which the query
                # shares), at least float32: a float64 bias is not rounded on the way.
                weight = layer.out_proj.weight
                dtype = torch.promote_types(weight.dtype, torch.float32)
                dense = attn_mask.to_dense(L, S, (N, H), device=weight.device, dtype=dtype)
                parts.append(_padded(dense, extra))
            else:
                parts.append(attn_mask)
        else:
            am = _check_mask_tensor("attn_mask", attn_mask, layer)
            am_given = am
            am = _attn_mask_4d(layer, am, batched, N, L, S)  # (N or 1, H or 1, L, S)
            if extra:
                am = F.pad(am, (0, extra))  # (.., L, S'): False / 0.0 = visible
            parts.append(
                masks.block(am)
                if am.dtype == torch.bool
                else _named_bias("attn_mask", am, am_given)
            )

    if is_causal:
        if extra:
            device = layer.out_proj.weight.device
            causal = masks.causal().to_dense(L, S, device=device)  # (L, S) keep
            parts.append(_padded(causal, extra))
        else:
            parts.append(masks.causal())

    if not parts:
        return None
    combined = parts[0]
    for p in parts[1:]:
        combined = combined & p
    return combined


def _attn_mask_4d(
    layer: MhaLayer, am: torch.Tensor, batched: bool, N: int, L: int, S: int
) -> torch.Tensor:
    """Reshape every accepted ``attn_mask`` layout to (N or 1, H or 1, L, S)."""
    H = layer.num_heads

    def accepted() -> str:
        # built only to raise: formatting a dynamic size under torch.compile or
        # torch.export would fix it to this call's value
        if batched:
            return (
                f"(L, S), (N·H, L, S), (N, L, S) or (N, H, L, S) = ({L}, {S}), "
                f"({N * H}, {L}, {S}), ({N}, {L}, {S}) or ({N}, {H}, {L}, {S})"
            )
        return f"(L, S) or (H, L, S) = ({L}, {S}) or ({H}, {L}, {S}) for unbatched inputs"

    def bad() -> InputShapeError:
        return InputShapeError(
            f"{OWNER}: attn_mask must have shape {accepted()}, got {shape_str(am)}"
        )

    if am.ndim not in ((2, 3, 4) if batched else (2, 3)):
        raise InputShapeError(
            f"{OWNER}: expected `attn_mask` to be `None`, 2-D or 3-D but found {am.ndim}-D "
            f"tensor instead; accepted shapes {accepted()}, "
            f"got {shape_str(am)}"
        )
    if not batched and am.ndim == 3 and tuple(am.shape) != (H, L, S) and am.shape[0] != 1:
        raise InputShapeError(
            f"{OWNER}: Expected `attn_mask` shape to be ({H}, {L}, {S}) (H, L, S) or "
            f"({L}, {S}) (L, S) for unbatched inputs, got {shape_str(am)}"
        )
    if am.shape[-2:] != (L, S):
        raise bad()
    if am.ndim == 2:
        return am.view(1, 1, L, S)  # (1, 1, L, S)
    if am.ndim == 3:
        lead = am.shape[0]
        if lead == N * H:
            return am.view(N, H, L, S)  # (N, H, L, S): torch's (N·H, L, S) layout
        if batched and lead == N:
            return am.view(N, 1, L, S)  # (N, 1, L, S)
        if lead == 1:
            return am.view(1, 1, L, S)  # (1, 1, L, S)
        raise bad()
    # (==, not `in`: dynamo's `in` misses a dynamic size equal to an int)
    if (am.shape[0] == 1 or am.shape[0] == N) and (am.shape[1] == 1 or am.shape[1] == H):
        return am  # (N or 1, H or 1, L, S)
    raise bad()


def _check_mask_tensor(name: str, value: object, layer: MhaLayer) -> torch.Tensor:
    """``value`` when it is a dense bool or float tensor on the layer's (the query's) device."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{OWNER}: {name} must be a bool or float tensor"
            + (" or an attnkit mask" if name == "attn_mask" else "")
            + f", got {type(value).__name__}"
        )
    check_strided(OWNER, name, value)
    if value.dtype != torch.bool and not value.is_floating_point():
        raise TypeError(
            f"{OWNER}: {name} must be bool (True = masked) or float (added to the logits), "
            f"got dtype {value.dtype}"
        )
    device = layer.out_proj.weight.device  # the query's (check_params)
    if value.device != device:
        raise ValueError(
            f"{OWNER}: {name} is on {value.device} but query is on {device}; expected the "
            f"masks on the query's device (move it with .to({str(device)!r}))"
        )
    return value


def _named_bias(name: str, bias: torch.Tensor, given: torch.Tensor) -> masks.Mask:
    """``masks.bias(bias)``, its refusal (NaN or +inf) naming the argument ``given``."""
    try:
        return masks.bias(bias)
    except ValueError as exc:
        raise ValueError(f"{OWNER}: {name} of shape {shape_str(given)}: {exc}") from None


def _padded(dense: torch.Tensor, extra: int) -> masks.Mask:
    """A dense keep/bias tensor (..., L, S) widened by ``extra`` always-visible keys."""
    if dense.dtype == torch.bool:
        return masks.keep(F.pad(dense, (0, extra), value=True))  # (..., L, S')
    return masks.bias(F.pad(dense, (0, extra), value=0.0))  # (..., L, S')


_CHECKED_INPUTS: dict[tuple[object, ...], bool] = {}
"""Input combinations that passed :func:`_check_inputs_once`: key -> batched."""
_CHECKED_MAX = 256


def _checked_key(
    layer: MhaLayer, query: object, key: object, value: object
) -> tuple[object, ...] | None:
    """What the input checks depend on, or None for inputs that are not plain tensors.

    None under torch.compile too: the checks run once as the graph is traced, and a
    lookup in the memo would make dynamo guard on the memo's contents (a recompile
    as soon as the call that traced it stores its key).
    """
    if torch.compiler.is_compiling():
        return None
    if not (
        type(query) is torch.Tensor and type(key) is torch.Tensor and type(value) is torch.Tensor
    ) or not (is_plain_strided(query) and is_plain_strided(key) and is_plain_strided(value)):
        return None
    return (
        layer.embed_dim,
        layer.kdim,
        layer.vdim,
        layer.batch_first,
        query.shape,
        key.shape,
        value.shape,
        query.dtype,
        key.dtype,
        value.dtype,
        query.device,
        key.device,
        value.device,
    )
