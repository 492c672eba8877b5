"""attnkit.nn.MultiHeadAttention (Keras's arguments, sizes from the first call) against
keras.layers.MultiHeadAttention on the torch backend, weights copied."""

from __future__ import annotations

import math
import os

os.environ["KERAS_BACKEND"] = "torch"  # before any keras import

import numpy as np
import pytest
import torch
from tests.tolerance import assert_close_to_scale

from attnkit.nn import EinsumMultiHeadAttention, MultiHeadAttention

keras = pytest.importorskip("keras")
if keras.backend.backend() != "torch":
    pytest.skip("keras was imported earlier with another backend", allow_module_level=True)


def _t(x: object) -> torch.Tensor:
    return torch.from_numpy(np.asarray(keras.ops.convert_to_numpy(x)))


def _randomize(layer: object, gen: np.random.Generator) -> None:
    """Random kernels and biases (Keras starts biases at 0, which would hide a missing one)."""
    weights = layer.get_weights()  # type: ignore[attr-defined]
    layer.set_weights(  # type: ignore[attr-defined]
        [gen.standard_normal(w.shape).astype(np.float32) * 0.5 for w in weights]
    )


def _copy_into(ours: MultiHeadAttention, layer: object) -> None:
    """Keras's weights into ours (state_dict keys of EinsumMultiHeadAttention)."""
    ours.load_state_dict(EinsumMultiHeadAttention.from_keras(layer).state_dict())


CASES = [
    # (constructor kwargs, query shape, value shape, key features or None)
    ({"num_heads": 2, "key_dim": 4}, (2, 5, 6), (2, 7, 6), None),
    ({"num_heads": 3, "key_dim": 2, "value_dim": 5, "output_shape": 4}, (2, 5, 3), (2, 4, 7), 6),
    ({"num_heads": 2, "key_dim": 3, "use_bias": False, "output_shape": (2, 3)}, (1, 6, 4), (1, 6, 4), None),
    ({"num_heads": 2, "key_dim": 2, "attention_axes": (2,)}, (2, 3, 4, 5), (2, 3, 6, 5), None),
    ({"num_heads": 1, "key_dim": 4, "attention_axes": (1, 2)}, (2, 2, 3, 5), (2, 3, 2, 4), 3),
]  # fmt: skip


@pytest.mark.parametrize("n", range(len(CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_parity_with_keras_after_the_first_call(n: int, causal: bool) -> None:
    kw, q_shape, v_shape, fk = CASES[n]
    if causal and kw.get("attention_axes") is not None:
        pytest.skip("Keras builds its causal mask from axis 1 whatever the attention axes")
    gen = np.random.default_rng(n)
    q = gen.standard_normal(q_shape).astype(np.float32)
    v = gen.standard_normal(v_shape).astype(np.float32)
    k = None if fk is None else gen.standard_normal((*v_shape[:-1], fk)).astype(np.float32)
    keras.utils.set_random_seed(n)
    layer = keras.layers.MultiHeadAttention(**kw)
    layer(q, v, key=k)  # build
    _randomize(layer, gen)
    ref, ref_scores = layer(
        q, v, key=k, use_causal_mask=causal, return_attention_scores=True, training=False
    )

    ours = MultiHeadAttention(**kw)
    assert ours.has_uninitialized_params()
    tk = None if k is None else torch.from_numpy(k)
    ours(torch.from_numpy(q), torch.from_numpy(v), tk)  # the first call builds it
    assert not ours.has_uninitialized_params()
    assert ours.query_kernel.shape == (q_shape[-1], kw["num_heads"], kw["key_dim"])
    _copy_into(ours, layer)
    out, scores = ours(
        torch.from_numpy(q),
        torch.from_numpy(v),
        key=tk,
        use_causal_mask=causal,
        return_attention_scores=True,
        training=False,
    )
    assert_close_to_scale(out, _t(ref), what="output")
    assert_close_to_scale(scores, _t(ref_scores), what="scores")


def test_attention_mask_in_keras_polarity_with_causal() -> None:
    gen = np.random.default_rng(7)
    q = gen.standard_normal((2, 6, 5)).astype(np.float32)
    v = gen.standard_normal((2, 6, 3)).astype(np.float32)
    keep = gen.random((2, 6, 6)) < 0.6  # Keras: True / 1 = may attend
    keep[..., 0] = True  # every row keeps a key (Keras averages a row it masks entirely)
    keras.utils.set_random_seed(7)
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, dropout=0.3)
    layer(q, v)
    _randomize(layer, gen)
    ours = MultiHeadAttention(num_heads=2, key_dim=3, dropout=0.3)
    _copy_into(ours, layer)  # loading builds it too, before any call
    assert not ours.has_uninitialized_params() and ours.query_features == 5
    for mask, causal in ((keep, False), (keep, True), (keep.astype(np.int32), True)):
        ref, ref_s = layer(
            q, v, attention_mask=mask, use_causal_mask=causal,
            return_attention_scores=True, training=False,
        )  # fmt: skip
        out, s = ours(
            torch.from_numpy(q), torch.from_numpy(v), attention_mask=torch.from_numpy(mask),
            use_causal_mask=causal, return_attention_scores=True, training=False,
        )  # fmt: skip
        assert_close_to_scale(out, _t(ref), what=f"output causal={causal} {mask.dtype}")
        assert_close_to_scale(s, _t(ref_s), what=f"scores causal={causal}")
    # key 3 blocked everywhere: an inverted polarity would keep only key 3
    blocked = np.ones((2, 6, 6), dtype=bool)
    blocked[..., 3] = False
    a = ours.eval()(
        torch.from_numpy(q), torch.from_numpy(v), attention_mask=torch.from_numpy(blocked)
    )
    ref = layer(q, v, attention_mask=blocked, training=False)
    assert_close_to_scale(a, _t(ref))  # type: ignore[arg-type]


def test_keras_call_order_and_its_key_masks() -> None:
    """Keras's call, in Keras's order: query, value, key, query_mask, value_mask,
    key_mask, attention_mask, ... The layer had no value_mask/key_mask (a TypeError where
    Keras runs) and read a fourth positional argument as attention_mask, where Keras reads
    query_mask and drops it: 1.09 off. value_mask and key_mask now mask keys as Keras's
    do; a query_mask, which Keras does not read, is refused."""
    gen = np.random.default_rng(11)
    q = gen.standard_normal((2, 4, 6)).astype(np.float32)
    v = gen.standard_normal((2, 5, 6)).astype(np.float32)
    k = gen.standard_normal((2, 5, 7)).astype(np.float32)
    keras.utils.set_random_seed(11)
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
    layer(q, v, k)
    _randomize(layer, gen)
    ours = MultiHeadAttention.from_keras(layer).eval()
    value_mask = np.ones((2, 5), dtype=bool)
    value_mask[1, 3:] = False
    key_mask = np.ones((2, 5), dtype=np.int32)
    key_mask[0, 0] = 0
    keep = gen.random((2, 4, 5)) < 0.8
    for kw in ({"value_mask": value_mask}, {"key_mask": key_mask},
               {"value_mask": value_mask, "key_mask": key_mask, "attention_mask": keep},
               {"value_mask": value_mask, "use_causal_mask": True}):  # fmt: skip
        ref = layer(q, v, k, training=False, **kw)
        mine = {n: torch.from_numpy(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
        out = ours(torch.from_numpy(q), torch.from_numpy(v), torch.from_numpy(k), **mine)
        assert_close_to_scale(out, _t(ref), what=str(sorted(kw)))
    tq, tv, tk = torch.from_numpy(q), torch.from_numpy(v), torch.from_numpy(k)
    positional = (tq, tv, tk, None, torch.from_numpy(value_mask), None, torch.from_numpy(keep))
    ref = layer(q, v, k, value_mask=value_mask, attention_mask=keep, training=False)
    assert_close_to_scale(ours(*positional), _t(ref), what="positional")
    with pytest.raises(TypeError, match="query_mask is not read"):
        ours(tq, tv, tk, torch.from_numpy(keep))
    # a bad attention_mask beside a value_mask is named by the layer, not by torch's
    # broadcast; a value_mask over an attention axis that is not the last is refused
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 4, 7\) does not"):
        ours(
            tq, tv, tk, value_mask=torch.from_numpy(value_mask), attention_mask=torch.ones(2, 4, 7)
        )
    axis1 = MultiHeadAttention(num_heads=2, key_dim=3, attention_axes=(1,))
    x = torch.randn(2, 5, 3, 4)
    with pytest.raises(ValueError, match=r"value_mask masks the keys of one attention axis, the"):
        axis1(x, x, value_mask=torch.ones(2, 5, 3, dtype=torch.bool))


def test_training_flag_and_module_mode() -> None:
    ours = MultiHeadAttention(num_heads=2, key_dim=2, dropout=0.5)
    x = torch.randn(2, 4, 3)
    ours.eval()
    base = ours(x, x)
    assert torch.equal(ours(x, x, training=False), base)
    torch.manual_seed(0)
    noisy = ours(x, x, training=True)  # dropout although the module is in eval
    assert not torch.equal(noisy, base)
    ours.train()
    assert torch.equal(ours(x, x, training=False), base)
    with pytest.raises(TypeError, match="training must be None, True or False"):
        ours(x, x, training=1)  # type: ignore[arg-type]


def test_lazy_parameters_move_and_train() -> None:
    ours = MultiHeadAttention(num_heads=2, key_dim=4, output_shape=3, dtype=torch.float64)
    ours = ours.to("cpu")  # before the first call: nothing to move but the placeholders
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    out = ours(x, x)
    assert out.shape == (2, 5, 3) and ours.output_kernel.dtype == torch.float64
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    loss = ours(x, x).square().mean()
    loss.backward()
    opt.step()
    assert all(p.grad is not None for p in ours.parameters())
    assert "query_features=6" in repr(ours)
    with pytest.raises(ValueError, match="expected 6 as built at the first call"):
        ours(torch.randn(2, 5, 7, dtype=torch.float64), x)  # sizes are fixed once built


def test_first_call_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"query must be a tensor of shape \(B, \*T, F\)"):
        MultiHeadAttention(2, 2)(torch.randn(5, 4), torch.randn(5, 4))
    with pytest.raises(TypeError, match="value must be a tensor"):
        MultiHeadAttention(2, 2)(torch.randn(2, 5, 4), [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        MultiHeadAttention(0, 2)


def test_refused_first_call_builds_nothing() -> None:
    """A first call refused by any check leaves the layer unbuilt, so the next valid call
    sets the sizes (the refused call's sizes were kept: "expected 4 as built at the first
    call")."""
    ours = MultiHeadAttention(num_heads=2, key_dim=3)
    q4, v4 = torch.randn(2, 5, 4), torch.randn(2, 7, 4)
    refused: list[tuple[type[Exception], str, dict[str, object]]] = [
        (TypeError, "query must be floating point", {"query": q4.long(), "value": v4.long()}),
        (TypeError, r"query is torch\.float64", {"query": q4.double(), "value": v4.double()}),
        (ValueError, "non-attention axis 0", {"query": q4, "value": torch.randn(3, 7, 4)}),
        (ValueError, "attention_mask of shape", {"attention_mask": torch.ones(2, 5, 5) > 0}),
        (TypeError, "return_attention_scores", {"return_attention_scores": "mean"}),
        (TypeError, "use_causal_mask", {"use_causal_mask": 1}),
        (TypeError, "training must be", {"training": "yes"}),
        (TypeError, r"forward\(\): got an unexpected keyword argument 'mask'", {"mask": None}),
        (TypeError, "query_mask is not read", {"query_mask": torch.ones(2, 5) > 0}),
        (
            ValueError,
            r"value_mask must have the value's shape",
            {"value_mask": torch.ones(2, 5) > 0},
        ),
        # a float mask that is not 0/1 (torch's additive -inf, NaN) once read as "attend"
        (
            ValueError,
            r"float attention_mask must hold 0 \(masked\) and 1 \(attend\) only, got -inf",
            {"attention_mask": torch.zeros(2, 5, 7).index_fill_(2, torch.tensor([0]), -math.inf)},
        ),
        (ValueError, "float value_mask must hold 0", {"value_mask": torch.full((2, 7), math.nan)}),
        # no features: a layer built from it would be degenerate for good
        (ValueError, "F >= 1", {"query": torch.randn(2, 5, 0)}),
    ]
    for error, match, kw in refused:
        call = {"query": q4, "value": v4, **kw}
        with pytest.raises(error, match=match):
            ours(**call)
        assert ours.has_uninitialized_params(), match
    q6, v6 = torch.randn(2, 5, 6), torch.randn(2, 7, 6)
    out, scores = ours(q6, v6, return_attention_scores=1)
    assert out.shape == (2, 5, 6) and scores.shape == (2, 2, 5, 7)
    assert ours.query_kernel.shape == (6, 2, 3)


def test_einsum_layer_without_query_features_points_to_the_lazy_one() -> None:
    with pytest.raises(TypeError, match=r"query_features .* attnkit\.nn\.MultiHeadAttention"):
        EinsumMultiHeadAttention(num_heads=2, key_dim=2)


def test_docstring_example_runs() -> None:
    import doctest

    from attnkit.nn import keras_mha

    result = doctest.testmod(keras_mha, verbose=False)
    assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize("n", [1, 2])
def test_from_keras_builds_the_keras_shaped_layer(n: int) -> None:
    """MultiHeadAttention.from_keras(layer): this class, built from the copied weights,
    Keras's numbers (it inherited the einsum layer's constructor call before)."""
    kw, q_shape, v_shape, fk = CASES[n]
    gen = np.random.default_rng(10 + n)
    q = gen.standard_normal(q_shape).astype(np.float32)
    v = gen.standard_normal(v_shape).astype(np.float32)
    k = None if fk is None else gen.standard_normal((*v_shape[:-1], fk)).astype(np.float32)
    layer = keras.layers.MultiHeadAttention(**kw)
    layer(q, v, key=k)
    _randomize(layer, gen)
    ours = MultiHeadAttention.from_keras(layer)
    assert type(ours) is MultiHeadAttention and not ours.has_uninitialized_params()
    assert ours.query_features == q_shape[-1]
    tk = None if k is None else torch.from_numpy(k)
    out = ours(torch.from_numpy(q), torch.from_numpy(v), key=tk, training=False)
    assert_close_to_scale(out, _t(layer(q, v, key=k, training=False)), what="output")


def test_the_lazy_layer_names_itself_and_keeps_its_output_shape() -> None:
    """Its errors name MultiHeadAttention (not the einsum layer it builds on), and a
    state_dict whose output kernel does not give the output_shape it was built with is
    refused by name (a lazy parameter takes any shape: it was taken silently)."""
    lazy = MultiHeadAttention(2, 3)
    lazy(torch.randn(2, 5, 6), torch.randn(2, 7, 6))
    with pytest.raises(ValueError, match=r"^MultiHeadAttention: query has 4 features"):
        lazy(torch.randn(2, 5, 4), torch.randn(2, 7, 6))
    einsum = EinsumMultiHeadAttention(2, 3, query_features=6)  # output kernel (2, 3, 6)
    asked = MultiHeadAttention(2, 3, output_shape=4)
    with pytest.raises(RuntimeError, match=r"output_kernel: .*output_shape=\(4,\)"):
        asked.load_state_dict(einsum.state_dict())
    free = MultiHeadAttention(2, 3)  # no output_shape asked for: the loaded one is taken
    free.load_state_dict(einsum.state_dict())
    assert free.output_shape == (6,)
