"""attention() takes SDPA's keywords and gives SDPA's numbers for them; unknown keywords
raise a TypeError naming the close ones."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.tolerance import assert_close_to_scale

import attnkit
from attnkit import masks


def _qkv(
    B: int = 2, Hq: int = 4, Hk: int = 4, L: int = 7, S: int = 7, E: int = 8, Ev: int = 5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(L * 31 + S)
    q = torch.randn(B, Hq, L, E, generator=g)  # (B, H, L, E)
    k = torch.randn(B, Hk, S, E, generator=g)  # (B, Hk, S, E)
    v = torch.randn(B, Hk, S, Ev, generator=g)  # (B, Hk, S, Ev)
    return q, k, v


@pytest.mark.parametrize(("L", "S"), [(7, 7), (5, 9), (9, 5)])
def test_is_causal_is_sdpa_top_left(L: int, S: int) -> None:
    q, k, v = _qkv(L=L, S=S)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for _ in range(2):  # the second call reuses the first call's plan
        assert_close_to_scale(attnkit.attention(q, k, v, is_causal=True), want)
    same = attnkit.attention(q, k, v, mask=masks.causal("top_left"))
    assert_close_to_scale(attnkit.attention(q, k, v, is_causal=True), same, rel=0.0)


def test_is_causal_gradients_match_sdpa() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(L=6, S=6))
    F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    want = [t.grad.clone() for t in (q, k, v)]  # type: ignore[union-attr]
    for t in (q, k, v):
        t.grad = None
    attnkit.attention(q, k, v, is_causal=True).square().sum().backward()
    for name, t, w in zip("qkv", (q, k, v), want, strict=True):
        assert t.grad is not None
        assert_close_to_scale(t.grad, w, what=f"d{name}")


@pytest.mark.parametrize("shape", ["LS", "B1LS", "BHLS"])
def test_bool_attn_mask_has_sdpa_polarity(shape: str) -> None:
    q, k, v = _qkv(L=6, S=9)
    g = torch.Generator().manual_seed(3)
    dims = {"LS": (6, 9), "B1LS": (2, 1, 6, 9), "BHLS": (2, 4, 6, 9)}[shape]
    keep = torch.rand(dims, generator=g) > 0.4  # True = may attend, as SDPA
    keep[..., 0] = True  # every row keeps a key: SDPA's numbers everywhere
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert_close_to_scale(attnkit.attention(q, k, v, attn_mask=keep), want)
    assert_close_to_scale(attnkit.attention(q, k, v, mask=masks.keep(keep)), want)


def test_bool_attn_mask_fully_masked_row_is_zero() -> None:
    q, k, v = _qkv(L=4, S=5)
    keep = torch.ones(4, 5, dtype=torch.bool)
    keep[2] = False  # row 2 keeps no key
    out = attnkit.attention(q, k, v, attn_mask=keep)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :]))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    rows = [0, 1, 3]
    assert_close_to_scale(out[..., rows, :], want[..., rows, :])


def test_float_attn_mask_is_added_like_sdpa() -> None:
    q, k, v = _qkv(L=6, S=8)
    bias = torch.randn(2, 1, 6, 8, generator=torch.Generator().manual_seed(5))
    bias[..., 3] = float("-inf")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    assert_close_to_scale(attnkit.attention(q, k, v, attn_mask=bias, scale=0.3), want)


def test_enable_gqa_like_sdpa() -> None:
    q, k, v = _qkv(Hq=6, Hk=2, L=5, S=7)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    for flag in (True, None):
        got = attnkit.attention(q, k, v, enable_gqa=flag, is_causal=True)
        assert_close_to_scale(got, want)
    with pytest.raises(RuntimeError):  # SDPA refuses 6 query heads over 2 without it
        F.scaled_dot_product_attention(q, k, v, enable_gqa=False)
    with pytest.raises(ValueError, match=r"enable_gqa: False .* head dims"):
        attnkit.attention(q, k, v, enable_gqa=False)
    q1, k1, v1 = _qkv(Hq=4, Hk=1)  # a single key head broadcasts, in SDPA too
    want = F.scaled_dot_product_attention(q1, k1, v1)
    assert_close_to_scale(attnkit.attention(q1, k1, v1, enable_gqa=False), want)


def test_is_causal_with_attn_mask_is_both() -> None:
    # it was refused "as SDPA refuses it"; SDPA takes the pair where its kernel reads a
    # mask (here: E = Ev) and refuses it on others (E != Ev): attnkit always takes it
    q, k, v = _qkv(L=5, S=7, Ev=8)
    keep = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) < 0.7
    got = attnkit.attention(q, k, v, is_causal=True, attn_mask=keep)
    ok = keep & torch.ones(5, 7, dtype=torch.bool).tril()  # (L, S)
    assert_close_to_scale(got, F.scaled_dot_product_attention(q, k, v, attn_mask=ok))
    try:  # (torch 2.15 refuses the pair in SDPA itself)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, attn_mask=keep)
    except RuntimeError:
        want = None
    if want is not None:
        rows = ok.any(-1)  # rows with a key: SDPA gives NaN or 0 for the others, attnkit 0
        assert_close_to_scale(got[..., rows, :], want[..., rows, :])
    bias = torch.randn(5, 7, generator=torch.Generator().manual_seed(2))
    got = attnkit.attention(q, k, v, is_causal=True, attn_mask=bias)
    causal_bias = bias.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), float("-inf"))
    assert_close_to_scale(got, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_bias))


def test_enable_gqa_false_takes_one_query_head_over_many_key_heads() -> None:
    # SDPA broadcasts a single query head over the key heads; attnkit refused it
    q, k, v = _qkv(Hq=1, Hk=4)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=False)
    assert_close_to_scale(attnkit.attention(q, k, v, enable_gqa=False), want)


def test_refuses_what_sdpa_refuses() -> None:
    q, k, v = _qkv()
    keep = torch.ones(7, 7, dtype=torch.bool)
    with pytest.raises(ValueError, match="attn_mask, mask: both given"):
        attnkit.attention(q, k, v, attn_mask=keep, mask=masks.causal())
    with pytest.raises(TypeError, match=r"attn_mask: expected a bool .* got dtype torch.int64"):
        attnkit.attention(q, k, v, attn_mask=keep.long())
    with pytest.raises(TypeError, match="attn_mask: expected a bool or float tensor"):
        attnkit.attention(q, k, v, attn_mask=masks.causal())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is_causal: expected True or False"):
        attnkit.attention(q, k, v, is_causal=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="enable_gqa: expected None, True or False"):
        attnkit.attention(q, k, v, enable_gqa="yes")  # type: ignore[arg-type]


def test_is_causal_with_mask_is_both() -> None:
    q, k, v = _qkv(L=6, S=6)
    lens = masks.valid_lens(torch.tensor([4, 6]))
    want = attnkit.attention(q, k, v, mask=lens & masks.causal())
    assert_close_to_scale(attnkit.attention(q, k, v, mask=lens, is_causal=True), want, rel=0.0)


def test_explain_takes_the_same_keywords() -> None:
    q, k, v = _qkv()
    ex = attnkit.explain(q, k, v, is_causal=True)
    assert ex.chosen is not None
    with pytest.raises(ValueError, match="attn_mask, mask: both given"):
        attnkit.explain(q, k, v, attn_mask=torch.ones(7, 7, dtype=torch.bool), mask=masks.causal())
    both = attnkit.explain(q, k, v, is_causal=True, attn_mask=torch.ones(7, 7, dtype=torch.bool))
    assert both.chosen is not None
    with pytest.raises(TypeError, match=r"explain\(\) got an unexpected keyword argument"):
        attnkit.explain(q, k, v, is_casual=True)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("is_casual", "did you mean 'is_causal'"),
        ("return_weight", "did you mean 'return_weights'"),
        ("atn_mask", "did you mean 'attn_mask'"),
        ("causal", "is_causal=True"),
        ("softmax_scale", "scale="),
        ("key_padding_mask", "masks.key_padding"),
    ],
)
def test_unknown_keyword_names_close_matches(given: str, hint: str) -> None:
    q, k, v = _qkv()
    with pytest.raises(TypeError) as info:
        attnkit.attention(q, k, v, **{given: True})
    message = str(info.value)
    assert f"unexpected keyword argument {given!r}" in message
    assert hint in message
    assert "takes attn_mask, backend" in message  # every keyword it does take


def test_unknown_keyword_is_refused_before_any_compute() -> None:
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="'frobnicate'"):  # no close match: named alone
        attnkit.attention(q, k[..., :3], v, frobnicate=1)  # bad shapes too: keyword first


def test_numpy_and_0d_tensor_scalars_are_taken_as_sdpa_takes_them() -> None:
    # scale=1 / np.sqrt(np.float32(E)), a 0-d tensor scale and a NumPy dropout_p were
    # refused, where a call written for SDPA should run unchanged
    import numpy as np

    q, k, v = _qkv(Ev=8)
    scale = 1 / np.sqrt(np.float32(8))
    want = F.scaled_dot_product_attention(q, k, v, scale=float(scale))
    assert_close_to_scale(attnkit.attention(q, k, v, scale=scale), want)
    assert_close_to_scale(attnkit.attention(q, k, v, scale=torch.tensor(float(scale))), want)
    with pytest.raises(ValueError, match=r"floating point; got shape \(\) and dtype torch.int64"):
        attnkit.attention(q, k, v, scale=torch.tensor(2))
    torch.manual_seed(0)
    a = attnkit.attention(q, k, v, dropout_p=np.float32(0.25))
    torch.manual_seed(0)
    assert torch.equal(a, attnkit.attention(q, k, v, dropout_p=float(np.float32(0.25))))


def test_outputs_and_lse_are_contiguous_on_every_backend() -> None:
    # ALiBi on sdpa returned a view of a padded buffer (out.view(B, -1) failed), and
    # sdpa's lse came back transposed
    from attnkit import mods

    q, k, v = _qkv(Ev=8)
    for backend in ("sdpa", "chunked", "reference"):
        out, lse = attnkit.attention(
            q, k, v, mask=masks.causal(), mods=mods.alibi(4), return_lse=True, backend=backend
        )
        assert out.is_contiguous() and lse.is_contiguous(), backend
