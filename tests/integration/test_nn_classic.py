"""d2l-style layers and Nadaraya–Watson against their formulas, written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnkit
from attnkit.nn import AdditiveAttention, DotProductAttention, KernelScore, NadarayaWatson

from tolerance import (
    FLOAT32_REL,
    FLOAT32_ULPS_REL,
    FLOAT64_REL,
    assert_close_to_scale,
    scaled_error,
)


def _d2l_masked_softmax(scores: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """d2l's rule: keys at or past the valid length get -1e6 before the softmax."""
    if valid_lens is None:
        return torch.softmax(scores, dim=-1)
    B, L, S = scores.shape
    lens = valid_lens[:, None].expand(B, L) if valid_lens.ndim == 1 else valid_lens
    cut = torch.arange(S)[None, None, :] >= lens[:, :, None]
    return torch.softmax(scores.masked_fill(cut, -1e6), dim=-1)


def _d2l_additive(layer: AdditiveAttention, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    feats = torch.tanh(layer.W_q(q)[:, :, None, :] + layer.W_k(k)[:, None, :, :])
    return layer.w_v(feats)[..., 0]  # (B, L, S)


@pytest.mark.parametrize("per_query", [False, True])
def test_additive_matches_d2l(per_query: bool) -> None:
    torch.manual_seed(0)
    layer = AdditiveAttention(key_size=3, query_size=5, num_hiddens=7, dropout=0.1).eval()
    assert set(layer.state_dict()) == {"W_q.weight", "W_k.weight", "w_v.weight"}
    for B, L, S in ((2, 1, 10), (3, 4, 6), (1, 7, 1)):
        q, k, v = torch.randn(B, L, 5), torch.randn(B, S, 3), torch.randn(B, S, 4)
        lens = torch.randint(1, S + 1, (B, L) if per_query else (B,))
        out = layer(q, k, v, lens)
        w = _d2l_masked_softmax(_d2l_additive(layer, q, k), lens)
        assert layer.attention_weights is not None
        assert_close_to_scale(layer.attention_weights, w, rel=FLOAT32_ULPS_REL)
        assert_close_to_scale(out, w @ v, rel=FLOAT32_ULPS_REL)
        assert_close_to_scale(
            layer(q, k, v),
            _d2l_masked_softmax(_d2l_additive(layer, q, k), None) @ v,
            rel=FLOAT32_ULPS_REL,
        )


def test_additive_loads_d2l_state_dict() -> None:
    torch.manual_seed(1)
    d2l_like = torch.nn.ModuleDict(
        {
            "W_k": torch.nn.Linear(2, 8, bias=False),
            "W_q": torch.nn.Linear(20, 8, bias=False),
            "w_v": torch.nn.Linear(8, 1, bias=False),
        }
    )
    layer = AdditiveAttention(2, 20, 8, 0.0)
    layer.load_state_dict(d2l_like.state_dict())
    q, k = torch.randn(2, 1, 20), torch.ones(2, 10, 2)
    v = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
    out = layer(q, k, v, torch.tensor([2, 6]))
    # All keys equal: the weights are uniform over the valid keys.
    assert out.shape == (2, 1, 4)
    assert_close_to_scale(out[0, 0], v[0, :2].mean(0), rel=FLOAT32_ULPS_REL)
    assert_close_to_scale(out[1, 0], v[0, :6].mean(0), rel=FLOAT32_ULPS_REL)
    layer.double()
    assert layer.score.W_q.weight.dtype == torch.float64
    assert layer(q.double(), k.double(), v.double()).dtype == torch.float64


def test_dot_product_matches_d2l() -> None:
    torch.manual_seed(2)
    layer = DotProductAttention(dropout=0.5).eval()
    for lens in (None, torch.tensor([2, 6]), torch.tensor([[1, 3, 10], [10, 4, 2]])):
        q, k, v = torch.randn(2, 3, 4), torch.randn(2, 10, 4), torch.randn(2, 10, 3)
        out = layer(q, k, v, lens)
        w = _d2l_masked_softmax(q @ k.transpose(1, 2) / math.sqrt(4), lens)
        assert layer.attention_weights is not None
        assert_close_to_scale(layer.attention_weights, w, rel=FLOAT32_ULPS_REL)
        assert_close_to_scale(out, w @ v, rel=FLOAT32_ULPS_REL)


def test_valid_length_zero_gives_zeros_not_uniform() -> None:
    layer = DotProductAttention(0.0)
    q, k, v = torch.randn(2, 2, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    lens = torch.tensor([0, 5])
    out = layer(q, k, v, lens)
    assert torch.equal(out[0], torch.zeros(2, 3))  # d2l: the mean of every value
    d2l = _d2l_masked_softmax(q @ k.transpose(1, 2) / 2, lens) @ v
    assert_close_to_scale(d2l[0], v[0].mean(0).expand(2, 3))
    assert_close_to_scale(out[1], d2l[1], rel=FLOAT32_ULPS_REL)


def test_dropout_and_gradients() -> None:
    torch.manual_seed(3)
    layer = AdditiveAttention(3, 3, 4, dropout=0.5)
    q, k, v = torch.randn(2, 3, 3), torch.randn(2, 4, 3), torch.randn(2, 4, 2)
    layer.eval()
    ref = layer(q, k, v)
    layer.train()
    assert scaled_error(layer(q, k, v), ref) > FLOAT32_REL  # dropout: more than rounding
    layer64 = AdditiveAttention(3, 2, 4, 0.0).double()
    args = (
        torch.randn(2, 2, 2, dtype=torch.float64, requires_grad=True),
        torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True),
        torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True),
    )
    assert torch.autograd.gradcheck(lambda q, k, v: layer64(q, k, v, torch.tensor([1, 3])), args)
    dot = DotProductAttention(0.0)
    assert torch.autograd.gradcheck(lambda q, k, v: dot(q, k[..., :2], v), args)


def test_additive_training_reduces_loss() -> None:
    torch.manual_seed(4)
    layer = AdditiveAttention(2, 2, 8, 0.0)
    k = torch.randn(32, 6, 2)
    v = torch.randn(32, 6, 1)
    q = k[:, :1] + 0.1 * torch.randn(32, 1, 2)  # the value of the key nearest the query
    target = v[:, :1]
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = ((layer(q, k, v) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_classic_bad_inputs() -> None:
    layer = DotProductAttention(0.0)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match=r"valid_lens must lie in \[0, 5\] .* from 1 to 6"):
        layer(q, k, v, torch.tensor([1, 6]))
    with pytest.raises(ValueError, match=r"valid_lens must have shape \(2,\) or \(2, 3\)"):
        layer(q, k, v, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="same feature size"):
        layer(q, torch.randn(2, 5, 3), v)
    with pytest.raises(
        ValueError,
        match=r"keys and values must have the same number of keys S, got keys "
        r"\(2, 5, 4\) and values \(2, 4, 3\)",
    ):
        layer(q, k, torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match=r"queries must have shape \(B, L, Dq\)"):
        layer(q[0], k, v)
    with pytest.raises(TypeError, match="valid_lens must be an integer tensor"):
        layer(q, k, v, "ab")  # type: ignore[arg-type]
    add = AdditiveAttention(4, 6, 8, 0.0)
    with pytest.raises(ValueError, match="expected query_size=6"):
        add(q, k, v)
    with pytest.raises(ValueError, match="num_hiddens"):
        AdditiveAttention(4, 6, 0, 0.0)


# --------------------------------------------------------------------------- Nadaraya–Watson


def _nw_numpy(kernel: str, sigma: float, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """f(q) = Σ K(q, k_j) v_j / Σ K(q, k_j) in float64; 0 where no key is in the support."""
    d2 = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1) / sigma**2
    if kernel == "gaussian":
        w = np.exp(-d2 / 2 + (d2 / 2).min(1, keepdims=True))  # the ratio, without underflow
    elif kernel == "boxcar":
        w = (d2 <= 1).astype(np.float64)
    else:
        w = np.clip(1 - d2, 0, None)
    tot = w.sum(1, keepdims=True)
    return np.where(tot > 0, (w / np.where(tot > 0, tot, 1)) @ v, 0.0)


def test_nadaraya_watson_seed_value() -> None:
    nw = NadarayaWatson()
    out = nw(
        torch.tensor([57.0]), torch.tensor([51.0, 56.0, 58.0]), torch.tensor([40.0, 43.0, 48.0])
    )
    assert out.shape == (1,) and out.item() == pytest.approx(45.5, rel=FLOAT32_ULPS_REL)
    assert nw.attention_weights is not None
    assert_close_to_scale(nw.attention_weights, torch.tensor([[0.0, 0.5, 0.5]]))


@pytest.mark.parametrize("kernel", ["gaussian", "boxcar", "epanechnikov"])
def test_nadaraya_watson_kernels_match_formula(kernel: str) -> None:
    rng = np.random.default_rng(5)
    for d, dv in ((1, None), (2, 3), (3, 1)):
        q = rng.uniform(0, 5, (7, d))
        k = rng.uniform(0, 5, (11, d))
        v = rng.standard_normal((11,) if dv is None else (11, dv))
        q[0] = 100.0  # far from every key: 0 for compact kernels
        nw = NadarayaWatson(kernel, sigma=1.3)
        args = [torch.from_numpy(a) for a in (q, k, v)]
        if d == 1:
            args[0], args[1] = args[0][:, 0], args[1][:, 0]
        out = nw(*args).numpy()
        ref = _nw_numpy(kernel, 1.3, q, k, v if dv else v[:, None])
        assert out.shape == ((7,) if dv is None else (7, dv))
        assert_close_to_scale(torch.from_numpy(out.reshape(ref.shape)), torch.from_numpy(ref),
                              rel=FLOAT64_REL)  # fmt: skip
        if kernel != "gaussian":
            assert np.all(out[0] == 0)


def test_nadaraya_watson_d2l_layout_and_learnable_sigma() -> None:
    torch.manual_seed(6)
    n = 40
    x_train = torch.sort(torch.rand(n) * 5).values
    y_train = 2 * torch.sin(x_train) + x_train**0.8 + 0.2 * torch.randn(n)
    # d2l's training layout: each query sees every other training point.
    others = ~torch.eye(n, dtype=torch.bool)
    keys = x_train.repeat(n, 1)[others].reshape(n, n - 1)
    values = y_train.repeat(n, 1)[others].reshape(n, n - 1)
    nw = NadarayaWatson(sigma=2.0, learnable=True)
    direct = _nw_numpy(
        "gaussian",
        2.0,
        x_train[:1, None].double().numpy(),
        keys[0, :, None].double().numpy(),
        values[0, :, None].double().numpy(),
    )
    assert nw(x_train, keys, values)[0].item() == pytest.approx(direct.item(), rel=FLOAT32_ULPS_REL)
    opt = torch.optim.Adam(nw.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = ((nw(x_train, keys, values) - y_train) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0] and abs(nw.sigma.item()) < 2.0

    epa = NadarayaWatson("epanechnikov", sigma=2.0, learnable=True).double()
    q = torch.rand(4, dtype=torch.float64) * 3
    k = torch.rand(4, 6, dtype=torch.float64) * 3
    v = torch.randn(4, 6, dtype=torch.float64)
    sig = epa.sigma

    def f(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return epa(q, k, v)

    assert torch.autograd.gradcheck(f, (q.requires_grad_(), v.requires_grad_()))
    epa(q, k, v).sum().backward()
    assert sig.grad is not None and torch.isfinite(sig.grad)


def test_nadaraya_watson_bad_inputs() -> None:
    with pytest.raises(ValueError, match="kernel must be one of"):
        NadarayaWatson("triangle")
    with pytest.raises(ValueError, match="sigma"):
        NadarayaWatson(sigma=0.0)
    with pytest.raises(ValueError, match="KernelScore: sigma"):
        KernelScore("boxcar", sigma=-1.0)
    nw = NadarayaWatson()
    with pytest.raises(ValueError, match=r"keys and values of shape \(3, m\)"):
        nw(torch.rand(3), torch.rand(4, 5), torch.rand(4, 5))
    with pytest.raises(
        ValueError,
        match=r"queries and keys must have the same feature size d, got queries "
        r"\(3, 2\) and keys \(4, 3\)",
    ):
        nw(torch.rand(3, 2), torch.rand(4, 3), torch.rand(4))
    with pytest.raises(
        ValueError,
        match=r"keys and values must have the same number m of rows, got keys \(4\) "
        r"and values \(5\)",
    ):
        nw(torch.rand(3), torch.rand(4), torch.rand(5))


@pytest.mark.parametrize("kernel", ["gaussian", "boxcar", "epanechnikov"])
def test_nadaraya_watson_learnable_sigma_at_zero_is_refused(kernel: str) -> None:
    """A learnable σ that reaches 0 (or inf, NaN) after construction is refused by the
    call, naming σ: the Gaussian gave NaN (1/(2σ²) = inf times a distance of 0) and the
    compact kernels 0, silently. A negative σ is a bandwidth of |σ| (the kernels read σ²)."""
    q, k, v = torch.tensor([0.0, 0.3]), torch.linspace(-1, 1, 5), torch.arange(5.0)
    nw = NadarayaWatson(kernel, 1.5, learnable=True)
    ref = nw(q, k, v)
    for bad in (0.0, -0.0, math.inf, math.nan):
        with torch.no_grad():
            nw.sigma.fill_(bad)
        with pytest.raises(
            ValueError, match=rf"sigma must be a nonzero finite bandwidth, got {bad}"
        ):
            nw(q, k, v)
    state = NadarayaWatson(kernel, 1.5, learnable=True).state_dict()
    state["score.sigma"] = torch.tensor(0.0)
    nw.load_state_dict(state)
    with pytest.raises(ValueError, match=r"sigma must be a nonzero finite bandwidth, got 0\.0"):
        nw(q, k, v)
    with torch.no_grad():
        nw.sigma.fill_(-1.5)
    assert torch.equal(nw(q, k, v), ref)
    with torch.no_grad():  # 1/σ² near float32's largest value: refused for float32 only
        nw.sigma.fill_(1e-20)
    with pytest.raises(ValueError, match=r"sigma 1e-20 is too small for torch\.float32 logits"):
        nw(q, k, v)
    assert torch.isfinite(nw.double()(q.double(), k.double(), v.double())).all()


# --------------------------------------------------------------------------- d2l's two forms


def _d2l_lazy_additive(num_hiddens: int) -> torch.nn.ModuleDict:
    """d2l's current AdditiveAttention modules: three bias-free LazyLinear layers."""
    return torch.nn.ModuleDict(
        {
            "W_k": torch.nn.LazyLinear(num_hiddens, bias=False),
            "W_q": torch.nn.LazyLinear(num_hiddens, bias=False),
            "w_v": torch.nn.LazyLinear(1, bias=False),
        }
    )


@pytest.mark.parametrize("per_query", [False, True])
def test_additive_lazy_form_matches_d2l(per_query: bool) -> None:
    torch.manual_seed(30)
    layer = AdditiveAttention(7, 0.1).eval()  # d2l: AdditiveAttention(num_hiddens, dropout)
    q, k, v = torch.randn(3, 4, 5), torch.randn(3, 6, 2), torch.randn(3, 6, 4)
    lens = torch.randint(1, 7, (3, 4) if per_query else (3,))
    out = layer(q, k, v, lens)
    assert (layer.W_q.in_features, layer.W_k.in_features) == (5, 2)
    assert set(layer.state_dict()) == {"W_q.weight", "W_k.weight", "w_v.weight"}
    w = _d2l_masked_softmax(_d2l_additive(layer, q, k), lens)
    assert layer.attention_weights is not None
    assert_close_to_scale(layer.attention_weights, w, rel=FLOAT32_ULPS_REL)
    assert_close_to_scale(out, w @ v, rel=FLOAT32_ULPS_REL)
    # Later calls keep the sizes fixed by the first one.
    with pytest.raises(ValueError, match="expected query_size=5"):
        layer(torch.randn(3, 4, 3), k, v)


def test_additive_lazy_form_loads_d2l_state_dict() -> None:
    torch.manual_seed(31)
    d2l = _d2l_lazy_additive(8)
    q, k = torch.randn(2, 3, 20), torch.randn(2, 10, 2)
    v = torch.randn(2, 10, 4)
    feats = torch.tanh(d2l["W_q"](q)[:, :, None, :] + d2l["W_k"](k)[:, None, :, :])
    scores = d2l["w_v"](feats)[..., 0]  # (B, L, S), the lazy layers now materialized
    lens = torch.tensor([2, 6])
    want = _d2l_masked_softmax(scores, lens) @ v
    for layer in (AdditiveAttention(8, 0.0), AdditiveAttention(num_hiddens=8, dropout=0.0)):
        layer.load_state_dict(d2l.state_dict())
        assert_close_to_scale(layer(q, k, v, lens), want, rel=FLOAT32_ULPS_REL)


def test_additive_both_signatures() -> None:
    sized = [
        AdditiveAttention(2, 20, 8, 0.1),
        AdditiveAttention(2, 20, 8),
        AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1),
        AdditiveAttention(2, 20, num_hiddens=8),
    ]
    for layer in sized:
        assert (layer.W_k.in_features, layer.W_q.in_features, layer.W_q.out_features) == (2, 20, 8)
        assert not isinstance(layer.W_q, torch.nn.LazyLinear)
    lazy = [AdditiveAttention(8, 0.1), AdditiveAttention(8), AdditiveAttention(8, dropout=0.0)]
    lazy.append(AdditiveAttention(num_hiddens=8, dropout=0.2))
    for layer in lazy:
        assert isinstance(layer.W_q, torch.nn.LazyLinear) and layer.W_q.out_features == 8
    assert sized[0].dropout.p == 0.1 and lazy[0].dropout.p == 0.1 and lazy[3].dropout.p == 0.2
    with pytest.raises(TypeError, match=r"AdditiveAttention\(num_hiddens, dropout=0\.0\)"):
        AdditiveAttention()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"got \(2, 20\)"):
        AdditiveAttention(2, 20)  # two sizes and no num_hiddens
    with pytest.raises(TypeError, match=r"got \(1, 2, 3, 0\.1, 5\)"):
        AdditiveAttention(1, 2, 3, 0.1, 5)
    with pytest.raises(TypeError, match="key_size=3"):
        AdditiveAttention(8, key_size=3)  # a key size without a query size
    with pytest.raises(ValueError, match="dropout"):
        AdditiveAttention(8, 1.5)


def test_additive_mixed_parameter_dtypes_are_named() -> None:
    layer = AdditiveAttention(3, 2, 4, 0.0).double()
    layer.W_k.weight.data = layer.W_k.weight.data.float()
    q = torch.randn(2, 1, 2, dtype=torch.float64)
    k, v = torch.randn(2, 3, 3, dtype=torch.float64), torch.randn(2, 3, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"parameter W_k\.weight is torch\.float32"):
        layer(q, k, v)
    with pytest.raises(TypeError, match=r"queries is torch\.float32 .* torch\.float64"):
        AdditiveAttention(3, 2, 4, 0.0).double()(q.float(), k, v)


def test_mixed_input_dtypes_are_named_by_the_layer() -> None:
    """Queries, keys and values of different dtypes: the layer names them, in its own
    words, before attnkit.attention would (with its query/key/value names)."""
    q64, k, v = torch.randn(4, dtype=torch.float64), torch.randn(3), torch.randn(3)
    with pytest.raises(TypeError, match=r"^NadarayaWatson: queries, keys and values must "):
        NadarayaWatson()(q64, k, v)
    q = torch.randn(2, 3, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^DotProductAttention: queries, keys and values must"):
        DotProductAttention()(q, torch.randn(2, 5, 4), torch.randn(2, 5, 4))


def test_masked_softmax_over_no_key_is_empty() -> None:
    """Logits (..., 0): empty weights (amax raised on an empty dim), with or without
    valid_lens, and a gradient of the input's shape."""
    x = torch.randn(2, 3, 0, requires_grad=True)
    for lens in (None, torch.tensor([0, 0])):
        w = attnkit.masked_softmax(x, lens)
        assert w.shape == (2, 3, 0)
    attnkit.masked_softmax(x).sum().backward()
    assert x.grad is not None and x.grad.shape == (2, 3, 0)


def test_a_learnable_boxcar_sigma_gets_its_zero_gradient() -> None:
    # the boxcar's log-kernel was a constant: its output had no gradient at all, so
    # d2l's loop failed at loss.backward(), and sigma.grad stayed None, not zeros
    x = torch.sort(torch.rand(12, generator=torch.Generator().manual_seed(0)) * 5).values
    y = torch.sin(x)
    model = NadarayaWatson("boxcar", sigma=1.0, learnable=True)
    out = model(x, x, y)
    ((out - y) ** 2).sum().backward()
    assert model.score.sigma.grad is not None
    assert torch.equal(model.score.sigma.grad, torch.zeros(()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_lazy_additive_layer_names_an_input_of_another_dtype(dtype: torch.dtype) -> None:
    # its first call ran the lazy Linear on the input: torch's bare "expected m1 and m2
    # to have the same dtype" instead of the layer's own message
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 4)
    with pytest.raises(TypeError, match=rf"AdditiveAttention: queries is {dtype}"):
        AdditiveAttention(6)(q.to(dtype), k.to(dtype), v.to(dtype))
    layer = AdditiveAttention(6).to(dtype)  # moved first: its sizes come from the call
    assert layer(q.to(dtype), k.to(dtype), v.to(dtype)).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint32, torch.uint64])
def test_unsigned_valid_lens_are_read_as_masks_valid_lens_reads_them(dtype: torch.dtype) -> None:
    # uint32 and uint64 lengths failed with torch's '"min_all" not implemented'
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    layer = DotProductAttention()
    want = layer(q, k, v, torch.tensor([2, 5]))
    assert torch.equal(layer(q, k, v, torch.tensor([2, 5]).to(dtype)), want)
    with pytest.raises(ValueError, match=r"valid_lens must lie in \[0, 5\]"):
        layer(q, k, v, torch.tensor([2, 6]).to(dtype))
