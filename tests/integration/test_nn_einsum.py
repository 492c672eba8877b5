"""attnkit.nn.EinsumMultiHeadAttention against keras.layers.MultiHeadAttention (torch backend)."""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "torch"  # before any keras import

import random

import numpy as np
import pytest
import torch

from attnkit.nn import EinsumMultiHeadAttention

from tolerance import (
    FLOAT32_REL,
    FLOAT32_ULPS_REL,
    FLOAT64_REL,
    assert_close_to_scale,
    scaled_error,
)

keras = pytest.importorskip("keras")
if keras.backend.backend() != "torch":
    pytest.skip("keras was imported earlier with another backend", allow_module_level=True)


def _np(x: object) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(x))


def _case(rng: random.Random, gen: np.random.Generator) -> dict[str, object]:
    rank = rng.choice([3, 3, 4, 5])
    axes_choices: list[object] = [None]
    if rank == 4:
        axes_choices += [(1,), (2,), (-2,), (1, 2), (2, 1)]
    if rank == 5:
        axes_choices += [(3,), (1, 3)]
    axes = rng.choice(axes_choices)
    nd = rank
    resolved = tuple(range(1, nd - 1)) if axes is None else tuple(a % nd for a in axes)  # type: ignore[union-attr]
    B = rng.choice([1, 2])
    q_shape = [B] + [rng.choice([1, 2, 3]) for _ in range(nd - 2)]
    kv_shape = list(q_shape)
    for a in resolved:  # attention axes may differ in size between query and key/value
        kv_shape[a] = rng.choice([1, 2, 4])
    fq, fv = rng.choice([2, 5]), rng.choice([3, 4])
    fk = rng.choice([fv, 6])
    causal = rng.random() < 0.3 and len(resolved) == 1 and resolved[0] == 1
    use_mask = rng.random() < 0.4
    kw = {
        "num_heads": rng.choice([1, 2, 3]),
        "key_dim": rng.choice([1, 2, 4]),
        "value_dim": rng.choice([None, 3]),
        "use_bias": rng.random() < 0.7,
        "output_shape": rng.choice([None, 4, (2, 3)]),
        "attention_axes": axes,
    }
    q = gen.standard_normal((*q_shape, fq)).astype(np.float32)
    v = gen.standard_normal((*kv_shape, fv)).astype(np.float32)
    k = (
        gen.standard_normal((*kv_shape, fk)).astype(np.float32)
        if fk != fv or rng.random() < 0.5
        else None
    )
    mask = None
    if use_mask:
        batch_axes = [a for a in range(nd - 1) if a not in resolved]
        t = [q_shape[a] for a in resolved]
        s = [kv_shape[a] for a in resolved]
        # Keras's rule: leading dims align with the leading batch axes.
        n_lead = rng.choice(range(len(batch_axes) + 1))
        lead = [q_shape[a] for a in batch_axes[:n_lead]]
        mask = gen.random((*lead, *t, *s)) < 0.6
        first = (slice(None),) * (len(lead) + len(t)) + (0,) * len(s)
        mask[first] = True  # no fully masked query row: Keras would average there
    return {"kw": kw, "q": q, "v": v, "k": k, "mask": mask, "causal": causal}


@pytest.mark.parametrize("chunk", range(3))
def test_parity_random_configs(chunk: int) -> None:
    rng = random.Random(2000 + chunk)
    gen = np.random.default_rng(chunk)
    for i in range(16):
        case = _case(rng, gen)
        keras.utils.set_random_seed(100 * chunk + i)
        layer = keras.layers.MultiHeadAttention(**case["kw"])  # type: ignore[arg-type]
        want_scores = i % 2 == 0
        res = layer(
            case["q"],
            case["v"],
            key=case["k"],
            attention_mask=case["mask"],
            use_causal_mask=case["causal"],
            return_attention_scores=want_scores,
        )
        ours = EinsumMultiHeadAttention.from_keras(layer)
        k = None if case["k"] is None else torch.from_numpy(case["k"])
        mask = None if case["mask"] is None else torch.from_numpy(case["mask"])
        got = ours(
            torch.from_numpy(case["q"]),
            torch.from_numpy(case["v"]),
            k,
            attention_mask=mask,
            use_causal_mask=bool(case["causal"]),
            return_attention_scores=want_scores,
        )
        if want_scores:
            (ref, ref_scores), (out, scores) = res, got
            assert tuple(scores.shape) == tuple(ref_scores.shape)
            assert_close_to_scale(scores.detach().numpy(), _np(ref_scores), rel=FLOAT32_ULPS_REL)
        else:
            ref, out = res, got
        assert tuple(out.shape) == tuple(ref.shape)
        assert_close_to_scale(out.detach().numpy(), _np(ref), rel=FLOAT32_ULPS_REL)


def test_seed_shapes_and_causal_with_mask() -> None:
    keras.utils.set_random_seed(0)
    layer = keras.layers.MultiHeadAttention(
        num_heads=4, key_dim=3, output_shape=5, attention_axes=(2,)
    )
    # Random, not ones: with equal inputs every weight is uniform and the test could not fail.
    x = np.random.default_rng(0).standard_normal((10, 7, 20, 3, 6)).astype(np.float32)
    q, k, v = x[0], x[1], x[2]
    ref = layer(q, v, key=k)
    ours = EinsumMultiHeadAttention.from_keras(layer)
    out = ours(torch.from_numpy(q), torch.from_numpy(v), torch.from_numpy(k))
    assert tuple(out.shape) == (7, 20, 3, 5)
    assert_close_to_scale(out.detach().numpy(), _np(ref), rel=FLOAT32_ULPS_REL)

    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    gen = np.random.default_rng(1)
    q = gen.standard_normal((2, 5, 6)).astype(np.float32)
    v = gen.standard_normal((2, 7, 6)).astype(np.float32)
    m = gen.random((2, 5, 7)) < 0.7
    m[..., 0] = True
    ref, ref_s = layer(q, v, attention_mask=m, use_causal_mask=True, return_attention_scores=True)
    ours = EinsumMultiHeadAttention.from_keras(layer)
    out, s = ours(
        torch.from_numpy(q),
        torch.from_numpy(v),
        attention_mask=torch.from_numpy(m),
        use_causal_mask=True,
        return_attention_scores=True,
    )
    assert_close_to_scale(out.detach().numpy(), _np(ref), rel=FLOAT32_ULPS_REL)
    assert_close_to_scale(s.detach().numpy(), _np(ref_s), rel=FLOAT32_ULPS_REL)


def test_dropout_eval_parity_and_training_noise() -> None:
    keras.utils.set_random_seed(3)
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2, dropout=0.5)
    q = np.random.default_rng(3).standard_normal((2, 4, 3)).astype(np.float32)
    ref = layer(q, q, training=False)
    ours = EinsumMultiHeadAttention.from_keras(layer).eval()
    out = ours(torch.from_numpy(q), torch.from_numpy(q))
    assert_close_to_scale(out.detach().numpy(), _np(ref), rel=FLOAT32_ULPS_REL)
    ours.train()
    torch.manual_seed(0)
    assert scaled_error(ours(torch.from_numpy(q), torch.from_numpy(q)), out) > FLOAT32_REL


def test_fully_masked_row_gives_zero_heads() -> None:
    torch.manual_seed(4)
    layer = EinsumMultiHeadAttention(2, 3, query_features=4, use_bias=False)
    x = torch.randn(1, 3, 4)
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    mask[0, 1] = False
    out, scores = layer(x, x, attention_mask=mask, return_attention_scores=True)
    assert torch.equal(out[0, 1], torch.zeros(4))
    assert torch.equal(scores[0, :, 1], torch.zeros(2, 3))


def test_gradients_and_gradcheck() -> None:
    torch.manual_seed(5)
    layer = EinsumMultiHeadAttention(
        2, 2, output_shape=(3,), attention_axes=(1, 2), query_features=3, dtype=torch.float64
    )
    q = torch.randn(1, 2, 2, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 3, 1, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, v: layer(q, v, use_causal_mask=True), (q, v))
    layer(q, v).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_training_reduces_loss() -> None:
    torch.manual_seed(6)
    layer = EinsumMultiHeadAttention(2, 4, query_features=6)
    x = torch.randn(8, 5, 6)
    target = x.mean(dim=1, keepdim=True).expand_as(x)
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = ((layer(x, x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        EinsumMultiHeadAttention(0, 2, query_features=3)
    with pytest.raises(TypeError, match="attention_axes"):
        EinsumMultiHeadAttention(1, 2, attention_axes="1", query_features=3)  # type: ignore[arg-type]
    layer = EinsumMultiHeadAttention(2, 2, query_features=3, value_features=4)
    q, v = torch.randn(2, 5, 3), torch.randn(2, 6, 4)
    with pytest.raises(ValueError, match=r"value has 3 features .* expected 4"):
        layer(q, q)
    with pytest.raises(ValueError, match="at least 3 dims"):
        layer(q[0], v[0])
    with pytest.raises(ValueError, match="non-attention axis 0"):
        layer(q, torch.randn(3, 6, 4))
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 5, 5\) does not broadcast"):
        layer(q, v, attention_mask=torch.ones(2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_axes must not hold -1, the feature axis"):
        EinsumMultiHeadAttention(1, 2, attention_axes=(-1,), query_features=3)
    bad_axes = EinsumMultiHeadAttention(1, 2, attention_axes=(-5,), query_features=3)
    with pytest.raises(ValueError, match="attention_axes entry -5"):
        bad_axes(q, q)
    with pytest.raises(
        TypeError, match=r"query is torch\.float64 .* parameters are torch\.float32"
    ):
        layer(q.double(), v.double())
    unbuilt = keras.layers.MultiHeadAttention(num_heads=1, key_dim=2)
    with pytest.raises(ValueError, match="not built"):
        EinsumMultiHeadAttention.from_keras(unbuilt)


# ---------------------------------------------------------------- gated attention, sliding window


def _randomize(layer: object, gen: np.random.Generator) -> None:
    """Random kernels and biases (Keras starts biases at 0, which would hide a missing one)."""
    weights = layer.get_weights()  # type: ignore[attr-defined]
    layer.set_weights(  # type: ignore[attr-defined]
        [gen.standard_normal(w.shape).astype(np.float32) * 0.5 for w in weights]
    )


@pytest.mark.parametrize("use_gate", [False, True])
def test_gate_and_sliding_window_parity(use_gate: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit import masks

    windows: list[tuple[object, ...]] = []
    real_window = masks.window

    def spy(*args: object, **kwargs: object) -> object:
        windows.append(args)
        return real_window(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(masks, "window", spy)
    gen = np.random.default_rng(40 + use_gate)
    rng = random.Random(41 + use_gate)
    for i in range(8):
        window = [None, 1, 2, 3, 6][i % 5]
        causal = i % 2 == 1
        T, S = rng.choice([(5, 5), (4, 7), (6, 3)])
        keras.utils.set_random_seed(i)
        layer = keras.layers.MultiHeadAttention(
            num_heads=rng.choice([1, 2, 3]),
            key_dim=rng.choice([2, 4]),
            value_dim=rng.choice([None, 3]),
            use_bias=rng.random() < 0.7,
            output_shape=rng.choice([None, 4]),
            use_gate=use_gate,
            sliding_window=window,
        )
        q = gen.standard_normal((2, T, 5)).astype(np.float32)
        v = gen.standard_normal((2, S, 6)).astype(np.float32)
        mask = gen.random((2, T, S)) < 0.8
        mask[:, :, 0] = True
        layer(q, v)  # build
        _randomize(layer, gen)
        ref, ref_scores = layer(
            q, v, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
        )
        ours = EinsumMultiHeadAttention.from_keras(layer)
        assert ours.use_gate is use_gate and ours.sliding_window == window
        assert (ours.gate_kernel is not None) is use_gate
        out, scores = ours(
            torch.from_numpy(q),
            torch.from_numpy(v),
            attention_mask=torch.from_numpy(mask),
            use_causal_mask=causal,
            return_attention_scores=True,
        )
        # Keras averages every value in a row it masks entirely; attnkit gives 0 there.
        live = _np(ref_scores).sum(-1) > 0.5  # (B, H, T): rows with a key left
        assert (scores.detach().numpy().sum(-1) > 0.5).tolist() == live.tolist()
        assert_close_to_scale(
            scores.detach().numpy()[live], _np(ref_scores)[live], rel=FLOAT32_ULPS_REL
        )
        rows = live.all(1)  # (B, T): every head has a key left
        assert rows.any()
        assert_close_to_scale(out.detach().numpy()[rows], _np(ref)[rows], rel=FLOAT32_ULPS_REL)
    assert windows and all(w[0] == w[1] and w[2] == "top_left" for w in windows)


def test_sliding_window_keeps_a_symmetric_band() -> None:
    torch.manual_seed(42)
    layer = EinsumMultiHeadAttention(1, 2, query_features=3, sliding_window=2)
    x = torch.randn(1, 5, 3)
    _, scores = layer(x, x, return_attention_scores=True)
    band = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs() < 2  # |i - j| < w
    assert torch.equal(scores[0, 0] > 0, band)
    _, scores = layer(x, x, use_causal_mask=True, return_attention_scores=True)
    assert torch.equal(scores[0, 0] > 0, band & torch.ones(5, 5, dtype=torch.bool).tril())


def test_gate_state_dict_and_bad_options() -> None:
    layer = EinsumMultiHeadAttention(2, 3, value_dim=4, query_features=5, use_gate=True)
    names = set(layer.state_dict())
    assert {"gate_kernel", "gate_bias"} <= names
    assert layer.gate_kernel is not None and layer.gate_kernel.shape == (5, 2, 4)
    no_bias = EinsumMultiHeadAttention(2, 3, query_features=5, use_gate=True, use_bias=False)
    assert "gate_bias" not in set(no_bias.state_dict())
    with pytest.raises(ValueError, match="sliding_window must be a positive int, got 0"):
        EinsumMultiHeadAttention(2, 3, query_features=5, sliding_window=0)
    with pytest.raises(TypeError, match="sliding_window"):
        EinsumMultiHeadAttention(2, 3, query_features=5, sliding_window=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="use_gate must be True or False"):
        EinsumMultiHeadAttention(2, 3, query_features=5, use_gate="yes")  # type: ignore[arg-type]


def test_dtype_checks() -> None:
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype .*int64"):
        EinsumMultiHeadAttention(2, 3, query_features=5, dtype=torch.int64)
    layer = EinsumMultiHeadAttention(2, 3, query_features=5, use_gate=True, dtype=torch.float64)
    assert layer.gate_bias is not None
    layer.gate_bias.data = layer.gate_bias.data.half()
    x = torch.randn(2, 4, 5, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"parameter gate_bias is torch\.float16"):
        layer(x, x)


@pytest.mark.parametrize("use_gate", [False, True])
def test_from_keras_merges_lora_projections(use_gate: bool) -> None:
    """A Keras layer with LoRA on its projections (as Keras' own test_lora enables it):
    from_keras copies each kernel as Keras computes it, kernel + (alpha / rank) a @ b, by
    value; the output equals the Keras layer's with LoRA active."""
    from tolerance import assert_close_to_scale, scaled_error

    keras.utils.set_random_seed(5)
    gen = np.random.default_rng(5)
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, use_gate=use_gate)
    q = gen.standard_normal((2, 5, 6)).astype(np.float32)
    v = gen.standard_normal((2, 7, 4)).astype(np.float32)
    layer(q, v)  # build
    _randomize(layer, gen)
    without = _np(layer(q, v))
    denses = [layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense]
    if use_gate:
        denses.append(layer._gate_dense)
    for n, dense in enumerate(denses):
        dense.enable_lora(2, lora_alpha=3.0 + n)
        b = dense.lora_kernel_b  # Keras starts it at 0 (LoRA a no-op): make it count
        b.assign(gen.standard_normal(tuple(b.shape)).astype(np.float32) * 0.5)
    ref, ref_scores = layer(q, v, return_attention_scores=True)
    assert scaled_error(torch.from_numpy(_np(ref)), torch.from_numpy(without)) > 0.05
    ours = EinsumMultiHeadAttention.from_keras(layer)
    for p in ours.parameters():
        assert p.is_leaf and p.grad_fn is None
    out, scores = ours(torch.from_numpy(q), torch.from_numpy(v), return_attention_scores=True)
    assert_close_to_scale(out, torch.from_numpy(_np(ref)), what="output")
    assert_close_to_scale(scores, torch.from_numpy(_np(ref_scores)), what="scores")
    # copied by value: training ours leaves the Keras layer as it was
    out.square().sum().backward()
    with torch.no_grad():
        for p in ours.parameters():
            p.sub_(p.grad if p.grad is not None else 0.0)
    assert_close_to_scale(torch.from_numpy(_np(layer(q, v))), torch.from_numpy(_np(ref)))


# ---------------------------------------------------------------- return_attention_scores, dtype


def test_return_attention_scores_is_read_as_keras_reads_it() -> None:
    """Keras reads the flag by its truth value: None and 0 give the output alone, 1 the
    pair. A string is refused, naming the argument (it was a bare reshape error for "mean",
    and None or 1 named ``return_weights``, an argument the caller never passed)."""
    keras.utils.set_random_seed(8)
    gen = np.random.default_rng(8)
    q = gen.standard_normal((2, 5, 6)).astype(np.float32)
    v = gen.standard_normal((2, 7, 6)).astype(np.float32)
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
    layer(q, v)
    _randomize(layer, gen)
    ours = EinsumMultiHeadAttention.from_keras(layer)
    tq, tv = torch.from_numpy(q), torch.from_numpy(v)
    out, scores = ours(tq, tv, return_attention_scores=True)
    for flag in (None, 0, False, np.False_):
        ref = layer(q, v, return_attention_scores=flag)
        got = ours(tq, tv, return_attention_scores=flag)  # type: ignore[arg-type]
        assert isinstance(got, torch.Tensor) and torch.equal(got, out), repr(flag)
        assert_close_to_scale(got, torch.from_numpy(_np(ref)), what=repr(flag))
    for flag in (1, np.True_):
        ref_out, ref_scores = layer(q, v, return_attention_scores=flag)
        got = ours(tq, tv, return_attention_scores=flag)  # type: ignore[arg-type]
        assert isinstance(got, tuple) and torch.equal(got[1], scores), repr(flag)
        assert_close_to_scale(got[0], torch.from_numpy(_np(ref_out)), what=repr(flag))
        assert_close_to_scale(got[1], torch.from_numpy(_np(ref_scores)), what=repr(flag))
    for flag in ("mean", 1.0, torch.tensor(True)):
        with pytest.raises(
            TypeError, match=r"return_attention_scores must be True or False .*, got "
        ) as info:
            ours(tq, tv, return_attention_scores=flag)  # type: ignore[arg-type]
        assert repr(flag) in str(info.value)


@pytest.mark.parametrize("lazy", [False, True])
def test_from_keras_keeps_a_float64_layer_in_float64(lazy: bool) -> None:
    """A float64 Keras layer gives a float64 layer with its weights unrounded (they were
    copied to float32: 3.9e-8 off Keras even after .double())."""
    from attnkit.nn import MultiHeadAttention

    keras.utils.set_random_seed(9)
    gen = np.random.default_rng(9)
    q = gen.standard_normal((2, 5, 6))
    v = gen.standard_normal((2, 7, 4))
    layer = keras.layers.MultiHeadAttention(
        num_heads=2, key_dim=3, output_shape=(2, 3), dtype="float64"
    )
    layer(q, v)
    layer.set_weights([gen.standard_normal(w.shape) * 0.5 for w in layer.get_weights()])
    ref, ref_scores = layer(q, v, return_attention_scores=True, training=False)
    cls = MultiHeadAttention if lazy else EinsumMultiHeadAttention
    ours = cls.from_keras(layer)
    assert {p.dtype for p in ours.parameters()} == {torch.float64}
    out, scores = ours(torch.from_numpy(q), torch.from_numpy(v), return_attention_scores=True)
    assert out.dtype == torch.float64
    assert_close_to_scale(out, torch.from_numpy(_np(ref)), rel=FLOAT64_REL, what="output")
    assert_close_to_scale(scores, torch.from_numpy(_np(ref_scores)), rel=FLOAT64_REL, what="scores")
