"""attention() and the layers on the meta device: shapes and dtypes, no storage.

Shape inference, FLOP and memory estimators and deferred initialisation run a model
on meta tensors; torch's SDPA and ``torch.nn.MultiheadAttention`` take them. Every
result of a meta call must have the shape and dtype of the same call on the CPU,
through a backward too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import attnkit
from attnkit import masks, mods, scores
from attnkit.nn import (
    AdditiveAttention,
    DotProductAttention,
    EinsumMultiHeadAttention,
    MultiheadAttention,
    SelfAttention,
)

Call = Callable[[str], object]


def _qkv(device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    shapes = ((2, 4, 7, 16), (2, 2, 9, 16), (2, 2, 9, 12))  # (B, H, L, E), (B, Hk, S, *)
    return tuple(torch.randn(s, generator=g).to(device).requires_grad_(True) for s in shapes)


def _lens(device: str) -> torch.Tensor:
    return torch.tensor([3, 9], device=device)  # (B,)


CALLS: dict[str, Call] = {
    "plain": lambda d: attnkit.attention(*_qkv(d)),
    "causal": lambda d: attnkit.attention(*_qkv(d), mask=masks.causal("bottom_right")),
    "valid_lens": lambda d: attnkit.attention(*_qkv(d), mask=masks.valid_lens(_lens(d))),
    "bias": lambda d: attnkit.attention(*_qkv(d), mask=torch.zeros(2, 1, 7, 9, device=d)),
    "weights_and_lse": lambda d: attnkit.attention(*_qkv(d), return_weights=True, return_lse=True),
    "mean_weights": lambda d: attnkit.attention(*_qkv(d), return_weights="mean"),
    "gaussian": lambda d: attnkit.attention(*_qkv(d), score="gaussian"),
    "bilinear": lambda d: attnkit.attention(*_qkv(d), score=scores.Bilinear(16, 16, device=d)),
    "alibi_and_sinks": lambda d: attnkit.attention(
        *_qkv(d), mods=[mods.alibi(4), mods.sinks(torch.zeros(4, device=d))]
    ),
    "bfloat16": lambda d: attnkit.attention(
        *(t.detach().bfloat16() for t in _qkv(d)), return_weights=True
    ),
}


def _layers(device: str) -> dict[str, Callable[[torch.Tensor], object]]:
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 4, batch_first=True, device=device)
    self_attn = SelfAttention(16, 4, device=device)
    einsum = EinsumMultiHeadAttention(4, 4, query_features=16, device=device)
    additive = AdditiveAttention(16, 16, 8, dropout=0.0).to(device)
    return {
        "MultiheadAttention": lambda x: mha(x, x, x),
        "MultiheadAttention_eval": lambda x: mha.eval()(x, x, x, need_weights=False),
        "SelfAttention": lambda x: self_attn(x, mask=masks.causal()),
        "EinsumMultiHeadAttention": lambda x: einsum(x, x),
        "DotProductAttention": lambda x: DotProductAttention(0.0)(x, x, x, _lens(x.device.type)),
        "AdditiveAttention": lambda x: additive(x, x, x, _lens(x.device.type)),
    }


def _described(result: object) -> list[tuple[tuple[int, ...], torch.dtype] | None]:
    parts = result if isinstance(result, tuple) else (result,)
    return [None if t is None else (tuple(t.shape), t.dtype) for t in parts]  # type: ignore[union-attr]


@pytest.mark.parametrize("name", list(CALLS))
def test_a_meta_call_has_the_cpu_call_s_shapes_and_dtypes(name: str) -> None:
    meta, cpu = CALLS[name]("meta"), CALLS[name]("cpu")
    assert _described(meta) == _described(cpu)
    out = meta[0] if isinstance(meta, tuple) else meta
    assert isinstance(out, torch.Tensor) and out.device.type == "meta"


def test_a_meta_backward_gives_gradients_of_the_inputs_shapes() -> None:
    q, k, v = _qkv("meta")
    attnkit.attention(q, k, v, mask=masks.causal()).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.device.type == "meta"
    assert attnkit.explain(q, k, v).chosen == "reference"


@pytest.mark.parametrize("name", list(_layers("cpu")))
def test_the_layers_run_on_meta_as_on_the_cpu(name: str) -> None:
    meta = _layers("meta")[name](torch.randn(2, 9, 16, device="meta"))
    cpu = _layers("cpu")[name](torch.randn(2, 9, 16))
    assert _described(meta) == _described(cpu)


def test_the_drop_in_on_meta_matches_torch_s_layer() -> None:
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True, device="meta")
    ours = MultiheadAttention(16, 4, batch_first=True, device="meta")
    x = torch.randn(2, 9, 16, device="meta")
    pad = torch.zeros(2, 9, dtype=torch.bool, device="meta")
    assert _described(ours(x, x, x, key_padding_mask=pad)) == _described(
        theirs(x, x, x, key_padding_mask=pad)
    )
