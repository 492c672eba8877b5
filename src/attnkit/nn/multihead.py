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
- nested tensors (jagged, or torch's strided layout) are taken in training
  and inference alike, as a ragged batch: padded once, their lengths given to
  :func:`attnkit.attention` so the backends skip the padding, the output nested
  like the query (torch takes them only on its inference fast path);
- ``in_proj_bias`` may have another floating-point dtype than the weights (as in
  torch's layer, whose matmul promotes it): it is cast to the query's dtype;
- shape errors are :class:`~attnkit.nn.InputShapeError`, both a ``ValueError``
  and the ``AssertionError`` torch's layer raises.

Inference calls that torch's own layer runs as its fused op
(``torch._native_multi_head_attention``: eval, no gradient, self-attention,
``batch_first``, even heads, biases, bool masks or none) take the same op, up to a
size where attnkit's kernels become the faster ones, so the layer matches torch's
speed and numbers on any CPU. attnkit's policy is kept by checking the input and the
masks first (a non-finite input or a fully masked row sends the call to
:func:`attnkit.attention`), and ``is_causal`` applies on its own (see
:mod:`attnkit.nn._mha_native`; :meth:`MultiheadAttention.explain_path` says which path
a call takes). Any other self-attention call with no mask tensors takes a lean path:
the same computation through :func:`attnkit.attention` with the per-call checks cut
to a few attribute reads.

The attributes and methods torch's own modules read from a
``self_attn`` (``_qkv_same_embed_dim``, ``batch_first``, ``in_proj_weight``,
``in_proj_bias``, ``out_proj``, ``merge_masks``, ...) are all present, so the
layer can replace torch's inside ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer``. The encoder layer's fused inference kernel, which
would run the layer without calling it, is declined (:func:`declines_fused_encoder`):
attnkit's policy holds in every mode, and the layer takes torch's fused attention op
itself where that is safe.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from .. import masks
from .._torch_features import check_compiling
from ._common import (
    attend,
    check_dropout,
    check_factory_device,
    check_factory_dtype,
    check_positive_int,
    shape_str,
)
from ._mha_inputs import OWNER as _OWNER
from ._mha_inputs import build_mask, check_inputs
from ._mha_native import blocker, metadata_blocker, native_forward, op_mask
from ._mha_nested import any_nested, nested_forward

__all__ = ["MultiheadAttention"]

_CAUSAL = masks.causal()


def declines_fused_encoder(module: nn.Module, args: tuple[torch.Tensor]) -> None:
    """A forward pre-hook that does nothing, on the layer's ``out_proj``.

    torch's ``nn.TransformerEncoderLayer`` runs a whole layer in eval without gradients
    as one fused kernel (``torch._transformer_encoder_layer_fwd``) that reads its
    ``self_attn``'s weights and never calls it: a fully masked row would give NaN and
    an ``is_causal`` without a mask would be ignored there. The encoder layer declines
    that kernel when any of its modules has a hook, so it calls this layer in every
    mode. ``out_proj``'s weights are read, the module is never called, so the hook costs
    nothing (and a Linear with a no-op hook computes as without it; TorchScript compiles
    it). The layer puts it on whatever module becomes its ``out_proj`` (a replacement,
    a layer loaded from a file saved before it had the hook)."""
    return None


def _declining(out_proj: object) -> None:
    """Give ``out_proj`` the hook :func:`declines_fused_encoder` once."""
    if isinstance(out_proj, torch.jit.ScriptModule):
        return  # (TorchScript modules take no hooks; torch's encoder may then fuse the layer)
    if isinstance(out_proj, nn.Module) and not any(
        hook is declines_fused_encoder for hook in out_proj._forward_pre_hooks.values()
    ):
        out_proj.register_forward_pre_hook(declines_fused_encoder)


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
        embed_dim = check_positive_int(_OWNER, "embed_dim", embed_dim)
        num_heads = check_positive_int(_OWNER, "num_heads", num_heads)
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"{_OWNER}: num_heads={num_heads} must divide embed_dim={embed_dim} "
                f"(each head gets embed_dim / num_heads features)"
            )
        if kdim is not None:
            kdim = check_positive_int(_OWNER, "kdim", kdim)
        if vdim is not None:
            vdim = check_positive_int(_OWNER, "vdim", vdim)
        check_factory_dtype(_OWNER, dtype)
        check_factory_device(_OWNER, device)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = check_dropout(_OWNER, dropout)
        self.batch_first = bool(batch_first)
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

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "out_proj":  # whichever module it is: torch's fused encoder declined
            _declining(value)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        _declining(self._modules.get("out_proj"))  # (saved before the hook existed)

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

    @property
    def head_dim(self) -> int:
        """Features per head, ``embed_dim // num_heads``, read from ``num_heads`` as it is
        now (torch's layer also takes a ``num_heads`` set after construction).

        Raises:
            TypeError, ValueError: ``num_heads`` was set to something other than a
                positive int that divides ``embed_dim``.
        """
        E, H = self.embed_dim, check_positive_int(_OWNER, "num_heads", self.num_heads)
        if E % H:
            raise ValueError(
                f"{_OWNER}: num_heads={H} must divide embed_dim={E} (each head gets "
                "embed_dim / num_heads features)"
            )
        return E // H

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
            query: (L, N, E), or (N, L, E) with ``batch_first``, or (L, E) unbatched;
                or a nested tensor (N, L*, E) (``torch.jagged`` or strided layout,
                always batch first), with key and value nested too: the output is
                nested like the query (see the class notes). Dense strided tensors
                otherwise: sparse or MKL-DNN ones are refused, naming the conversion.
            key: (S, N, kdim), (N, S, kdim) or (S, kdim), or nested (N, S*, kdim); on
                the query's device.
            value: (S, N, vdim), (N, S, vdim) or (S, vdim), or nested (N, S*, vdim); on
                the query's device.
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
        check_compiling()
        if (
            metadata_blocker(self, query, key, value, key_padding_mask, attn_mask, is_causal)
            is None
        ):  # torch's fused op, as torch's layer takes it (see _mha_native)
            assert isinstance(query, torch.Tensor)
            blocked, fused_mask, fused_type = op_mask(
                self, query, key_padding_mask, attn_mask, is_causal
            )
            if blocked is None:
                return native_forward(
                    self, query, fused_mask, fused_type, need_weights, average_attn_weights
                )
        if (
            query is key
            and key is value
            and key_padding_mask is None
            and attn_mask is None
            and type(query) is torch.Tensor
            and not query.is_nested
            and query.layout is torch.strided
            and query.ndim == 3
            and (is_causal is False or is_causal is True)
        ):
            x = query if self.batch_first else query.transpose(0, 1)  # (N, L, E)
            lean = self._lean(x, _CAUSAL if is_causal else None, need_weights, average_attn_weights)
            if lean is not None:
                out, weights = lean
                return (out if self.batch_first else out.transpose(0, 1)), weights
        if any_nested(query, key, value):
            return nested_forward(
                self, query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal,
            )  # fmt: skip
        batched = check_inputs(self, query, key, value)
        if not isinstance(is_causal, bool):
            raise TypeError(f"{_OWNER}: is_causal must be True or False, got {is_causal!r}")
        assert isinstance(query, torch.Tensor)
        assert isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
        self_attn = query is key and key is value  # one fused input projection
        if batched and not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))  # (N, *, E)
        elif not batched:
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))  # (1, *, E)
        N, L, S = query.shape[0], query.shape[1], key.shape[1]
        extra = int(self.bias_k is not None) + int(self.add_zero_attn)
        mask = build_mask(self, key_padding_mask, attn_mask, is_causal, batched, N, L, S, extra)
        out, weights = self._attend(
            query, key, value, mask, self_attn, need_weights, average_attn_weights
        )  # (N, L, E)
        if batched and not self.batch_first:
            out = out.transpose(0, 1)  # (L, N, E)
        elif not batched:
            out = out.squeeze(0)  # (L, E)
            if weights is not None:
                weights = weights.squeeze(0)  # (L, S') or (H, L, S')
        return out, weights

    def _lean(
        self,
        x: torch.Tensor,
        mask: masks.Mask | None,
        need_weights: bool,
        average_attn_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Self-attention on ``x`` (N, L, E) without the per-call checks, or None.

        Runs when nothing is left to check: ``x`` is a plain (not nested) tensor
        with ``embed_dim`` features, the parameters the computation reads are in its
        dtype and on its device, and there is no ``bias_k`` or zero key. Any other
        case returns None and takes the checked path, which raises the errors.
        The parameters are read once, straight from the modules' dicts; one that is
        not there as a plain parameter (``torch.nn.utils.parametrize`` or ``prune``
        moved it, and its value comes from the attribute) also takes the checked path.
        """
        params, out_params = self._parameters, self.out_proj._parameters
        if (
            isinstance(self.out_proj, torch.jit.ScriptModule)
            or "in_proj_bias" not in params
            or "weight" not in out_params
            or "bias" not in out_params
            or self.bias_k is not None
            or self.add_zero_attn
        ):
            return None
        w = params.get("in_proj_weight")
        if w is None:
            return None
        dt, dev = x.dtype, x.device
        if x.shape[-1] != self.embed_dim or w.dtype != dt or w.device != dev:
            return None
        b = params["in_proj_bias"]
        ow, ob = out_params["weight"], out_params["bias"]
        for t in (b, ow, ob):
            if t is not None and (t.dtype != dt or t.device != dev):
                return None
        assert ow is not None
        N, L = x.shape[0], x.shape[1]
        H, D = self.num_heads, self.head_dim
        qkv = F.linear(x, w, b)  # (N, L, 3E)
        qkv = qkv.view(N, L, 3, H, D).permute(2, 0, 3, 1, 4)  # (3, N, H, L, D)
        q, k, v = qkv.unbind(0)  # (N, H, L, D) each
        return self._heads_out(q, k, v, mask, need_weights, average_attn_weights, ow, ob)

    def _attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: masks.Mask | None,
        self_attn: bool,
        need_weights: bool,
        average_attn_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Project, attend through :func:`attnkit.attention`, project out.

        Args:
            query: (N, L, E); key: (N, S, kdim); value: (N, S, vdim); checked.
            mask: over (N, H, L, S') (S' = S + the extra keys), or None.
            self_attn: query, key and value are one tensor (one fused projection).

        Returns:
            ``(output (N, L, E), weights)``: weights (N, L, S') averaged or
            (N, H, L, S') per head, or None unless ``need_weights``.
        """
        N, L = query.shape[0], query.shape[1]
        H, D, E = self.num_heads, self.head_dim, self.embed_dim
        bias: torch.Tensor | None = self.in_proj_bias
        if bias is not None and bias.dtype != query.dtype:
            bias = bias.to(query.dtype)  # torch's layer promotes it inside its matmul
        w = self.in_proj_weight
        if self_attn and w is not None and self.bias_k is None:
            qkv = F.linear(query, w, bias)  # (N, L, 3E)
            qkv = qkv.view(N, L, 3, H, D).permute(2, 0, 3, 1, 4)  # (3, N, H, L, D)
            q, k, v = qkv.unbind(0)  # (N, H, L, D) each
        else:
            q, k, v = self._project(query, key, value, self_attn, bias)  # (N, L|S, E) each
            if self.bias_k is not None and self.bias_v is not None:
                k = torch.cat([k, self.bias_k.expand(N, 1, E)], dim=1)  # (N, S+1, E)
                v = torch.cat([v, self.bias_v.expand(N, 1, E)], dim=1)  # (N, S+1, E)
            q = q.view(N, L, H, D).transpose(1, 2)  # (N, H, L, D)
            k = k.view(N, k.shape[1], H, D).transpose(1, 2)  # (N, H, S', D)
            v = v.view(N, v.shape[1], H, D).transpose(1, 2)  # (N, H, S', D)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(N, H, 1, D)], dim=2)  # (N, H, S'+1, D)
            v = torch.cat([v, v.new_zeros(N, H, 1, D)], dim=2)  # (N, H, S'+1, D)

        proj = self.out_proj
        return self._heads_out(
            q, k, v, mask, need_weights, average_attn_weights, proj.weight, proj.bias
        )

    def _heads_out(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: masks.Mask | None,
        need_weights: bool,
        average_attn_weights: bool,
        out_weight: torch.Tensor,
        out_bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of (N, H, L, D), (N, H, S', D), (N, H, S', D) heads, then ``out_proj``.

        Returns ``(output (N, L, E), weights (N, L, S') or (N, H, L, S') or None)``.
        """
        N, L = q.shape[0], q.shape[2]
        dropout_p = self.dropout if self.training else 0.0
        want: bool | Literal["mean"] = (
            "mean" if need_weights and average_attn_weights else bool(need_weights)
        )
        out, weights = attend(q, k, v, mask=mask, dropout_p=dropout_p, need_weights=want)
        out = out.transpose(1, 2).reshape(N, L, self.embed_dim)  # (N, L, E)
        out = F.linear(out, out_weight, out_bias)  # (N, L, E)
        if weights is not None:
            weights = weights.to(out.dtype)  # (N, L, S') averaged or (N, H, L, S')
        return out, weights

    def explain_path(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | masks.Mask | None = None,
        is_causal: bool = False,
    ) -> str:
        """Which computation :meth:`forward` runs for these arguments, and why; runs none.

        ``"torch._native_multi_head_attention"`` where the call takes torch's fused
        op (where torch's own layer takes it, and attnkit's checks of the values
        pass: see :mod:`attnkit.nn._mha_native`), else ``"attnkit.attention: "``
        followed by the reason the fused op is not taken. The input and masks are
        read as the forward reads them (a sum, and any fully masked row).
        """
        why = blocker(self, query, key, value, key_padding_mask, attn_mask, is_causal)
        return "torch._native_multi_head_attention" if why is None else f"attnkit.attention: {why}"

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
        - ``attn_mask`` (L, L), (N·H, L, L), (N, L, L) or (N, H, L, L): returned as
          (N, H, L, L) (broadcast or viewed), mask type 2; with a ``key_padding_mask``
          as well, the two are added (a logical or for bool masks), mask type 2;
        - neither: ``(None, None)``.

        Args:
            attn_mask: (L, L), (N·H, L, L), (N, L, L) or (N, H, L, L), bool (True =
                masked) or float: the shapes :meth:`forward` takes for self-attention.
            key_padding_mask: (N, L), bool (True = padding) or float.
            query: (N, L, E), batch first.

        Returns:
            ``(merged_mask, mask_type)``.

        Raises:
            ValueError: ``query`` is not 3-D, or ``attn_mask`` has none of those shapes.
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
        shapes = {(L, L): (1, 1), (N * H, L, L): (N, H), (N, L, L): (N, 1), (N, H, L, L): (N, H)}
        lead = shapes.get(tuple(attn_mask.shape))
        if lead is None:
            raise ValueError(
                f"{_OWNER}.merge_masks: attn_mask must be (L, L), (N*H, L, L), (N, L, L) or "
                f"(N, H, L, L) = {', '.join(str(tuple(s)) for s in shapes)} for this query "
                f"{shape_str(query)} and {H} heads, got {shape_str(attn_mask)}"
            )
        merged = attn_mask.view(*lead, L, L).expand(N, H, L, L)  # (N, H, L, L)
        if key_padding_mask is not None:
            padding = key_padding_mask.view(N, 1, 1, L).expand(N, H, 1, L)  # (N, H, 1, L)
            merged = merged + padding  # (N, H, L, L)
        return merged, 2

    # ------------------------------------------------------------------ pieces

    def _project(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        self_attn: bool,
        bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input projections of (N, *, features) inputs to (N, *, E).

        ``self_attn``: query, key and value are one tensor, projected by one matmul.
        ``bias``: ``in_proj_bias`` in the query's dtype, or None.
        """
        E = self.embed_dim
        b = bias
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
