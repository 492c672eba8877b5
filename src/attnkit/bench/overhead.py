"""The overhead suite (``attnkit bench --suite overhead``): attnkit inside a real model.

Eight cases, each against torch's own equivalent on the same inputs:

- ``call_overhead``: host cost of one ``attention()`` call at a tiny shape
  (B=1 H=8 L=S=16 E=64 float32), where the arithmetic is negligible; target:
  at most 10 µs more per call than ``F.scaled_dot_product_attention``.
- ``call_overhead_causal``: the same with ``masks.causal()`` against ``is_causal=True``;
  on the CPU it also reports the host time of each stage of the call
  (:mod:`attnkit.bench.stages`).
- ``layer_mha``: ``attnkit.nn.MultiheadAttention`` forward against
  ``torch.nn.MultiheadAttention`` (same weights, eval, no grad, B=1 L=S=16 E=64);
  target: at most 1.1× torch's time (both take torch's fused op there).
- ``layer_mha_train``: one training step of the same two layers (train mode,
  grad on, dropout 0): forward, a sum-of-squares loss, backward into the
  parameters; target: at most 1.1× torch's time.
- ``decode_step``: one query against a 4096-key cache (B=1 H=32 E=128) with
  ``masks.causal("bottom_right")``, against SDPA on the same cache; target: at
  most 1.1× SDPA's time.
- ``compiled``: ``torch.compile(fullgraph=True)`` (default inductor) of
  ``attention(mask=masks.causal())`` against compiled SDPA with ``is_causal=True``
  at B=1 H=8 L=S=128 E=64; target: at most 1.05× its time, no graph break and no
  recompile over the first 100 calls (torch._dynamo's counters).
- ``compiled_unchecked``: the same with ``check_finite=False`` (the caller promises
  finite inputs, so the graph holds no non-finite policy).
- ``compiled_small``: ``compiled`` at the call-overhead shape, L=S=16, where the kernel
  takes about 15 µs and what the compiled call adds around it (dynamo's guards over
  attnkit's Python, the policy's op) shows; same target.

Each compiled case starts from a reset dynamo, so none is traced with the sizes another
case left dynamic.

Microsecond calls are timed in samples of many calls (``Sides.repeat``), the two
sides interleaved sample by sample; on CUDA each sample ends with one device sync.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks

from .cases import BenchCase, Sides
from .stages import causal_call_stages

__all__ = ["OVERHEAD_CASES", "compile_counts", "overhead_cases"]


def _qkv(
    B: int, H: int, L: int, S: int, E: int, device: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g).to(device)  # (B, H, L, E)
    k = torch.randn(B, H, S, E, generator=g).to(device)  # (B, H, S, E)
    v = torch.randn(B, H, S, E, generator=g).to(device)  # (B, H, S, E)
    return q, k, v


def _chosen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> Callable[[], Any]:
    return lambda: attnkit.explain(q, k, v, **kw).chosen


def _sync(device: str) -> Callable[[], None] | None:
    return torch.cuda.synchronize if device.startswith("cuda") else None


def _call_overhead(device: str, causal: bool = False) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        B, H, N, E = 1, 8, 16, 64
        q, k, v = _qkv(B, H, N, N, E, device, 11)
        mask = masks.causal() if causal else None

        def ours() -> torch.Tensor:
            return attnkit.attention(q, k, v, mask=mask)

        def theirs() -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return Sides.compared(
            ours,
            theirs,
            "torch SDPA" + (", is_causal=True" if causal else ""),
            f"B={B} H={H} L=S={N} E={E} float32{' causal' if causal else ''}, per call",
            repeat=20 if quick else 200,
            backend=_chosen(q, k, v, mask=mask),
            sync=_sync(device),
            # where a causal call's host time goes (host-readable inputs only)
            figures=(
                (lambda: causal_call_stages(q, k, v, mask, quick=quick))
                if mask is not None and device == "cpu"
                else None
            ),
        )

    return build


def _layer(device: str, training: bool = False) -> Callable[[bool], Sides]:
    """attnkit's MultiheadAttention against torch's, holding the same weights, on x (1, 16,
    64) with 8 heads: an eval forward per call, or with ``training`` a forward and backward
    per step (the in_proj_weight gradient compared)."""

    def build(quick: bool) -> Sides:
        B, N, E, H = 1, 16, 64, 8
        seed = 15 if training else 12
        torch.manual_seed(seed)
        theirs = torch.nn.MultiheadAttention(E, H, batch_first=True).to(device).train(training)
        ours = attnkit.nn.MultiheadAttention(E, H, batch_first=True).to(device).train(training)
        ours.load_state_dict(theirs.state_dict())
        x = torch.randn(B, N, E, generator=torch.Generator().manual_seed(seed)).to(device)

        def step(
            layer: torch.nn.MultiheadAttention | attnkit.nn.MultiheadAttention,
        ) -> torch.Tensor:
            for p in layer.parameters():
                p.grad = None
            out = layer(x, x, x, need_weights=False)[0]
            out.square().sum().backward()
            grad = layer.in_proj_weight.grad if layer.in_proj_weight is not None else None
            assert grad is not None
            return grad

        def side(
            layer: torch.nn.MultiheadAttention | attnkit.nn.MultiheadAttention,
        ) -> Callable[[], torch.Tensor]:
            if training:
                return lambda: step(layer)

            def forward() -> torch.Tensor:
                with torch.no_grad():
                    return layer(x, x, x, need_weights=False)[0]

            return forward

        what = "forward + backward, per step" if training else "eval forward, per call"
        return Sides.compared(
            side(ours),
            side(theirs),
            "torch.nn.MultiheadAttention",
            f"B={B} L=S={N} E={E} heads={H}, {what}",
            repeat=(5 if quick else 50) if training else (10 if quick else 100),
            sync=_sync(device),
        )

    return build


def _decode(device: str) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        B, H, S, E = (1, 4, 256, 32) if quick else (1, 32, 4096, 128)
        q, k, v = _qkv(B, H, 1, S, E, device, 13)
        mask = masks.causal("bottom_right")
        return Sides.compared(
            lambda: attnkit.attention(q, k, v, mask=mask),
            lambda: F.scaled_dot_product_attention(q, k, v),
            "torch SDPA, same cache",
            f"B={B} H={H} L=1 S={S} E={E} causal('bottom_right'), per step",
            repeat=5 if quick else 20,
            backend=_chosen(q, k, v, mask=mask),
            sync=_sync(device),
        )

    return build


def compile_counts(fn: Callable[[], Any], calls: int) -> dict[str, int]:
    """Run ``fn`` ``calls`` times; graph breaks and recompiles torch._dynamo counted meanwhile.

    ``recompiles``: graphs compiled after the first call's (0 when the first compile
    serves every later call at fixed shapes).
    """
    from torch._dynamo.utils import counters

    def breaks() -> int:
        return sum(counters["graph_break"].values())

    def graphs() -> int:
        return int(counters["stats"]["unique_graphs"])

    breaks0 = breaks()
    fn()
    graphs1 = graphs()
    for _ in range(calls - 1):
        fn()
    return {"graph_breaks": breaks() - breaks0, "recompiles": graphs() - graphs1}


def _compiled(device: str, check_finite: bool = True, tokens: int = 128) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        B, H, N, E = (1, 2, 32, 16) if quick else (1, 8, tokens, 64)
        q, k, v = _qkv(B, H, N, N, E, device, 14)
        mask = masks.causal()
        # Every compiled case traces afresh: the cases share these functions' code, and
        # dynamo, having seen them at L=128, would trace L=16 with dynamic sizes.
        import torch._dynamo

        torch._dynamo.reset()

        def ours_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return attnkit.attention(q, k, v, mask=mask, check_finite=check_finite)

        def theirs_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        ours = torch.compile(ours_eager, fullgraph=True)
        theirs = torch.compile(theirs_eager, fullgraph=True)
        # the first 100 calls, compile included, happen here (outside the timed region)
        counts = compile_counts(lambda: ours(q, k, v), 100)
        theirs(q, k, v)
        return Sides.compared(
            lambda: ours(q, k, v),
            lambda: theirs(q, k, v),
            "compiled torch SDPA",
            f"B={B} H={H} L=S={N} E={E} causal, torch.compile(fullgraph=True)"
            + ("" if check_finite else ", check_finite=False")
            + ", per call",
            repeat=10 if quick else 100,
            counts=lambda: counts,
            backend=_chosen(q, k, v, mask=mask),
            sync=_sync(device),
        )

    return build


def overhead_cases(device: str = "cpu") -> tuple[BenchCase, ...]:
    """The eight overhead cases with their inputs on ``device`` ("cpu" or "cuda")."""
    zero = (("graph_breaks", 0), ("recompiles", 0))
    return (
        BenchCase(
            "call_overhead",
            "overhead",
            "≤ SDPA + 10 µs",
            None,
            _call_overhead(device),
            max_extra_s=10e-6,
            max_pairs=41,
            memory=False,
        ),
        BenchCase(
            "call_overhead_causal",
            "overhead",
            "≤ SDPA + 10 µs",
            None,
            _call_overhead(device, causal=True),
            max_extra_s=10e-6,
            max_pairs=41,
            memory=False,
        ),
        BenchCase(
            "layer_mha",
            "overhead",
            "≤ 1.1× torch",
            1 / 1.1,
            _layer(device),
            max_pairs=41,
            memory=False,
        ),
        BenchCase(
            "layer_mha_train",
            "overhead",
            "≤ 1.1× torch",
            1 / 1.1,
            _layer(device, training=True),
            max_pairs=31,
            memory=False,
        ),
        BenchCase(
            "decode_step",
            "overhead",
            "≤ 1.1× SDPA",
            1 / 1.1,
            _decode(device),
            max_pairs=31,
            memory=False,
        ),
        BenchCase(
            "compiled",
            "overhead",
            "≤ 1.05× compiled SDPA, 0 breaks, 0 recompiles",
            1 / 1.05,
            _compiled(device),
            count_limits=zero,
            max_pairs=31,
            memory=False,
        ),
        BenchCase(
            "compiled_unchecked",
            "overhead",
            "≤ 1.05× compiled SDPA, 0 breaks, 0 recompiles",
            1 / 1.05,
            _compiled(device, check_finite=False),
            count_limits=zero,
            max_pairs=31,
            memory=False,
        ),
        BenchCase(
            "compiled_small",
            "overhead",
            "≤ 1.05× compiled SDPA, 0 breaks, 0 recompiles",
            1 / 1.05,
            _compiled(device, tokens=16),
            count_limits=zero,
            max_pairs=31,
            memory=False,
        ),
    )


OVERHEAD_CASES: tuple[BenchCase, ...] = overhead_cases("cpu")
