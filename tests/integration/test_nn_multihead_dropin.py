"""attnkit.nn.MultiheadAttention where torch's layer differs from a plain dense call:
nested (ragged) inputs, an ``in_proj_bias`` of another dtype, and the AssertionError
torch's callers catch for bad shapes. Always against torch's layer with the same weights."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import InputShapeError, MultiheadAttention

from tolerance import (
    FLOAT32_CHAIN_REL,
    FLOAT32_GRAD_REL,
    FLOAT32_ULPS_REL,
    FLOAT64_REL,
    assert_close_to_scale,
)

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")


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


def _seqs(gen: torch.Generator, lens: list[int], features: int) -> list[torch.Tensor]:
    return [torch.randn(n, features, generator=gen) for n in lens]


def _jagged(parts: list[torch.Tensor], grad: bool = False) -> torch.Tensor:
    return torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=grad)


def _per_sequence(
    theirs: torch.nn.MultiheadAttention,
    qs: list[torch.Tensor],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    **kw: object,
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """torch's layer on each sequence alone, batch of one: the ragged batch's reference."""
    return [
        tuple(
            t[0] if t is not None else None
            for t in theirs(q[None], k[None], v[None], **kw)  # type: ignore[arg-type]
        )
        for q, k, v in zip(qs, ks, vs, strict=True)
    ]  # type: ignore[misc]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"add_bias_kv": True},
        {"add_zero_attn": True},
        {"add_bias_kv": True, "add_zero_attn": True},
    ],
    ids=["plain", "bias_kv", "zero_attn", "both"],
)
def test_jagged_self_attention_equals_each_sequence_alone(options: dict[str, bool]) -> None:
    theirs, ours = _pair(40, embed_dim=10, num_heads=5, batch_first=True, **options)
    parts = _seqs(torch.Generator().manual_seed(41), [4, 6, 1], 10)
    nt = _jagged(parts)
    out, weights = ours(nt, nt, nt)
    assert out.is_nested and out.layout == torch.jagged
    assert out.shape == nt.shape  # the query's own offsets: x + attn(x) works
    assert (out + nt).is_nested
    want = _per_sequence(theirs, parts, parts, parts)
    assert weights is not None
    extra = int(options.get("add_bias_kv", False)) + int(options.get("add_zero_attn", False))
    assert weights.shape == (3, 6, 6 + extra)  # (N, L_max, S_max + extra keys)
    for i, (got, (w_out, w_weights)) in enumerate(zip(out.unbind(), want, strict=True)):
        n = parts[i].shape[0]
        assert_close_to_scale(got, w_out, rel=FLOAT32_CHAIN_REL)
        assert w_weights is not None
        keys = list(range(n)) + list(range(6, 6 + extra))  # its keys, then the extra ones
        assert_close_to_scale(weights[i, :n, keys], w_weights, rel=FLOAT32_ULPS_REL)
        assert not weights[i, n:].any() and not weights[i, :, n:6].any()  # padding: 0


def test_jagged_cross_attention_causal_and_per_head_weights() -> None:
    theirs, ours = _pair(42, embed_dim=8, num_heads=2, batch_first=True)
    g = torch.Generator().manual_seed(43)
    qs, ks, vs = _seqs(g, [4, 6], 8), _seqs(g, [7, 3], 8), _seqs(g, [7, 3], 8)
    out, weights = ours(_jagged(qs), _jagged(ks), _jagged(vs), average_attn_weights=False)
    assert weights is not None and weights.shape == (2, 2, 6, 7)  # (N, H, L_max, S_max)
    want = _per_sequence(theirs, qs, ks, vs, average_attn_weights=False)
    for i, (got, (w_out, w_weights)) in enumerate(zip(out.unbind(), want, strict=True)):
        assert w_weights is not None
        L, S = qs[i].shape[0], ks[i].shape[0]
        assert_close_to_scale(got, w_out, rel=FLOAT32_ULPS_REL)
        assert_close_to_scale(weights[i, :, :L, :S], w_weights, rel=FLOAT32_ULPS_REL)
    # is_causal on a ragged self-attention batch: causal within each sequence
    nt = _jagged(qs)
    out, _ = ours(nt, nt, nt, is_causal=True, need_weights=False)
    for q, got in zip(qs, out.unbind(), strict=True):
        causal = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).triu(1)
        want_out = theirs(q[None], q[None], q[None], attn_mask=causal, need_weights=False)[0][0]
        assert_close_to_scale(got, want_out, rel=FLOAT32_ULPS_REL)


def test_jagged_training_gradients_equal_each_sequence_alone() -> None:
    theirs, ours = _pair(44, embed_dim=6, num_heads=3, batch_first=True, dropout=0.0)
    parts = _seqs(torch.Generator().manual_seed(45), [3, 5], 6)
    nt = _jagged(parts, grad=True)
    out, _ = ours(nt, nt, nt, need_weights=False)
    out.values().square().sum().backward()
    dense = [p.clone().requires_grad_(True) for p in parts]
    for x in dense:
        theirs(x[None], x[None], x[None], need_weights=False)[0].square().sum().backward()
    assert nt.grad is not None
    for got, x in zip(nt.grad.unbind(), dense, strict=True):
        assert x.grad is not None
        assert_close_to_scale(got, x.grad, rel=FLOAT32_ULPS_REL)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert_close_to_scale(p.grad, q.grad, rel=FLOAT32_GRAD_REL, what=name)


def test_strided_nested_equals_torchs_fast_path() -> None:
    """torch's layer takes strided nested tensors on its inference fast path: same output."""
    theirs, ours = _pair(46, embed_dim=8, num_heads=2, batch_first=True)
    theirs.eval(), ours.eval()
    nt = torch.nested.nested_tensor(_seqs(torch.Generator().manual_seed(47), [2, 5], 8))
    with torch.no_grad():
        want, want_w = theirs(nt, nt, nt)
        got, got_w = ours(nt, nt, nt)
    assert got.is_nested and got.layout == torch.strided
    for a, b in zip(got.unbind(), want.unbind(), strict=True):
        assert_close_to_scale(a, b, rel=FLOAT32_ULPS_REL)
    assert got_w is not None and want_w is not None
    assert_close_to_scale(got_w, want_w, rel=FLOAT32_ULPS_REL)


@pytest.mark.parametrize("need_weights", [False, True])
def test_jagged_equals_torchs_fast_path_on_the_same_sequences(need_weights: bool) -> None:
    """Nested inputs are supported through the layer: a jagged batch gives what torch's
    layer gives on its inference fast path for the same sequences (torch's layer takes
    them in the strided nested layout only; a jagged one it refuses)."""
    theirs, ours = _pair(50, embed_dim=8, num_heads=2, batch_first=True)
    theirs.eval(), ours.eval()
    parts = _seqs(torch.Generator().manual_seed(51), [6, 2, 4], 8)
    strided, jagged = torch.nested.nested_tensor(parts), _jagged(parts)
    with torch.no_grad():
        want, want_w = theirs(strided, strided, strided, need_weights=need_weights)
        got, got_w = ours(jagged, jagged, jagged, need_weights=need_weights)
    assert got.is_nested and got.layout == torch.jagged
    for a, b in zip(got.unbind(), want.unbind(), strict=True):
        assert_close_to_scale(a, b, what="output")
    if need_weights:
        assert got_w is not None and want_w is not None
        assert_close_to_scale(got_w, want_w, what="weights")
    else:
        assert got_w is None and want_w is None


def test_nested_inputs_bad_combinations() -> None:
    ours = MultiheadAttention(4, 2, batch_first=True)
    nt = _jagged(_seqs(torch.Generator().manual_seed(48), [3, 5], 4))
    dense = torch.randn(2, 5, 4)
    with pytest.raises(TypeError, match="all nested tensors or all dense; key is a dense"):
        ours(nt, dense, nt)
    with pytest.raises(TypeError, match="dense; query is a dense tensor while another is nested"):
        ours(dense, dense, nt)
    with pytest.raises(ValueError, match="key_padding_mask is not taken with nested inputs"):
        ours(nt, nt, nt, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be an attnkit mask"):
        ours(nt, nt, nt, attn_mask=torch.zeros(5, 5, dtype=torch.bool))
    other = _jagged(_seqs(torch.Generator().manual_seed(49), [3, 4], 4))
    with pytest.raises(ValueError, match=r"same lengths, got key lengths \[3, 5\]"):
        ours(nt, nt, other)
    with pytest.raises(ValueError, match="expected kdim=4"):
        ours(nt, _jagged([torch.randn(2, 3), torch.randn(1, 3)]), nt)
    empty = torch.nested.nested_tensor([])
    with pytest.raises(AssertionError, match="query should be unbatched 2D or batched 3D tensor"):
        ours(empty, empty, empty)


@pytest.mark.parametrize("mode", ["eval_no_grad", "train"])
def test_in_proj_bias_of_another_dtype_runs_like_torch(mode: str) -> None:
    theirs, ours = _pair(50, embed_dim=4, num_heads=4, batch_first=True, dtype=torch.float64)
    for layer in (theirs, ours):
        layer.in_proj_bias = torch.nn.Parameter(layer.in_proj_bias.detach().half())
        layer.train(mode == "train")
    x = torch.randn(4, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(51))
    with torch.set_grad_enabled(mode == "train"):
        want, want_w = theirs(x, x, x)
        got, got_w = ours(x, x, x)
    assert got.dtype == torch.float64 and got_w is not None and want_w is not None
    assert_close_to_scale(got, want, rel=FLOAT64_REL)
    assert_close_to_scale(got_w, want_w, rel=FLOAT64_REL)
    if mode == "train":
        want.sum().backward()
        got.sum().backward()
        g_ours, g_theirs = ours.in_proj_bias.grad, theirs.in_proj_bias.grad
        assert g_ours is not None and g_theirs is not None and g_ours.dtype == torch.float16
        assert torch.equal(g_ours, g_theirs)


# Inputs torch's layer rejects with an AssertionError, and the sentence it says.
_BAD_SHAPES = [
    ((4, 4, 4), (4, 4), (4, 4, 4), {}, r"`key` and `value` to be 3-D but found 2-D and 3-D"),
    ((4, 4, 4), (4, 4, 4), (4, 4), {}, r"`key` and `value` to be 3-D but found 3-D and 2-D"),
    ((4, 4), (4, 4, 4), (4, 4), {}, r"`key` and `value` to be 2-D but found 3-D and 2-D"),
    (
        (4, 4, 4),
        (4, 4, 4),
        (4, 4, 4),
        {"key_padding_mask": torch.tensor([False, False, True, True])},
        r"expected `key_padding_mask` to be `None` or 2-D but found 1-D tensor instead",
    ),
    (
        (4, 4),
        (4, 4),
        (4, 4),
        {"key_padding_mask": torch.tensor([[False, False, True, True] * 2])},
        r"expected `key_padding_mask` to be `None` or 1-D but found 2-D tensor instead",
    ),
    (
        (4, 4, 4),
        (4, 4, 4),
        (4, 4, 4),
        {"attn_mask": torch.tensor([False, False, True, True])},
        r"expected `attn_mask` to be `None`, 2-D or 3-D but found 1-D tensor instead",
    ),
    (
        (4, 4),
        (4, 4),
        (4, 4),
        {"attn_mask": torch.zeros(5, 4, 4, dtype=torch.bool)},
        r"Expected `attn_mask` shape to be \(4, 4, 4\)",
    ),
]


@pytest.mark.parametrize(("q", "k", "v", "kw", "message"), _BAD_SHAPES)
@pytest.mark.parametrize("inference", [False, True])
def test_bad_shapes_raise_an_assertion_error_like_torch(
    q: tuple[int, ...],
    k: tuple[int, ...],
    v: tuple[int, ...],
    kw: dict[str, torch.Tensor],
    message: str,
    inference: bool,
) -> None:
    theirs, ours = _pair(52, embed_dim=4, num_heads=4, batch_first=inference)
    args = (torch.randn(q), torch.randn(k), torch.randn(v))
    for layer in (theirs, ours):
        layer.train(not inference)
        with torch.set_grad_enabled(not inference), pytest.raises(AssertionError, match=message):
            layer(*args, **kw)
    with pytest.raises(InputShapeError, match=message) as caught:
        ours(*args, **kw)
    assert isinstance(caught.value, ValueError) and str(caught.value).startswith(
        "MultiheadAttention: "
    )
