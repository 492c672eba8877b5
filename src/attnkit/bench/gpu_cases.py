"""The GPU suite (``attnkit bench --device cuda``): case definitions, shapes and FLOP counts.

Each case pairs an attnkit call under automatic dispatch (``backend=None``) with one
peer on the same inputs: torch SDPA, FlexAttention (compiled; its block mask built
before timing), the d2l materialized Additive formula, or the materialized softmax.
Defaults: bfloat16, B=4 H=16 E=128. The definitions build on any device, so their
shapes and FLOP counts are checked without a GPU; :mod:`attnkit.bench.gpu_runner`
times them on CUDA.

Shapes and FLOP counts are in :mod:`attnkit.bench.gpu_shapes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks, scores

from .cases import Sides, d2l_additive, max_abs_diff
from .gpu_shapes import (
    BWD_FACTOR,
    GpuCase,
    GpuShape,
    additive_flops,
    attention_flops,
    bilinear_flops,
    causal_pairs,
    dense_pairs,
    ragged_lengths,
    ragged_pairs,
    window_pairs,
)

__all__ = [
    "BWD_FACTOR",
    "GPU_CASES",
    "GpuCase",
    "GpuShape",
    "attention_flops",
    "flex_available",
    "ragged_lengths",
    "window_pairs",
]


def _qkv(s: GpuShape, device: str, *, grad: bool = False, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s.B, s.H, s.L, s.E, generator=g)  # (B, H, L, E)
    k = torch.randn(s.B, s.H, s.S, s.E, generator=g)  # (B, H, S, E)
    v = torch.randn(s.B, s.H, s.S, s.E, generator=g)  # (B, H, S, E)
    return [t.to(device=device, dtype=s.dtype).requires_grad_(grad) for t in (q, k, v)]


def _fwd_bwd(fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor]) -> Callable[[], Any]:
    """One forward and one backward against a fixed output gradient."""
    grad_out: list[torch.Tensor] = []

    def step() -> tuple[torch.Tensor, ...]:
        out = fn()
        if not grad_out:
            grad_out.append(torch.randn_like(out))
        return torch.autograd.grad(out, leaves, grad_out[0])

    return step


def _explained(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> Callable[[], Any]:
    return lambda: attnkit.explain(q, k, v, backend=None, **kw).chosen


def flex_available() -> str | None:
    """Why FlexAttention cannot be a peer here (torch < 2.5 has none), or None."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return "FlexAttention needs torch >= 2.5"
    return None


def _flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_mod: Callable[..., torch.Tensor],
    B: int | None,
) -> Callable[[], torch.Tensor]:
    """Compiled FlexAttention with its block mask built now, outside any timed region."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    L, S = q.shape[-2], k.shape[-2]
    block_mask = create_block_mask(mask_mod, B, None, L, S, device=str(q.device))
    compiled = torch.compile(flex_attention)
    return lambda: compiled(q, k, v, block_mask=block_mask)


# ------------------------------------------------------------------ builders


def _dense(causal: bool, backward: bool) -> Callable[[GpuShape, str], Sides]:
    def build(s: GpuShape, device: str) -> Sides:
        q, k, v = _qkv(s, device, grad=backward, seed=1)
        mask = masks.causal() if causal else None

        def ours() -> torch.Tensor:
            return attnkit.attention(q, k, v, mask=mask, backend=None)

        def theirs() -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return Sides(
            attnkit=_fwd_bwd(ours, [q, k, v]) if backward else ours,
            baseline=_fwd_bwd(theirs, [q, k, v]) if backward else theirs,
            baseline_name="torch SDPA" + (" (is_causal)" if causal else ""),
            shape=_describe(s) + (", forward+backward" if backward else ""),
            check=lambda: max_abs_diff(ours(), theirs()),
            backend=_explained(q, k, v, mask=mask),
        )

    return build


def _ragged(peer: str) -> Callable[[GpuShape, str], Sides]:
    def build(s: GpuShape, device: str) -> Sides:
        q, k, v = _qkv(s, device, seed=2)
        lens = ragged_lengths(s.B, s.L).to(device)  # (B,)
        mask = masks.valid_lens(lens, queries=True)
        keep = torch.arange(s.L, device=device) < lens[:, None]  # (B, L)

        def ours() -> torch.Tensor:
            return attnkit.attention(q, k, v, mask=mask, backend=None)

        if peer == "flex":

            def padding(b: Any, h: Any, qi: Any, kv: Any) -> Any:
                return (qi < lens[b]) & (kv < lens[b])

            theirs = _flex(q, k, v, padding, s.B)
            name = "FlexAttention, padding block mask"
        else:
            key_mask = keep[:, None, None, :]  # (B, 1, 1, S)

            def theirs() -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)

            name = "SDPA + bool key mask"

        def check() -> float:
            rows = keep[:, None, :, None].expand(-1, s.H, -1, s.E)  # (B, H, L, E)
            return max_abs_diff(ours()[rows], theirs()[rows])

        return Sides(
            attnkit=ours,
            baseline=theirs,
            baseline_name=name,
            shape=_describe(s) + ", valid_lens(lens, queries=True), lens~U[N/10, N]",
            check=check,
            backend=_explained(q, k, v, mask=mask),
        )

    return build


def _window(peer: str) -> Callable[[GpuShape, str], Sides]:
    def build(s: GpuShape, device: str) -> Sides:
        q, k, v = _qkv(s, device, seed=5)
        W = s.window
        mask = masks.window(W, 0)

        def ours() -> torch.Tensor:
            return attnkit.attention(q, k, v, mask=mask, backend=None)

        if peer == "flex":

            def band(b: Any, h: Any, qi: Any, kv: Any) -> Any:
                return (kv <= qi) & (qi - kv <= W)

            theirs = _flex(q, k, v, band, None)
            name = "FlexAttention, window block mask"
        else:
            i = torch.arange(s.L, device=device)
            dense = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - W)  # (L, S)

            def theirs() -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)

            name = "SDPA + dense bool window (built once)"
        return Sides.compared(
            ours,
            theirs,
            name,
            _describe(s) + f", window({W}, 0)",
            backend=_explained(q, k, v, mask=mask),
        )

    return build


def _score(kind: str) -> Callable[[GpuShape, str], Sides]:
    def build(s: GpuShape, device: str) -> Sides:
        q, k, v = _qkv(s, device, seed=7)
        torch.manual_seed(7)
        score: scores.Score = (
            scores.Gaussian(2.0)
            if kind == "gaussian"
            else scores.Bilinear(s.E, s.E, device=device, dtype=s.dtype)
        )

        def ours() -> torch.Tensor:
            with torch.no_grad():
                return attnkit.attention(q, k, v, score=score, backend=None)

        return Sides(
            attnkit=ours,
            baseline=lambda: F.scaled_dot_product_attention(q, k, v),
            baseline_name="torch SDPA (dot)",
            shape=_describe(s) + f", score {kind}",
            backend=_explained(q, k, v, score=score),
        )

    return build


def _additive(backward: bool) -> Callable[[GpuShape, str], Sides]:
    def build(s: GpuShape, device: str) -> Sides:
        g = torch.Generator().manual_seed(6)
        torch.manual_seed(6)
        score = scores.Additive(s.E, s.E, s.hidden, device=device, dtype=s.dtype)
        q = torch.randn(s.B, s.L, s.E, generator=g)  # (B, L, E)
        k = torch.randn(s.B, s.S, s.E, generator=g)  # (B, S, E)
        v = torch.randn(s.B, s.S, s.E, generator=g)  # (B, S, Ev)
        q, k, v = (t.to(device=device, dtype=s.dtype).requires_grad_(backward) for t in (q, k, v))
        leaves = [q, k, v, *score.parameters()]

        def ours() -> torch.Tensor:
            return attnkit.attention(q, k, v, score=score, backend=None)

        def theirs() -> torch.Tensor:
            return d2l_additive(q, k, v, score)

        def no_grad(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                with torch.no_grad():
                    return fn()

            return run

        return Sides(
            attnkit=_fwd_bwd(ours, leaves) if backward else no_grad(ours),
            baseline=_fwd_bwd(theirs, leaves) if backward else no_grad(theirs),
            baseline_name="d2l materialized" + (", autograd" if backward else ""),
            shape=(
                f"B={s.B} L=S={s.L} hidden={s.hidden} E={s.E} {_dtype(s)}"
                + (", forward+backward" if backward else "")
            ),
            check=lambda: max_abs_diff(no_grad(ours)(), no_grad(theirs)()),
            backend=_explained(q, k, v, score=score),
        )

    return build


def _weights(peer: str) -> Callable[[GpuShape, str], Sides]:
    def build(s: GpuShape, device: str) -> Sides:
        q, k, v = _qkv(s, device, seed=8)

        def ours() -> tuple[torch.Tensor, torch.Tensor]:
            out, w = attnkit.attention(q, k, v, return_weights=True, backend=None)
            return out, w

        if peer == "plain":

            def theirs() -> Any:
                return attnkit.attention(q, k, v, backend=None)

            name = "attnkit, no weights"
        else:

            def theirs() -> Any:
                logits = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(s.E)  # (B, H, L, S)
                w = torch.softmax(logits, dim=-1)  # (B, H, L, S)
                return (w.to(v.dtype) @ v), w

            name = "materialized softmax"

        return Sides(
            attnkit=ours,
            baseline=theirs,
            baseline_name=name,
            shape=_describe(s) + ", return_weights=True",
            check=lambda: max_abs_diff(
                ours()[1], torch.softmax(q.float() @ k.float().transpose(-2, -1) / s.E**0.5, -1)
            ),
            backend=_explained(q, k, v, return_weights=True),
        )

    return build


def _dtype(s: GpuShape) -> str:
    return str(s.dtype).removeprefix("torch.")


def _describe(s: GpuShape) -> str:
    lengths = f"L=S={s.L}" if s.L == s.S else f"L={s.L} S={s.S}"
    return f"B={s.B} H={s.H} {lengths} E={s.E} {_dtype(s)}"


# ------------------------------------------------------------------ the cases

_N4K = GpuShape()
_RAGGED = GpuShape(B=16, L=2048, S=2048)
_WINDOW = GpuShape(B=1, L=8192, S=8192, window=256)
_ADD_BF16 = GpuShape(B=2, H=1, L=2048, S=2048, hidden=128)
_ADD_FP32 = replace(_ADD_BF16, dtype=torch.float32)
_WEIGHTS = GpuShape(L=1024, S=1024)


def _dot(pairs: Callable[[GpuShape], float], backward: bool = False) -> Callable[..., float]:
    return lambda s: attention_flops(s, pairs(s), backward=backward)


GPU_CASES: tuple[GpuCase, ...] = (
    GpuCase(
        "dense_fwd",
        "dense",
        "SDPA",
        "≥ 0.98×",
        0.98,
        _N4K,
        _dot(dense_pairs),
        _dense(False, False),
    ),
    GpuCase(
        "dense_fwd_bwd",
        "dense",
        "SDPA",
        "≥ 0.98×",
        0.98,
        _N4K,
        _dot(dense_pairs, True),
        _dense(False, True),
    ),
    GpuCase(
        "causal_fwd",
        "dense",
        "SDPA",
        "≥ 0.98×",
        0.98,
        _N4K,
        _dot(causal_pairs),
        _dense(True, False),
    ),
    GpuCase(
        "causal_fwd_bwd",
        "dense",
        "SDPA",
        "≥ 0.98×",
        0.98,
        _N4K,
        _dot(causal_pairs, True),
        _dense(True, True),
    ),
    GpuCase(
        "ragged_vs_sdpa",
        "ragged",
        "SDPA",
        "≥ 2.5×",
        2.5,
        _RAGGED,
        _dot(ragged_pairs),
        _ragged("sdpa"),
    ),
    GpuCase(
        "ragged_vs_flex",
        "ragged",
        "FlexAttention",
        "≥ 1.0×",
        1.0,
        _RAGGED,
        _dot(ragged_pairs),
        _ragged("flex"),
        needs_flex=True,
    ),
    GpuCase(
        "window_vs_flex",
        "window",
        "FlexAttention",
        "≥ 1.0×",
        1.0,
        _WINDOW,
        _dot(lambda s: window_pairs(s.L, s.window)),
        _window("flex"),
        needs_flex=True,
    ),
    GpuCase(
        "window_vs_sdpa",
        "window",
        "SDPA",
        "≥ 5×",
        5.0,
        _WINDOW,
        _dot(lambda s: window_pairs(s.L, s.window)),
        _window("sdpa"),
    ),
    GpuCase(
        "gaussian", "scores", "SDPA", "≥ 0.9×", 0.9, _N4K, _dot(dense_pairs), _score("gaussian")
    ),
    GpuCase("bilinear", "scores", "SDPA", "≥ 0.9×", 0.9, _N4K, bilinear_flops, _score("bilinear")),
    GpuCase(
        "additive_bf16",
        "additive",
        "d2l",
        "≥ 5×, ≤ 1/20 memory",
        5.0,
        _ADD_BF16,
        additive_flops,
        _additive(False),
        mem_goal=1 / 20,
    ),
    GpuCase(
        "additive_fp32",
        "additive",
        "d2l",
        "≥ 5×, ≤ 1/20 memory",
        5.0,
        _ADD_FP32,
        additive_flops,
        _additive(False),
        mem_goal=1 / 20,
    ),
    GpuCase(
        "additive_fwd_bwd_bf16",
        "additive",
        "d2l",
        "≥ 3×",
        3.0,
        _ADD_BF16,
        lambda s: additive_flops(s, backward=True),
        _additive(True),
    ),
    GpuCase(
        "weights_vs_plain",
        "weights",
        "attnkit, no weights",
        "≤ 1.3 × (plain + copy floor)",
        None,
        _WEIGHTS,
        _dot(dense_pairs),
        _weights("plain"),
        weights_floor=True,
    ),
    GpuCase(
        "weights_vs_materialized",
        "weights",
        "materialized softmax",
        "-",
        None,
        _WEIGHTS,
        _dot(dense_pairs),
        _weights("materialized"),
    ),
)
