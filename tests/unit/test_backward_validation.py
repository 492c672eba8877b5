"""attnkit.attention_backward checks its own arguments like attention(): before any
compute, each bad one is named with what it received and what was expected; a valid
call still gives the oracle's gradients on every CPU backend."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnkit
from attnkit import masks

from cases import CPU_BACKENDS
from tolerance import FLOAT64_REL, assert_close_to_scale

B, H, HK, L, S, E, EV = 2, 4, 2, 5, 6, 3, 2


def _call(dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A valid grouped-query call (query heads 4, key heads 2) and its (out, lse)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, E, generator=g).to(dtype)
    k = torch.randn(B, HK, S, E, generator=g).to(dtype)
    v = torch.randn(B, HK, S, EV, generator=g).to(dtype)
    out, lse = attnkit.attention(q, k, v, return_lse=True)
    return {
        "query": q, "key": k, "value": v, "out": out, "lse": lse,
        "grad_out": torch.randn(out.shape, generator=g).to(dtype),
        "grad_lse": torch.randn(lse.shape, generator=g).to(lse.dtype),
    }  # fmt: skip


def _run(args: dict[str, Any], **kw: Any) -> Any:
    return attnkit.attention_backward(
        args["query"], args["key"], args["value"], args["out"], args["lse"],
        args["grad_out"], args["grad_lse"], **kw,
    )  # fmt: skip


Change = Callable[[dict[str, Any]], None]


def _set(name: str, make: Callable[[dict[str, Any]], Any]) -> Change:
    def change(args: dict[str, Any]) -> None:
        args[name] = make(args)

    return change


BAD: list[tuple[str, Change, type[Exception], str]] = [
    # out
    ("out None", _set("out", lambda a: None), TypeError, "out: expected a torch.float32 tensor"),
    ("out a list", _set("out", lambda a: a["out"].tolist()), TypeError, "got list"),
    (
        "out bool",
        _set("out", lambda a: a["out"] > 0),
        TypeError,
        "out: expected dtype torch.float32",
    ),
    ("out float64", _set("out", lambda a: a["out"].double()), TypeError, "got torch.float64"),
    ("out int", _set("out", lambda a: a["out"].long()), TypeError, "out: expected dtype"),
    ("out meta", _set("out", lambda a: a["out"].to("meta")), ValueError, "out: is on meta"),
    (
        "out rows",
        _set("out", lambda a: a["out"][..., :-1, :]),
        ValueError,
        "(2, 4, 5, 2), got (2, 4, 4, 2)",
    ),
    (
        "out features",
        _set("out", lambda a: a["out"][..., :1]),
        ValueError,
        "out: expected shape (..., L, Ev)",
    ),
    ("out key heads", _set("out", lambda a: a["out"][:, :HK]), ValueError, "out: expected shape"),
    ("out broadcast batch", _set("out", lambda a: a["out"][:1]), ValueError, "out: expected shape"),
    ("out 1-D", _set("out", lambda a: a["out"].flatten()), ValueError, "out: expected shape"),
    ("out 0-D", _set("out", lambda a: torch.tensor(1.0)), ValueError, "got ()"),
    ("out extra dim", _set("out", lambda a: a["out"][None]), ValueError, "out: expected shape"),
    ("out a number", _set("out", lambda a: 1.0), TypeError, "got float"),
    # lse
    ("lse None", _set("lse", lambda a: None), TypeError, "lse: expected a torch.float32 tensor"),
    (
        "lse int64",
        _set("lse", lambda a: a["lse"].long()),
        TypeError,
        "lse: expected dtype torch.float32",
    ),
    ("lse bool", _set("lse", lambda a: a["lse"] > 0), TypeError, "lse: expected dtype"),
    ("lse float64", _set("lse", lambda a: a["lse"].double()), TypeError, "the compute dtype"),
    (
        "lse shape of out",
        _set("lse", lambda a: a["out"]),
        ValueError,
        "lse: expected shape (..., L)",
    ),
    ("lse rows", _set("lse", lambda a: a["lse"][..., :-1]), ValueError, "(2, 4, 5), got (2, 4, 4)"),
    (
        "lse trailing 1",
        _set("lse", lambda a: a["lse"].unsqueeze(-1)),
        ValueError,
        "lse: expected shape",
    ),
    ("lse meta", _set("lse", lambda a: a["lse"].to("meta")), ValueError, "lse: is on meta"),
    ("lse +inf", _set("lse", lambda a: a["lse"].clone().fill_(float("inf"))), ValueError, "+inf"),
    ("lse a list", _set("lse", lambda a: a["lse"].tolist()), TypeError, "lse: expected"),
    # grad_out
    ("grad_out None", _set("grad_out", lambda a: None), TypeError, "grad_out: expected"),
    (
        "grad_out shape",
        _set("grad_out", lambda a: a["grad_out"][..., :1]),
        ValueError,
        "grad_out: expected shape (..., L, Ev) like out",
    ),
    (
        "grad_out float64",
        _set("grad_out", lambda a: a["grad_out"].double()),
        TypeError,
        "grad_out: expected dtype",
    ),
    (
        "grad_out bool",
        _set("grad_out", lambda a: a["grad_out"] > 0),
        TypeError,
        "grad_out: expected dtype",
    ),
    (
        "grad_out meta",
        _set("grad_out", lambda a: a["grad_out"].to("meta")),
        ValueError,
        "grad_out: is on meta",
    ),
    (
        "grad_out an array",
        _set("grad_out", lambda a: a["grad_out"].numpy()),
        TypeError,
        "got ndarray",
    ),
    # grad_lse
    (
        "grad_lse shape",
        _set("grad_lse", lambda a: a["grad_lse"][..., :1]),
        ValueError,
        "grad_lse: expected shape (..., L) like lse",
    ),
    (
        "grad_lse int",
        _set("grad_lse", lambda a: a["grad_lse"].int()),
        TypeError,
        "grad_lse: expected dtype",
    ),
    (
        "grad_lse meta",
        _set("grad_lse", lambda a: a["grad_lse"].to("meta")),
        ValueError,
        "grad_lse: is on meta",
    ),
    ("grad_lse a float", _set("grad_lse", lambda a: 0.0), TypeError, "grad_lse: expected"),
    # the call's own arguments, as attention() checks them
    (
        "query int",
        _set("query", lambda a: a["query"].long()),
        TypeError,
        "query: expected a floating-point",
    ),
    ("query None", _set("query", lambda a: None), TypeError, "query: expected a torch.Tensor"),
    ("key dtype", _set("key", lambda a: a["key"].double()), TypeError, "dtypes must match"),
    ("value keys", _set("value", lambda a: a["value"][..., :-1, :]), ValueError, "key, value"),
    ("heads", _set("query", lambda a: torch.randn(B, 3, L, E)), ValueError, "grouped-query"),
]


@pytest.mark.parametrize(("what", "change", "error", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_argument_is_named(what: str, change: Change, error: type[Exception],
                                 message: str) -> None:  # fmt: skip
    args = _call()
    change(args)
    with pytest.raises(error, match=re.escape(message)):
        _run(args)


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"params": "weight"}, TypeError, "params: expected a sequence of tensors"),
        ({"params": torch.ones(2)}, TypeError, "params: expected a sequence"),
        ({"params": [1.0]}, TypeError, "params: item 0 is float"),
        (
            {"params": [torch.ones(2)]},
            ValueError,
            "params: item 0 (shape (2)) does not require grad",
        ),
        ({"params": None}, TypeError, "params: expected a sequence"),
        ({"scale": "2"}, TypeError, "scale: expected"),
        ({"scale": torch.ones(3)}, ValueError, "scale: a tensor scale"),
        ({"score": "nope"}, ValueError, "score"),
        ({"mask": torch.ones(L, S, dtype=torch.bool)}, TypeError, "masks.keep"),
        ({"mask": masks.valid_lens(torch.tensor([1, 2, 3]))}, ValueError, "3 lengths"),
        ({"backend": "nope"}, ValueError, "nope"),
    ],
)
def test_bad_keywords_are_named(kw: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        _run(_call(), **kw)


def test_half_inputs_take_a_float32_lse() -> None:
    args = _call(torch.bfloat16)
    assert args["lse"].dtype == torch.float32
    dq, dk, dv, _ = _run(args)
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16
    args["lse"] = args["lse"].to(torch.bfloat16)
    args["grad_lse"] = None
    with pytest.raises(TypeError, match=re.escape("lse: expected dtype torch.float32")):
        _run(args)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_valid_call_gives_the_gradients_of_attention(backend: str) -> None:
    """The whole call's own (out, lse): the gradients autograd gives through attention()."""
    args = _call(torch.float64)
    leaves = [args[n].clone().requires_grad_(True) for n in ("query", "key", "value")]
    out, lse = attnkit.attention(*leaves, return_lse=True, backend="reference")
    want = torch.autograd.grad((out * args["grad_out"]).sum() + (lse * args["grad_lse"]).sum(),
                               leaves)  # fmt: skip
    got = _run(args, backend=backend)
    for a, b in zip(got[:3], want, strict=True):
        assert_close_to_scale(a, b, rel=FLOAT64_REL)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(("b", "lq", "sk"), [(1, 0, 5), (1, 3, 0), (0, 3, 4)])
def test_an_empty_call_gives_zero_gradients(backend: str, b: int, lq: int, sk: int) -> None:
    """No pair (L, S or the batch 0): zero gradients of each input's shape, as the
    forward's empty result gives. sdpa and chunked reshaped tensors of 0 elements."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, 2, lq, 8, generator=g)
    k, v = torch.randn(b, 2, sk, 8, generator=g), torch.randn(b, 2, sk, 6, generator=g)
    out, lse = attnkit.attention(q, k, v, return_lse=True)
    dq, dk, dv, _ = attnkit.attention_backward(
        q, k, v, out, lse, torch.ones_like(out), backend=backend
    )
    for got, want in ((dq, q), (dk, k), (dv, v)):
        assert got.shape == want.shape and not got.any()
