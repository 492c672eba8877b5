"""``keras.layers.MultiHeadAttention`` in PyTorch: feature sizes inferred from the first call.

:class:`MultiHeadAttention` takes Keras's constructor and call arguments. Like a Keras
layer (and torch's lazy modules, :class:`torch.nn.modules.lazy.LazyModuleMixin`), it
learns the feature sizes of query, key and value from its first call: until then its
kernels are :class:`torch.nn.parameter.UninitializedParameter` (``.to(device)`` works;
build an optimizer after the first call). It is an
:class:`attnkit.nn.EinsumMultiHeadAttention` once built: same parameters, same
state_dict keys, same numbers, attention through :func:`attnkit.attention`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedParameter

from ._common import check_factory_device, check_factory_dtype, keep_of_zero_one, shape_str
from .einsum import BIAS_HINT, EinsumMultiHeadAttention

__all__ = ["MultiHeadAttention"]

_OWNER = "MultiHeadAttention"


class MultiHeadAttention(LazyModuleMixin, EinsumMultiHeadAttention):
    """Keras's ``MultiHeadAttention``, feature sizes inferred from the first call.

    Not torch's layer: for ``torch.nn.MultiheadAttention(embed_dim, num_heads)`` use
    :class:`attnkit.nn.MultiheadAttention` (lower-case h, torch's spelling).

    Args:
        num_heads: H.
        key_dim: Dk, the size of each head for query and key; logits scaled by 1/sqrt(Dk).
        value_dim: Dv, the size of each head for value (default ``key_dim``).
        dropout: dropout on the attention weights while training, in [0, 1).
        use_bias: biases on the four projections.
        output_shape: the trailing output shape O, an int or a tuple (default: the
            query's feature size Fq, known at the first call).
        attention_axes: the axes attention runs over (None: every axis but the first
            and the last), as in :class:`attnkit.nn.EinsumMultiHeadAttention`.
        sliding_window, use_gate: as in :class:`attnkit.nn.EinsumMultiHeadAttention`.
        device, dtype: of the parameters when they are built (floating point).

    Parameters, built at the first call from query (B, *T, Fq), value (B, *S, Fv) and
    key (B, *S, Fk): ``query_kernel`` (Fq, H, Dk), ``key_kernel`` (Fk, H, Dk),
    ``value_kernel`` (Fv, H, Dv), ``output_kernel`` (H, Dv, *O) and their biases, Glorot
    uniform and zeros as Keras initializes them. ``load_state_dict`` before the first
    call builds them from the loaded shapes.

    Examples:
        >>> import torch
        >>> from attnkit.nn import MultiHeadAttention
        >>> mha = MultiHeadAttention(num_heads=2, key_dim=4)
        >>> x = torch.randn(3, 5, 8)                          # (B, T, F)
        >>> mha(x, x, use_causal_mask=True).shape             # self-attention, causal
        torch.Size([3, 5, 8])
        >>> mha.query_kernel.shape                            # (Fq, H, Dk), from the call
        torch.Size([8, 2, 4])
    """

    _sizes_from = "as built at the first call (or loaded)"
    _owner = _OWNER

    cls_to_become = None  # stays this class: its forward takes Keras's ``training``

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
        sliding_window: int | None = None,
        use_gate: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        check_factory_dtype(_OWNER, dtype)
        check_factory_device(_OWNER, device)
        # Every argument is checked by EinsumMultiHeadAttention; its parameters are built
        # on the meta device (nothing allocated) with placeholder feature sizes, then
        # replaced by uninitialized ones until the first call gives the sizes.
        super().__init__(
            num_heads,
            key_dim,
            value_dim,
            dropout,
            use_bias,
            output_shape,
            attention_axes,
            query_features=1,
            sliding_window=sliding_window,
            use_gate=use_gate,
            device="meta",
            dtype=dtype,
        )
        self._output_shape_arg = None if output_shape is None else self.output_shape
        self.query_features = self.key_features = self.value_features = 0  # not known yet
        for name, param in list(self._parameters.items()):
            if param is not None:
                lazy = UninitializedParameter(device=device, dtype=dtype)  # type: ignore[call-arg]
                self._parameters[name] = lazy  # type: ignore[assignment]

    def initialize_parameters(self, *args: Any, **kwargs: Any) -> None:
        """Build the parameters from the first call's feature sizes (LazyModuleMixin).

        Takes the first call's arguments, those of :meth:`forward`: query (B, *T, Fq),
        value (B, *S, Fv), key (B, *S, Fk) or None (= value), and the rest. They are
        checked first, as :meth:`forward` checks them: a first call that is refused
        builds nothing, and the next call sets the sizes.
        """
        try:
            bound = inspect.signature(self.forward).bind(*args, **kwargs)
        except TypeError as e:  # what forward itself would raise, under its name
            raise TypeError(f"{_OWNER}.forward(): {e}") from None
        bound.apply_defaults()
        arg = bound.arguments
        query, value, key = arg["query"], arg["value"], arg["key"]
        if key is None:
            key = value
        for name, t in (("query", query), ("value", value), ("key", key)):
            if not isinstance(t, torch.Tensor) or t.ndim < 3 or t.shape[-1] == 0:
                got = shape_str(t) if isinstance(t, torch.Tensor) else type(t).__name__
                raise (ValueError if isinstance(t, torch.Tensor) else TypeError)(
                    f"{_OWNER}: {name} must be a tensor of shape (B, *T, F) with at least 3 "
                    f"dims and F >= 1 (its last dim F sets the layer's {name} features), "
                    f"got {got}"
                )
        assert isinstance(query, torch.Tensor) and isinstance(value, torch.Tensor)
        assert isinstance(key, torch.Tensor)
        if not self.has_uninitialized_params():  # built, or loaded from a state_dict
            self._read_sizes()
            return
        attention_mask = self._keras_masks(
            query, value, arg["query_mask"], arg["value_mask"], arg["key_mask"],
            arg["attention_mask"],
        )  # fmt: skip
        self._check_call(
            query,
            value,
            key,
            attention_mask,
            arg["return_attention_scores"],
            arg["use_causal_mask"],
            arg["training"],
            features=False,
        )
        Fq, Fv, Fk = int(query.shape[-1]), int(value.shape[-1]), int(key.shape[-1])
        self.query_features, self.value_features, self.key_features = Fq, Fv, Fk
        if self._output_shape_arg is None:
            self.output_shape = (Fq,)
        H, Dk, Dv, out = self.num_heads, self.key_dim, self.value_dim, self.output_shape
        shapes = {
            "query_kernel": (Fq, H, Dk),
            "key_kernel": (Fk, H, Dk),
            "value_kernel": (Fv, H, Dv),
            "output_kernel": (H, Dv, *out),
            "gate_kernel": (Fq, H, Dv),
            "query_bias": (H, Dk),
            "key_bias": (H, Dk),
            "value_bias": (H, Dv),
            "output_bias": out,
            "gate_bias": (H, Dv),
        }
        with torch.no_grad():
            for name, param in self._parameters.items():
                if isinstance(param, UninitializedParameter):
                    param.materialize(shapes[name])
            self.reset_parameters()

    def _read_sizes(self) -> None:
        """The feature sizes and output shape of parameters already built (loaded)."""
        self.query_features = int(self.query_kernel.shape[0])
        self.key_features = int(self.key_kernel.shape[0])
        self.value_features = int(self.value_kernel.shape[0])
        self.output_shape = tuple(int(d) for d in self.output_kernel.shape[2:])

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Load as torch does; an ``output_shape`` given at construction must be the
        loaded ``output_kernel``'s last dims (a lazy parameter takes any shape)."""
        kernel = state_dict.get(prefix + "output_kernel")
        want = self._output_shape_arg
        if want is not None and isinstance(kernel, torch.Tensor):
            got = tuple(int(d) for d in kernel.shape[2:])
            if got != tuple(want):
                error_msgs.append(
                    f"size mismatch for {prefix}output_kernel: copying a param with shape "
                    f"{tuple(kernel.shape)}, whose output shape {got} is not the "
                    f"output_shape={tuple(want)} this {_OWNER} was built with"
                )
                return
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if not self.has_uninitialized_params():
            self._read_sizes()

    @classmethod
    def from_keras(cls, layer: Any) -> MultiHeadAttention:
        """Build a layer equal to a built ``keras.layers.MultiHeadAttention``, weights copied.

        The same copy as :meth:`EinsumMultiHeadAttention.from_keras` (``use_gate``,
        ``sliding_window`` and LoRA-merged kernels carry over), loaded into this Keras-shaped
        layer, whose feature sizes then come from the copied weights, in their dtype.
        """
        einsum = EinsumMultiHeadAttention.from_keras(layer)
        new = cls(
            num_heads=einsum.num_heads,
            key_dim=einsum.key_dim,
            value_dim=einsum.value_dim,
            dropout=einsum.dropout,
            use_bias=einsum.use_bias,
            output_shape=einsum.output_shape,
            attention_axes=einsum.attention_axes,
            sliding_window=einsum.sliding_window,
            use_gate=einsum.use_gate,
            dtype=einsum.query_kernel.dtype,
        )
        new.load_state_dict(einsum.state_dict())
        return new

    def extra_repr(self) -> str:
        if self.has_uninitialized_params():
            return (
                f"num_heads={self.num_heads}, key_dim={self.key_dim}, "
                f"value_dim={self.value_dim}, feature sizes: inferred at the first call"
            )
        return super().extra_repr()

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        value: torch.Tensor,
        key: torch.Tensor | None = None,
        query_mask: torch.Tensor | None = None,
        value_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        return_attention_scores: bool = False,
        training: bool | None = None,
        use_causal_mask: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Keras's call, its arguments in Keras's order: attend from ``query`` to
        ``key``/``value``.

        Args:
            query: (B, *T, Fq).
            value: (B, *S, Fv).
            key: (B, *S, Fk), default ``value``.
            query_mask: refused unless None. Keras 3 drops this argument for the query's
                own Keras mask, which a torch tensor does not have (so a mask passed
                here is ignored there); mask query rows with ``attention_mask``.
            value_mask, key_mask: (B, *S) bool or 0/1 numbers, True (nonzero) = a key
                that may be attended, as Keras reads them: combined with
                ``attention_mask`` by "and", over every query. One attention axis only
                (Keras's own expansion of them is defined for one). A float mask
                holding anything but 0 and 1 is refused.
            attention_mask: Keras's polarity: bool True (or 1) = may attend, broadcastable
                to (B, H, *T, *S) under Keras's rule (a (B, T, S) mask fits 3-D inputs).
                A query row it masks entirely gives 0 (Keras 3.15: a uniform average
                without ``return_attention_scores``, 0 with it).
            return_attention_scores: also return the weights (B, H, *T, *S); read by its
                truth value, as Keras does (None, 0: no; 1: yes; a string is a TypeError).
            training: None follows ``.train()``/``.eval()``; True/False: dropout or not.
            use_causal_mask: query i attends to keys j <= i (top-left, as Keras).

        Returns:
            output (B, *T, *O), or ``(output, scores)``.
        """
        attention_mask = self._keras_masks(query, value, query_mask, value_mask, key_mask,
                                           attention_mask)  # fmt: skip
        return super().forward(
            query,
            value,
            key,
            attention_mask,
            return_attention_scores,
            use_causal_mask,
            training=training,
        )

    def _keras_masks(
        self,
        query: torch.Tensor,
        value: torch.Tensor,
        query_mask: torch.Tensor | None,
        value_mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """``attention_mask`` and the (B, *S) key masks as one bool mask, as Keras
        combines them (each key mask expanded to (B, 1, S)); unchanged without them.
        A ``query_mask`` is refused (see :meth:`forward`)."""
        if query_mask is not None:
            raise TypeError(
                f"{_OWNER}: query_mask is not read: Keras 3 replaces it with the query's "
                "own Keras mask (a torch tensor has none, so Keras ignores what is passed "
                "here); mask query rows with attention_mask, (B, T, S) with False rows"
            )
        given = [(n, m) for n, m in (("value_mask", value_mask), ("key_mask", key_mask))
                 if m is not None]  # fmt: skip
        if not given:
            return attention_mask
        if not isinstance(value, torch.Tensor) or not isinstance(query, torch.Tensor):
            return attention_mask  # (the call's own check names them)
        nd = value.ndim
        axes = self.attention_axes if self.attention_axes is not None else range(1, nd - 1)
        axes = tuple(a % nd for a in axes)
        if axes != (nd - 2,):
            # Keras expands such a mask to (..., 1, S) over the last axis before the
            # features: over any other attention axis it would mask the wrong keys
            raise ValueError(
                f"{_OWNER}: {given[0][0]} masks the keys of one attention axis, the last "
                f"before the features (as Keras expands it); with attention_axes="
                f"{self.attention_axes} and inputs of {nd} dims pass the keys' mask in "
                "attention_mask instead"
            )
        auto: torch.Tensor | None = None
        for name, m in given:
            if not isinstance(m, torch.Tensor):
                raise TypeError(f"{_OWNER}: {name} must be a torch.Tensor, got {type(m).__name__}")
            if tuple(m.shape) != tuple(value.shape[:-1]):
                raise ValueError(
                    f"{_OWNER}: {name} must have the value's shape but its features, "
                    f"{tuple(value.shape[:-1])} (B, *S), got {shape_str(m)}"
                )
            keep = keep_of_zero_one(_OWNER, name, m, BIAS_HINT).unsqueeze(-2)  # (B, ..., 1, S)
            auto = keep if auto is None else auto & keep
        assert auto is not None
        if attention_mask is None:
            return auto
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.is_complex():
            return attention_mask  # (the call's own check names it)
        given_keep = keep_of_zero_one(_OWNER, "attention_mask", attention_mask, BIAS_HINT)
        try:
            return given_keep & auto  # Keras's "and", broadcast as numpy broadcasts
        except RuntimeError:
            return attention_mask  # shapes that do not broadcast: the call's check names them
