"""attnkit.nn.MultiheadAttention on torch's fused op: where torch's layer takes it, the
same numbers as torch's layer; attnkit's policy (non-finite inputs, fully masked rows,
is_causal) kept; every other call on attnkit.attention, with the reason named."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.nn import MultiheadAttention
from attnkit.nn import _mha_native as native

from tolerance import assert_close_to_scale

OP = "torch._native_multi_head_attention"
E, H = 16, 4


def _pair(seed: int, **kw: object) -> tuple[torch.nn.MultiheadAttention, MultiheadAttention]:
    """torch's layer (random weights and biases, eval) and ours loaded from it."""
    torch.manual_seed(seed)
    options: dict[str, object] = {"embed_dim": E, "num_heads": H, "batch_first": True, **kw}
    theirs = torch.nn.MultiheadAttention(**options).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = MultiheadAttention(**options).eval()  # type: ignore[arg-type]
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _x(N: int, L: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(N, L, E, generator=torch.Generator().manual_seed(seed))  # (N, L, E)


def _masks(N: int, L: int, kind: str) -> dict[str, torch.Tensor]:
    """Bool masks in torch's convention (True = masked) that leave every row a key."""
    g = torch.Generator().manual_seed(N * 100 + L)
    kpm = torch.rand(N, L, generator=g) < 0.4
    kpm[:, 0] = False  # (N, S): every sequence keeps its first key
    am = torch.rand(L, L, generator=g) < 0.4
    am[:, 0] = False  # (L, S): every row sees key 0
    am_heads = torch.rand(N * H, L, L, generator=g) < 0.4
    am_heads[..., 0] = False  # (N·H, L, S)
    return {
        "none": {},
        "padding": {"key_padding_mask": kpm},
        "attn_mask": {"attn_mask": am},
        "attn_mask_per_head": {"attn_mask": am_heads},
        "both": {"attn_mask": am, "key_padding_mask": kpm},
    }[kind]


@pytest.mark.parametrize("kind", ["none", "padding", "attn_mask", "attn_mask_per_head", "both"])
@pytest.mark.parametrize(("N", "L"), [(1, 1), (3, 5), (2, 16)])
def test_fast_path_calls_equal_torchs_layer(kind: str, N: int, L: int) -> None:
    theirs, ours = _pair(N * 7 + L)
    x = _x(N, L, seed=L)
    kw = _masks(N, L, kind)
    with torch.no_grad():
        assert ours.explain_path(x, x, x, **kw) == OP
        for need_weights, average in ((False, True), (True, True), (True, False)):
            want, want_w = theirs(
                x, x, x, need_weights=need_weights, average_attn_weights=average, **kw
            )
            got, got_w = ours(
                x, x, x, need_weights=need_weights, average_attn_weights=average, **kw
            )
            assert_close_to_scale(got, want, what=f"{kind} output")
            assert (got_w is None) == (want_w is None)
            if got_w is not None and want_w is not None:
                assert_close_to_scale(got_w, want_w, what=f"{kind} weights")


def test_is_causal_alone_applies_the_causal_mask() -> None:
    """torch's fast path reads is_causal as a hint about attn_mask and, without one,
    attends everywhere; attnkit applies it, on the same op."""
    theirs, ours = _pair(3)
    x = _x(2, 6, seed=4)
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)  # (L, S), True = masked
    with torch.no_grad():
        assert ours.explain_path(x, x, x, is_causal=True) == OP
        got, got_w = ours(x, x, x, is_causal=True, average_attn_weights=False)
        want, want_w = theirs(x, x, x, attn_mask=causal, average_attn_weights=False)
        assert_close_to_scale(got, want)
        assert got_w is not None and want_w is not None
        assert_close_to_scale(got_w, want_w)
        assert torch.equal(got_w.triu(1), torch.zeros_like(got_w))
        # with an attn_mask as well, both apply
        extra = torch.zeros(6, 6, dtype=torch.bool)
        extra[1:, 1] = True
        assert ours.explain_path(x, x, x, attn_mask=extra, is_causal=True) == OP
        both, _ = ours(x, x, x, attn_mask=extra, is_causal=True)
        want_both, _ = theirs(x, x, x, attn_mask=extra | causal)
        assert_close_to_scale(both, want_both)
        per_head = extra.expand(2 * H, 6, 6)  # (N·H, L, S)
        both, _ = ours(x, x, x, attn_mask=per_head, is_causal=True)
        assert_close_to_scale(both, want_both)


def test_a_fully_padded_sequence_gives_zeros_not_nan() -> None:
    theirs, ours = _pair(5)
    x = _x(3, 5, seed=6)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[1] = True  # sequence 1 has no key
    kpm[2, 3:] = True
    with torch.no_grad():
        assert "no key to attend" in ours.explain_path(x, x, x, key_padding_mask=kpm)
        got, w = ours(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
        want, _ = theirs(x, x, x, key_padding_mask=kpm)
    assert torch.isnan(want[1]).all()  # torch's op: NaN
    assert ours.out_proj.bias is not None
    assert_close_to_scale(got[1], ours.out_proj.bias.expand(5, E))  # attention 0, then out_proj
    assert w is not None and torch.equal(w[1], torch.zeros(H, 5, 5))
    assert_close_to_scale(got[[0, 2]], want[[0, 2]])


def test_a_row_masked_everywhere_by_attn_mask_gives_zero_attention() -> None:
    theirs, ours = _pair(7)
    x = _x(2, 4, seed=8)
    am = torch.zeros(4, 4, dtype=torch.bool)
    am[2] = True  # query 2 sees no key
    with torch.no_grad():
        assert "no key to attend" in ours.explain_path(x, x, x, attn_mask=am)
        got, w = ours(x, x, x, attn_mask=am)
        want, _ = theirs(x, x, x, attn_mask=am)
    assert torch.isfinite(got).all() and torch.isnan(want[:, 2]).all()
    assert w is not None and torch.equal(w[:, 2], torch.zeros(2, 4))
    keep = [0, 1, 3]
    assert_close_to_scale(got[:, keep], want[:, keep])


def test_a_nan_behind_padding_reaches_no_row() -> None:
    """The op lets it through (0 * NaN); attnkit's policy: a masked position never
    contributes, so the rows equal those of the same input with that position zeroed."""
    theirs, ours = _pair(9)
    x = _x(2, 6, seed=10)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    clean = x.clone()
    clean[0, 5] = 0.0
    poisoned = x.clone()
    poisoned[0, 5, 3] = float("nan")  # behind sequence 0's padding
    with torch.no_grad():
        assert "NaN or an inf" in ours.explain_path(
            poisoned, poisoned, poisoned, key_padding_mask=kpm
        )
        assert torch.isnan(theirs(poisoned, poisoned, poisoned, key_padding_mask=kpm)[0][0]).all()
        got, _ = ours(poisoned, poisoned, poisoned, key_padding_mask=kpm)
        want, _ = ours(clean, clean, clean, key_padding_mask=kpm)
    # the query at the padded position itself holds the NaN: its own row is NaN
    assert torch.isnan(got[0, 5]).all()
    assert_close_to_scale(got[0, :5], want[0, :5])
    assert_close_to_scale(got[1], want[1])


def test_a_nan_in_a_used_position_reaches_every_row_that_uses_it() -> None:
    _, ours = _pair(11)
    x = _x(2, 5, seed=12)
    x[1, 2, 0] = float("nan")
    with torch.no_grad():
        got, _ = ours(x, x, x, need_weights=False)
    assert torch.isnan(got[1]).all()  # every row of sequence 1 uses position 2
    assert torch.isfinite(got[0]).all()


def _reason(ours: MultiheadAttention, x: torch.Tensor, **kw: object) -> str:
    path = ours.explain_path(x, x, x, **kw)  # type: ignore[arg-type]
    assert path.startswith("attnkit.attention: "), path
    return path


@pytest.mark.parametrize(
    ("ctor", "reason"),
    [
        ({"num_heads": 1}, "odd"),
        ({"batch_first": False}, "batch_first"),
        ({"bias": False}, "bias"),
        ({"add_bias_kv": True}, "add_bias_kv"),
        ({"add_zero_attn": True}, "add_zero_attn"),
    ],
)
def test_layers_torch_keeps_off_its_fast_path_stay_off_it(
    ctor: dict[str, object], reason: str
) -> None:
    theirs, ours = _pair(13, **ctor)
    x = _x(2, 4, seed=14)
    with torch.no_grad():
        assert reason in _reason(ours, x)
        got, _ = ours(x, x, x)
        want, _ = theirs(x, x, x)
    assert_close_to_scale(got, want)


def test_calls_that_need_attnkit_attention_stay_on_it() -> None:
    theirs, ours = _pair(15)
    x = _x(2, 4, seed=16)
    y = _x(2, 4, seed=17)
    float_pad = torch.zeros(2, 4)
    assert "gradients" in _reason(ours, x)  # parameters require grad, grad on
    with torch.no_grad():
        assert "self-attention" in ours.explain_path(x, y, y)
        assert "bool" in _reason(ours, x, key_padding_mask=float_pad)
        assert "bool tensor" in _reason(ours, x, attn_mask=attnkit.masks.causal())
        assert "scores" in _reason(ours, _x(8, 128))  # large: attnkit's kernels are faster
        ours.train()
        assert "training" in _reason(ours, x)
        ours.eval()
        with attnkit.use_backend("reference"):
            assert "use_backend" in _reason(ours, x)
            got, _ = ours(x, x, x)
        assert_close_to_scale(got, theirs(x, x, x)[0])
        if hasattr(torch.backends, "mha"):
            torch.backends.mha.set_fastpath_enabled(False)
            try:
                assert "get_fastpath_enabled" in _reason(ours, x)
            finally:
                torch.backends.mha.set_fastpath_enabled(True)
        unbatched = x[0]
        assert "batched" in ours.explain_path(unbatched, unbatched, unbatched)
        for empty in (_x(0, 4), _x(2, 0)):
            assert "empty" in _reason(ours, empty)
            got, weights = ours(empty, empty, empty)
            assert got.shape == empty.shape and weights is not None
            assert weights.shape == (empty.shape[0], empty.shape[1], empty.shape[1])


def test_a_recording_sees_the_layers_attention() -> None:
    """attnkit.viz.capture records attnkit.attention calls: the layer stays on them."""
    _, ours = _pair(18)
    x = _x(1, 5, seed=19)
    with torch.no_grad(), attnkit.viz.capture(ours) as cap:
        assert "recording" in _reason(ours, x)
        ours(x, x, x, need_weights=False)
    assert len(cap.records) == 1


def test_the_sizes_given_to_the_op_are_bounded_per_mask_kind() -> None:
    assert set(native.MAX_SCORES) == {"plain", "causal", "masked"}
    _, ours = _pair(20)
    L = 16  # N·H·L·S = N · 1024
    with torch.no_grad():
        for kind, bound in native.MAX_SCORES.items():
            fits, over = bound // (H * L * L), bound // (H * L * L) + 1
            kw = {"is_causal": True} if kind == "causal" else {}
            if kind == "masked":
                kw = {"key_padding_mask": torch.zeros(over, L, dtype=torch.bool)}
            x = _x(over, L)
            assert "scores" in _reason(ours, x, **kw), kind
            if kind == "masked":
                kw = {"key_padding_mask": torch.zeros(fits, L, dtype=torch.bool)}
            x = _x(fits, L)
            assert ours.explain_path(x, x, x, **kw) == OP, kind  # type: ignore[arg-type]


def test_a_finite_half_input_whose_sum_overflows_float16_takes_the_op() -> None:
    """The finiteness check sums a float16 input in float32: a finite input whose sum
    passes 65504 is not called non-finite, and keeps torch's fused op."""
    theirs, ours = _pair(13)
    theirs, ours = theirs.half(), ours.half()
    x = (torch.randn(8, 32, E, generator=torch.Generator().manual_seed(14)) + 20).half()
    assert torch.isfinite(x).all() and not torch.isfinite(x.sum())  # 8·32·16 · ~20 > 65504
    with torch.no_grad():
        assert ours.explain_path(x, x, x) == OP
        got, got_w = ours(x, x, x)
        want, want_w = theirs(x, x, x)
    assert got_w is not None and want_w is not None
    assert torch.isfinite(want).all()
    assert torch.equal(got, want) and torch.equal(got_w, want_w)  # the same op: same bits
    y = x.clone()
    y[1, 2, 3] = float("inf")
    with torch.no_grad():
        assert "NaN or an inf" in ours.explain_path(y, y, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_finiteness_check_is_isfinite_all(dtype: torch.dtype) -> None:
    """Finite values whose sum passes the dtype's range are finite; one NaN or inf is not."""
    big = torch.finfo(dtype).max / 2
    x = torch.full((3, 4), big, dtype=dtype)  # (N·L, E): finite, its sum in dtype is inf
    assert not torch.isfinite(x.sum())
    assert native._finite(x)
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[2, 1] = bad
        assert not native._finite(y)
        assert not native._finite(-y)
