"""attnkit.viz.compare: two sides and A − B, made in Python from the exact weights.

The page's record of the difference is decoded here as the page decodes it (one signed
byte per value against each head's largest |A − B|) and checked against the weights.
"""

from __future__ import annotations

import base64
import json
import re
import zlib

import numpy as np
import pytest
import torch

from attnkit import viz
from attnkit.viz.reduce import Budget

from tolerance import FLOAT32_ULPS_REL, SIGNED_BYTE_STEP, assert_close_to_scale, half_step_rel

TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]


def _weights(layers: int, heads: int, L: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(layers, heads, L, L, generator=g) * 2, -1)


def _side(w: torch.Tensor, tokens: list[str]) -> viz.AttentionSet:
    return viz.AttentionSet("self-attention", w, tokens)


def _payload(page: str) -> dict:
    m = re.search(r'id="attention-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def _signed(part: dict) -> np.ndarray:
    """A difference as the page reads it: signed bytes times each head's scale / 127."""
    raw = base64.b64decode(part["data"])
    if part["encoding"] == "deflate":
        raw = zlib.decompress(raw)
    codes = np.frombuffer(raw, dtype=np.int8).reshape(part["shape"]).astype(np.float64)
    scales = np.asarray(part["scales"], np.float64).reshape(*part["shape"][:2], 1, 1)
    return codes * scales / 127.0


def _block_means(w: np.ndarray, b: int) -> np.ndarray:
    """(layers, heads, Q, K) -> (layers, heads, Qb, Kb) means over b × b blocks (the last ones short)."""
    nl, nh, Q, K = w.shape
    out = np.zeros((nl, nh, -(-Q // b), -(-K // b)))
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            out[:, :, i, j] = w[:, :, i * b : (i + 1) * b, j * b : (j + 1) * b].mean(axis=(2, 3))
    return out


def test_equal_tokens_give_a_minus_b_of_every_weight() -> None:
    wa, wb = _weights(2, 3, 8, 0), _weights(2, 3, 8, 1)
    c = viz.compare(_side(wa, TOKENS), _side(wb, TOKENS), names=("m1", "m2"))
    assert c.why is None and c.names == ("m1", "m2")
    (d,) = c.differences
    assert d is not None and d.block == 1
    np.testing.assert_array_equal(d.weights, (wa - wb).numpy())  # made from the exact weights
    assert d.rollout is not None
    want = viz.attention_rollout(wa) - viz.attention_rollout(wb)
    assert_close_to_scale(d.rollout, want, rel=FLOAT32_ULPS_REL)
    data = _payload(viz.render_html(c))
    assert [s["name"] for s in data["sets"]] == ["self-attention"] * 2
    cmp = data["compare"]
    assert cmp["names"] == ["m1", "m2"] and cmp["kinds"] == 1 and cmp["why"] is None
    (part,) = cmp["diffs"]
    assert part["mode"] == "dense" and part["shape"] == [2, 3, 8, 8]
    exact = (wa - wb).double().numpy()
    head_max = np.abs(exact).max(axis=(2, 3), keepdims=True)  # (layers, heads, 1, 1)
    err = np.abs(_signed(part) - exact)
    assert (err <= head_max * half_step_rel(SIGNED_BYTE_STEP)).all()  # one signed byte each
    assert err.max() > 0
    rollout = _signed(part["rollout"])[0, 0]
    assert_close_to_scale(rollout, d.rollout, rel=half_step_rel(SIGNED_BYTE_STEP))


def test_long_sides_give_a_minus_b_of_the_exact_block_means() -> None:
    L = 90
    wa, wb = _weights(1, 2, L, 2), _weights(1, 2, L, 3)
    tokens = [f" t{i}" for i in range(L)]
    budget = Budget(dense_cells=1000, overview=32)
    c = viz.compare(_side(wa, tokens), _side(wb, tokens), budget=budget)
    (d,) = c.differences
    assert d is not None and d.block == 3 and d.weights.shape == (1, 2, 30, 30)
    want = _block_means((wa - wb).double().numpy(), 3)  # a mean of differences
    assert_close_to_scale(d.weights, want, rel=FLOAT32_ULPS_REL)
    part = _payload(viz.render_html(c))["compare"]["diffs"][0]
    assert part["mode"] == "blocks" and part["block"] == 3 and part["shape"] == [1, 2, 30, 30]


@pytest.mark.parametrize(
    ("b_tokens", "b_layers", "why"),
    [
        (TOKENS[:7], 2, r"^The token sequences differ: A has 8 tokens and B has 7\.$"),
        (
            [*TOKENS[:2], "dog", *TOKENS[3:]],
            2,
            r"^The token sequences differ from token 2 on \('cat' in A, 'dog' in B\)\.$",
        ),
        (TOKENS, 3, r"^A shows 2 layers × 2 heads and B 3 × 2; each layer and head"),
    ],
)
def test_sides_that_cannot_be_subtracted_say_why(
    b_tokens: list[str], b_layers: int, why: str
) -> None:
    a = _side(_weights(2, 2, 8, 0), TOKENS)
    b = _side(_weights(b_layers, 2, len(b_tokens), 1), b_tokens)
    c = viz.compare(a, b)
    assert c.differences == [None]
    assert c.why is not None and re.search(why, c.why)
    data = _payload(viz.render_html(c))
    assert data["compare"]["diffs"] == [None] and data["compare"]["why"] == c.why
    assert [s["shape"][2] for s in data["sets"]] == [8, len(b_tokens)]


def test_sides_pair_up_by_the_tokenizers_spelling_not_the_shown_text() -> None:
    """An uncased model makes the same tokens of "the" and "The": A − B is drawn, and
    the shown text (each side's own casing) does not decide it. Different tokens under
    the same shown text still do."""
    wa, wb = _weights(1, 2, 8, 0), _weights(1, 2, 8, 1)
    cased = [TOKENS[0], "The", *TOKENS[2:]]
    b = viz.AttentionSet("self-attention", wb, cased, raw_tokens=TOKENS)
    c = viz.compare(_side(wa, TOKENS), b)
    assert c.why is None
    (d,) = c.differences
    assert d is not None
    np.testing.assert_array_equal(d.weights, (wa - wb).numpy())
    other = viz.AttentionSet("self-attention", wb, TOKENS, raw_tokens=[*TOKENS[:7], "[PAD]"])
    c = viz.compare(_side(wa, TOKENS), other)
    assert c.differences == [None]
    assert c.why is not None and "differ from token 7" in c.why


def test_several_kinds_pair_up_by_position() -> None:
    enc = _side(_weights(1, 2, 5, 0), list("abcde"))
    cross = viz.AttentionSet(
        "cross-attention", _weights(1, 2, 5, 1)[..., :3, :], list("xyz"), key_tokens=list("abcde")
    )
    other_cross = viz.AttentionSet(
        "cross-attention", _weights(1, 2, 5, 2)[..., :3, :], list("xyz"), key_tokens=list("abcdf")
    )
    c = viz.compare([enc, cross], [enc, other_cross])
    assert c.differences[0] is not None and c.differences[1] is None
    assert c.why is not None and "key token sequences differ from token 4" in c.why
    np.testing.assert_array_equal(c.differences[0].weights, 0.0)


def test_bad_arguments() -> None:
    a = _side(_weights(1, 1, 3, 0), ["a", "b", "c"])
    with pytest.raises(ValueError, match="b: expected as many kinds of attention as a"):
        viz.compare(a, [a, a])
    with pytest.raises(TypeError, match="a: expected an AttentionSet"):
        viz.compare(torch.rand(1, 1, 3, 3), a)
    with pytest.raises(TypeError, match="b: expected AttentionSet or reduced set items"):
        viz.compare(a, [a, "x"])
    with pytest.raises(ValueError, match="names: expected two non-empty strings"):
        viz.compare(a, a, names=("only one",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens: a Comparison carries its own tokens"):
        viz.render_html(viz.compare(a, a), ["a", "b", "c"])
