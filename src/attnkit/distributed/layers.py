"""Run an :mod:`attnkit.nn` attention layer on sequence shards, context-parallel.

:class:`ContextParallel` wraps a ``SelfAttention`` or ``MultiheadAttention``: each
rank calls the wrapper with its shard of the sequence (as
:func:`attnkit.distributed.shard` cuts it, along the layer's sequence dim) and a
mask of the full sequence; the projections run on the rank's own tokens and the
attention itself runs through :func:`context_parallel_attention` over ``group``.
Parameter gradients are each rank's local part: sum them across the group
(:func:`attnkit.distributed.all_reduce_grads`, or DDP over the ranks).

The wrapper routes the layer's attention through :func:`attnkit.nn.attention_override`
for the duration of its forward only, so every other use of the layer is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .. import masks as _masks
from ..nn import multihead as _multihead
from ..nn import self_attention as _self_attention
from ..nn._common import attention_override
from .agree import refuse
from .api import attend
from .errors import ContextParallelError
from .layout import Layout, check_layout
from .plan import Strategy

__all__ = ["ContextParallel"]


@dataclass(frozen=True)
class _Route:
    group: dist.ProcessGroup | None
    layout: Layout
    strategy: Strategy | None
    backend: str | None

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        mask: _masks.Mask | None,
        dropout_p: float,
        need_weights: object,
        scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer's attention of (..., H, L_r, E) shards, across the group. A call this
        rank cannot make still takes part in the agreement, so every rank raises."""
        problem = None
        if need_weights:
            problem = ValueError(
                "ContextParallel: attention weights span the full sequence and are not "
                "returned; call the layer with need_weights=False / return_weights=False"
            )
        elif dropout_p > 0:
            problem = ValueError(
                f"ContextParallel: attention dropout is not supported (dropout_p={dropout_p}); "
                "build the layer with dropout=0.0 or call it in eval() mode"
            )
        out = attend(
            q, k, v, group=self.group, score="scaled_dot", mask=mask, scale=scale,
            layout=self.layout, strategy=self.strategy, return_lse=False,
            backend=self.backend, problem=problem,
        )  # fmt: skip
        return out, None


class ContextParallel(nn.Module):
    """A ``SelfAttention`` or ``MultiheadAttention`` run context-parallel over ``group``.

    Args:
        layer: an :class:`attnkit.nn.SelfAttention` or :class:`attnkit.nn.MultiheadAttention`
            (without ``add_bias_kv``/``add_zero_attn`` and with attention dropout off).
        group: the process group (None = the default group).
        layout: how the sequence is cut (``"zigzag"`` or ``"contiguous"``).
        strategy: ``"ring"``, ``"all_to_all"`` or None (chosen per call).
        backend: passed to every :func:`attnkit.attention` call.

    Call it as the layer, with this rank's shard of the sequence, and masks as
    :mod:`attnkit.masks` objects on the full sequence: ``SelfAttention``'s ``mask``,
    ``MultiheadAttention``'s ``attn_mask`` or ``is_causal=True`` (tensors of the local
    shape, such as ``key_padding_mask``, would describe the shard only and are
    refused). ``MultiheadAttention`` needs ``need_weights=False``. A KV cache is refused:
    prefill through the wrapper, decode with the unwrapped layer on one process.

    Raises:
        ContextParallelError: on every rank, naming the ranks at fault, when a rank's
            call is refused (by this wrapper, by the layer before its attention, or by
            the attention's agreement), before any block is computed or sent.
    """

    def __init__(
        self,
        layer: nn.Module,
        *,
        group: dist.ProcessGroup | None = None,
        layout: Layout = "zigzag",
        strategy: Strategy | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(layer, (_self_attention.SelfAttention, _multihead.MultiheadAttention)):
            raise TypeError(
                "ContextParallel: layer must be an attnkit.nn.SelfAttention or "
                f"attnkit.nn.MultiheadAttention, got {type(layer).__name__}"
            )
        if getattr(layer, "bias_k", None) is not None or getattr(layer, "add_zero_attn", False):
            raise ValueError(
                "ContextParallel: add_bias_kv / add_zero_attn add keys outside the sequence, "
                "which have no place in a sharded sequence; build the layer without them"
            )
        if strategy is not None and strategy not in ("ring", "all_to_all"):
            raise ValueError(f"strategy: expected 'ring', 'all_to_all' or None, got {strategy!r}")
        self.layer = layer
        self._route = _Route(group, check_layout(layout), strategy, backend)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The layer's forward on this rank's shard (see the class docstring)."""
        if kwargs.get("cache") is not None:  # every rank raises, as below
            refuse(
                ValueError(
                    "ContextParallel: cache= cannot decode a sharded sequence: each rank's "
                    "cache would hold its own shard's keys in layout order, not the "
                    "sequence's; prefill here without a cache, and decode with the "
                    "unwrapped layer (.layer) on one process"
                ),
                self._route.group,
            )
        local_only = [k for k in ("key_padding_mask",) if kwargs.get(k) is not None]
        mask = kwargs.get(
            "mask",
            args[1]
            if len(args) > 1 and isinstance(self.layer, _self_attention.SelfAttention)
            else None,
        )
        if isinstance(mask, torch.Tensor):
            local_only.append("mask (a tensor)")
        if isinstance(kwargs.get("attn_mask"), torch.Tensor):
            local_only.append("attn_mask (a tensor)")
        if local_only:  # every rank raises: this one takes part in the agreement, refusing
            refuse(
                ValueError(
                    f"ContextParallel: {', '.join(local_only)} would describe this rank's "
                    "shard only; pass an attnkit mask of the full sequence instead "
                    "(masks.key_padding, masks.keep, masks.bias, masks.causal, ...)"
                ),
                self._route.group,
            )
        reached = False

        def marked(*a: Any, **k: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            nonlocal reached
            reached = True
            return self._route.attend(*a, **k)

        try:
            with attention_override(marked):
                return self.layer(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError) as exc:
            if reached or isinstance(exc, ContextParallelError):
                raise
            # the layer refused or failed this rank's call before its attention (a
            # shape, a dtype, torch's own error): the other ranks wait in the agreement,
            # so this rank joins it
            refuse(exc, self._route.group)
