"""The record of what the installed torch offers, and each gated feature's refusal."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import _torch_features as tf

q = k = v = torch.randn(1, 2, 4, 8)  # (B, H, L, E)


def test_the_record_reads_the_installed_version() -> None:
    assert tf.INSTALLED.version == str(torch.__version__).split("+")[0]
    assert tf.INSTALLED.release == tuple(int(p) for p in tf.INSTALLED.version.split(".")[:2])
    assert tf._record("2.6.0+cu124") == tf.TorchRecord("2.6.0", (2, 6))
    assert tf._record("2.13.0.dev20260101+cpu") == tf.TorchRecord("2.13.0.dev20260101", (2, 13))


def test_every_floor_is_above_the_package_floor() -> None:
    for key, feature in tf.FEATURES.items():
        assert feature.floor > tf.PACKAGE_FLOOR, key
        assert feature.name and feature.why


@pytest.mark.parametrize("key", sorted(tf.FEATURES))
def test_below_its_floor_a_feature_is_refused_in_one_line(key: str) -> None:
    feature = tf.FEATURES[key]
    old = tf.TorchRecord("2.6.0", tf.PACKAGE_FLOOR)
    why = tf.missing(key, old)
    floor = ".".join(map(str, feature.floor))
    assert why == f"{feature.name} needs torch >= {floor} (installed 2.6.0)"
    assert "\n" not in why
    assert tf.missing(key, tf.TorchRecord(f"{floor}.0", feature.floor)) is None


def test_an_unknown_feature_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        tf.missing("no such feature")


def test_require_raises_the_line_as_a_runtime_error() -> None:
    for key in tf.FEATURES:
        why = tf.missing(key)
        if why is None:
            tf.require(key)
            assert tf.available(key)
        else:
            with pytest.raises(attnkit.FeatureUnavailableError, match="needs torch >= "):
                tf.require(key)
            assert issubclass(attnkit.FeatureUnavailableError, RuntimeError)


def test_the_triton_backend_names_its_floor_when_below_it() -> None:
    reasons = attnkit.explain(q, k, v).reasons.get("triton")
    if reasons is None:
        pytest.skip("the triton backend is not registered")
    why = tf.missing("triton")
    if why is None:
        assert not any("needs torch >=" in r for r in reasons)
    else:
        assert why in reasons
        with pytest.raises(attnkit.BackendNotSupportedError, match="needs torch >= "):
            attnkit.attention(q, k, v, backend="triton")


@pytest.mark.skipif(tf.available("triton"), reason="the triton backend runs on this torch")
def test_below_its_floor_the_gpu_target_check_refuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnkit.backends.triton import targets

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert targets.main(["--targets", "86"]) == 3
    assert capsys.readouterr().err.strip().endswith(str(tf.missing("triton")))


@pytest.mark.skipif(tf.available("compile"), reason="torch compiles attention() here")
@pytest.mark.parametrize("fullgraph", [False, True])
def test_below_the_compile_floor_compiling_attention_is_refused(fullgraph: bool) -> None:
    """torch.compile of attention() below its floor raises the feature's line (inside
    dynamo's own error under fullgraph); the eager call still runs."""
    import torch._dynamo

    torch._dynamo.reset()
    why = tf.missing("compile")
    assert why is not None

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v)

    compiled = torch.compile(f, fullgraph=fullgraph, backend="eager")
    with pytest.raises(Exception) as caught:
        compiled(q, k, v)
    assert why in str(caught.value)
    if not fullgraph:
        assert isinstance(caught.value, attnkit.FeatureUnavailableError)
    assert f(q, k, v).shape == (1, 2, 4, 8)


@pytest.mark.skipif(tf.available("compile"), reason="torch compiles attention() here")
def test_below_the_compile_floor_a_compiled_layer_is_refused_at_its_first_call() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    why = tf.missing("compile")
    assert why is not None
    x = torch.randn(2, 5, 16)  # (B, L, E)
    for layer in (attnkit.nn.MultiheadAttention(16, 2, batch_first=True),
                  attnkit.nn.SelfAttention(16, 2)):  # fmt: skip
        compiled = torch.compile(layer, backend="eager")
        with pytest.raises(attnkit.FeatureUnavailableError, match="needs torch >= "):
            compiled(x, x, x) if isinstance(layer, attnkit.nn.MultiheadAttention) else compiled(x)


def test_the_constant_mark_is_the_one_torch_s_own_decorator_sets() -> None:
    """``constant_under_compile`` sets what ``torch.compiler.assume_constant_result``
    sets, on this torch (the nox sessions run it at both ends of the range): a torch
    that marked such functions another way would fail here, not silently trace them."""

    def ours() -> int:
        return 1

    def theirs() -> int:
        return 1

    assert tf.constant_under_compile(ours) is ours
    torch.compiler.assume_constant_result(theirs)
    assert ours.__dict__ == theirs.__dict__ and theirs.__dict__
