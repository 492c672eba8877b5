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
