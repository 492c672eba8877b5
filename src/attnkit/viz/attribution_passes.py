"""The passes behind :func:`attnkit.viz.explain`: one forward and backward at the input,
the interpolation batches of integrated gradients, and the forward of rollout.

Everything about attention comes from inside :func:`attnkit.attention`: while a
:class:`HeadRecorder` is active (the recording hook of :mod:`attnkit._recording`, as
:func:`attnkit.viz.capture` uses it), each call's per-head output ``o`` (*batch, H, L, Ev),
taken before the model's output projection, gets a gradient hook. When the backward
reaches it, the hook has ``∂y/∂o`` and derives, per head,

- Michel et al.'s importance ``|Σ_{i,e} o ⊙ ∂y/∂o|``;
- the gradient with respect to the attention weights, exactly: the output is
  ``o = A·V``, so ``∂y/∂A = (∂y/∂o)·Vᵀ`` (A takes no other path to y), and Chefer et
  al.'s layer map ``Ā = mean_h (∂y/∂A ⊙ A)⁺``, with ``A`` the call's exact weights
  recomputed by attnkit (without dropout) at that moment, so no layer's weights wait
  for the backward.

Only ``Ā`` (L, S) per layer is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import _recording
from .capture import _exact_weights
from .model_modes import evaluating
from .rollout import _lower_product, mix_residual

if TYPE_CHECKING:
    from .._inputs import AttentionInputs
    from ..backends.base import AttentionResult, Backend

__all__ = [
    "IG_BATCH_TOKENS",
    "INTEGRATIONS",
    "HeadRecorder",
    "chefer_relevance",
    "integrated_gradients",
    "integration_points",
    "on_attnkit",
    "recording",
    "rollout_matrix",
]

INTEGRATIONS = (
    "gausslegendre",
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
)
IG_BATCH_TOKENS = 4096
"""Integrated gradients runs this many tokens (interpolation points × input length) a forward."""

Objective = Callable[[Any], torch.Tensor]


@dataclass
class HeadRecorder:
    """Per-layer head importance and Chefer's layer maps, filled by the backward.

    Attributes:
        layer_maps: keep ``Ā`` of each layer (attention × gradient) or not.
        outputs: the per-head outputs (*batch, H, L, Ev) in call order (detached).
        importance: per call, (H,) ``|Σ o ⊙ ∂y/∂o|`` over batch element 0, once known.
        maps: per call, ``Ā`` (L, S) of batch element 0, once known.
    """

    layer_maps: bool = False
    outputs: list[torch.Tensor] = field(default_factory=list)
    importance: dict[int, torch.Tensor] = field(default_factory=dict)
    maps: dict[int, torch.Tensor] = field(default_factory=dict)

    def record(self, inputs: AttentionInputs, result: AttentionResult, backend: Backend) -> None:
        out = result.output  # (*batch, H, L, Ev): each head's output, before any projection
        if out.ndim != 4:
            raise ValueError(
                "model: explain needs attention calls with (batch, heads) leading dims, got "
                f"an output of shape {tuple(out.shape)}"
            )
        index = len(self.outputs)
        self.outputs.append(out.detach())
        if not out.requires_grad:
            return
        out.register_hook(self._hook(index, inputs, result, backend))

    def _hook(
        self, index: int, inputs: AttentionInputs, result: AttentionResult, backend: Backend
    ) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            o = self.outputs[index][0]  # (H, L, Ev)
            g = grad[0].to(o.dtype)  # (H, L, Ev)
            self.importance[index] = (o * g).sum(dim=(-2, -1)).abs()  # (H,)
            if not self.layer_maps:
                return
            weights, _ = _exact_weights(inputs, result, backend)  # (*batch, H, L, S)
            v = inputs.value.detach()[0]  # (Hk, S, Ev)
            if inputs.groups > 1:
                v = v.repeat_interleave(inputs.groups, dim=-3)  # (H, S, Ev)
            grad_a = g @ v.transpose(-1, -2).to(g.dtype)  # (H, L, S): ∂y/∂A = ∂y/∂o · Vᵀ
            cam = (grad_a * weights[0].to(g.dtype)).clamp_min(0)  # (H, L, S)
            self.maps[index] = cam.mean(dim=0)  # (L, S)

        return hook

    def head_importance(self) -> torch.Tensor:
        """(layers, heads): one row per attention call, in call order."""
        n = len(self.outputs)
        missing = [i for i in range(n) if i not in self.importance]
        if not n or missing:
            raise RuntimeError(
                "model: no gradient reached the attention output of call(s) "
                f"{missing or 'any'}; is every layer on the path to the target?"
            )
        return torch.stack([self.importance[i] for i in range(n)])  # (layers, H)

    def layer_map_stack(self) -> list[torch.Tensor]:
        """Chefer's ``Ā`` of every layer, in forward order: (L, L) each."""
        return [self.maps[i] for i in range(len(self.outputs))]


@contextmanager
def recording(recorder: Any) -> Iterator[Any]:
    """Within the block, every :func:`attnkit.attention` call reports to ``recorder``
    (then to the recorder that was active before, if any)."""
    parent = _recording.ACTIVE.get()

    class _Both:
        # (for _recording.reaches: the calls reach both)
        also, parent = recorder, _recording.ACTIVE.get()

        def record(self, inputs: Any, result: Any, backend: Any) -> None:
            recorder.record(inputs, result, backend)
            if parent is not None:
                parent.record(inputs, result, backend)

    token = _recording.ACTIVE.set(_Both())
    try:
        yield recorder
    finally:
        _recording.ACTIVE.reset(token)


@contextmanager
def on_attnkit(model: nn.Module) -> Iterator[None]:
    """Within the block the model's attention runs through :func:`attnkit.attention`
    (``attn_implementation="attnkit"``), in eval mode (:func:`evaluating`); its own
    implementation and modes are restored after."""
    from .sources.streaming import IMPLEMENTATION, supports_streaming

    if not supports_streaming(model):
        raise ValueError(
            f"model: {type(model).__name__} computes its attention itself (it cannot switch "
            'to attn_implementation="attnkit"); explain reads attention inside attnkit'
        )
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None) or "eager"
    model.set_attn_implementation(IMPLEMENTATION)  # type: ignore[operator]
    try:
        with evaluating(model):
            yield
    finally:
        model.set_attn_implementation(before)  # type: ignore[operator]


def chefer_relevance(maps: list[torch.Tensor], causal: bool) -> torch.Tensor:
    """Chefer et al.'s relevance: ``R = I``, then ``R ← R + Ā·R`` for each layer in order.

    Args:
        maps: each layer's ``Ā`` (L, L), in forward order.
        causal: the model is causal: when every map is indeed lower triangular (checked:
            a model's class name does not prove it), the products skip the upper half.

    Returns:
        R (L, L).
    """
    causal = causal and all(not bool(torch.triu(a, diagonal=1).any()) for a in maps)
    L = maps[0].shape[-1]
    r = torch.eye(L, dtype=maps[0].dtype, device=maps[0].device)  # (L, L)
    for a in maps:
        r = r + (_lower_product(a, r) if causal else a @ r)  # (L, L)
    return r


def rollout_matrix(weights: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema's rollout in the weights' own dtype, as :mod:`attnkit.viz.rollout`
    defines it: ``Ã = (mean_h A + I) / 2`` (rows renormalised), ``R = Ã_n ··· Ã_1``.

    Args:
        weights: each layer's (H, L, L) weights, in forward order.
    """
    out: torch.Tensor | None = None
    for w in weights:
        m = mix_residual(w.mean(dim=0))  # (L, L)
        out = m if out is None else m @ out
    assert out is not None
    return out


def integration_points(integration: str, steps: int) -> tuple[list[float], list[float]]:
    """(alphas, weights) of the path integral over [0, 1], as captum's IntegratedGradients
    places them: Gauss–Legendre nodes and weights mapped to [0, 1]; Riemann sums of
    ``steps`` points of width 1/steps at the left ends, right ends or middles; and
    captum's trapezoid: ``steps`` points from 0 to 1 inclusive, each of width 1/steps,
    halved at both ends (weights summing to 1 − 1/steps, as captum has them)."""
    import numpy as np

    n = steps
    if integration == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(n)
        return [float(a) for a in 0.5 * (x + 1)], [float(b) for b in 0.5 * w]
    width = [1.0 / n] * n
    if integration == "riemann_left":
        return [i / n for i in range(n)], width
    if integration == "riemann_right":
        return [(i + 1) / n for i in range(n)], width
    if integration == "riemann_middle":
        return [(i + 0.5) / n for i in range(n)], width
    if integration == "riemann_trapezoid":
        width[0] /= 2
        width[-1] /= 2
        return [i / (n - 1) for i in range(n)], width
    raise ValueError(f"integration: expected one of {', '.join(INTEGRATIONS)}, got {integration!r}")


def integrated_gradients(
    run: Callable[[torch.Tensor], torch.Tensor],
    embeds: torch.Tensor,
    integration: str,
    steps: int,
) -> tuple[torch.Tensor, float]:
    """Integrated gradients of ``run`` along the straight path from zero embeddings.

    Args:
        run: (k, L, D) embeddings -> (k,) target values, one per row.
        embeds: (1, L, D) the input's embeddings.
        integration, steps: where the path is sampled (:func:`integration_points`).

    Returns:
        (scores (L,) ``Σ_d e_{i,d} · Σ_k w_k ∂y/∂e_{i,d}(α_k e)``, y at the zero baseline).
    """
    alphas, weights = integration_points(integration, steps)
    L = embeds.shape[1]
    chunk = max(1, min(len(alphas), IG_BATCH_TOKENS // max(L, 1)))
    total = torch.zeros_like(embeds[0])  # (L, D): Σ_k w_k ∂y/∂e at α_k
    base = embeds.detach()
    for start in range(0, len(alphas), chunk):
        a = torch.tensor(alphas[start : start + chunk], dtype=base.dtype, device=base.device)
        w = torch.tensor(weights[start : start + chunk], dtype=base.dtype, device=base.device)
        x = (a[:, None, None] * base).requires_grad_(True)  # (k, L, D): baseline 0 + α (e - 0)
        (grad,) = torch.autograd.grad(run(x).sum(), [x])  # (k, L, D)
        total += (w[:, None, None] * grad).sum(dim=0)
    with torch.no_grad():
        at_zero = float(run(torch.zeros_like(base))[0])
    return (base[0] * total).sum(dim=-1), at_zero  # (L,)
