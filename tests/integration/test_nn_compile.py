"""Every attnkit.nn layer under torch.compile, traced whole and under inductor.

The layers run in one function and compile once: fullgraph (no graph break), the same
numbers as eager, and no recompilation over repeated calls at fixed shapes. The default
run traces them with "aot_eager" (dynamo and AOTAutograd, where graph breaks,
recompiles and custom-op registration show); the slow run compiles them with inductor,
the default backend, whose C++ code generation takes half a minute on a cold cache
(it is also the inductor compile of attnkit's native custom ops, through
``AdditiveAttention``). The default run's inductor compile of ``attention()`` itself is
in test_compile_attention.py. The other layer tests compile with the "eager" backend.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import (
    AdditiveAttention,
    DotProductAttention,
    EinsumMultiHeadAttention,
    MultiheadAttention,
    NadarayaWatson,
    SelfAttention,
)

from tolerance import assert_close_to_scale

pytestmark = pytest.mark.torch_feature("compile")

B, L, E = 2, 5, 8


@pytest.mark.parametrize(
    "compiler",
    [pytest.param(c, marks=pytest.mark.slow) for c in ("aot_eager", "inductor")],
)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_every_layer_compiles_fullgraph_without_recompiles(compiler: str) -> None:
    torch.manual_seed(0)
    mha = MultiheadAttention(E, 2, batch_first=True).eval()
    decoder = SelfAttention(E, 4, causal=True, num_kv_heads=2).eval()
    einsum = EinsumMultiHeadAttention(
        2, 4, query_features=E, use_gate=True, sliding_window=2
    ).eval()
    dot = DotProductAttention().eval()
    additive = AdditiveAttention(E, E, 6).eval()
    kernel = NadarayaWatson(sigma=0.7).eval()
    padding = torch.tensor([[False] * L, [False] * 3 + [True] * 2])
    lens = torch.tensor([L, 3])

    def layers(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, weights = mha(x, x, x, key_padding_mask=padding)  # head-averaged weights
        assert weights is not None
        e = additive(x, x, x, lens)
        b = decoder(x)
        c = einsum(x, x, use_causal_mask=True)
        d = dot(x, x, x, lens)
        f = kernel(x[0], x[1], x[1])
        return a, weights, b, c, d, e, f  # type: ignore[return-value]

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(layers, fullgraph=True, backend=compiler)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        x = torch.randn(B, L, E, generator=g)
        want = layers(x)  # eager first
        got = compiled(x)
        for w, o in zip(want, got, strict=True):
            assert_close_to_scale(o, w)
        graphs = counters["stats"]["unique_graphs"]
        assert graphs == 1
        for _ in range(20):
            compiled(torch.randn(B, L, E, generator=g))
    assert counters["stats"]["unique_graphs"] == graphs
    assert not counters["graph_break"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_mha_with_an_attn_mask_compiles_once_for_every_length() -> None:
    """The drop-in layer with a dense ``attn_mask`` under ``dynamic=True``: one graph over
    several (L, S), as torch's own layer. Its error messages were formatted on every
    call, which fixed L and S to the first call's values: a graph per length, and a
    hard failure at the recompile limit under ``fullgraph=True``."""
    torch.manual_seed(0)
    mha = MultiheadAttention(E, 2).eval()

    def call(q: torch.Tensor, kv: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
        return mha(q, kv, kv, attn_mask=am)[0]

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(call, dynamic=True, fullgraph=True, backend="eager")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n in range(4, 8):
            q, kv = torch.randn(n, B, E, generator=g), torch.randn(n + 1, B, E, generator=g)
            bool_mask = torch.rand(n, n + 1, generator=g) < 0.3  # (L, S), True = blocked
            bool_mask[:, 0] = False
            float_mask = torch.randn(B * 2, n, n + 1, generator=g)  # (N·H, L, S)
            for am in (bool_mask, float_mask):
                assert_close_to_scale(compiled(q, kv, am), call(q, kv, am))
    assert counters["stats"]["unique_graphs"] <= 2  # one per mask dtype
    assert not counters["graph_break"]
