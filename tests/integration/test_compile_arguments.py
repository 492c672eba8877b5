"""attention()'s arguments under torch.compile(fullgraph=True): each kind traces without a
graph break and gives the eager call's numbers, or is refused with attnkit's own message.

Score objects, ALiBi (whose common part is left out of a shallow copy of the mod), an lse
with gradients, and per-head tensors (sinks, a scale, a T5 table) and dense masks whose
sizes stay static while dynamo traces the call's sizes as symbols. Dynamo's own
``backend="eager"`` is enough: what failed was tracing, not code generation.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo

import attnkit
from attnkit import masks, mods, scores

from tolerance import FLOAT32_CALL_REL, FLOAT32_GRAD_REL, assert_close_to_scale

pytestmark = pytest.mark.torch_feature("compile")

Call = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _qkv(requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(
        torch.randn(2, 4, 8, 8, generator=g).requires_grad_(requires_grad) for _ in range(3)
    )  # (B, H, L, E)


def _score_calls() -> dict[str, Call]:
    torch.manual_seed(1)  # the score objects' parameters
    made = {
        "dot": scores.Dot(),
        "scaled_dot": scores.ScaledDot(),
        "bilinear": scores.Bilinear(8, 8),
        "gaussian": scores.Gaussian(2.0),
        "additive": scores.Additive(8, 8, hidden_dim=6),
    }
    return {
        name: (lambda q, k, v, s=score: attnkit.attention(q, k, v, score=s, mask=masks.causal()))
        for name, score in made.items()
    }


def _alibi_calls() -> dict[str, Call]:
    return {
        "alibi": lambda q, k, v: attnkit.attention(q, k, v, mods=mods.alibi(4)),
        "alibi_causal": lambda q, k, v: attnkit.attention(
            q, k, v, mask=masks.causal(), mods=mods.alibi(4, causal=True)
        ),
    }


@pytest.mark.parametrize("name", [*_score_calls(), *_alibi_calls()])
def test_score_objects_and_alibi_trace_in_one_graph(name: str) -> None:
    """A score object (with or without parameters) is no constant of the traced route,
    and ALiBi's copy without its common part is made without copy.copy: both trace."""
    call = {**_score_calls(), **_alibi_calls()}[name]
    q, k, v = _qkv()
    got = torch.compile(call, backend="eager", fullgraph=True)(q, k, v)
    assert_close_to_scale(got, call(q, k, v), rel=FLOAT32_CALL_REL)


@pytest.mark.parametrize("mask", [None, "valid_lens"])
def test_an_lse_with_gradients_traces_and_differentiates(mask: str | None) -> None:
    """sdpa's differentiable lse calls torch.autograd.grad in its backward, which dynamo
    does not trace: under compile the call goes to a backend whose lse autograd follows,
    with the eager gradients."""
    m = masks.valid_lens(torch.tensor([3, 8])) if mask else None

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse = attnkit.attention(q, k, v, mask=m, return_lse=True)
        return out.sum() + lse.sum()

    q, k, v = _qkv(requires_grad=True)
    torch.compile(call, backend="eager", fullgraph=True)(q, k, v).backward()
    got = [t.grad for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    call(q2, k2, v2).backward()
    for g, t in zip(got, (q2, k2, v2), strict=True):
        assert g is not None and t.grad is not None
        assert_close_to_scale(g, t.grad, rel=FLOAT32_GRAD_REL)


class _PerHead(torch.nn.Module):
    """Learnt per-head tensors, whose sizes stay static under dynamic=True."""

    def __init__(self) -> None:
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.zeros(4))
        self.scale = torch.nn.Parameter(torch.full((4,), 0.3))
        self.table = torch.nn.Parameter(torch.linspace(0, 1, 32 * 4).view(32, 4))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t5 = mods.relative_position_bias(self.table, 32, 128)
        keep = masks.keep(torch.ones(8, 8, dtype=torch.bool).tril())
        return attnkit.attention(
            q, k, v, mask=keep, scale=self.scale, mods=[t5, mods.sinks(self.sinks)]
        )


def test_static_per_head_sizes_match_dynamic_call_sizes() -> None:
    """Under dynamic=True the call's head count is a symbol while a parameter's is an
    int: the checks that compare them (sinks, a tensor scale, a T5 table, a dense mask's
    broadcast) see them equal."""
    layer = _PerHead()
    q, k, v = _qkv()
    got = torch.compile(layer, backend="eager", dynamic=True, fullgraph=True)(q, k, v)
    assert_close_to_scale(got, layer(q, k, v), rel=FLOAT32_CALL_REL)


def test_document_lengths_inside_a_compiled_function_are_refused_by_name() -> None:
    """document(lengths=) sizes its ids from the lengths' values: inside a compiled
    function it is refused with a message that names the way out; built outside and
    passed in, it compiles."""
    q, k, v = _qkv()
    lengths = torch.tensor([4, 3, 1])

    def inside(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.document(lengths=lengths))

    with pytest.raises(Exception, match="build the mask outside the compiled function"):
        torch.compile(inside, backend="eager", fullgraph=True)(q, k, v)
    mask = masks.document(lengths=lengths)
    outside = torch.compile(
        lambda q, k, v, m: attnkit.attention(q, k, v, mask=m), backend="eager", fullgraph=True
    )
    assert_close_to_scale(outside(q, k, v, mask), inside(q, k, v), rel=FLOAT32_CALL_REL)


def test_a_size_error_under_dynamic_shapes_keeps_its_message() -> None:
    """A mask of the wrong size, compiled with dynamic shapes: the error carries
    attnkit's message with the sizes written out (dynamo formats a symbolic size in an
    f-string, not through str())."""
    q, k, v = _qkv()

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.keep(torch.ones(3, 8, 8, dtype=torch.bool)))

    with pytest.raises(Exception, match=r"has shape \(3, 8, 8\), which does not broadcast"):
        torch.compile(call, backend="eager", dynamic=True, fullgraph=True)(q, k, v)


def test_the_chunked_backend_is_refused_under_compile_with_its_reason() -> None:
    """chunked loops over tiles in Python; forced under compile, even with no mask, the
    refusal says so rather than blaming a mask the call does not have."""
    q, k, v = _qkv()

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, backend="chunked")

    with pytest.raises(Exception, match="tiles run in a Python loop"):
        torch.compile(call, backend="eager", fullgraph=True)(q, k, v)


def test_a_compiled_gaussian_stays_exact_on_inputs_its_trace_never_saw() -> None:
    """A compiled graph keeps its backend for every later input, and inside the trace the
    inputs cannot be measured for the Gaussian's dot form: the differences run, so keys
    moved 1000 bandwidths away after tracing give the eager numbers (the dot form chosen
    at trace time gave 1.5 of the output's scale)."""
    score = scores.Gaussian(0.05)

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, score=score)

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 4, generator=g) * 0.05
    k = q + 0.03 * torch.randn(1, 2, 6, 4, generator=g)
    v = torch.randn(1, 2, 6, 3, generator=g)
    compiled = torch.compile(call, backend="eager", fullgraph=True)
    assert_close_to_scale(compiled(q, k, v), call(q, k, v), rel=FLOAT32_CALL_REL)
    far = k.clone()
    far[..., -2:, :] += 1000.0  # (1, 2, 6, 4): two keys far from every query
    want = attnkit.attention(q.double(), far.double(), v.double(), score=score)
    assert_close_to_scale(compiled(q, far, v), want, rel=FLOAT32_CALL_REL)
