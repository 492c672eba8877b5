"""A drop-in replacement for ``torch.nn.MultiheadAttention`` built on :func:`attnkit.attention`.

Same constructor, same forward signature, same ``state_dict`` keys, so weights
load in both directions. The conventions of torch's layer are kept (boolean
masks: True = masked; float masks: added to the logits) and attnkit mask
objects are accepted as well. Differences, all deliberate fixes:

- a query row with no key to attend gives an output of 0 (and weights 0),
  never NaN;
- ``is_causal=True`` works on its own (no ``attn_mask`` needed); with an
  ``attn_mask`` both apply;
- ``attn_mask`` may be (L, S), (N·H, L, S), (N, L, S) or (N, H, L, S);
- ``need_weights=True`` asks :func:`attnkit.attention` for the exact weights
  of the same computation, per head or averaged over the heads (computed
  head-averaged by the backend, never holding every head's weights where it
  can); the weights returned are the softmax *before* dropout (torch returns
  them after dropout);
- nested tensors are refused with a TypeError: pad them and pass
  ``key_padding_mask`` (torch takes them only on its inference fast path).

The attributes and methods torch's own modules read from a
``self_attn`` (``_qkv_same_embed_dim``, ``batch_first``, ``in_proj_weight``,
``in_proj_bias``, ``out_proj``, ``merge_masks``, ...) are all present, so the
layer can replace torch's inside ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer``, fast path included.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from .. import masks
from ._common import (
    attend,
    check_dropout,
    check_factory_dtype,
    check_key_value,
    check_not_nested,
    check_param_dtype,
    check_positive_int,
    shape_str,
)

__all__ = ["MultiheadAttention"]

_OWNER = "MultiheadAttention"
_NESTED_HINT = (
    "pad it to a dense tensor (torch.nested.to_padded_tensor(t, 0.0)) and mark the padded "
    "keys with key_padding_mask"
)


class MultiheadAttention(nn.Module):
    """Multi-head attention with ``torch.nn.MultiheadAttention``'s interface.

    Args:
        embed_dim: E, the query feature size and the output size.
        num_heads: H; must divide ``embed_dim`` (head size E / H).
        dropout: dropout on the attention weights while training, in [0, 1).
        bias: add biases to the input and output projections.
        add_bias_kv: append a learned key and value (``bias_k``, ``bias_v``) to
            every sequence; every query may attend to it.
        add_zero_attn: append an all-zero key and value (after the head split);
            every query may attend to it.
        kdim, vdim: feature sizes of key and value (default ``embed_dim``); when
            either differs, the projections are ``q_proj_weight``,
            ``k_proj_weight``, ``v_proj_weight`` instead of ``in_proj_weight``.
        batch_first: inputs and output are (N, L, E) instead of (L, N, E).
        device, dtype: where and in which floating-point dtype the parameters live.

    Parameters (torch's names): ``in_proj_weight`` (3E, E) or ``q_proj_weight``
    (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight`` (E, vdim);
    ``in_proj_bias`` (3E,); ``out_proj.weight`` (E, E), ``out_proj.bias`` (E,);
    ``bias_k``, ``bias_v`` (1, 1, E).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_positive_int(_OWNER, "embed_dim", embed_dim)
        check_positive_int(_OWNER, "num_heads", num_heads)
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"{_OWNER}: num_heads={num_heads} must divide embed_dim={embed_dim} "
                f"(each head gets embed_dim / num_heads features)"
            )
        if kdim is not None:
            check_positive_int(_OWNER, "kdim", kdim)
        if vdim is not None:
            check_positive_int(_OWNER, "vdim", vdim)
        check_factory_dtype(_OWNER, dtype)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = check_dropout(_OWNER, dropout)
        self.batch_first = bool(batch_first)
        self.head_dim = embed_dim // num_heads
        self.add_zero_attn = bool(add_zero_attn)

        self.in_proj_weight: nn.Parameter | None
        self.q_proj_weight: nn.Parameter | None
        self.k_proj_weight: nn.Parameter | None
        self.v_proj_weight: nn.Parameter | None
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
        self.in_proj_bias: nn.Parameter | None
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        # torch's class for this Linear: dynamic quantization leaves it alone, as in torch.
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **factory)
        self.bias_k: nn.Parameter | None
        self.bias_v: nn.Parameter | None
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Glorot-uniform projections, zero biases, Glorot-normal ``bias_k``/``bias_v``."""
        if self.in_proj_weight is not None:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                assert w is not None
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)
        if self.bias_k is not None and self.bias_v is not None:
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"kdim={self.kdim}, vdim={self.vdim}, batch_first={self.batch_first}"
        )

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | masks.Mask | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (L, N, E), or (N, L, E) with ``batch_first``, or (L, E) unbatched.
            key: (S, N, kdim), (N, S, kdim) or (S, kdim).
            value: (S, N, vdim), (N, S, vdim) or (S, vdim).
            key_padding_mask: (N, S) or (S,) unbatched; bool (True = padding key,
                ignored) or float (added to the logits).
            need_weights: also return the attention weights.
            attn_mask: bool (True = masked) or float (added to the logits) of
                shape (L, S), (N·H, L, S), (N, L, S) or (N, H, L, S); unbatched
                (L, S) or (H, L, S). Or an :mod:`attnkit.masks` object, whose
                leading dims are (N, H).
            average_attn_weights: average the returned weights over heads.
            is_causal: query i attends to keys j <= i (top-left alignment); on
                its own or together with ``attn_mask``.

        Returns:
            ``(output, weights)``: output shaped like ``query`` with E features;
            weights (N, L, S') averaged or (N, H, L, S') per head ((L, S') or
            (H, L, S') unbatched), S' = S (+1 with ``add_bias_kv``, +1 with
            ``add_zero_attn``); None unless ``need_weights``. Rows with no key
            to attend give output 0 and weights 0.
        """
        batched = self._check_inputs(query, key, value)
        if not isinstance(is_causal, bool):
            raise TypeError(f"{_OWNER}: is_causal must be True or False, got {is_causal!r}")
        self_attn = query is key and key is value  # one fused input projection
        if batched and not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))  # (N, *, E)
        elif not batched:
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))  # (1, *, E)
        N, L, S = query.shape[0], query.shape[1], key.shape[1]
        H, D = self.num_heads, self.head_dim
        extra = int(self.bias_k is not None) + int(self.add_zero_attn)
        mask = self._build_mask(key_padding_mask, attn_mask, is_causal, batched, N, L, S, extra)

        if self_attn and self.in_proj_weight is not None and self.bias_k is None:
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (N, L, 3E)
            qkv = qkv.view(N, L, 3, H, D).permute(2, 0, 3, 1, 4)  # (3, N, H, L, D)
            q, k, v = qkv.unbind(0)  # (N, H, L, D) each
        else:
            q, k, v = self._project(query, key, value, self_attn)  # (N, L|S, E) each
            if self.bias_k is not None and self.bias_v is not None:
                k = torch.cat([k, self.bias_k.expand(N, 1, self.embed_dim)], dim=1)  # (N, S+1, E)
                v = torch.cat([v, self.bias_v.expand(N, 1, self.embed_dim)], dim=1)  # (N, S+1, E)
            q = q.view(N, L, H, D).transpose(1, 2)  # (N, H, L, D)
            k = k.view(N, k.shape[1], H, D).transpose(1, 2)  # (N, H, S', D)
            v = v.view(N, v.shape[1], H, D).transpose(1, 2)  # (N, H, S', D)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(N, H, 1, D)], dim=2)  # (N, H, S'+1, D)
            v = torch.cat([v, v.new_zeros(N, H, 1, D)], dim=2)  # (N, H, S'+1, D)

        dropout_p = self.dropout if self.training else 0.0
        want: bool | Literal["mean"] = (
            "mean" if need_weights and average_attn_weights else bool(need_weights)
        )
        out, weights = attend(q, k, v, mask=mask, dropout_p=dropout_p, need_weights=want)
        out = out.transpose(1, 2).reshape(N, L, self.embed_dim)  # (N, L, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)  # (N, L, E)

        if batched and not self.batch_first:
            out = out.transpose(0, 1)  # (L, N, E)
        elif not batched:
            out = out.squeeze(0)  # (L, E)
        if weights is not None:
            weights = weights.to(out.dtype)  # (N, L, S') averaged or (N, H, L, S')
            if not batched:
                weights = weights.squeeze(0)  # (L, S') or (H, L, S')
        return out, weights

    def merge_masks(
        self,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        query: torch.Tensor,
    ) -> tuple[torch.Tensor | None, int | None]:
        """Combine the two masks of a self-attention call as torch's fused kernels take them.

        The same contract as ``torch.nn.MultiheadAttention.merge_masks`` (torch's
        encoder layer calls it on its inference fast path):

        - only ``key_padding_mask`` (N, S): returned as is, mask type 1;
        - ``attn_mask`` (L, L) or (N·H, L, L): returned as (N, H, L, L)
          (broadcast or viewed), mask type 2; with a ``key_padding_mask`` as
          well, the two are added (a logical or for bool masks), mask type 2;
        - neither: ``(None, None)``.

        Args:
            attn_mask: (L, L) or (N·H, L, L), bool (True = masked) or float.
            key_padding_mask: (N, L), bool (True = padding) or float.
            query: (N, L, E), batch first.

        Returns:
            ``(merged_mask, mask_type)``.
        """
        if attn_mask is None:
            if key_padding_mask is None:
                return None, None
            return key_padding_mask, 1
        if query.ndim != 3:
            raise ValueError(
                f"{_OWNER}.merge_masks: query must be (N, L, E) batch first, got {shape_str(query)}"
            )
        N, L, H = query.shape[0], query.shape[1], self.num_heads
        if attn_mask.ndim == 3:
            merged = attn_mask.view(N, -1, L, L)  # (N, H, L, L)
        else:
            merged = attn_mask.view(1, 1, L, L).expand(N, H, L, L)  # (N, H, L, L)
        if key_padding_mask is not None:
            padding = key_padding_mask.view(N, 1, 1, L).expand(N, H, 1, L)  # (N, H, 1, L)
            merged = merged + padding  # (N, H, L, L)
        return merged, 2

    # ------------------------------------------------------------------ pieces

    def _project(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, self_attn: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input projections of (N, *, features) inputs to (N, *, E).

        ``self_attn``: query, key and value are one tensor, projected by one matmul.
        """
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
        if self.in_proj_weight is not None:
            w = self.in_proj_weight
            if self_attn:
                # One matmul (N, L, 3E), split into 3 x (N, L, E).
                return F.linear(query, w, b).chunk(3, dim=-1)  # type: ignore[return-value]
            wq, wk, wv = w[:E], w[E : 2 * E], w[2 * E :]
        else:
            pq, pk, pv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
            assert pq is not None and pk is not None and pv is not None
            wq, wk, wv = pq, pk, pv
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def _check_inputs(self, query: object, key: object, value: object) -> bool:
        """Validate shapes and feature sizes; return whether the inputs are batched.

        The checks of the inputs alone depend only on their types, shapes, dtypes and
        devices and the layer's sizes, so a combination seen before skips them; the
        parameters' dtypes and devices are checked on every call (they can change).
        """
        seen = _checked_key(self, query, key, value)
        if seen is not None and seen in _CHECKED_INPUTS:
            check_param_dtype(_OWNER, self, query=query)  # type: ignore[arg-type]
            return _CHECKED_INPUTS[seen]
        batched = self._check_inputs_once(query, key, value)
        if seen is not None:
            if len(_CHECKED_INPUTS) >= _CHECKED_MAX:
                _CHECKED_INPUTS.clear()
            _CHECKED_INPUTS[seen] = batched
        return batched

    def _check_inputs_once(self, query: object, key: object, value: object) -> bool:
        """Every check of :meth:`_check_inputs`, in full."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{_OWNER}: {name} must be a torch.Tensor, got {type(t).__name__}")
            check_not_nested(_OWNER, name, t, _NESTED_HINT)
            if not t.is_floating_point():
                raise TypeError(
                    f"{_OWNER}: {name} must be a floating-point tensor, got dtype {t.dtype}"
                )
        assert isinstance(query, torch.Tensor)
        assert isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
        layout = "(N, L, E)" if self.batch_first else "(L, N, E)"
        if query.ndim not in (2, 3):
            raise ValueError(
                f"{_OWNER}: query must be 3-D {layout} or 2-D (L, E) unbatched, got "
                f"{shape_str(query)}"
            )
        batched = query.ndim == 3
        for name, t in (("key", key), ("value", value)):
            if t.ndim != query.ndim:
                raise ValueError(
                    f"{_OWNER}: {name} must have as many dims as query ({query.ndim}), got "
                    f"{name} {shape_str(t)} and query {shape_str(query)}"
                )
        for name, t, want in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if t.shape[-1] != want:
                what = {"query": "embed_dim", "key": "kdim", "value": "vdim"}[name]
                raise ValueError(
                    f"{_OWNER}: {name} has {t.shape[-1]} features (last dim of "
                    f"{shape_str(t)}), expected {what}={want}"
                )
        check_key_value(_OWNER, key, value)
        if batched:
            n_dim = 0 if self.batch_first else 1
            if query.shape[n_dim] != key.shape[n_dim]:
                raise ValueError(
                    f"{_OWNER}: query and key must have the same batch size N (dim {n_dim} with "
                    f"batch_first={self.batch_first}), got query {shape_str(query)} and key "
                    f"{shape_str(key)}"
                )
        if not (query.dtype == key.dtype == value.dtype):
            raise TypeError(
                f"{_OWNER}: query, key and value must share a dtype, got {query.dtype}, "
                f"{key.dtype}, {value.dtype}"
            )
        check_param_dtype(_OWNER, self, query=query)
        return batched

    def _build_mask(
        self,
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
        H = self.num_heads
        parts: list[masks.Mask] = []

        if key_padding_mask is not None:
            kpm = _check_mask_tensor("key_padding_mask", key_padding_mask)
            want = (N, S) if batched else (S,)
            if tuple(kpm.shape) != want:
                raise ValueError(
                    f"{_OWNER}: key_padding_mask must have shape {shape_str(want)} "
                    f"({'(N, S)' if batched else '(S,) for unbatched inputs'}), got "
                    f"{shape_str(kpm)}"
                )
            kpm = kpm.reshape(N, S)  # (N, S)
            if extra:
                kpm = F.pad(kpm, (0, extra))  # (N, S'): the extra keys are never padding
            if kpm.dtype == torch.bool:
                parts.append(masks.key_padding(kpm))
            else:
                parts.append(masks.bias(kpm.view(N, 1, 1, S + extra)))  # (N, 1, 1, S')

        if attn_mask is not None:
            if isinstance(attn_mask, masks.Mask):
                if extra:
                    dense = attn_mask.to_dense(L, S, (N, H), device=self._device())
                    parts.append(_padded(dense, extra))
                else:
                    parts.append(attn_mask)
            else:
                am = _check_mask_tensor("attn_mask", attn_mask)
                am = self._attn_mask_4d(am, batched, N, L, S)  # (N or 1, H or 1, L, S)
                if extra:
                    am = F.pad(am, (0, extra))  # (.., L, S'): False / 0.0 = visible
                parts.append(masks.block(am) if am.dtype == torch.bool else masks.bias(am))

        if is_causal:
            if extra:
                causal = masks.causal().to_dense(L, S, device=self._device())  # (L, S) keep
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
        self, am: torch.Tensor, batched: bool, N: int, L: int, S: int
    ) -> torch.Tensor:
        """Reshape every accepted ``attn_mask`` layout to (N or 1, H or 1, L, S)."""
        H = self.num_heads
        if batched:
            accepted = (
                f"(L, S), (N·H, L, S), (N, L, S) or (N, H, L, S) = ({L}, {S}), "
                f"({N * H}, {L}, {S}), ({N}, {L}, {S}) or ({N}, {H}, {L}, {S})"
            )
        else:
            accepted = f"(L, S) or (H, L, S) = ({L}, {S}) or ({H}, {L}, {S}) for unbatched inputs"
        bad = ValueError(f"{_OWNER}: attn_mask must have shape {accepted}, got {shape_str(am)}")
        if am.shape[-2:] != (L, S):
            raise bad
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
            raise bad
        if am.ndim == 4 and batched and am.shape[0] in (1, N) and am.shape[1] in (1, H):
            return am
        raise bad

    def _device(self) -> torch.device:
        return self.out_proj.weight.device


def _check_mask_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{_OWNER}: {name} must be a bool or float tensor"
            + (" or an attnkit mask" if name == "attn_mask" else "")
            + f", got {type(value).__name__}"
        )
    if value.dtype != torch.bool and not value.is_floating_point():
        raise TypeError(
            f"{_OWNER}: {name} must be bool (True = masked) or float (added to the logits), "
            f"got dtype {value.dtype}"
        )
    return value


def _padded(dense: torch.Tensor, extra: int) -> masks.Mask:
    """A dense keep/bias tensor (..., L, S) widened by ``extra`` always-visible keys."""
    if dense.dtype == torch.bool:
        return masks.keep(F.pad(dense, (0, extra), value=True))  # (..., L, S')
    return masks.bias(F.pad(dense, (0, extra), value=0.0))  # (..., L, S')


_CHECKED_INPUTS: dict[tuple[object, ...], bool] = {}
"""Input combinations that passed :meth:`MultiheadAttention._check_inputs_once`: key ->
batched."""
_CHECKED_MAX = 256


def _checked_key(
    layer: MultiheadAttention, query: object, key: object, value: object
) -> tuple[object, ...] | None:
    """What the input checks depend on, or None for inputs that are not plain tensors."""
    if not (
        type(query) is torch.Tensor and type(key) is torch.Tensor and type(value) is torch.Tensor
    ) or (query.is_nested or key.is_nested or value.is_nested):
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
    )
