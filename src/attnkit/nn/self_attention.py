"""The classic self-attention block: QKV projection, attention dropout, output projection.

One layer covers the usual hand-written variants: separate ``q``/``k``/``v``
projections or one fused ``proj`` producing all three, dropout on the
attention weights, an optional output projection ``output_proj``, one or
several heads. The submodule names are those hand-written blocks commonly use,
so their weights load unchanged. The logits are scaled by 1/sqrt(head size).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import masks
from ._common import (
    attend,
    check_dropout,
    check_param_dtype,
    check_positive_int,
    check_tensor,
    shape_str,
)

__all__ = ["SelfAttention"]

_OWNER = "SelfAttention"


class SelfAttention(nn.Module):
    """Self-attention over a sequence, softmax(q kᵀ / sqrt(d)) v.

    Args:
        hidden_dim: the feature size of the input and of the output.
        num_heads: heads; must divide ``hidden_dim`` (head size d = hidden_dim / num_heads).
        fused_qkv: one ``proj`` Linear (hidden, 3·hidden) instead of ``q``, ``k``, ``v``.
        dropout: dropout on the attention weights while training, in [0, 1).
        out_proj: apply ``output_proj`` Linear (hidden, hidden) to the result.
        bias: biases in the projections.
    """

    def __init__(
        self,
        hidden_dim: int,
        num_heads: int = 1,
        fused_qkv: bool = True,
        dropout: float = 0.0,
        out_proj: bool = True,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.hidden_dim = check_positive_int(_OWNER, "hidden_dim", hidden_dim)
        self.num_heads = check_positive_int(_OWNER, "num_heads", num_heads)
        if hidden_dim % num_heads != 0:
            raise ValueError(f"{_OWNER}: num_heads={num_heads} must divide hidden_dim={hidden_dim}")
        self.head_dim = hidden_dim // num_heads
        self.dropout = check_dropout(_OWNER, dropout)
        self.fused_qkv = bool(fused_qkv)
        factory: dict[str, Any] = {"device": device, "dtype": dtype, "bias": bias}
        self.proj: nn.Linear | None = None
        self.q: nn.Linear | None = None
        self.k: nn.Linear | None = None
        self.v: nn.Linear | None = None
        if self.fused_qkv:
            self.proj = nn.Linear(hidden_dim, 3 * hidden_dim, **factory)
        else:
            self.q = nn.Linear(hidden_dim, hidden_dim, **factory)
            self.k = nn.Linear(hidden_dim, hidden_dim, **factory)
            self.v = nn.Linear(hidden_dim, hidden_dim, **factory)
        self.output_proj = nn.Linear(hidden_dim, hidden_dim, **factory) if out_proj else None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dropout={self.dropout}"

    def forward(
        self,
        x: torch.Tensor,
        mask: masks.Mask | torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from every position of ``x`` to every position of ``x``.

        Args:
            x: (B, S, hidden) or (S, hidden).
            mask: an :mod:`attnkit.masks` object over (B, H, S, S), or a keep
                tensor (B, S) or (B, S, S): bool or 0/1 numbers, nonzero = may
                attend (the ``masked_fill(mask == 0, -inf)`` convention). A query
                with no key left gives 0, not NaN.
            return_weights: also return the weights (B, H, S, S) (before dropout).

        Returns:
            (B, S, hidden) (or (S, hidden)); with ``return_weights`` the tuple
            ``(output, weights)``.
        """
        check_tensor(_OWNER, "x", x, f"(B, S, {self.hidden_dim})")
        if x.ndim not in (2, 3) or x.shape[-1] != self.hidden_dim:
            raise ValueError(
                f"{_OWNER}: x must have shape (B, S, {self.hidden_dim}) or (S, "
                f"{self.hidden_dim}), got {shape_str(x)}"
            )
        check_param_dtype(_OWNER, self, x=x)
        batched = x.ndim == 3
        xb = x if batched else x.unsqueeze(0)  # (B, S, hidden)
        B, S = xb.shape[0], xb.shape[1]
        m = self._mask(mask, B, S, batched)

        if self.proj is not None:
            q, k, v = self.proj(xb).chunk(3, dim=-1)  # 3 x (B, S, hidden)
        else:
            assert self.q is not None and self.k is not None and self.v is not None
            q, k, v = self.q(xb), self.k(xb), self.v(xb)  # 3 x (B, S, hidden)
        H, D = self.num_heads, self.head_dim
        q = q.view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        k = k.view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        v = v.view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
        dropout_p = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, mask=m, dropout_p=dropout_p, need_weights=return_weights)
        out = out.transpose(1, 2).reshape(B, S, self.hidden_dim)  # (B, S, hidden)
        if self.output_proj is not None:
            out = self.output_proj(out)  # (B, S, hidden)
        if not batched:
            out = out.squeeze(0)  # (S, hidden)
        if weights is None:
            return out
        return out, (weights if batched else weights.squeeze(0))  # (B, H, S, S) or (H, S, S)

    def _mask(self, mask: object, B: int, S: int, batched: bool) -> masks.Mask | None:
        """The ``mask`` argument as an attnkit mask over (B, H, S, S), or None."""
        if mask is None or isinstance(mask, masks.Mask):
            return mask
        if not isinstance(mask, torch.Tensor):
            raise TypeError(
                f"{_OWNER}: mask must be an attnkit mask or a keep tensor (B, S) / (B, S, S), "
                f"got {type(mask).__name__}"
            )
        if mask.is_floating_point():
            bad = (mask != 0) & (mask != 1)
            if bool(bad.any()):
                raise ValueError(
                    f"{_OWNER}: a float mask tensor must hold 0 (masked) and 1 (attend) only; "
                    "for an additive bias pass masks.bias(t)"
                )
        keep = mask if mask.dtype == torch.bool else mask != 0
        if not batched:
            keep = keep.unsqueeze(0)  # (1, S) or (1, S, S)
        if keep.shape == (B, S):
            return masks.keep(keep.view(B, 1, 1, S))  # (B, 1, 1, S)
        if keep.shape == (B, S, S):
            return masks.keep(keep.view(B, 1, S, S))  # (B, 1, S, S)
        want = f"({B}, {S}) or ({B}, {S}, {S})" if batched else f"({S},) or ({S}, {S})"
        raise ValueError(f"{_OWNER}: mask must have shape {want}, got {shape_str(mask)}")
