"""Keras ``MultiHeadAttention`` semantics in PyTorch, computed by :func:`attnkit.attention`.

Inputs may have any number of batch dims: a query of shape (B, *T, Fq)
attends over the chosen ``attention_axes`` (by default every axis but the
first and the last), all other axes being batch axes. The projections are
einsum kernels of Keras's shapes, so weights copy over one to one
(:meth:`EinsumMultiHeadAttention.from_keras`)::

    query (B, *T, Fq)  . query_kernel (Fq, H, Dk)  -> (B, *T, H, Dk)
    key   (B, *S, Fk)  . key_kernel   (Fk, H, Dk)  -> (B, *S, H, Dk)
    value (B, *S, Fv)  . value_kernel (Fv, H, Dv)  -> (B, *S, H, Dv)
    softmax(q·k / sqrt(Dk)) over the attention axes, per head
    with use_gate: heads *= sigmoid(query . gate_kernel (Fq, H, Dv) + gate_bias)
    heads (B, *T, H, Dv) . output_kernel (H, Dv, *O) -> (B, *T, *O)

The attention axes are flattened into one sequence (row-major) before
:func:`attnkit.attention` runs, so a causal mask over several attention axes
is causal in that raster order, and a ``sliding_window`` band is measured in
that order too (Keras defines both on the first attention axis; the two agree
whenever there is one attention axis). Where Keras and attnkit differ: a query row
that ``attention_mask`` masks entirely gives 0 here, with or without the scores (Keras
3.15 returns a uniform average of every value there on its fused path, without
``return_attention_scores``, and 0 with it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from .. import masks
from .._torch_features import check_compiling
from ._common import (
    attend,
    check_dropout,
    check_factory_device,
    check_factory_dtype,
    check_key_value,
    check_param_dtype,
    check_positive_int,
    keep_of_zero_one,
    shape_str,
)

__all__ = ["EinsumMultiHeadAttention"]

_OWNER = "EinsumMultiHeadAttention"

BIAS_HINT = (
    "a mask of 0 and -inf is an additive bias (torch's convention): pass (mask == 0), True = attend"
)
"""What a Keras-style layer says to a float mask that is not 0/1."""


class _Call(NamedTuple):
    """A call's arguments once checked: what :meth:`EinsumMultiHeadAttention.forward` runs."""

    key: torch.Tensor
    nd: int
    axes: tuple[int, ...]
    batch_axes: tuple[int, ...]
    b_sizes: tuple[int, ...]
    t_sizes: tuple[int, ...]
    s_sizes: tuple[int, ...]
    mask: masks.Mask | None
    scores: bool


def _scores_flag(value: object, owner: str) -> bool:
    """``return_attention_scores`` read as Keras reads it, by its truth value (None and 0
    are False, 1 is True), for the values that are flags: None, a bool or an int."""
    if value is None or isinstance(value, (bool, int, np.bool_, np.integer)):
        return bool(value)
    raise TypeError(
        f"{owner}: return_attention_scores must be True or False (None, 0 and 1 are read "
        f"as Keras reads them), got {type(value).__name__} {value!r}"
    )


class EinsumMultiHeadAttention(nn.Module):
    """Multi-head attention over arbitrary batch dims and attention axes (Keras semantics).

    Args:
        num_heads: H.
        key_dim: Dk, the size of each head for query and key; the logits are
            scaled by 1/sqrt(Dk).
        value_dim: Dv, the size of each head for value (default ``key_dim``).
        dropout: dropout on the attention weights while training, in [0, 1).
        use_bias: add biases to the four projections.
        output_shape: the trailing output shape O, an int or a tuple (default
            ``(query_features,)``).
        attention_axes: the query/value axes attention runs over, ints
            counted on the input (negative from the end; the feature axis
            -1 is not allowed). None: every axis but the first and the last.
        query_features: Fq, the last dim of ``query`` (required; for feature sizes
            inferred from the first call use :class:`attnkit.nn.MultiHeadAttention`).
        value_features: Fv, the last dim of ``value`` (default ``query_features``).
        key_features: Fk, the last dim of ``key`` (default ``value_features``).
        sliding_window: None, or w > 0: query position i attends only to key
            positions j with |i - j| < w (a symmetric band, positions counted
            from the start of both sequences); with ``use_causal_mask`` the
            band's causal half. Applied with :func:`attnkit.masks.window`.
        use_gate: gate every head's output elementwise by a sigmoid of a
            projection of the query, before the output projection (Keras's
            gated attention): ``gate_kernel`` (Fq, H, Dv), ``gate_bias`` (H, Dv).
        device, dtype: where and in which floating-point dtype the parameters live.

    Parameters: ``query_kernel`` (Fq, H, Dk), ``query_bias`` (H, Dk),
    ``key_kernel`` (Fk, H, Dk), ``key_bias`` (H, Dk), ``value_kernel``
    (Fv, H, Dv), ``value_bias`` (H, Dv), ``output_kernel`` (H, Dv, *O),
    ``output_bias`` (*O); with ``use_gate`` also ``gate_kernel`` (Fq, H, Dv)
    and ``gate_bias`` (H, Dv).
    """

    _sizes_from = "as given at construction"
    """Where the feature sizes came from, for errors (a lazy subclass builds them later)."""
    _owner = _OWNER
    """The class its errors name (a subclass names itself)."""

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_shape: int | Sequence[int] | None = None,
        attention_axes: int | Sequence[int] | None = None,
        *,
        query_features: int | None = None,
        value_features: int | None = None,
        key_features: int | None = None,
        sliding_window: int | None = None,
        use_gate: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_factory_dtype(self._owner, dtype)
        check_factory_device(self._owner, device)
        self.num_heads = check_positive_int(self._owner, "num_heads", num_heads)
        self.key_dim = check_positive_int(self._owner, "key_dim", key_dim)
        self.value_dim = (
            check_positive_int(self._owner, "value_dim", value_dim)
            if value_dim is not None
            else self.key_dim
        )
        self.dropout = check_dropout(self._owner, dropout)
        self.use_bias = bool(use_bias)
        if query_features is None:
            raise TypeError(
                f"{self._owner}: query_features (Fq, the last dim of query) is required, the "
                "parameters' shapes depend on it; to infer the feature sizes from the first "
                "call, as Keras does, use attnkit.nn.MultiHeadAttention(num_heads, key_dim, ...)"
            )
        self.query_features = check_positive_int(self._owner, "query_features", query_features)
        vf = value_features if value_features is not None else query_features
        self.value_features = check_positive_int(self._owner, "value_features", vf)
        kf = key_features if key_features is not None else self.value_features
        self.key_features = check_positive_int(self._owner, "key_features", kf)
        if output_shape is None:
            out: tuple[int, ...] = (self.query_features,)
        elif isinstance(output_shape, int) and not isinstance(output_shape, bool):
            out = (output_shape,)
        elif isinstance(output_shape, (tuple, list)):
            out = tuple(output_shape)
        else:
            raise TypeError(
                f"{self._owner}: output_shape must be None, an int or a tuple of ints, got "
                f"{output_shape!r}"
            )
        if not out:
            raise ValueError(f"{self._owner}: output_shape must not be empty, got {output_shape!r}")
        out = tuple(check_positive_int(self._owner, "output_shape entries", d) for d in out)
        self.output_shape = out
        if attention_axes is None:
            self.attention_axes: tuple[int, ...] | None = None
        elif isinstance(attention_axes, int) and not isinstance(attention_axes, bool):
            self.attention_axes = (attention_axes,)
        elif isinstance(attention_axes, (tuple, list)) and all(
            isinstance(a, int) and not isinstance(a, bool) for a in attention_axes
        ):
            if not attention_axes:
                raise ValueError(
                    f"{self._owner}: attention_axes must not be empty; use None for all"
                )
            self.attention_axes = tuple(attention_axes)
        else:
            raise TypeError(
                f"{self._owner}: attention_axes must be None, an int or a tuple of ints, got "
                f"{attention_axes!r}"
            )
        if self.attention_axes is not None and -1 in self.attention_axes:
            raise ValueError(
                f"{self._owner}: attention_axes must not hold -1, the feature axis of every "
                f"input, got {attention_axes!r}"
            )

        self.sliding_window = (
            None
            if sliding_window is None
            else check_positive_int(self._owner, "sliding_window", sliding_window)
        )
        if not isinstance(use_gate, bool):
            raise TypeError(f"{self._owner}: use_gate must be True or False, got {use_gate!r}")
        self.use_gate = use_gate

        H, Dk, Dv = self.num_heads, self.key_dim, self.value_dim
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.query_kernel = nn.Parameter(torch.empty(self.query_features, H, Dk, **factory))
        self.key_kernel = nn.Parameter(torch.empty(self.key_features, H, Dk, **factory))
        self.value_kernel = nn.Parameter(torch.empty(self.value_features, H, Dv, **factory))
        self.output_kernel = nn.Parameter(torch.empty(H, Dv, *out, **factory))
        self.gate_kernel: nn.Parameter | None = None
        self.gate_bias: nn.Parameter | None = None
        if self.use_gate:
            self.gate_kernel = nn.Parameter(torch.empty(self.query_features, H, Dv, **factory))
            if self.use_bias:
                self.gate_bias = nn.Parameter(torch.zeros(H, Dv, **factory))
        self.query_bias: nn.Parameter | None
        self.key_bias: nn.Parameter | None
        self.value_bias: nn.Parameter | None
        self.output_bias: nn.Parameter | None
        if self.use_bias:
            self.query_bias = nn.Parameter(torch.zeros(H, Dk, **factory))
            self.key_bias = nn.Parameter(torch.zeros(H, Dk, **factory))
            self.value_bias = nn.Parameter(torch.zeros(H, Dv, **factory))
            self.output_bias = nn.Parameter(torch.zeros(*out, **factory))
        else:
            for name in ("query_bias", "key_bias", "value_bias", "output_bias"):
                self.register_parameter(name, None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-uniform kernels (fan-in: contracted dims, fan-out: produced dims), zero biases."""
        kernels = [
            (self.query_kernel, 1),
            (self.key_kernel, 1),
            (self.value_kernel, 1),
            (self.output_kernel, 2),
        ]
        if self.gate_kernel is not None:
            kernels.append((self.gate_kernel, 1))
        for kernel, n_in in kernels:
            fan_in = math.prod(kernel.shape[:n_in])
            fan_out = math.prod(kernel.shape[n_in:])
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            nn.init.uniform_(kernel, -bound, bound)
        for b in (
            self.query_bias,
            self.key_bias,
            self.value_bias,
            self.output_bias,
            self.gate_bias,
        ):
            if b is not None:
                nn.init.zeros_(b)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, key_dim={self.key_dim}, value_dim={self.value_dim}, "
            f"query_features={self.query_features}, key_features={self.key_features}, "
            f"value_features={self.value_features}, output_shape={self.output_shape}, "
            f"attention_axes={self.attention_axes}, dropout={self.dropout}, "
            f"use_bias={self.use_bias}, sliding_window={self.sliding_window}, "
            f"use_gate={self.use_gate}"
        )

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        query: torch.Tensor,
        value: torch.Tensor,
        key: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        return_attention_scores: bool = False,
        use_causal_mask: bool = False,
        *,
        training: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` to ``key``/``value`` (``key`` defaults to ``value``).

        Args:
            query: (B, *T, Fq), at least 3 dims.
            value: (B, *S, Fv), as many dims as ``query``; its non-attention
                axes must equal the query's.
            key: (B, *S, Fk), same dims as ``value`` but the last; default ``value``.
            attention_mask: bool (True = may attend) or 0/1 numbers (nonzero =
                attend), broadcastable to the scores' shape (batch axes..., H,
                *T_attn, *S_attn) after Keras's rule: a mask with fewer dims gets
                size-1 dims inserted just before its trailing 2·n attention dims,
                so (B, T, S) fits a 3-D input. A float mask holding anything but
                0 and 1 (an additive -inf mask, NaN) is refused.
            return_attention_scores: also return the attention weights, shaped
                (batch axes..., H, *T_attn, *S_attn) like Keras's. Read by its truth
                value as Keras reads it (None and 0 are False, 1 is True); a value that
                is not a flag (a string such as ``"mean"``) is a TypeError.
            use_causal_mask: query position i attends to key positions j <= i
                (top-left; positions of several attention axes in row-major order).
                Combines with the layer's ``sliding_window``.
            training: Keras's flag: None (default) follows the module's mode
                (``.train()``/``.eval()``); True or False applies dropout or not
                for this call.

        Returns:
            output (B, *T, *O); with ``return_attention_scores`` the tuple
            ``(output, scores)``.
        """
        check_compiling()
        call = self._check_call(
            query, value, key, attention_mask, return_attention_scores, use_causal_mask, training
        )
        key, nd, axes, batch_axes = call.key, call.nd, call.axes, call.batch_axes
        b_sizes, t_sizes, s_sizes = call.b_sizes, call.t_sizes, call.s_sizes

        q = self._project(query, self.query_kernel, self.query_bias)  # (B, *T, H, Dk)
        k = self._project(key, self.key_kernel, self.key_bias)  # (B, *S, H, Dk)
        v = self._project(value, self.value_kernel, self.value_bias)  # (B, *S, H, Dv)
        # Projected axes: input axes 0..nd-2 keep their index, heads at nd-1, features at nd.
        perm = (*batch_axes, nd - 1, *axes, nd)
        Tf, Sf = math.prod(t_sizes), math.prod(s_sizes)
        H = self.num_heads
        q = q.permute(perm).reshape(*b_sizes, H, Tf, self.key_dim)  # (*batch, H, T, Dk)
        k = k.permute(perm).reshape(*b_sizes, H, Sf, self.key_dim)  # (*batch, H, S, Dk)
        v = v.permute(perm).reshape(*b_sizes, H, Sf, self.value_dim)  # (*batch, H, S, Dv)

        dropout_p = self.dropout if (self.training if training is None else training) else 0.0
        out, weights = attend(
            q,
            k,
            v,
            mask=call.mask,
            scale=1.0 / math.sqrt(self.key_dim),
            dropout_p=dropout_p,
            need_weights=call.scores,
        )  # (*batch, H, T, Dv), (*batch, H, T, S)
        out = out.reshape(*b_sizes, H, *t_sizes, self.value_dim)  # (*batch, H, *T, Dv)
        inverse = [0] * len(perm)
        for i, p in enumerate(perm):
            inverse[p] = i
        out = out.permute(inverse)  # (B, *T, H, Dv) in the query's axis order
        if self.gate_kernel is not None:
            gate = self._project(query, self.gate_kernel, self.gate_bias)  # (B, *T, H, Dv)
            out = out * torch.sigmoid(gate)  # (B, *T, H, Dv)
        y = torch.einsum("...hd,hdo->...o", out, self.output_kernel.flatten(2))  # (B, *T, prod O)
        y = y.reshape(*y.shape[:-1], *self.output_shape)  # (B, *T, *O)
        if self.output_bias is not None:
            y = y + self.output_bias  # (B, *T, *O)
        if weights is None:
            return y
        scores = weights.to(y.dtype).reshape(*b_sizes, H, *t_sizes, *s_sizes)  # Keras layout
        return y, scores

    # ------------------------------------------------------------------ pieces

    def _check_call(
        self,
        query: object,
        value: object,
        key: object,
        attention_mask: object,
        return_attention_scores: object,
        use_causal_mask: object,
        training: object,
        *,
        features: bool = True,
    ) -> _Call:
        """Check every argument of a call, before any compute, and build its mask.

        ``features=False`` leaves out the feature sizes of query, key and value: the lazy
        :class:`attnkit.nn.MultiHeadAttention` runs these checks before it builds its
        parameters from those sizes, so a call refused here builds nothing.
        """
        if key is None:
            key = value
        nd = self._check_inputs(query, value, key, features=features)
        assert isinstance(query, torch.Tensor) and isinstance(value, torch.Tensor)
        assert isinstance(key, torch.Tensor)
        axes = self._resolve_axes(nd)
        batch_axes = tuple(a for a in range(nd - 1) if a not in axes)
        for a in batch_axes:
            if not (query.shape[a] == key.shape[a] == value.shape[a]):
                raise ValueError(
                    f"{self._owner}: query and key/value must agree on the non-attention axis {a} "
                    f"(attention_axes={axes}), got query {shape_str(query)} and value "
                    f"{shape_str(value)}"
                )
        scores = _scores_flag(return_attention_scores, self._owner)
        if not isinstance(use_causal_mask, bool):
            raise TypeError(
                f"{self._owner}: use_causal_mask must be True or False, got {use_causal_mask!r}"
            )
        if training is not None and not isinstance(training, bool):
            raise TypeError(
                f"{self._owner}: training must be None, True or False, got {training!r}"
            )
        t_sizes = tuple(int(query.shape[a]) for a in axes)
        s_sizes = tuple(int(key.shape[a]) for a in axes)
        b_sizes = tuple(int(query.shape[a]) for a in batch_axes)
        mask = self._build_mask(attention_mask, b_sizes, t_sizes, s_sizes, use_causal_mask)
        return _Call(key, nd, axes, batch_axes, b_sizes, t_sizes, s_sizes, mask, scores)

    @staticmethod
    def _project(x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x (..., F) . kernel (F, H, D) (+ bias (H, D)) -> (..., H, D)."""
        y = torch.einsum("...f,fhd->...hd", x, kernel)  # (..., H, D)
        return y if bias is None else y + bias

    def _check_inputs(
        self, query: object, value: object, key: object, *, features: bool = True
    ) -> int:
        for name, t, f, layout in (
            ("query", query, self.query_features, "(B, *T, Fq)"),
            ("value", value, self.value_features, "(B, *S, Fv)"),
            ("key", key, self.key_features, "(B, *S, Fk)"),
        ):
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"{self._owner}: {name} must be a torch.Tensor of shape {layout}, got "
                    f"{type(t).__name__}"
                )
            if not t.is_floating_point():
                raise TypeError(
                    f"{self._owner}: {name} must be floating point, got dtype {t.dtype}"
                )
            if t.ndim < 3:
                raise ValueError(
                    f"{self._owner}: {name} must have shape {layout} with at least 3 dims, got "
                    f"{shape_str(t)}"
                )
            if features and t.shape[-1] != f:
                raise ValueError(
                    f"{self._owner}: {name} has {t.shape[-1]} features (last dim of {shape_str(t)}), "
                    f"expected {f} {self._sizes_from}"
                )
        assert isinstance(query, torch.Tensor) and isinstance(value, torch.Tensor)
        assert isinstance(key, torch.Tensor)
        if value.ndim != query.ndim:
            raise ValueError(
                f"{self._owner}: value must have as many dims as query, got query {shape_str(query)} "
                f"and value {shape_str(value)}"
            )
        check_key_value(self._owner, key, value)
        if not (query.dtype == key.dtype == value.dtype):
            raise TypeError(
                f"{self._owner}: query, key and value must share a dtype, got {query.dtype}, "
                f"{key.dtype}, {value.dtype}"
            )
        check_param_dtype(self._owner, self, query=query)
        return query.ndim

    def _resolve_axes(self, nd: int) -> tuple[int, ...]:
        """Attention axes as non-negative input axes, in the given order."""
        if self.attention_axes is None:
            return tuple(range(1, nd - 1))
        axes = tuple(a + nd if a < 0 else a for a in self.attention_axes)
        for given, a in zip(self.attention_axes, axes, strict=True):
            if not 0 <= a <= nd - 2:
                raise ValueError(
                    f"{self._owner}: attention_axes entry {given} does not name a non-feature axis "
                    f"of a {nd}-D input; expected values in [{-nd}, {nd - 2}] except -1"
                )
        if len(set(axes)) != len(axes):
            raise ValueError(
                f"{self._owner}: attention_axes has a repeated axis: {self.attention_axes}"
            )
        return axes

    def _build_mask(
        self,
        attention_mask: object,
        b_sizes: tuple[int, ...],
        t_sizes: tuple[int, ...],
        s_sizes: tuple[int, ...],
        causal: bool,
    ) -> masks.Mask | None:
        """Keras's ``attention_mask`` and causal flag as one mask over (*batch, H, T, S)."""
        parts: list[masks.Mask] = []
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor):
                raise TypeError(
                    f"{self._owner}: attention_mask must be a bool tensor (True = attend), got "
                    f"{type(attention_mask).__name__}"
                )
            n = len(t_sizes)
            full = (*b_sizes, self.num_heads, *t_sizes, *s_sizes)
            m = keep_of_zero_one(self._owner, "attention_mask", attention_mask, BIAS_HINT)
            if m.ndim < 2 * n or m.ndim > len(full):
                raise ValueError(
                    f"{self._owner}: attention_mask of shape {shape_str(m)} does not fit the scores "
                    f"{shape_str(full)} (batch axes..., heads, query attention axes..., key "
                    f"attention axes...)"
                )
            lead = m.shape[: m.ndim - 2 * n]
            # Keras's rule: the missing dims are inserted just before the attention dims.
            m = m.reshape(*lead, *([1] * (len(full) - m.ndim)), *m.shape[m.ndim - 2 * n :])
            if any(d != 1 and d != f for d, f in zip(m.shape, full, strict=True)):  # (not `in`)
                raise ValueError(
                    f"{self._owner}: attention_mask of shape {shape_str(attention_mask)} does not "
                    f"broadcast to the scores {shape_str(full)} (batch axes..., heads, query "
                    f"attention axes..., key attention axes...)"
                )
            nb = len(b_sizes) + 1
            m = m.expand(*m.shape[:nb], *t_sizes, *s_sizes)  # (*batch', H', *T, *S)
            m = m.reshape(*m.shape[:nb], math.prod(t_sizes), math.prod(s_sizes))  # (.., T, S)
            parts.append(masks.keep(m))
        if causal:
            parts.append(masks.causal())
        if self.sliding_window is not None:
            reach = self.sliding_window - 1  # |i - j| < w: up to w - 1 on either side
            parts.append(masks.window(reach, reach, "top_left"))
        if not parts:
            return None
        combined = parts[0]
        for part in parts[1:]:
            combined = combined & part
        return combined

    # ------------------------------------------------------------------ keras

    @classmethod
    def from_keras(cls, layer: Any) -> EinsumMultiHeadAttention:
        """Build a layer equal to a built ``keras.layers.MultiHeadAttention``, weights copied.

        The Keras layer must be built (called once, or ``build(query_shape,
        value_shape)``). Its ``use_gate`` (with the ``gate`` kernel and bias) and
        ``sliding_window`` options carry over. Projections with LoRA enabled are copied
        merged: each kernel as Keras computes it, ``kernel + (alpha / rank) lora_a @
        lora_b``, by value (later training of either layer does not reach the other).
        The new layer's parameters have the dtype of the Keras layer's variables (float32
        by default; float64 for a layer built with ``dtype="float64"``).
        """
        qd = getattr(layer, "_query_dense", None)
        if qd is None or not getattr(layer, "built", False):
            raise ValueError(
                f"{_OWNER}.from_keras: the Keras layer is not built; call it once or "
                "build(query_shape, value_shape) first"
            )
        use_gate = bool(getattr(layer, "_use_gate", False))
        window = getattr(layer, "_sliding_window", None)

        def arr(var: Any) -> torch.Tensor:
            """A weight's value, copied in its own dtype (CPU, no autograd history). A
            kernel with LoRA enabled (``enable_lora``) is computed on each read, ``kernel +
            (alpha / rank) lora_a @ lora_b``: on the torch backend a tensor in Keras's
            graph. A bfloat16 array (ml_dtypes, which numpy lacks) goes through float32,
            exactly."""
            if isinstance(var, torch.Tensor):
                return var.detach().to(device="cpu").clone()
            value = np.array(var.numpy() if hasattr(var, "numpy") else var)
            if value.dtype.name == "bfloat16":
                return torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
            return torch.from_numpy(value)

        qk, kk, vk = arr(qd.kernel), arr(layer._key_dense.kernel), arr(layer._value_dense.kernel)
        ok = arr(layer._output_dense.kernel)
        new = cls(
            num_heads=int(layer.num_heads),
            key_dim=int(layer.key_dim),
            value_dim=int(layer.value_dim),
            dropout=float(layer.dropout),
            use_bias=bool(layer.use_bias),
            output_shape=tuple(int(d) for d in ok.shape[2:]),
            attention_axes=layer.attention_axes,
            query_features=int(qk.shape[0]),
            value_features=int(vk.shape[0]),
            key_features=int(kk.shape[0]),
            sliding_window=None if window is None else int(window),
            use_gate=use_gate,
            dtype=qk.dtype,  # the Keras variables' dtype: a float64 layer is not rounded
        )
        dense_layers = [
            ("query", qd),
            ("key", layer._key_dense),
            ("value", layer._value_dense),
            ("output", layer._output_dense),
        ]
        if use_gate:
            dense_layers.append(("gate", layer._gate_dense))
        with torch.no_grad():
            for prefix, dense in dense_layers:
                getattr(new, f"{prefix}_kernel").copy_(arr(dense.kernel))
                if new.use_bias:
                    getattr(new, f"{prefix}_bias").copy_(arr(dense.bias))
        return new
