"""Dispatch: explain() as data, use_backend() restores state, forced backends never fall back."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, masks, scores

from tolerance import FLOAT32_CALL_REL, FLOAT32_ULPS_REL, assert_close_to_scale

q = torch.randn(2, 2, 4, 8)
k = torch.randn(2, 2, 6, 8)


def test_explain_reports_every_backend_and_the_choice() -> None:
    ex = attnkit.explain(q, k, k)
    assert set(ex.reasons) == set(attnkit.available_backends())
    assert ex.chosen == attnkit.available_backends()[0]
    cpu_backends = attnkit.backends.dispatch.backends_for("cpu")
    runnable = [n for n in cpu_backends if attnkit.get_backend(n).is_available() is None]
    assert all(ex.reasons[n] == [] for n in runnable)  # (triton is CUDA's)
    ex2 = attnkit.explain(q, k, k, score=scores.Additive(8, 8, 4))
    assert ex2.reasons["sdpa"] == ["score 'additive' does not reduce to a dot product"]
    assert ex2.chosen != "sdpa"
    assert "sdpa: score 'additive'" in str(ex2)


def test_explain_computes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit.backends.base import Backend

    for name in attnkit.available_backends():
        b = attnkit.get_backend(name)
        monkeypatch.setattr(type(b), "forward", Backend.forward)
    assert attnkit.explain(q, k, k, mask=masks.causal()).chosen is not None


def test_use_backend_forces_and_restores_even_on_error() -> None:
    with attnkit.use_backend("reference"):
        assert attnkit.explain(q, k, k).chosen == "reference"
        with pytest.raises(RuntimeError):
            with attnkit.use_backend("sdpa"):
                assert attnkit.explain(q, k, k).chosen == "sdpa"
                raise RuntimeError("inside")
        assert attnkit.explain(q, k, k).chosen == "reference"
    assert attnkit.explain(q, k, k).forced is None


def test_forced_backend_raises_with_reasons_instead_of_falling_back() -> None:
    with attnkit.use_backend("sdpa"):
        with pytest.raises(BackendNotSupportedError, match=r"forced backend\(s\) \['sdpa'\]"):
            attnkit.attention(q, k, k, score=scores.Additive(8, 8, 4))


def test_forced_additive_on_sdpa_lists_the_reason() -> None:
    with pytest.raises(BackendNotSupportedError, match="does not reduce to a dot product"):
        attnkit.attention(q, k, k, score=scores.Additive(8, 8, 4), backend="sdpa")


def test_backend_list_tries_in_order() -> None:
    add = scores.Additive(8, 8, 4)
    ex = attnkit.explain(q, k, k, score=add, backend=["sdpa", "reference"])
    assert ex.chosen == "reference" and ex.candidates == ("sdpa", "reference")


def test_use_backend_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        with attnkit.use_backend("fast"):
            pass


def test_reference_returns_weights_that_sum_to_one() -> None:
    out, w, lse = attnkit.attention(q, k, k, return_weights=True, return_lse=True)
    assert_close_to_scale(w.sum(-1), torch.ones(2, 2, 4), rel=FLOAT32_ULPS_REL)
    assert lse.shape == (2, 2, 4)
    assert_close_to_scale(out, w @ k, rel=FLOAT32_CALL_REL)


def test_a_backend_unregistered_during_a_choice_never_runs_afterwards() -> None:
    # A call still choosing (here: in the backend's own check) when the backend is
    # unregistered stored its choice and plan after the registry's caches were
    # cleared: every later call ran the removed backend while explain() named another.
    from attnkit.backends.reference import ReferenceBackend

    runs: list[int] = []

    class Leaving(ReferenceBackend):
        name = "leaving"

        def materialized_masks(self, inputs):  # type: ignore[no-untyped-def]
            if "leaving" in attnkit.available_backends():
                attnkit.unregister_backend("leaving")  # as another thread would, meanwhile
            return []

        def forward(self, inputs):  # type: ignore[no-untyped-def]
            runs.append(1)
            return super().forward(inputs)

    q = torch.randn(2, 2, 8, 4, generator=torch.Generator().manual_seed(0))
    for mask in (None, masks.valid_lens(torch.tensor([3, 5]))):
        attnkit.register_backend(Leaving(), before="sdpa")
        attnkit.attention(q, q, q, mask=mask)  # it was registered when the call began
        runs.clear()
        for _ in range(2):
            attnkit.attention(q, q, q, mask=mask)
        assert runs == [] and attnkit.explain(q, q, q, mask=mask).chosen == "sdpa"


def test_a_forced_backend_that_was_unregistered_is_named() -> None:
    from attnkit.backends.reference import ReferenceBackend

    class Mine(ReferenceBackend):
        name = "mine"

    attnkit.register_backend(Mine())
    q = torch.randn(1, 4, 4)
    with attnkit.use_backend("mine"):
        attnkit.unregister_backend("mine")
        for call in (attnkit.attention, attnkit.explain):
            with pytest.raises(ValueError, match="'mine' is no longer registered"):
                call(q, q, q)


def test_registering_a_backend_before_itself_is_refused() -> None:
    sdpa = attnkit.get_backend("sdpa")
    before = attnkit.backends.dispatch.backends_for("cpu")
    with pytest.raises(ValueError, match="before: 'sdpa' is the backend being registered"):
        attnkit.register_backend(sdpa, before="sdpa")
    assert attnkit.backends.dispatch.backends_for("cpu") == before
