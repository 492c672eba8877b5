"""Nested, sparse and MKL-DNN tensors, and tensors on another device, are refused before
any compute with a TypeError/ValueError naming the argument, the layout or device
received and the conversion that gives what attnkit takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.nn import MultiheadAttention

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*nested tensors.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning"),
]

q = torch.randn(2, 3, 5, 4)  # (B, H, L, E)
k = torch.randn(2, 3, 7, 4)  # (B, H, S, E)
v = torch.randn(2, 3, 7, 6)  # (B, H, S, Ev)


def _jagged(features: int) -> torch.Tensor:
    return torch.nested.nested_tensor(
        [torch.randn(5, features), torch.randn(3, features)], layout=torch.jagged
    )  # (2, L*, features)


def _strided_nested(features: int) -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(5, features), torch.randn(3, features)])


KINDS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sparse_coo": lambda t: t.to_sparse(),
    "sparse_csr": lambda t: t.reshape(-1, t.shape[-1]).to_sparse_csr(),
    "mkldnn": lambda t: t.to_mkldnn(),
}
WORDS = {
    "sparse_coo": ("sparse COO", "torch.sparse_coo", ".to_dense()"),
    "sparse_csr": ("sparse CSR", "torch.sparse_csr", ".to_dense()"),
    "mkldnn": ("MKL-DNN", "torch._mkldnn", ".to_dense()"),
    "jagged": ("nested (jagged)", "torch.nested.to_padded_tensor", "masks.valid_lens"),
    "strided_nested": ("nested (strided)", "torch.nested.to_padded_tensor", "masks.valid_lens"),
}


def _raises(fn: Callable[[], Any], error: type[Exception], *words: str) -> str:
    with pytest.raises(error) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    for raw in ("relation is indeterminate", "doesn't support sizes", "unsupported for Sparse"):
        assert raw not in msg
    return msg


@pytest.mark.parametrize("arg", ["query", "key", "value"])
@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "mkldnn"])
def test_attention_refuses_a_non_strided_input(arg: str, kind: str) -> None:
    args = {"query": q, "key": k, "value": v}
    if kind == "sparse_csr":  # CSR is 2-D only: a call without leading dims
        args = {n: t[0, 0] for n, t in args.items()}
    args[arg] = KINDS[kind](args[arg])
    _raises(lambda: attnkit.attention(**args), TypeError, f"{arg} is", *WORDS[kind], arg)


@pytest.mark.parametrize("arg", ["query", "key", "value"])
@pytest.mark.parametrize("kind", ["jagged", "strided_nested"])
def test_attention_refuses_a_nested_input(arg: str, kind: str) -> None:
    make = _jagged if kind == "jagged" else _strided_nested
    dense = {
        "query": torch.randn(2, 5, 4),
        "key": torch.randn(2, 5, 4),
        "value": torch.randn(2, 5, 4),
    }
    dense[arg] = make(4)
    msg = _raises(lambda: attnkit.attention(**dense), TypeError, f"{arg} is", *WORDS[kind])
    assert "attnkit.nn.MultiheadAttention takes nested inputs" in msg


def test_the_plan_of_a_dense_call_does_not_take_a_sparse_one() -> None:
    """A plain call is planned by its shapes; a sparse tensor of the same shape is refused,
    not run by the dense call's plan."""
    x = torch.randn(2, 5, 4)
    attnkit.attention(x, x, x)
    attnkit.attention(x, x, x)  # planned
    _raises(lambda: attnkit.attention(x.to_sparse(), x, x), TypeError, "query is", "sparse COO")
    _raises(lambda: attnkit.attention(x, x, x.to_mkldnn()), TypeError, "value is", "MKL-DNN")


def test_a_sparse_mask_is_refused() -> None:
    bias = torch.randn(5, 7)
    keep = torch.rand(5, 7) > 0.3
    _raises(lambda: attnkit.attention(q, k, v, mask=bias.to_sparse()), TypeError,
            "mask is a sparse COO tensor", "mask.to_dense()")  # fmt: skip
    for mask in (masks.bias(bias.to_sparse()), masks.keep(keep.to_sparse()),
                 masks.key_padding((torch.rand(2, 7) > 0.5).to_sparse())):  # fmt: skip
        _raises(lambda m=mask: attnkit.attention(q, k, v, mask=m), TypeError,
                "mask: a tensor t it holds is a sparse COO tensor", "t.to_dense()")  # fmt: skip


def test_a_sparse_per_head_scale_is_refused() -> None:
    scale = torch.tensor([0.5, 0.0, 0.25]).to_sparse()
    _raises(lambda: attnkit.attention(q, k, v, scale=scale), TypeError,
            "scale is a sparse COO tensor", "scale.to_dense()")  # fmt: skip


def _backward_args() -> dict[str, torch.Tensor]:
    out, lse = attnkit.attention(q, k, v, return_lse=True)
    return {"query": q, "key": k, "value": v, "out": out, "lse": lse,
            "grad_out": torch.randn_like(out), "grad_lse": torch.randn_like(lse)}  # fmt: skip


@pytest.mark.parametrize("arg", ["query", "key", "value", "out", "lse", "grad_out", "grad_lse"])
def test_attention_backward_refuses_a_sparse_tensor(arg: str) -> None:
    args = _backward_args()
    args[arg] = args[arg].to_sparse()
    _raises(lambda: attnkit.attention_backward(**args), TypeError, f"{arg} is a sparse COO",
            f"{arg}.to_dense()")  # fmt: skip


def test_attention_backward_refuses_a_nested_query() -> None:
    args = _backward_args()
    args["query"] = _jagged(4)
    _raises(lambda: attnkit.attention_backward(**args), TypeError, "query is a nested (jagged)")


def test_attention_names_the_device_before_the_dtype() -> None:
    _raises(lambda: attnkit.attention(q, k.to("meta").double(), v), ValueError,
            "one device", "meta")  # fmt: skip


# ---------------------------------------------------------------- MultiheadAttention


def _layer() -> MultiheadAttention:
    return MultiheadAttention(4, 2, batch_first=True).eval()


@pytest.mark.parametrize("arg", ["key", "value", "both"])
def test_multihead_names_a_key_or_value_on_another_device(arg: str) -> None:
    layer, x = _layer(), torch.randn(2, 5, 4)
    meta = x.to("meta")
    key, value = (meta if arg in ("key", "both") else x), (meta if arg in ("value", "both") else x)
    name = "value" if arg == "value" else "key"
    for _ in range(2):  # the second call meets the memo of checked input shapes
        _raises(lambda: layer(x, key, value), ValueError,
                f"MultiheadAttention: {name} is on meta but query is on cpu")  # fmt: skip
    layer(x, x, x)  # the same shapes on one device still run
    _raises(lambda: layer(x, key, value), ValueError, f"{name} is on meta")


def test_multihead_names_a_nested_key_on_another_device() -> None:
    layer, nt = _layer(), _jagged(4)
    _raises(lambda: layer(nt, nt.to("meta"), nt.to("meta")), ValueError,
            "key is on meta but query is on cpu")  # fmt: skip


@pytest.mark.parametrize("name", ["key_padding_mask", "attn_mask"])
def test_multihead_names_a_mask_on_another_device_or_sparse(name: str) -> None:
    layer, x, y = _layer(), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    shape = (2, 5) if name == "key_padding_mask" else (5, 5)
    mask = torch.zeros(shape, dtype=torch.bool)
    _raises(lambda: layer(x, y, y, **{name: mask.to("meta")}), ValueError,
            f"{name} is on meta but query is on cpu")  # fmt: skip
    _raises(lambda: layer(x, x, x, **{name: mask.to_sparse()}), TypeError,
            f"{name} is a sparse COO", f"{name}.to_dense()")  # fmt: skip


@pytest.mark.parametrize("kind", ["sparse_coo", "mkldnn"])
@pytest.mark.parametrize("self_attention", [True, False])
def test_multihead_refuses_a_sparse_or_mkldnn_input(kind: str, self_attention: bool) -> None:
    layer, x = _layer(), torch.randn(2, 5, 4)
    bad = KINDS[kind](x)
    args = (bad, bad, bad) if self_attention else (x, bad, bad)
    name = "query" if self_attention else "key"
    for _ in range(2):  # the fused op's and the lean path's checks, then the memo
        _raises(lambda: layer(*args), TypeError, f"MultiheadAttention: {name} is", *WORDS[kind])
    assert "not a plain dense tensor" in layer.explain_path(bad, bad, bad)
