"""``attnkit demo``: a short tour of attnkit on the seed examples.

1. Nadaraya–Watson kernel regression as attention (d2l): keys 51, 56, 58 with
   values 40, 43, 48; the query 57 gets 45.5.
2. A masked softmax with d2l's ``valid_lens``, per batch and per query.
3. What :func:`attnkit.explain` chooses for a few calls, and why.
"""

from __future__ import annotations

import argparse

import torch

from .. import masks, scores
from ..functional import attention, explain

DESCRIPTION = "walk through Nadaraya–Watson, valid_lens masks and backend dispatch"


SEED_MAX = 2**64 - 1
"""Largest seed torch.manual_seed accepts (seeds are unsigned 64-bit)."""


def seed_value(text: str) -> int:
    """``--seed``: an integer in [0, 2**64 - 1]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer in [0, {SEED_MAX}], got {text!r}"
        ) from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {SEED_MAX}], got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seed",
        type=seed_value,
        default=0,
        help=f"random seed for the examples, in [0, {SEED_MAX}] (default: %(default)s)",
    )


def _fmt(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{x:.4f}" for x in t.tolist()) + "]"


def nadaraya_watson() -> tuple[torch.Tensor, torch.Tensor]:
    """The seed-004 example: returns (prediction (1, 1), weights (1, 3))."""
    keys = torch.tensor([[51.0], [56.0], [58.0]], dtype=torch.float64)  # (S, 1)
    values = torch.tensor([[40.0], [43.0], [48.0]], dtype=torch.float64)  # (S, 1)
    query = torch.tensor([[57.0]], dtype=torch.float64)  # (L, 1)
    pred, weights = attention(
        query, keys, values, score=scores.Gaussian(sigma=1.0), return_weights=True
    )
    return pred, weights


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    print("1. Nadaraya–Watson regression is attention with a Gaussian kernel score")
    print("   keys 51, 56, 58 -> values 40, 43, 48; query 57")
    pred, w = nadaraya_watson()
    print(f"   weights    {_fmt(w[0])}   (softmax of -(57 - key)^2 / 2)")
    print(f"   prediction {pred.item():.4f}")
    print()

    print("2. Masked softmax with d2l's valid_lens (key j kept when j < length)")
    q = torch.randn(2, 2, 4)  # (B, L, E)
    k = torch.randn(2, 4, 4)  # (B, S, E)
    _, w = attention(q, k, k, mask=masks.valid_lens([2, 3]), return_weights=True)
    print("   valid_lens([2, 3]) -> weights (B=2, L=2, S=4):")
    for b in range(2):
        for i in range(2):
            print(f"     batch {b} query {i}: {_fmt(w[b, i])}")
    _, w = attention(
        q, k, k, mask=masks.valid_lens(torch.tensor([[1, 3], [2, 4]])), return_weights=True
    )
    print("   valid_lens([[1, 3], [2, 4]]) (one length per query):")
    for b in range(2):
        for i in range(2):
            print(f"     batch {b} query {i}: {_fmt(w[b, i])}")
    _, w = attention(q, k, k, mask=masks.valid_lens([0, 4]), return_weights=True)
    print(f"   a length of 0 gives a zero row, not NaN: {_fmt(w[0, 0])}")
    print()

    print("3. Which backend runs, and why (attnkit.explain)")
    qh = torch.randn(2, 4, 64, 32)  # (B, H, L, E)
    calls: list[tuple[str, dict[str, object]]] = [
        ("scaled dot product, causal", {"mask": masks.causal()}),
        (
            "Gaussian kernel, key padding",
            {"score": "gaussian", "mask": masks.key_padding(torch.zeros(2, 64, dtype=torch.bool))},
        ),
        ("additive (Bahdanau) score", {"score": scores.Additive(32, 32, 16)}),
        ("scaled dot product with weights", {"return_weights": True}),
    ]
    for title, kw in calls:
        ex = explain(qh, qh, qh, **kw)  # type: ignore[arg-type]
        print(f"   {title}: runs on {ex.chosen!r}")
        for name, why in ex.reasons.items():
            print(f"     {name:<10} {'can run' if not why else '; '.join(why)}")
    return 0
