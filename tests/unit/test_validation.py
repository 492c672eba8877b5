"""Bad input raises ValueError/TypeError before any compute, naming the argument,
what was received and what was expected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import attnkit
from attnkit import masks, scores

q = torch.randn(2, 3, 5, 4)  # (B, H, L, E)
k = torch.randn(2, 3, 7, 4)  # (B, H, S, E)
v = torch.randn(2, 3, 7, 6)  # (B, H, S, Ev)


def call(**kw: Any) -> Callable[[], Any]:
    args = {"query": q, "key": k, "value": v}
    args.update({n: kw.pop(n) for n in ("query", "key", "value") if n in kw})
    return lambda: attnkit.attention(args["query"], args["key"], args["value"], **kw)


# (id, thunk, exception, words the message must contain)
BAD: list[tuple[str, Callable[[], Any], type[Exception], tuple[str, ...]]] = [
    ("query not a tensor", call(query=[[1.0]]), TypeError, ("query", "list")),
    ("key not a tensor", call(key=None), TypeError, ("key", "NoneType")),
    ("value not a tensor", call(value=3.0), TypeError, ("value", "float")),
    ("query 1-d", call(query=torch.randn(4)), ValueError, ("query", "(4)", "(..., L, E)")),
    ("value 1-d", call(value=torch.randn(7)), ValueError, ("value", "(7)")),
    (
        "integer query",
        call(query=torch.ones(2, 3, 5, 4, dtype=torch.int64)),
        TypeError,
        ("query", "int64"),
    ),
    ("dtype mix", call(key=k.double()), TypeError, ("dtypes must match", "float64")),
    (
        "S mismatch",
        call(value=torch.randn(2, 3, 8, 6)),
        ValueError,
        ("key", "value", "(2, 3, 7, 4)", "(2, 3, 8, 6)"),
    ),
    ("E mismatch", call(key=torch.randn(2, 3, 7, 5)), ValueError, ("query", "E=4", "E=5")),
    (
        "kv leading mismatch",
        call(value=torch.randn(1, 3, 7, 6)),
        ValueError,
        ("key, value", "leading"),
    ),
    (
        "batch not broadcastable",
        call(query=torch.randn(3, 3, 5, 4)),
        ValueError,
        ("broadcast", "(3, 3)", "(2, 3)"),
    ),
    ("gqa not a multiple", call(query=torch.randn(2, 4, 5, 4)), ValueError, ("multiple", "4", "3")),
    ("unknown score", call(score="cosine"), ValueError, ("score", "'cosine'", "scaled_dot")),
    ("score wrong type", call(score=3), TypeError, ("score", "int")),
    ("bilinear dims", call(score=scores.Bilinear(5, 4)), ValueError, ("query", "bilinear", "5")),
    (
        "additive key dims",
        call(score=scores.Additive(4, 3, 8)),
        ValueError,
        ("key", "additive", "3"),
    ),
    (
        "score dtype",
        call(score=scores.Bilinear(4, 4).double()),
        TypeError,
        ("score", "weight", "float64"),
    ),
    ("NaN scale", call(scale=float("nan")), ValueError, ("scale", "nan")),
    ("negative scale", call(scale=-1.0), ValueError, ("scale", "-1.0")),
    ("scale string", call(scale="1"), TypeError, ("scale", "'1'")),
    ("dropout 1.0", call(dropout_p=1.0), ValueError, ("dropout_p", "[0, 1)", "1.0")),
    ("dropout negative", call(dropout_p=-0.1), ValueError, ("dropout_p", "-0.1")),
    (
        "raw bool mask",
        call(mask=torch.ones(5, 7, dtype=torch.bool)),
        TypeError,
        ("masks.keep", "masks.block"),
    ),
    ("int mask", call(mask=torch.ones(5, 7, dtype=torch.int32)), TypeError, ("masks.tf", "int32")),
    ("mask wrong type", call(mask=[[True]]), TypeError, ("mask", "list")),
    (
        "keep mask shape",
        call(mask=masks.keep(torch.ones(5, 6, dtype=torch.bool))),
        ValueError,
        ("(5, 6)", "(2, 3, 5, 7)"),
    ),
    (
        "bias grows batch",
        call(mask=masks.bias(torch.zeros(4, 2, 3, 5, 7))),
        ValueError,
        ("(4, 2, 3, 5, 7)",),
    ),
    (
        "valid_lens too long",
        call(mask=masks.valid_lens(torch.tensor([3, 8]))),
        ValueError,
        ("valid_lens", "8", "7 keys"),
    ),
    (
        "valid_lens batch",
        call(mask=masks.valid_lens(torch.tensor([3, 4, 5]))),
        ValueError,
        ("3 lengths", "2"),
    ),
    (
        "valid_lens per-query shape",
        call(mask=masks.valid_lens(torch.ones(2, 4, dtype=torch.long))),
        ValueError,
        ("(2, 4)", "(2, 5)"),
    ),
    (
        "valid_lens without batch",
        call(
            query=torch.randn(5, 4),
            key=torch.randn(7, 4),
            value=torch.randn(7, 6),
            mask=masks.valid_lens([3]),
        ),
        ValueError,
        ("batch dim",),
    ),
    (
        "key_padding shape",
        call(mask=masks.key_padding(torch.zeros(2, 6, dtype=torch.bool))),
        ValueError,
        ("key_padding", "(2, 6)", "(2, 7)"),
    ),
    ("unknown backend", call(backend="flash"), ValueError, ("backend", "'flash'", "sdpa")),
    ("backend wrong type", call(backend=3), TypeError, ("backend", "int")),
    ("return_weights not bool", call(return_weights=1), TypeError, ("return_weights", "1")),
    (
        "empty feature dim",
        call(query=torch.randn(2, 3, 5, 0), key=torch.randn(2, 3, 7, 0)),
        ValueError,
        ("feature dim",),
    ),
    (
        "forced backend cannot run",
        call(score=scores.Additive(4, 4, 3), backend="sdpa"),
        ValueError,
        ("sdpa", "additive", "dot product"),
    ),
]

# Mask constructors check their own arguments when built.
BAD_CONSTRUCTORS: list[tuple[str, Callable[[], Any], type[Exception], tuple[str, ...]]] = [
    ("negative window", lambda: masks.window(-1, 0), ValueError, ("left", ">= 0", "-1")),
    ("float window", lambda: masks.window(2.5, 0), TypeError, ("left", "2.5")),  # type: ignore[arg-type]
    ("bad align", lambda: masks.causal("top"), ValueError, ("align", "'top'")),  # type: ignore[arg-type]
    ("negative lens", lambda: masks.valid_lens([2, -1]), ValueError, ("lengths", "-1")),
    (
        "float lens",
        lambda: masks.valid_lens(torch.tensor([1.5])),
        TypeError,
        ("integer", "float32"),
    ),
    (
        "lens 3-d",
        lambda: masks.valid_lens(torch.ones(1, 2, 3, dtype=torch.long)),
        ValueError,
        ("(B,)", "(1, 2, 3)"),
    ),
    (
        "queries with 2-d lens",
        lambda: masks.valid_lens(torch.ones(2, 3, dtype=torch.long), queries=True),
        ValueError,
        ("queries=True", "(2, 3)"),
    ),
    ("tf values", lambda: masks.tf(torch.tensor([0.0, 0.5])), ValueError, ("masks.tf", "0.5")),
    ("keep not bool", lambda: masks.keep(torch.ones(3, 3)), TypeError, ("masks.keep", "float32")),
    (
        "block not bool",
        lambda: masks.block(torch.ones(3, 3)),
        TypeError,
        ("masks.block", "float32"),
    ),
    (
        "bias not float",
        lambda: masks.bias(torch.ones(3, 3, dtype=torch.bool)),
        TypeError,
        ("masks.bias", "masks.keep"),
    ),
    ("bias NaN", lambda: masks.bias(torch.tensor([[0.0, float("nan")]])), ValueError, ("NaN",)),
    (
        "key_padding float",
        lambda: masks.key_padding(torch.zeros(2, 3)),
        TypeError,
        ("key_padding", "float32"),
    ),
    (
        "key_padding 3-d",
        lambda: masks.key_padding(torch.zeros(2, 3, 4, dtype=torch.bool)),
        ValueError,
        ("(B, S)", "(2, 3, 4)"),
    ),
    ("gaussian sigma", lambda: scores.Gaussian(0.0), ValueError, ("sigma", "0.0")),
    ("bilinear dim", lambda: scores.Bilinear(0, 3), ValueError, ("query_dim", "0")),
    ("scaled dot scale", lambda: scores.ScaledDot(float("inf")), ValueError, ("scale", "inf")),
]


@pytest.mark.parametrize(
    ("name", "thunk", "exc", "words"),
    BAD + BAD_CONSTRUCTORS,
    ids=[b[0] for b in BAD + BAD_CONSTRUCTORS],
)
def test_bad_input_raises_clear_error(
    name: str, thunk: Callable[[], Any], exc: type[Exception], words: tuple[str, ...]
) -> None:
    with pytest.raises(exc) as info:
        thunk()
    message = str(info.value)
    for w in words:
        assert w in message, f"{name}: {w!r} not in {message!r}"


def test_there_are_at_least_25_distinct_bad_calls() -> None:
    assert len({b[0] for b in BAD}) >= 25


def test_errors_come_before_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad mask is refused before any backend runs."""
    from attnkit.backends import reference, sdpa

    def boom(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a backend ran")

    monkeypatch.setattr(reference.ReferenceBackend, "forward", boom)
    monkeypatch.setattr(sdpa.SDPABackend, "forward", boom)
    with pytest.raises(ValueError, match="valid_lens"):
        attnkit.attention(q, k, v, mask=masks.valid_lens([1, 9]))
