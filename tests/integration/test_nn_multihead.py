"""attnkit.nn.MultiheadAttention against torch.nn.MultiheadAttention, same weights."""

from __future__ import annotations

import copy
import random
import warnings

import pytest
import torch
from torch.nn.utils import parametrizations, parametrize, prune

from attnkit import masks
from attnkit.nn import MultiheadAttention

from tolerance import (
    FLOAT32_CHAIN_REL,
    FLOAT32_REL,
    FLOAT32_ULPS_REL,
    FLOAT64_REL,
    GRADCHECK_ATOL,
    assert_close_to_scale,
    scaled_error,
)


def _pair(seed: int, **kw: object) -> tuple[torch.nn.MultiheadAttention, MultiheadAttention]:
    """torch's layer with random weights (biases too) and ours loaded from it."""
    torch.manual_seed(seed)
    theirs = torch.nn.MultiheadAttention(**kw)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = MultiheadAttention(**kw)  # type: ignore[arg-type]
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _close_where_finite(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    assert torch.isfinite(ours).all()
    ok = torch.isfinite(ref)
    assert_close_to_scale(ours[ok], ref[ok], rel=FLOAT32_CHAIN_REL)


def _random_config(rng: random.Random) -> dict[str, object]:
    H = rng.choice([1, 2, 3])
    E = H * rng.choice([1, 2, 3, 5])
    same = rng.random() < 0.5
    return {
        "ctor": {
            "embed_dim": E,
            "num_heads": H,
            "bias": rng.random() < 0.7,
            "add_bias_kv": rng.random() < 0.3,
            "add_zero_attn": rng.random() < 0.3,
            "kdim": None if same else rng.choice([1, 2, 4, 7]),
            "vdim": None if same else rng.choice([1, 3, 6]),
            "batch_first": rng.random() < 0.5,
        },
        "batched": rng.random() < 0.8,
        "N": rng.choice([1, 2, 3]),
        "L": rng.choice([1, 3, 5]),
        "S": rng.choice([1, 2, 4, 7]),
        "kpm": rng.choice([None, "bool", "float"]),
        "attn_mask": rng.choice([None, "2d", "3d_heads", "3d_batch", "4d", "4d_b1"]),
        "mask_dtype": rng.choice(["bool", "float"]),
        "is_causal": rng.random() < 0.3,
        "need_weights": rng.random() < 0.6,
        "average": rng.random() < 0.5,
    }


def _inputs(cfg: dict[str, object], gen: torch.Generator) -> dict[str, torch.Tensor | None]:
    ctor = cfg["ctor"]
    assert isinstance(ctor, dict)
    E, H = ctor["embed_dim"], ctor["num_heads"]
    kdim = ctor["kdim"] or E
    vdim = ctor["vdim"] or E
    N, L, S = cfg["N"], cfg["L"], cfg["S"]
    assert isinstance(N, int) and isinstance(L, int) and isinstance(S, int)

    def seq(n: int, f: int) -> torch.Tensor:
        if not cfg["batched"]:
            return torch.randn(n, f, generator=gen)
        return torch.randn((N, n, f) if ctor["batch_first"] else (n, N, f), generator=gen)

    out: dict[str, torch.Tensor | None] = {
        "query": seq(L, E),
        "key": seq(S, kdim),
        "value": seq(S, vdim),
    }
    NB = N if cfg["batched"] else 1
    kpm = None
    if cfg["kpm"] is not None:
        pad = torch.rand(NB, S, generator=gen) < 0.3
        if NB > 1:
            pad[0] = True  # a fully padded sequence
        kpm = pad if cfg["kpm"] == "bool" else torch.zeros(NB, S).masked_fill(pad, float("-inf"))
        if cfg["kpm"] == "float":
            kpm = kpm + torch.randn(NB, S, generator=gen) * 0.1
        kpm = kpm if cfg["batched"] else kpm[0]
    out["kpm"] = kpm
    # A full (N, H, L, S) mask; each accepted layout is a view of one broadcast of it.
    layout = cfg["attn_mask"]
    full_shape = {
        None: None,
        "2d": (1, 1, L, S),
        "3d_heads": (NB, H, L, S),
        "3d_batch": (NB, 1, L, S),
        "4d": (NB, H, L, S),
        "4d_b1": (1, H, L, S),
    }[layout]
    if not cfg["batched"] and layout in ("3d_batch", "4d", "4d_b1"):
        full_shape = (1, H, L, S)
        layout = "3d_heads"
    ours_mask = theirs_mask = None
    if full_shape is not None:
        blocked = torch.rand(full_shape, generator=gen) < 0.3
        if cfg["mask_dtype"] == "bool":
            base = blocked
        else:
            base = torch.randn(full_shape, generator=gen).masked_fill(blocked, float("-inf"))
        theirs_mask = base.expand(NB, H, L, S).reshape(NB * H, L, S)
        if layout == "2d":
            ours_mask = base[0, 0]
            theirs_mask = ours_mask
        elif layout == "3d_heads":
            ours_mask = theirs_mask
        elif layout == "3d_batch":
            ours_mask = base[:, 0]
        else:
            ours_mask = base
    if cfg["is_causal"]:
        causal = torch.ones(L, S, dtype=torch.bool).triu(1)  # True = masked
        if theirs_mask is None:
            theirs_mask = causal
        elif theirs_mask.dtype == torch.bool:
            theirs_mask = theirs_mask | causal
        else:
            theirs_mask = theirs_mask.masked_fill(causal, float("-inf"))
    out["ours_mask"], out["theirs_mask"] = ours_mask, theirs_mask
    return out


@pytest.mark.parametrize("chunk", range(4))
def test_parity_random_configs(chunk: int) -> None:
    rng = random.Random(1000 + chunk)
    gen = torch.Generator().manual_seed(chunk)
    for i in range(40):
        cfg = _random_config(rng)
        theirs, ours = _pair(chunk * 100 + i, **cfg["ctor"])  # type: ignore[arg-type]
        x = _inputs(cfg, gen)
        common = {"key_padding_mask": x["kpm"], "average_attn_weights": cfg["average"]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: mismatched mask dtypes are deprecated
            t_w, t_ww = theirs(x["query"], x["key"], x["value"], attn_mask=x["theirs_mask"],
                               need_weights=True, **common)  # fmt: skip
            t_nw, _ = theirs(x["query"], x["key"], x["value"], attn_mask=x["theirs_mask"],
                             need_weights=False, **common)  # fmt: skip
        out, w = ours(
            x["query"],
            x["key"],
            x["value"],
            attn_mask=x["ours_mask"],
            is_causal=cfg["is_causal"],
            need_weights=cfg["need_weights"],
            **common,
        )
        _close_where_finite(out, t_w)
        _close_where_finite(out, t_nw)
        if cfg["need_weights"]:
            assert w is not None
            _close_where_finite(w, t_ww)
        else:
            assert w is None


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
def test_self_attention_without_mask_tensors_matches_torch(
    batch_first: bool, is_causal: bool
) -> None:
    """The lean path (one input, no mask tensors) against torch's layer, weights included."""
    theirs, ours = _pair(28, embed_dim=8, num_heads=2, batch_first=batch_first)
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(29))
    L = 5 if batch_first else 3  # (N, L, E) or (L, N, E)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1) if is_causal else None
    for need_weights, average in ((False, True), (True, True), (True, False)):
        want, want_w = theirs(
            x, x, x, attn_mask=causal, need_weights=need_weights, average_attn_weights=average
        )
        got, got_w = ours(
            x, x, x, is_causal=is_causal, need_weights=need_weights, average_attn_weights=average
        )
        assert_close_to_scale(got, want, rel=FLOAT32_ULPS_REL)
        assert (got_w is None) == (want_w is None)
        if got_w is not None and want_w is not None:
            assert_close_to_scale(got_w, want_w, rel=FLOAT32_ULPS_REL)
    with pytest.raises(TypeError, match="is_causal must be True or False"):
        ours(x, x, x, is_causal=1)  # type: ignore[arg-type]


def test_state_dict_round_trip_both_ways() -> None:
    for kw in (
        {"embed_dim": 6, "num_heads": 2},
        {"embed_dim": 6, "num_heads": 3, "kdim": 4, "vdim": 5, "bias": False},
        {"embed_dim": 4, "num_heads": 2, "add_bias_kv": True, "add_zero_attn": True},
    ):
        theirs, ours = _pair(0, **kw)
        assert set(theirs.state_dict()) == set(ours.state_dict())
        fresh = torch.nn.MultiheadAttention(**kw)  # type: ignore[arg-type]
        fresh.load_state_dict(ours.state_dict())
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, theirs.state_dict()[k])


def test_fully_masked_rows_are_zero_not_nan() -> None:
    theirs, ours = _pair(1, embed_dim=4, num_heads=2, bias=False)
    q = torch.randn(3, 2, 4)
    kpm = torch.zeros(2, 3, dtype=torch.bool)
    kpm[1] = True
    out, w = ours(q, q, q, key_padding_mask=kpm, average_attn_weights=False)
    t_out, _ = theirs(q, q, q, key_padding_mask=kpm)
    assert torch.isnan(t_out[:, 1]).all()  # torch's need_weights path: NaN
    assert torch.equal(out[:, 1], torch.zeros(3, 4))
    assert w is not None and torch.equal(w[1], torch.zeros(2, 3, 3))
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters() if p.grad is not None)


def test_is_causal_alone_and_mask_objects() -> None:
    theirs, ours = _pair(2, embed_dim=6, num_heads=2, batch_first=True)
    x = torch.randn(2, 5, 6)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    ref, ref_w = theirs(x, x, x, attn_mask=causal, average_attn_weights=False)
    out, w = ours(x, x, x, is_causal=True, average_attn_weights=False)
    assert_close_to_scale(out, ref, rel=FLOAT32_ULPS_REL)
    assert w is not None
    assert_close_to_scale(w, ref_w, rel=FLOAT32_ULPS_REL)
    out2, _ = ours(x, x, x, attn_mask=masks.causal())
    assert_close_to_scale(out2, ref, rel=FLOAT32_ULPS_REL)
    band = masks.window(1, 1)
    dense = ~band.to_dense(5, 5)  # True = masked
    ref3, _ = theirs(x, x, x, attn_mask=dense)
    out3, _ = ours(x, x, x, attn_mask=band)
    assert_close_to_scale(out3, ref3, rel=FLOAT32_ULPS_REL)


def test_mask_object_with_extra_keys() -> None:
    kw = {"embed_dim": 4, "num_heads": 2, "add_bias_kv": True, "add_zero_attn": True}
    theirs, ours = _pair(3, **kw)
    x = torch.randn(4, 2, 4)
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    ref, _ = theirs(x, x, x, attn_mask=causal)
    for mask in (masks.causal(), masks.block(causal)):
        out, _ = ours(x, x, x, attn_mask=mask)
        assert_close_to_scale(out, ref, rel=FLOAT32_ULPS_REL)
    out, _ = ours(x, x, x, is_causal=True)
    assert_close_to_scale(out, ref, rel=FLOAT32_ULPS_REL)


@pytest.mark.parametrize("extra", ["add_bias_kv", "add_zero_attn"])
def test_float64_bias_mask_object_with_extra_keys(extra: str) -> None:
    """masks.bias(b), alone and with causal, beside the extra keys in float64: the bias is
    widened in the layer's dtype (it was densified in float32: 1.6e-8 off torch's)."""
    dt = torch.float64
    theirs, ours = _pair(11, embed_dim=8, num_heads=2, batch_first=True, dtype=dt, **{extra: True})
    N, H, L, S = 2, 2, 4, 6
    q = torch.randn(N, L, 8, dtype=dt)
    kv = torch.randn(N, S, 8, dtype=dt)
    bias = torch.randn(N, H, L, S, dtype=dt)
    blocked = torch.ones(L, S, dtype=torch.bool).triu(1)
    for mask, torch_mask in (
        (masks.bias(bias), bias),
        (masks.causal() & masks.bias(bias), bias.masked_fill(blocked, float("-inf"))),
    ):
        ref, ref_w = theirs(q, kv, kv, attn_mask=torch_mask.reshape(N * H, L, S))
        out, w = ours(q, kv, kv, attn_mask=mask)
        assert out.dtype == dt and w is not None
        assert_close_to_scale(out, ref, rel=FLOAT64_REL, what="output")
        assert_close_to_scale(w, ref_w, rel=FLOAT64_REL, what="weights")


def test_dropout_only_while_training() -> None:
    theirs, ours = _pair(4, embed_dim=4, num_heads=2, dropout=0.5)
    x = torch.randn(3, 2, 4)
    ours.eval()
    theirs.eval()
    ref, _ = theirs(x, x, x)
    out, _ = ours(x, x, x)
    assert_close_to_scale(out, ref, rel=FLOAT32_ULPS_REL)
    ours.train()
    torch.manual_seed(0)
    a, w = ours(x, x, x)
    assert torch.isfinite(a).all() and scaled_error(a, out) > FLOAT32_REL
    assert w is not None  # the weights before dropout
    assert_close_to_scale(w.sum(-1), torch.ones(2, 3), rel=FLOAT32_ULPS_REL)


def test_half_precision_weights_dtype() -> None:
    ours = MultiheadAttention(4, 2, dtype=torch.bfloat16)
    x = torch.randn(3, 2, 4, dtype=torch.bfloat16)
    out, w = ours(x, x, x)
    assert out.dtype == torch.bfloat16 and w is not None and w.dtype == torch.bfloat16


def test_gradcheck_float64() -> None:
    torch.manual_seed(5)
    layer = MultiheadAttention(4, 2, add_bias_kv=True, kdim=3, dtype=torch.float64)
    q = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True)
    kpm = torch.tensor([[False, True], [False, False]])

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return layer(q, k, v, key_padding_mask=kpm, is_causal=False)[0]

    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)


def test_training_reduces_loss() -> None:
    torch.manual_seed(6)
    layer = MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(16, 5, 8)
    target = x.flip(1)  # reverse the sequence: needs attention across positions
    pos = torch.randn(1, 5, 8) * 0.5
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        out, _ = layer(x + pos, x + pos, x, need_weights=False)
        loss = ((out - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.torch_feature("compile")
@pytest.mark.parametrize("path", ["plain", "key_padding", "causal"])
def test_compile_fullgraph(path: str) -> None:
    torch.manual_seed(7)
    layer = MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    kwargs: dict[str, object] = {"need_weights": False}
    if path == "key_padding":
        kwargs["key_padding_mask"] = kpm
    if path == "causal":
        kwargs["is_causal"] = True

    def run(x: torch.Tensor) -> torch.Tensor:
        return layer(x, x, x, **kwargs)[0]

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="eager")
    assert_close_to_scale(compiled(x), run(x))


@pytest.mark.parametrize(
    ("ctor", "message"),
    [
        ({"embed_dim": 6, "num_heads": 4}, "must divide embed_dim=6"),
        ({"embed_dim": 0, "num_heads": 1}, "embed_dim"),
        ({"embed_dim": 4, "num_heads": 2, "dropout": 1.0}, "dropout"),
        ({"embed_dim": 4, "num_heads": 2, "kdim": -1}, "kdim"),
    ],
)
def test_bad_constructor(ctor: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiheadAttention(**ctor)  # type: ignore[arg-type]


def test_bad_forward_inputs() -> None:
    layer = MultiheadAttention(4, 2, kdim=3)
    q, k, v = torch.randn(5, 2, 4), torch.randn(6, 2, 3), torch.randn(6, 2, 4)
    with pytest.raises(ValueError, match=r"query has 5 features .* expected embed_dim=4"):
        layer(torch.randn(5, 2, 5), k, v)
    with pytest.raises(ValueError, match="expected kdim=3"):
        layer(q, v, v)
    with pytest.raises(ValueError, match="same batch size"):
        layer(q, torch.randn(6, 3, 3), torch.randn(6, 3, 4))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(2, 6\)"):
        layer(q, k, v, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask must have shape .* got \(5, 5\)"):
        layer(q, k, v, attn_mask=torch.zeros(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask must have shape .* got \(3, 5, 6\)"):
        layer(q, k, v, attn_mask=torch.zeros(3, 5, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        layer(q, k, v, attn_mask=torch.zeros(5, 6, dtype=torch.int64))
    with pytest.raises(ValueError, match="query should be unbatched 2D or batched 3D"):
        layer(torch.randn(1, 5, 2, 4), k, v)
    inf_at = torch.zeros(5, 6).index_fill(1, torch.tensor([2]), float("inf"))  # (L, S)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(5, 6\): .* NaN or \+inf"):
        layer(q, k, v, attn_mask=inf_at)
    with pytest.raises(ValueError, match=r"key_padding_mask of shape \(2, 6\): .* NaN or \+inf"):
        layer(q, k, v, key_padding_mask=torch.full((2, 6), float("nan")))
    with pytest.raises(
        TypeError, match=r"query is torch\.float64 .* parameters are torch\.float32"
    ):
        layer(q.double(), k.double(), v.double())


# ---------------------------------------------------------------- torch's modules around it


def _encoder_pair(
    seed: int, heads: int, norm_first: bool
) -> tuple[torch.nn.TransformerEncoderLayer, torch.nn.TransformerEncoderLayer]:
    """torch's encoder layer with random weights, and a copy whose self_attn is ours."""
    torch.manual_seed(seed)
    theirs = torch.nn.TransformerEncoderLayer(
        d_model=8, nhead=heads, dim_feedforward=16, batch_first=True, norm_first=norm_first
    )
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = copy.deepcopy(theirs)
    attn = MultiheadAttention(8, heads, dropout=theirs.self_attn.dropout, batch_first=True)
    attn.load_state_dict(theirs.self_attn.state_dict())
    ours.self_attn = attn  # type: ignore[assignment]
    return theirs.eval(), ours.eval()


@pytest.mark.parametrize("norm_first", [False, True])
def test_inside_transformer_encoder_layer_fast_path(norm_first: bool) -> None:
    theirs, ours = _encoder_pair(20, heads=2, norm_first=norm_first)
    g = torch.Generator().manual_seed(21)
    x = torch.randn(3, 5, 8, generator=g)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # (5, 5), True = masked
    calls = [
        {},
        {"src_key_padding_mask": pad},
        {"src_mask": causal},
        {"src_mask": causal, "src_key_padding_mask": pad},
        {"src_mask": causal, "is_causal": True},
    ]
    with torch.no_grad():  # eval + no_grad + even heads: torch's fast path reads self_attn
        for kwargs in calls:
            want = theirs(x, **kwargs)
            got = ours(x, **kwargs)
            ok = torch.isfinite(want)
            assert torch.equal(ok, torch.isfinite(got))
            assert_close_to_scale(got[ok], want[ok], rel=FLOAT32_ULPS_REL)
    # The regular path (gradients on) runs our forward: the same numbers where finite.
    for kwargs in calls[:4]:
        want, got = theirs(x, **kwargs), ours(x, **kwargs)
        ok = torch.isfinite(want).all(-1)
        assert_close_to_scale(got[ok], want[ok], rel=FLOAT32_ULPS_REL)


def test_inside_transformer_encoder_layer_attnkit_runs_in_every_mode() -> None:
    # torch's encoder layer ran eval without gradients as one fused kernel that never
    # called self_attn: a fully padded sequence gave NaN, is_causal alone was ignored.
    _, ours = _encoder_pair(26, heads=2, norm_first=False)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(27))
    pad = torch.tensor([[False] * 5, [True] * 5])  # the second sequence: all padding
    blocked = torch.zeros(5, 5, dtype=torch.bool)
    blocked[2] = True  # query 2 may attend nothing
    for kwargs in ({"src_key_padding_mask": pad}, {"src_mask": blocked}, {"is_causal": True}):
        with_grad = ours(x, **kwargs)  # runs attnkit's forward
        with torch.no_grad():
            without = ours(x, **kwargs)
        assert torch.isfinite(without).all(), kwargs
        assert_close_to_scale(without, with_grad, rel=FLOAT32_ULPS_REL)
    later = x.clone()
    later[:, -1] += 1.0  # causal: the first position cannot see the last one
    with torch.no_grad():
        first, second = ours(x, is_causal=True), ours(later, is_causal=True)
    assert torch.equal(first[:, 0], second[:, 0])


def test_the_encoder_layer_calls_attnkit_after_out_proj_is_replaced_or_reloaded() -> None:
    # the hook that declines torch's fused encoder kernel was set in __init__ only: a
    # replaced out_proj, or a layer saved before it, brought the fused NaN rows back
    import pickle

    _, ours = _encoder_pair(30, heads=2, norm_first=False)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(31))
    pad = torch.tensor([[False] * 5, [True] * 5])
    attn = ours.self_attn
    replaced = torch.nn.Linear(8, 8)
    replaced.load_state_dict(attn.out_proj.state_dict())
    attn.out_proj = replaced
    with torch.no_grad():
        assert torch.isfinite(ours(x, src_key_padding_mask=pad)).all()
    attn.out_proj._forward_pre_hooks.clear()  # as a layer saved before the hook existed
    ours = pickle.loads(pickle.dumps(ours))
    with torch.no_grad():
        assert torch.isfinite(ours(x, src_key_padding_mask=pad)).all()
    assert len(ours.self_attn.out_proj._forward_pre_hooks) == 1  # once, not per load
    torch.jit.script(ours.self_attn.out_proj)  # TorchScript compiles the hook
    scripted = torch.jit.script(torch.nn.Linear(8, 8))  # takes no hook: assigned as it is
    ours.self_attn.out_proj = scripted
    assert ours.self_attn(x, x, x)[0].shape == x.shape


def test_merge_masks_takes_every_self_attention_mask_shape() -> None:
    theirs, ours = _pair(28, embed_dim=8, num_heads=2, batch_first=True)
    N, L, H = 3, 4, 2
    g = torch.Generator().manual_seed(29)
    q = torch.randn(N, L, 8, generator=g)
    pad = torch.rand(N, L, generator=g) < 0.3
    full = torch.rand(N, H, L, L, generator=g) < 0.3  # (N, H, L, L)
    per_batch = full[:, 0]  # (N, L, L)
    for attn_mask, want in [
        (full, full),
        (full.reshape(N * H, L, L), full),
        (per_batch, per_batch[:, None].expand(N, H, L, L)),
    ]:
        got, kind = ours.merge_masks(attn_mask, pad, q)
        assert kind == 2 and got is not None
        assert torch.equal(got, want | pad[:, None, None, :])
    with pytest.raises(RuntimeError):
        theirs.merge_masks(full, None, q)  # torch's own takes (L, L) and (N*H, L, L) only
    with pytest.raises(ValueError, match=r"attn_mask must be .* got \(2, 4, 4\)"):
        ours.merge_masks(torch.zeros(2, L, L, dtype=torch.bool), None, q)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_inside_transformer_encoder_with_nested_fast_path() -> None:
    theirs_layer, ours_layer = _encoder_pair(22, heads=4, norm_first=False)
    theirs = torch.nn.TransformerEncoder(theirs_layer, num_layers=2, enable_nested_tensor=True)
    ours = torch.nn.TransformerEncoder(ours_layer, num_layers=2, enable_nested_tensor=True)
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(23))
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    with torch.no_grad():
        want = theirs.eval()(x, src_key_padding_mask=pad)
        got = ours.eval()(x, src_key_padding_mask=pad)
    assert_close_to_scale(got, want)


def test_merge_masks_matches_torch() -> None:
    theirs, ours = _pair(24, embed_dim=8, num_heads=2, batch_first=True)
    g = torch.Generator().manual_seed(25)
    N, L = 3, 4
    q = torch.randn(N, L, 8, generator=g)
    pad_b = torch.rand(N, L, generator=g) < 0.3
    pad_f = torch.randn(N, L, generator=g)
    am2_b = torch.rand(L, L, generator=g) < 0.3
    am2_f = torch.randn(L, L, generator=g)
    am3_f = torch.randn(N * 2, L, L, generator=g)
    for attn_mask, kpm in [
        (None, None),
        (None, pad_b),
        (None, pad_f),
        (am2_b, None),
        (am2_f, None),
        (am3_f, None),
        (am2_b, pad_b),
        (am2_f, pad_f),
        (am3_f, pad_f),
    ]:
        want, want_type = theirs.merge_masks(attn_mask, kpm, q)
        got, got_type = ours.merge_masks(attn_mask, kpm, q)
        assert got_type == want_type
        if want is None:
            assert got is None
        else:
            assert got is not None and got.shape == want.shape and torch.equal(got, want)


def test_fast_path_attributes_and_reset() -> None:
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    ours = MultiheadAttention(8, 2, batch_first=True)
    for name in (
        "_qkv_same_embed_dim",
        "batch_first",
        "embed_dim",
        "num_heads",
        "head_dim",
        "kdim",
        "vdim",
        "dropout",
        "add_zero_attn",
        "bias_k",
        "bias_v",
        "q_proj_weight",
        "k_proj_weight",
        "v_proj_weight",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert type(ours.out_proj) is type(theirs.out_proj)
    assert ours.in_proj_weight is not None and ours.in_proj_bias is not None
    with torch.no_grad():
        ours.in_proj_bias.fill_(1.0)
    ours._reset_parameters()
    assert torch.equal(ours.in_proj_bias, torch.zeros(24))
    split = MultiheadAttention(8, 2, kdim=3)
    assert split._qkv_same_embed_dim is False and split.in_proj_weight is None
    assert split.k_proj_weight is not None and split.k_proj_weight.shape == (8, 3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_non_float_dtype_is_refused(dtype: object) -> None:
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype"):
        MultiheadAttention(4, 2, dtype=dtype)  # type: ignore[arg-type]


def test_mixed_parameter_dtypes_are_named() -> None:
    layer = MultiheadAttention(4, 2, dtype=torch.float64)
    assert layer.in_proj_weight is not None
    layer.in_proj_weight.data = layer.in_proj_weight.data.half()
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"parameter in_proj_weight is torch\.float16"):
        layer(x, x, x)
    layer = MultiheadAttention(4, 2, dtype=torch.float64)
    layer.out_proj.bias.data = layer.out_proj.bias.data.float()
    with pytest.raises(TypeError, match=r"parameter out_proj\.bias is torch\.float32"):
        layer(x, x, x)


def test_average_weights_are_asked_of_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """need_weights with average_attn_weights asks attnkit.attention for head-averaged weights."""
    import attnkit.nn._common as common

    seen: list[object] = []
    real = common.attention

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("return_weights", False))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(common, "attention", spy)
    theirs, ours = _pair(26, embed_dim=6, num_heads=3)
    x = torch.randn(4, 2, 6, generator=torch.Generator().manual_seed(27))
    for average in (True, False):
        want = theirs(x, x, x, average_attn_weights=average)
        got = ours(x, x, x, average_attn_weights=average)
        assert got[1] is not None and want[1] is not None
        assert got[1].shape == want[1].shape
        assert_close_to_scale(got[0], want[0], rel=FLOAT32_ULPS_REL)
        assert_close_to_scale(got[1], want[1], rel=FLOAT32_ULPS_REL)
    ours(x, x, x, need_weights=False)
    assert seen == ["mean", True, False]


def test_checks_hold_after_a_call_of_the_same_shapes() -> None:
    """The input checks a repeated call skips depend only on what it repeats."""
    layer = MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        first = layer(x, x, x, need_weights=False)[0]
        again = layer(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    with pytest.raises(ValueError, match="features"):
        layer(x, x, torch.randn(2, 5, 7))
    with pytest.raises(TypeError, match="share a dtype"):
        layer(x, x, x.double())
    layer.out_proj.bias.data = layer.out_proj.bias.data.half()  # parameters are checked each call
    with pytest.raises(TypeError, match=r"parameter out_proj\.bias is torch\.float16"):
        layer(x, x, x)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"need_weights": False}, id="plain"),
        # gradgradcheck is slow (about 10 s each): one option by default, the rest slow
        pytest.param({"need_weights": True}, id="weights", marks=pytest.mark.slow),
        pytest.param(
            {"need_weights": False, "is_causal": True}, id="causal", marks=pytest.mark.slow
        ),
        pytest.param(
            {"need_weights": False, "padding": True}, id="padding", marks=pytest.mark.slow
        ),
        pytest.param(
            {"need_weights": True, "separate_kv": True}, id="cross", marks=pytest.mark.slow
        ),
    ],
)
def test_double_backward_like_torch(options: dict[str, bool]) -> None:
    """gradgradcheck of the layer's forward, as PyTorch's module tests run it."""
    torch.manual_seed(5)
    layer = MultiheadAttention(6, 2, batch_first=True, dtype=torch.float64)
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[False] * 4, [False, False, True, True]])
    causal = options.get("is_causal", False)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kv = y if options.get("separate_kv") else x
        out, w = layer(
            x,
            kv,
            kv,
            need_weights=options["need_weights"],
            key_padding_mask=pad if options.get("padding") else None,
            attn_mask=mask if causal else None,
            is_causal=causal,
        )
        return (out,) if w is None else (out, w)

    assert torch.autograd.gradgradcheck(f, (x, y), atol=GRADCHECK_ATOL, fast_mode=True)


@pytest.mark.parametrize("mode", ["train", "eval", "eval_no_grad"])
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_num_heads_set_after_construction_splits_the_heads_as_torch_does(
    mode: str, cross: bool
) -> None:
    """torch's layer reads ``num_heads`` at each call (its weights do not depend on it):
    ours too, on every path, with the same output and per-head weights; a number that
    does not divide embed_dim is refused, naming both."""
    theirs, ours = _pair(11, embed_dim=16, num_heads=4, batch_first=True, dropout=0.0)
    for layer in (theirs, ours):
        layer.num_heads = 2
        layer.train(mode == "train")
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 5, 16, generator=g)
    kv = torch.randn(2, 7, 16, generator=g) if cross else x
    with torch.set_grad_enabled(mode != "eval_no_grad"):
        want, want_w = theirs(x, kv, kv, average_attn_weights=False)
        got, got_w = ours(x, kv, kv, average_attn_weights=False)
    assert ours.head_dim == 8
    assert got_w is not None and want_w is not None and got_w.shape == want_w.shape
    assert_close_to_scale(got, want, rel=FLOAT32_CHAIN_REL)
    assert_close_to_scale(got_w, want_w, rel=FLOAT32_CHAIN_REL)
    ours.num_heads = 3
    with pytest.raises(ValueError, match="num_heads=3 must divide embed_dim=16"):
        ours(x, kv, kv)


class _Shift(torch.nn.Module):
    """A parametrization that moves a tensor by one (its value differs from the
    stored one, so a layer that reads the stored tensor gives other numbers)."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t + 1


_MOVED = [
    (how, where)
    for how in ("parametrize", "prune")
    for where in ("in_proj_bias", "out_proj.bias", "out_proj.weight")
] + [("weight_norm", "out_proj.weight"), ("parametrize", "bias_k")]


@pytest.mark.parametrize(("how", "where"), _MOVED)
def test_parametrized_or_pruned_projections_are_read_in_self_attention(
    how: str, where: str
) -> None:
    # torch's layer reads its projections as attributes, so a parametrization or a
    # pruning mask applies; self-attention calls must see it too (they once read the
    # stored parameters: a bias was dropped, an output weight raised KeyError).
    owner_name, _, name = where.rpartition(".")
    kv = where == "bias_k"
    theirs, ours = _pair(5, embed_dim=8, num_heads=2, batch_first=True, add_bias_kv=kv)
    for layer in (theirs, ours):
        owner = layer.get_submodule(owner_name) if owner_name else layer
        if how == "parametrize":
            parametrize.register_parametrization(owner, name, _Shift())
        elif how == "prune":
            torch.manual_seed(1)  # the same random mask on both sides
            prune.random_unstructured(owner, name, amount=0.5)
        else:
            parametrizations.weight_norm(owner, name)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    for train, grad in ((True, True), (False, True), (False, False)):  # the last: fused
        theirs.train(train)
        ours.train(train)
        with torch.set_grad_enabled(grad):
            want = theirs(x, x, x)
            got = ours(x, x, x)
        assert_close_to_scale(got[0], want[0], rel=FLOAT32_CHAIN_REL)
        assert_close_to_scale(got[1], want[1], rel=FLOAT32_CHAIN_REL)
