"""``attnkit explain``: which backend runs an attention call of given shapes, and why."""

from __future__ import annotations

import argparse
import sys

import torch

from .. import masks, scores
from ..functional import explain

DESCRIPTION = "which backend runs a call of given shapes, and why"

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=2, help="batch size B (default 2)")
    parser.add_argument("--heads", type=int, default=8, help="heads H (default 8)")
    parser.add_argument("-L", "--queries", type=int, default=512, help="query length L")
    parser.add_argument("-S", "--keys", type=int, default=None, help="key length S (default L)")
    parser.add_argument("-E", "--dim", type=int, default=64, help="feature dim E (default 64)")
    parser.add_argument(
        "--score",
        default="scaled_dot",
        choices=["dot", "scaled_dot", "gaussian", "bilinear", "additive"],
    )
    parser.add_argument(
        "--mask", default="none", choices=["none", "causal", "window", "valid_lens", "key_padding"]
    )
    parser.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    parser.add_argument("--weights", action="store_true", help="ask for the attention weights")
    parser.add_argument("--lse", action="store_true", help="ask for the log-sum-exp")
    parser.add_argument("--grad", action="store_true", help="inputs require gradients")


def run(args: argparse.Namespace) -> int:
    for name in ("batch", "heads", "queries", "dim"):
        if getattr(args, name) < 1:
            print(
                f"attnkit explain: error: --{name} must be >= 1, got {getattr(args, name)}",
                file=sys.stderr,
            )
            return 2
    L = args.queries
    S = args.keys if args.keys is not None else L
    if S < 1:
        print(f"attnkit explain: error: --keys must be >= 1, got {S}", file=sys.stderr)
        return 2
    B, H, E, dtype = args.batch, args.heads, args.dim, _DTYPES[args.dtype]
    # Shapes only matter: explain() computes nothing, so empty storage is enough.
    q = torch.empty(B, H, L, E, dtype=dtype, requires_grad=args.grad)  # (B, H, L, E)
    k = torch.empty(B, H, S, E, dtype=dtype, requires_grad=args.grad)  # (B, H, S, E)
    score: str | scores.Score = args.score
    if args.score == "bilinear":
        score = scores.Bilinear(E, E, dtype=dtype)
    elif args.score == "additive":
        score = scores.Additive(E, E, E, dtype=dtype)
    mask: masks.Mask | None = {
        "none": None,
        "causal": masks.causal(),
        "window": masks.window(min(128, S), 0),
        "valid_lens": masks.valid_lens(torch.full((B,), S)),
        "key_padding": masks.key_padding(torch.zeros(B, S, dtype=torch.bool)),
    }[args.mask]
    ex = explain(q, k, k, score=score, mask=mask, return_weights=args.weights, return_lse=args.lse)
    print(
        f"attention(query {(B, H, L, E)}, key/value {(B, H, S, E)}, score={args.score}, "
        f"mask={args.mask}, dtype={args.dtype})"
    )
    print(ex)
    return 0
