"""Dispatch ranks per device type, with preference rules that live in dispatch alone."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

import attnkit
from attnkit import _host, masks
from attnkit._inputs import AttentionInputs, validate_inputs
from attnkit.backends import dispatch
from attnkit.backends.base import AttentionResult, Backend

from tolerance import FLOAT32_CALL_REL, assert_close_to_scale


class _OnDevice:
    """A validated call that reports another device type (to rank without that device)."""

    def __init__(self, inputs: AttentionInputs, device_type: str) -> None:
        self._inputs = inputs
        self.device = torch.device(device_type)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inputs, name)

    def signature(self) -> tuple[object, ...]:
        return (self.device.type, *self._inputs.signature())


def _call(mask: masks.Mask | None = None, L: int = 64, S: int = 64) -> AttentionInputs:
    q = torch.randn(2, 4, L, 16)
    k = torch.randn(2, 4, S, 16)
    return validate_inputs(q, k, k, mask=mask)


def _choose(inputs: object) -> str:
    return dispatch.select_backend(inputs).name  # type: ignore[arg-type]


MASKS = {
    "none": None,
    "causal": masks.causal(),
    "causal_br": masks.causal("bottom_right"),
    "window": masks.window(8, 0),
    "valid_lens": masks.valid_lens([5, 64]),
    "key_padding": masks.key_padding(torch.arange(64) >= torch.tensor([[40], [64]])),
    "causal_and_padding": masks.causal()
    & masks.key_padding(torch.arange(64) >= torch.tensor([[40], [64]])),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_cuda_never_prefers_a_python_tiled_backend_over_a_fused_one(name: str) -> None:
    """On CUDA every dot-product mask goes to a fused kernel: sdpa for what it runs without a
    dense mask, else triton when it is installed (it skips the blocks), else sdpa with a dense
    mask (which beats Python loops over tiles there), never chunked."""
    L, S = (128, 160) if name == "causal_br" else (64, 64)  # past the decoding rows
    inputs = _OnDevice(_call(MASKS[name], L=L, S=S), "cuda")
    ranking = dispatch.backends_for("cuda")
    assert ranking.index("sdpa") < ranking.index("chunked") < ranking.index("reference")
    with _host.device_semantics():  # the tensors are read as a GPU's would be: never
        chosen = _choose(inputs)
    assert attnkit.get_backend(chosen).fused, (name, chosen)
    triton_ok = not attnkit.get_backend("triton").is_available()
    dense_for_sdpa = name not in ("none", "causal")
    assert chosen == ("triton" if dense_for_sdpa and triton_ok else "sdpa"), (name, chosen)


def test_cpu_passes_over_sdpa_for_band_masks_only() -> None:
    assert _choose(_call()) == "sdpa"
    assert _choose(_call(masks.causal())) == "sdpa"
    assert _choose(_call(masks.window(8, 0))) == "chunked"
    ex = attnkit.explain(torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8),
                         torch.randn(1, 2, 64, 8), mask=masks.window(8, 0))  # fmt: skip
    assert ex.chosen == "chunked"
    assert any("chunked keeps it symbolic" in r for r in ex.reasons["sdpa"])


def test_decoding_against_a_kv_cache_stays_on_sdpa() -> None:
    """One new token (or a few) against a long cache: a fused kernel, no block skipping."""
    mask = masks.causal("bottom_right")
    assert _choose(_call(mask, L=1, S=256)) == "sdpa"
    assert _choose(_call(mask, L=4, S=256)) == "sdpa"
    assert _choose(_call(mask, L=200, S=256)) == "chunked"


def test_preference_rules_do_not_apply_to_a_forced_backend() -> None:
    q = torch.randn(1, 2, 32, 8)
    assert attnkit.explain(q, q, q, mask=masks.window(4, 0), backend="sdpa").chosen == "sdpa"


def test_ranking_lists_only_backends_that_declare_the_device() -> None:
    assert dispatch.backends_for("cpu")[:3] == ("sdpa", "chunked", "reference")
    assert "chunked" in dispatch.backends_for("cuda")
    assert dispatch.backends_for("hpu") == ()
    inputs = _OnDevice(_call(), "hpu")
    with pytest.raises(attnkit.BackendNotSupportedError, match="no backend is registered"):
        dispatch.select_backend(inputs)  # type: ignore[arg-type]


class _Unavailable(Backend):
    name = "test-unavailable"
    device_types = frozenset({"cpu"})

    def is_available(self) -> str | None:
        return "the test kernel is not installed"

    def forward(self, inputs: AttentionInputs) -> AttentionResult:  # pragma: no cover
        raise AssertionError("an unavailable backend must never run")


def test_an_unavailable_backend_gives_its_reason_and_never_runs() -> None:
    attnkit.register_backend(_Unavailable(), before="sdpa")
    try:
        q = torch.randn(1, 1, 4, 4)
        ex = attnkit.explain(q, q, q)
        assert ex.chosen == "sdpa"
        assert ex.reasons["test-unavailable"] == ["the test kernel is not installed"]
        with pytest.raises(attnkit.BackendNotSupportedError, match="not installed"):
            attnkit.attention(q, q, q, backend="test-unavailable")
    finally:
        attnkit.unregister_backend("test-unavailable")
    assert "test-unavailable" not in attnkit.available_backends()
    assert attnkit.explain(q, q, q).chosen == "sdpa"


def test_registering_takes_only_names_it_knows() -> None:
    """device_types="cpu" registered the backend for device types 'c', 'p' and 'u', and
    before="sdpaa" was dropped without a word; both are refused before any change, and
    unregister_backend names itself."""
    before = {dev: list(names) for dev, names in dispatch.PRIORITY.items()}
    with pytest.raises(TypeError, match=r"device_types: expected a list .* got 'cpu'"):
        attnkit.register_backend(_Unavailable(), device_types="cpu")
    with pytest.raises(ValueError, match=r"before: unknown backend 'sdpaa'"):
        attnkit.register_backend(_Unavailable(), before="sdpaa")
    with pytest.raises(ValueError, match=r"unregister_backend: unknown backend 'spda'"):
        attnkit.unregister_backend("spda")
    assert "test-unavailable" not in attnkit.available_backends()
    assert {dev: list(names) for dev, names in dispatch.PRIORITY.items()} == before
    attnkit.register_backend(_Unavailable(), device_types=(d for d in ["cpu"]))  # read twice
    try:
        assert "test-unavailable" in dispatch.PRIORITY["cpu"]
    finally:
        attnkit.unregister_backend("test-unavailable")


def test_no_backend_module_imports_another() -> None:
    import ast
    import pathlib

    root = pathlib.Path(attnkit.__file__).parent / "backends"
    names = {"sdpa", "chunked", "reference", "triton"}
    for path in root.rglob("*.py"):
        if path.name == "dispatch.py":
            continue
        own = path.relative_to(root).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = set(node.module.split(".")) | {a.name for a in node.names}
                assert not (parts & names) - {own}, (path, node.module)


def test_the_choice_cache_follows_the_mask_structure() -> None:
    """Two calls of one shape but different masks are decided apart, not from a cache."""
    assert _choose(_call(masks.causal())) == "sdpa"
    assert _choose(_call(masks.window(8, 0))) == "chunked"
    assert _choose(_call(masks.causal())) == "sdpa"
    with torch.no_grad():
        q = torch.randn(1, 1, 8, 4)
        assert attnkit.explain(q, q, q, score=attnkit.scores.Additive(4, 4, 3)).chosen == "chunked"


def test_use_backend_is_per_thread() -> None:
    """Thread A forcing sdpa neither breaks thread B's Additive call nor, when A's block ends
    first, removes B's own choice."""
    q = torch.randn(1, 2, 8, 4)
    additive = attnkit.scores.Additive(4, 4, 3)
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def thread_a() -> None:
        with attnkit.use_backend("sdpa"):
            a_inside.set()
            b_inside.wait(5)
        a_done.set()

    def thread_b() -> None:
        a_inside.wait(5)
        try:
            with attnkit.use_backend("reference"):
                b_inside.set()
                seen["additive"] = attnkit.explain(q, q, q, score=additive).chosen
                a_done.wait(5)
                seen["after_a"] = attnkit.explain(q, q, q).chosen
        except Exception as exc:  # pragma: no cover - reported below
            seen["error"] = exc

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert "error" not in seen, seen
    assert seen == {"additive": "reference", "after_a": "reference"}
    assert attnkit.explain(q, q, q).forced is None


@pytest.mark.torch_feature("compile")
def test_compile_recompiles_when_the_forced_backend_changes() -> None:
    torch._dynamo.reset()
    calls: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        calls.append(1)
        return gm

    def f(q: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, q, q)

    g = torch.compile(f, backend=counting_backend, fullgraph=True)
    q = torch.randn(1, 2, 8, 4)
    ref = attnkit.attention(q, q, q, backend="reference")
    assert_close_to_scale(g(q), ref, rel=FLOAT32_CALL_REL)
    with attnkit.use_backend("reference"):
        assert_close_to_scale(g(q), ref, rel=FLOAT32_CALL_REL)
    assert_close_to_scale(g(q), ref, rel=FLOAT32_CALL_REL)
    assert len(calls) == 2  # once per choice; the third call reuses the first graph


def test_explain_reports_every_registered_backend() -> None:
    q = torch.randn(1, 1, 4, 4)
    ex = attnkit.explain(q, q, q)
    assert set(ex.reasons) == set(attnkit.available_backends())
    assert dataclasses.is_dataclass(ex)


@pytest.mark.parametrize("score_name", ["gaussian", "bilinear"])
def test_half_scores_on_cuda_go_to_half_tiles(score_name: str) -> None:
    """SDPA runs a Gaussian or Bilinear score on half inputs in float32; on CUDA the
    triton kernels keep half tiles (4x faster on an H200), so they take the call when
    installed. float32 inputs, and the CPU, keep SDPA."""
    score = (
        attnkit.scores.Gaussian(2.0)
        if score_name == "gaussian"
        else attnkit.scores.Bilinear(16, 16, dtype=torch.bfloat16)
    )
    triton_ok = not attnkit.get_backend("triton").is_available()
    q = torch.randn(2, 4, 64, 16, dtype=torch.bfloat16)
    half = _OnDevice(validate_inputs(q, q, q, score=score), "cuda")
    with _host.device_semantics():
        assert _choose(half) == ("triton" if triton_ok else "sdpa")
        why = dispatch.explain_inputs(half).reasons["sdpa"]  # type: ignore[arg-type]
    if triton_ok:
        assert why == [
            f"score {score_name!r} in torch.bfloat16 would run upcast to float32 "
            "(triton keeps half-precision tiles)"
        ]
    assert _choose(validate_inputs(q, q, q, score=score)) == "sdpa"  # the CPU
    if score_name == "gaussian":
        full = _OnDevice(validate_inputs(q.float(), q.float(), q.float(), score=score), "cuda")
        with _host.device_semantics():
            assert _choose(full) == "sdpa"


def test_the_reference_backend_is_not_taken_for_keeping_masks_symbolic() -> None:
    """It builds every mask densely: a window beside a learnt bias (which chunked
    declines) passed sdpa over for it, with the reason "reference keeps it symbolic"."""
    q = torch.randn(1, 2, 64, 8)
    bias = torch.zeros(64, 64, requires_grad=True)
    ex = attnkit.explain(q, q, q, mask=masks.window(3, 0) & masks.bias(bias))
    assert ex.chosen == "sdpa", ex
    assert not any("reference keeps" in r for r in ex.reasons.get("sdpa", []))
