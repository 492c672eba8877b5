"""Smoke tests: every example script runs and shows what its name says (the seed systems' results,
the viewer page)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tolerance import FLOAT32_CHAIN_REL, FLOAT32_ULPS_REL, assert_close_to_scale

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(
    name: str, capsys: pytest.CaptureFixture[str], *args: object
) -> tuple[dict[str, Any], str]:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    assert isinstance(module, ModuleType)
    spec.loader.exec_module(module)
    result = module.main(*args)
    return result, capsys.readouterr().out


def test_keras_einsum_multihead(capsys: pytest.CaptureFixture[str]) -> None:
    r, out = _run("keras_einsum_multihead", capsys)
    assert r["self_attention_shape"] == (10, 5)
    assert r["seed_diagonal_shape"] == (10, 3, 5)
    assert r["uniform_rows"]
    assert r["mha_shape"] == (7, 20, 3, 5)
    assert r["scores_shape"] == (7, 20, 4, 3, 3)
    assert_close_to_scale(*r["pair_vs_einsums"], rel=FLOAT32_CHAIN_REL)
    assert "(7, 20, 3, 5)" in out


def test_torch_multihead_dropin_and_scores(capsys: pytest.CaptureFixture[str]) -> None:
    r, out = _run("torch_multihead_dropin_and_scores", capsys)
    assert r["output_shape"] == (3, 4, 10)
    assert r["weights_shape"] == (4, 3, 6)
    for got, want in r["pairs_vs_torch"]:
        assert_close_to_scale(got, want, rel=FLOAT32_ULPS_REL)
    assert r["extra_keys_weights_shape"] == (4, 3, 8)
    assert r["padding_weight"] == 0.0
    assert set(r["score_weights"]) == {"additive", "dot", "scaled_dot", "bilinear"}
    for w in r["score_weights"].values():
        assert w.shape == (5,) and float(w.sum()) == pytest.approx(1, rel=FLOAT32_ULPS_REL)
    assert "(N, L, S)" in out


def test_tensorflow_mask_convention(capsys: pytest.CaptureFixture[str]) -> None:
    r, _ = _run("tensorflow_mask_convention", capsys)
    assert_close_to_scale(r["weights"], torch.tensor([0.0, 0.0, 0.5, 0.5]))
    assert_close_to_scale(r["output"], torch.tensor([6.0, 7.0]))
    assert_close_to_scale(r["masked_weights"], torch.tensor([0.0, 0.0, 1.0, 0.0]))
    w = r["decoder_weights"]  # (B, H, L, S): no future key, no padding key
    assert torch.equal(w[..., 2:4][0], torch.zeros(2, 5, 2))
    assert torch.equal(w.triu(1), torch.zeros_like(w))
    assert torch.equal(r["dead_row_output"], torch.zeros(2))
    assert not torch.equal(r["tutorial_dead_row_output"], torch.zeros(2))
    assert r["mha_shape"] == (1, 11, 128) and r["per_head_shape"] == (1, 8, 11, 11)


def test_self_attention_v1_to_v4(capsys: pytest.CaptureFixture[str]) -> None:
    r, _ = _run("self_attention_v1_to_v4", capsys)
    assert r["v1_shape"] == (3, 2, 4)
    rows = r["v2_row_sums"]  # (3, 2)
    assert_close_to_scale(rows, torch.ones_like(rows), rel=FLOAT32_ULPS_REL)
    rows = r["seed_v2_row_sums"]
    assert_close_to_scale(rows, torch.full_like(rows, 0.5), rel=FLOAT32_ULPS_REL)
    assert r["v3_shape"] == (3, 4, 2) and r["v3_same_with_expanded_mask"]
    w3 = r["v3_weights"]  # (B, H, L, S); the mask keeps 3, 2 and 1 keys
    for b, n in enumerate((3, 2, 1)):
        assert torch.equal(w3[b, 0, :, n:], torch.zeros(4, 4 - n))
    assert r["v4_shape"] == (3, 4, 2) and r["v4_weights_shape"] == (3, 4, 4)
    assert torch.equal(r["dead_row"], torch.zeros(4, 2))


def test_d2l_masked_softmax_and_nadaraya_watson(capsys: pytest.CaptureFixture[str]) -> None:
    r, out = _run("d2l_masked_softmax_and_nadaraya_watson", capsys)
    assert r["nw_57"] == pytest.approx(45.5, rel=FLOAT32_ULPS_REL)
    assert "f(57) = 45.5" in out
    assert_close_to_scale(r["nw_weights"], torch.tensor([[0.0, 0.5, 0.5]]))
    assert r["compact_kernels"] == pytest.approx({"boxcar": 45.5, "epanechnikov": 45.5})
    per_seq, per_query = r["masked_softmax_per_sequence"], r["masked_softmax_per_query"]
    assert torch.equal(per_seq[0, :, 2:], torch.zeros(2, 2)) and torch.equal(
        per_seq[1, :, 3:], torch.zeros(2, 1)
    )
    assert_close_to_scale(per_query.sum(-1), torch.ones(2, 2), rel=FLOAT32_ULPS_REL)
    assert per_query[0, 0, 0] == 1
    # Equal keys: uniform weights over the valid ones, means of the value rows.
    expected = torch.tensor([[[2.0, 3.0, 4.0, 5.0]], [[10.0, 11.0, 12.0, 13.0]]])
    assert_close_to_scale(r["additive_output"], expected, rel=FLOAT32_ULPS_REL)
    assert_close_to_scale(r["dot_output"], expected, rel=FLOAT32_ULPS_REL)
    assert r["two_feature"].shape == (2, 2)


def test_viewer_for_a_transformers_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    r, out = _run("viewer_for_a_transformers_model", capsys, tmp_path / "page.html")
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert r["path"] == tmp_path / "page.html" and r["bytes"] == len(page.encode("utf-8"))
    assert page.startswith("<!DOCTYPE html>") and "A tiny GPT-2 on one sentence" in page
    for word in ("animal", "street", "tired"):  # the sentence's tokens are on the page
        assert word in page
    assert f"wrote {tmp_path / 'page.html'}" in out


def test_examples_are_named_for_what_they_show() -> None:
    """No example is named after a seed number; each still says which seed it reproduces."""
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert len(scripts) >= 6
    for script in scripts:
        assert not script.name.startswith("seed"), script.name
    notes = [s.read_text(encoding="utf-8") for s in scripts]
    for seed in range(5):
        assert sum(f"Reproduces seed {seed:03d}" in n for n in notes) == 1, seed


@pytest.mark.slow
def test_scripts_run_from_the_command_line() -> None:
    """Slow: a fresh interpreter's import, seconds. By default the script's ``main`` runs
    in process (test_d2l_masked_softmax_and_nadaraya_watson)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "d2l_masked_softmax_and_nadaraya_watson.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "f(57) = 45.5" in done.stdout
