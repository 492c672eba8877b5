"""Plain calls under torch.compile: one op chosen at trace time, never a wrong answer.

A plain call (output only, a named score, no mask or a band with integer offsets) is
traced as the one op its backend names (``attnkit._plans.traced_call``), chosen outside
the trace, so the compiled call guards on the call's key and not on the registry and
the dicts that validation and dispatch read. Each test checks that this choice is made
again whenever the full path would choose otherwise: another ``use_backend``, a
registry change, ``device_semantics``, a gradient, dynamic shapes, a mask that holds
data; and that the answer is the reference's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch._dynamo
import torch._dynamo.utils

import attnkit
from attnkit import _torch_features as tf
from attnkit import masks
from attnkit._host import device_semantics
from attnkit.backends import dispatch
from attnkit.backends.reference import ReferenceBackend
from attnkit.backends.sdpa import run as sdpa_run

from compiled_graphs import aten_graph_code
from tolerance import assert_close_to_scale

pytestmark = pytest.mark.torch_feature("compile")

Call = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def _qkv(L: int = 6, S: int = 6, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, n, 8, generator=g) for n in (L, S, S))  # (B, H, N, E)


def _graph(fn: Call, *inputs: torch.Tensor) -> tuple[str, int]:
    """The code of the ATen graphs ``fn`` runs on these inputs (:func:`aten_graph_code`),
    and how many guards dynamo's trace holds."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*inputs)
    assert explained.graph_break_count == 0, explained.break_reasons
    return aten_graph_code(fn, *inputs), len(explained.out_guards or [])


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    return attnkit.attention(q, k, v, backend="reference", **kw)  # type: ignore[arg-type]


@pytest.mark.skipif(
    tf.INSTALLED.release < tf.TRACED_ONE_OP_FLOOR, reason="this torch traces every call in full"
)
def test_a_plain_compiled_call_is_one_op_with_few_guards() -> None:
    """The plain causal call traces to the checked op alone, and its guards are fewer
    than half of the same call's on the full path (a list of backend names is not plain):
    they hold nothing of the registry."""
    q, k, v = _qkv()
    mask = masks.causal()

    def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=mask)

    def full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=mask, backend=["sdpa"])

    code, guards = _graph(plain, q, k, v)
    full_code, full_guards = _graph(full, q, k, v)
    name = sdpa_run.checked_op_name()
    assert code.count("torch.ops.") == 1 and f"attnkit.{name}" in code
    assert f"attnkit.{name}" in full_code  # the same op, reached the long way
    assert guards * 2 < full_guards, (guards, full_guards)
    assert_close_to_scale(
        torch.compile(plain, fullgraph=True)(q, k, v), _reference(q, k, v, mask=mask)
    )


def test_without_the_policy_the_traced_call_is_torch_s_op() -> None:
    """``check_finite=False``: the graph is torch's SDPA and nothing of attnkit's."""
    q, k, v = _qkv(5, 7)

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, scale=0.3, check_finite=False)

    code, _ = _graph(call, q, k, v)
    assert "attnkit" not in code and "scaled_dot_product" in code
    got = torch.compile(call, fullgraph=True)(q, k, v)
    assert_close_to_scale(got, _reference(q, k, v, scale=0.3))


_BANDS: dict[str, Callable[[], masks.Mask | None]] = {
    "none": lambda: None,
    "causal": lambda: masks.causal(),
    "causal_br": lambda: masks.causal("bottom_right"),
    "causal_offset": lambda: masks.causal(q_offset=2),
    "window": lambda: masks.window(2, 1),
}


@pytest.mark.parametrize(
    ("band", "inside"),
    [*((name, False) for name in _BANDS), ("causal", True), ("window", True)],
    ids=[*(f"{name}-given" for name in _BANDS), "causal-made_inside", "window-made_inside"],
)
def test_every_band_gives_the_reference_given_or_made_inside(band: str, inside: bool) -> None:
    """Bands given to the compiled function and bands built inside it (which dynamo holds
    as objects of its own) key the call alike, with NaN rows where the policy puts them."""
    make_mask = _BANDS[band]
    q, k, v = _qkv(5, 7)
    given = make_mask()

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=make_mask() if inside else given)

    compiled = torch.compile(call, fullgraph=True)
    assert_close_to_scale(compiled(q, k, v), _reference(q, k, v, mask=given))
    qn = q.clone()
    qn[1, 2, 3, 0] = math.nan
    want = _reference(qn, k, v, mask=given)
    got = compiled(qn, k, v)
    assert torch.equal(got.isnan(), want.isnan())
    assert_close_to_scale(got[~want.isnan()], want[~want.isnan()])


def test_use_backend_and_device_semantics_are_honoured_after_compiling() -> None:
    """A compiled call traced outside ``use_backend`` is traced again inside it (and
    runs the forced backend), and again inside ``device_semantics`` (no host read)."""
    q, k, v = _qkv()
    mask = masks.causal()

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=mask)

    compiled = torch.compile(call, fullgraph=True)
    want = _reference(q, k, v, mask=mask)
    assert_close_to_scale(compiled(q, k, v), want)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with attnkit.use_backend("reference"):
        code, _ = _graph(call, q, k, v)
        assert "sdpa" not in code
        assert_close_to_scale(compiled(q, k, v), want)
    with device_semantics():
        code, _ = _graph(call, q, k, v)
        assert "sdpa_settled" not in code and "sdpa_checked" not in code
        assert_close_to_scale(compiled(q, k, v), want)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames


def test_use_backend_and_capture_work_inside_a_compiled_function() -> None:
    """``use_backend`` written inside the compiled function, and a model compiled while
    ``viz.capture`` records (another thread's run of a shared model), trace in one
    graph: neither reads a context variable, which dynamo cannot trace."""
    from attnkit.viz import capture

    q, k, v = _qkv()

    def forced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with attnkit.use_backend("reference"):
            return attnkit.attention(q, k, v, is_causal=True)

    want = _reference(q, k, v, mask=masks.causal())
    assert_close_to_scale(torch.compile(forced, fullgraph=True)(q, k, v), want)
    layer = attnkit.nn.SelfAttention(q.shape[-1], 2).eval()
    x = q[0].transpose(0, 1).reshape(1, q.shape[2], -1)[..., : q.shape[-1]]  # (1, L, E)
    compiled = torch.compile(layer, fullgraph=True)
    with capture(layer) as cap:
        assert_close_to_scale(compiled(x), layer(x))
    assert len(cap) == 1  # the eager call's record; compiled calls record nothing


def test_a_registry_change_traces_the_call_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend registered after compiling, ranked before sdpa, makes the compiled call
    trace again and run it (its op was chosen from the old registry); unregistered, the
    call traces again back to sdpa's op."""
    q, k, v = _qkv()

    class FirstReference(ReferenceBackend):
        name = "first_reference"

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, is_causal=True)

    want = _reference(q, k, v, mask=masks.causal())
    compiled = torch.compile(call, fullgraph=True)
    compiled(q, k, v)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled(q, k, v)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames
    monkeypatch.setitem(dispatch.PRIORITY, "cpu", list(dispatch.PRIORITY["cpu"]))  # restored
    runs: list[int] = []
    monkeypatch.setattr(FirstReference, "forward", lambda self, inputs: runs.append(1) or
                        ReferenceBackend.forward(self, inputs))  # fmt: skip
    dispatch.register_backend(FirstReference(), before="sdpa", device_types=["cpu"])
    try:
        assert_close_to_scale(compiled(q, k, v), want)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames + 1
        assert runs  # traced through the new backend
    finally:
        dispatch.unregister_backend("first_reference")
    assert_close_to_scale(compiled(q, k, v), want)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames + 2
    code, _ = _graph(call, q, k, v)
    assert f"attnkit.{sdpa_run.checked_op_name()}" in code


def test_gradients_dynamic_shapes_and_data_masks_take_the_full_path() -> None:
    """A call that needs a gradient, one traced with dynamic sizes and one with a mask
    that holds data are traced in full, without a graph break, with the reference's
    answer (and gradient)."""
    q, k, v = _qkv(5, 7)
    lens = masks.valid_lens(torch.tensor([3, 7]))

    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.causal())

    def padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=lens)

    qg = q.clone().requires_grad_()
    code, _ = _graph(causal, qg, k, v)
    assert "sdpa_settled" not in code and "sdpa_checked" not in code
    out = torch.compile(causal, fullgraph=True)(qg, k, v)
    out.sum().backward()
    qr = q.clone().requires_grad_()
    _reference(qr, k, v, mask=masks.causal()).sum().backward()
    assert qg.grad is not None and qr.grad is not None
    assert_close_to_scale(qg.grad, qr.grad)
    dynamic = torch.compile(causal, fullgraph=True, dynamic=True)
    for n in (5, 6):
        qd, kd, vd = _qkv(n, n + 1, seed=n)
        assert_close_to_scale(dynamic(qd, kd, vd), _reference(qd, kd, vd, mask=masks.causal()))
    assert_close_to_scale(
        torch.compile(padded, fullgraph=True)(q, k, v), _reference(q, k, v, mask=lens)
    )


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non_strict"])
def test_an_exported_plain_call_holds_the_traced_op_and_the_eager_numbers(strict: bool) -> None:
    """``torch.export`` (through dynamo, or not) of a module that builds its causal mask
    in its forward: the exported graph holds the one op the traced call names (the
    route's runner, kept whole by dynamo, traced through), with the eager call's
    numbers."""
    q, k, v = _qkv()

    class Causal(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return attnkit.attention(q, k, v, mask=masks.causal())

    exported = torch.export.export(Causal(), (q, k, v), strict=strict)
    ops = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert len(ops) == 1 and f"attnkit.{sdpa_run.checked_op_name()}" in str(ops[0])
    want = attnkit.attention(q, k, v, mask=masks.causal())
    assert_close_to_scale(exported.module()(q, k, v), want)


def test_numbers_that_vary_between_calls_give_the_reference_without_a_break() -> None:
    """Numbers given to the compiled function turn dynamic once they take a second
    value: a float scale, a window's side or a decode position made into a mask inside
    it. Each call then takes the full path (a symbol is no constant for the route),
    without a graph break under ``fullgraph=True``, with the reference's answer; a (H,)
    tensor of scales does too."""
    q, k, v = _qkv(5, 7)

    def scaled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: float) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.causal(), scale=s)

    def windowed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.window(n, 1))

    def decoded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: int) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.causal("bottom_right", q_offset=p))

    compiled = torch.compile(scaled, fullgraph=True)
    for s in (0.2, 0.3, 0.7):
        assert_close_to_scale(
            compiled(q, k, v, s), _reference(q, k, v, mask=masks.causal(), scale=s)
        )
    compiled = torch.compile(windowed, fullgraph=True)
    for n in (0, 1, 3):
        assert_close_to_scale(compiled(q, k, v, n), _reference(q, k, v, mask=masks.window(n, 1)))
    compiled = torch.compile(decoded, fullgraph=True)
    for p in (0, 1, 4):
        want = _reference(q, k, v, mask=masks.causal("bottom_right", q_offset=p))
        assert_close_to_scale(compiled(q, k, v, p), want)
    heads = torch.tensor([0.3, 0.5, 0.9])
    compiled = torch.compile(lambda q, k, v: scaled(q, k, v, heads), fullgraph=True)  # type: ignore[arg-type]
    assert_close_to_scale(compiled(q, k, v), _reference(q, k, v, mask=masks.causal(), scale=heads))
