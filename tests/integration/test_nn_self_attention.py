"""attnkit.nn.SelfAttention against self-attention written out with plain torch ops."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnkit import masks
from attnkit.nn import SelfAttention

TOL = 1e-5


def _written_out(layer: SelfAttention, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v per head, keep (B, S, S) with True = attend; dead rows 0."""
    if layer.proj is not None:
        q, k, v = layer.proj(x).split(layer.hidden_dim, dim=-1)
    else:
        assert layer.q is not None and layer.k is not None and layer.v is not None
        q, k, v = layer.q(x), layer.k(x), layer.v(x)
    B, S, _ = x.shape
    H, D = layer.num_heads, layer.head_dim
    q, k, v = (t.reshape(B, S, H, D).permute(0, 2, 1, 3) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)
    if keep is not None:
        logits = logits.masked_fill(~keep[:, None], float("-inf"))
    w = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    out = (w @ v).permute(0, 2, 1, 3).reshape(B, S, H * D)
    return layer.output_proj(out) if layer.output_proj is not None else out


@pytest.mark.parametrize(
    ("heads", "fused", "out_proj", "bias"),
    list(itertools.product([1, 2, 3], [True, False], [True, False], [True, False])),
)
def test_matches_written_out(heads: int, fused: bool, out_proj: bool, bias: bool) -> None:
    torch.manual_seed(heads)
    layer = SelfAttention(6, heads, fused_qkv=fused, out_proj=out_proj, bias=bias)
    x = torch.randn(3, 5, 6)
    lens = torch.tensor([5, 2, 0])
    keep2 = torch.arange(5)[None, :] < lens[:, None]  # (B, S)
    out = layer(x, keep2.to(torch.int64))  # 0/1 integers, as the classic scripts build them
    ref = _written_out(layer, x, keep2[:, None, :].expand(3, 5, 5))
    assert (out - ref).abs().max() <= TOL
    assert torch.equal(out[2], ref[2]) and not torch.isnan(out).any()
    keep3 = torch.rand(3, 5, 5) < 0.6
    assert (layer(x, keep3) - _written_out(layer, x, keep3)).abs().max() <= TOL
    causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(3, 5, 5)
    assert (layer(x, masks.causal()) - _written_out(layer, x, causal)).abs().max() <= TOL
    assert (layer(x) - _written_out(layer, x, None)).abs().max() <= TOL


def test_seed_state_dict_names_and_unbatched() -> None:
    fused = SelfAttention(4)
    assert set(fused.state_dict()) == {
        "proj.weight",
        "proj.bias",
        "output_proj.weight",
        "output_proj.bias",
    }
    sep = SelfAttention(4, fused_qkv=False, out_proj=False, bias=False)
    assert set(sep.state_dict()) == {"q.weight", "k.weight", "v.weight"}
    x = torch.randn(5, 4)
    out, w = sep(x, return_weights=True)
    assert out.shape == (5, 4) and w.shape == (1, 5, 5)
    assert (out - sep(x[None])[0]).abs().max() <= TOL


def test_dropout_on_weights_only_while_training() -> None:
    torch.manual_seed(1)
    layer = SelfAttention(4, dropout=0.5)
    x = torch.randn(2, 6, 4)
    layer.eval()
    ref = layer(x)
    assert (ref - _written_out(layer, x, None)).abs().max() <= TOL
    layer.train()
    assert not torch.allclose(layer(x), ref)


def test_gradcheck_and_training() -> None:
    torch.manual_seed(2)
    layer = SelfAttention(4, 2, dtype=torch.float64)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert torch.autograd.gradcheck(lambda x: layer(x, keep), (x,))

    layer32 = SelfAttention(8, 2)
    data = torch.randn(16, 6, 8)
    target = data.cumsum(1) / torch.arange(1, 7).view(1, 6, 1)  # running mean: causal attention
    opt = torch.optim.Adam(layer32.parameters(), lr=0.03)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((layer32(data, masks.causal()) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("path", ["plain", "keep", "causal"])
def test_compile_fullgraph(path: str) -> None:
    torch.manual_seed(3)
    layer = SelfAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    mask: object = {
        "plain": None,
        "keep": torch.tensor([[True] * 5, [True, True, False, False, False]]),
        "causal": masks.causal(),
    }[path]

    def run(x: torch.Tensor) -> torch.Tensor:
        return layer(x, mask)  # type: ignore[return-value, arg-type]

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="eager")
    assert torch.allclose(compiled(x), run(x), atol=1e-6)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="num_heads=4 must divide hidden_dim=6"):
        SelfAttention(6, 4)
    with pytest.raises(ValueError, match="dropout"):
        SelfAttention(6, dropout=-0.1)
    layer = SelfAttention(6, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(B, S, 6\) .* got \(2, 3, 5\)"):
        layer(torch.randn(2, 3, 5))
    with pytest.raises(
        ValueError, match=r"mask must have shape \(2, 3\) or \(2, 3, 3\), got \(2, 4\)"
    ):
        layer(torch.randn(2, 3, 6), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"0 \(masked\) and 1"):
        layer(torch.randn(2, 3, 6), torch.full((2, 3), 0.5))
    with pytest.raises(TypeError, match="mask must be an attnkit mask"):
        layer(torch.randn(2, 3, 6), [[1, 1, 1]])
    with pytest.raises(TypeError, match=r"x is torch\.float64 .* parameters are torch\.float32"):
        layer(torch.randn(2, 3, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        layer(torch.ones(2, 3, 6, dtype=torch.int64))
