"""attention() under torch.compile(fullgraph=True) with the default inductor backend.

Every mask kind compiles without a graph break (by default causal through inductor, and
key_padding and window through AOTAutograd without code generation; every kind through
inductor, and the others through AOTAutograd too, under ``slow``), gives the reference result (also for non-finite inputs), and 10
further calls at fixed shapes (past dynamo's recompile limit of 8) trigger no
recompilation.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.utils

import attnkit
from attnkit import masks

from tolerance import assert_close_to_scale

pytestmark = pytest.mark.torch_feature("compile")

B, H, L, S, E = 2, 2, 8, 8, 8


def _masks() -> dict[str, masks.Mask | None]:
    g = torch.Generator().manual_seed(0)
    pad = torch.rand(B, S, generator=g) < 0.3
    return {
        "none": None,
        "causal": masks.causal(),
        "causal_br": masks.causal("bottom_right"),
        "window": masks.window(2, 1),
        "valid_lens": masks.valid_lens(torch.tensor([3, 8])),
        "valid_lens_queries": masks.valid_lens(torch.tensor([3, 8]), queries=True),
        "key_padding": masks.key_padding(pad),
        "keep": masks.keep(torch.rand(B, 1, L, S, generator=g) < 0.8),
        "bias": masks.bias(torch.randn(L, S, generator=g)),
        "causal_and_padding": masks.causal() & masks.key_padding(pad),
    }


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


INDUCTOR_KINDS = ("causal",)
"""Kinds compiled by inductor in the default run (its C++ code generation takes seconds
per kernel on a cold cache); the others are traced the same way (dynamo, AOTAutograd)
without it, and by inductor too under ``slow``."""
AOT_KINDS = ("key_padding", "window")
"""Kinds traced without inductor in the default run (a tensor mask and a structured
one); the other kinds' traces run under ``slow``."""


def _backends() -> list[object]:
    out: list[object] = []
    for name in sorted(_masks()):
        if name in INDUCTOR_KINDS:
            out.append(pytest.param(name, "inductor", id=f"{name}-inductor"))
        else:
            quick = [] if name in AOT_KINDS else [pytest.mark.slow]
            out.append(pytest.param(name, "aot_eager", id=f"{name}-aot_eager", marks=quick))
            out.append(
                pytest.param(name, "inductor", id=f"{name}-inductor", marks=pytest.mark.slow)
            )
    return out


@pytest.mark.parametrize(("name", "backend"), _backends())
def test_every_mask_kind_compiles_fullgraph_without_recompiles(name: str, backend: str) -> None:
    mask = _masks()[name]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, n, E, generator=g) for n in (L, S, S))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=mask)

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    ref = attnkit.attention(q, k, v, mask=mask, backend="reference")
    assert_close_to_scale(compiled(q, k, v), ref)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for _ in range(10):  # past dynamo's recompile limit (8): a recompile per call shows at once
        compiled(q, k, v)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames
    assert not torch._dynamo.utils.counters["graph_break"]
    # non-finite inputs follow the policy in compiled code too (inductor must not
    # simplify the flags away): a NaN query row, and NaN keys and values that some
    # rows use and others mask out
    qn, kn, vn = q.clone(), k.clone(), v.clone()
    qn[0, 0, 2] = float("nan")
    kn[1, 1, S - 1] = float("nan")
    vn[0, 1, S - 2] = float("nan")
    want = attnkit.attention(qn, kn, vn, mask=mask, backend="reference")
    assert_close_to_scale(compiled(qn, kn, vn), want)
