"""A layer's forward captured in a CUDA graph and replayed (needs a CUDA device).

Capture fails on any host-device synchronization, so this also checks that the
call path of every mask kind a decoder uses reads nothing on the host. Without a
GPU the same property is checked on the CPU by tests/unit/test_no_host_sync.py.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks

from tolerance import assert_close_to_scale

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _capture(fn: object, *static: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: plans, kernels and allocations happen here
            fn(*static)  # type: ignore[operator]
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)  # type: ignore[operator]
    return graph, out


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_forward_replays(causal: bool) -> None:
    torch.manual_seed(0)
    layer = attnkit.nn.SelfAttention(64, num_heads=4, causal=causal).cuda().eval()
    x = torch.randn(2, 32, 64, device="cuda")

    def forward(t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return layer(t)

    graph, out = _capture(forward, x)
    for seed in (1, 2):
        x.copy_(torch.randn(2, 32, 64, device="cuda").mul_(seed))
        graph.replay()
        assert_close_to_scale(out, forward(x.clone()))


def _mask(name: str) -> masks.Mask | None:
    if name == "causal":
        return masks.causal()
    if name == "window":
        return masks.window(8, 0)
    if name == "valid_lens":
        return masks.valid_lens(torch.tensor([20, 32], device="cuda"))
    return None


@pytest.mark.parametrize("name", ["none", "causal", "window", "valid_lens"])
def test_attention_replays_for_symbolic_masks(name: str) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 64, device="cuda") for _ in range(3))
    mask = _mask(name)

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=mask)

    graph, out = _capture(call, q, k, v)
    q.normal_()
    graph.replay()
    assert_close_to_scale(out, call(q.clone(), k, v))
