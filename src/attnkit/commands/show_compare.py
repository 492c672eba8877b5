"""``attnkit show --compare TEXT2`` and ``--compare-model DIR``: two sides on one page.

A comparison changes one thing: the text (``--compare``: a second text on the
same model) or the model (``--compare-model``: the same text on a second local
checkpoint with the same tokenizer). Both sides run with the same options
(layers, heads, length, top-k); the page shows them in sync, and A − B where
their tokens are equal (:mod:`attnkit.viz.compare`). Giving both flags is an
error: with two changes at once no difference could be read.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .outputs import check_input
from .show_args import UsageError, count, resolve, utf8_argument
from .show_report import elide_text, tokens_line
from .show_sources import open_source

if TYPE_CHECKING:
    from ..viz.options import RunOptions

__all__ = [
    "SecondSide",
    "add_arguments",
    "check",
    "open_second",
    "prepare",
    "run_second",
    "selection",
    "subtitle",
]

_NAME = 60  # characters of a text used as its side's name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--compare`` and ``--compare-model``."""
    add = parser.add_argument
    add("--compare", metavar="TEXT2",
        help="a second text on the same model: one page with both side by side, in sync, and "
        "A − B where the two texts make the same tokens")  # fmt: skip
    add("--compare-model", metavar="DIR",
        help="the same text on a second local checkpoint with the same tokenizer: both models "
        "side by side, in sync, and their difference A − B")  # fmt: skip


def check(args: argparse.Namespace) -> None:
    """The comparison flags against each other and the rest (arithmetic and paths only)."""
    text2, other = getattr(args, "compare", None), getattr(args, "compare_model", None)
    if text2 is not None and other is not None:
        raise UsageError(
            "--compare and --compare-model: give one; a comparison changes the text or the "
            "model, not both"
        )
    if text2 is None and other is None:
        return
    flag = "--compare" if text2 is not None else "--compare-model"
    if text2 is not None and not utf8_argument(text2, "--compare").strip():
        raise UsageError("--compare: the second text is empty; give a sentence or leave it out")
    if args.generate:
        raise UsageError(f"{flag} and --generate: a comparison shows one forward pass per side")
    if text2 is not None and args.pair is not None:
        raise UsageError(
            "--compare and --pair: the second text replaces the whole input; compare pairs from "
            "Python (attnkit.viz.compare)"
        )
    if other is not None:
        check_input(other, "--compare-model", directory=True)


def open_second(args: argparse.Namespace) -> Any:
    """The second checkpoint of ``--compare-model``, checked but not built (None otherwise)."""
    other = getattr(args, "compare_model", None)
    if other is None:
        return None
    try:
        return open_source(str(Path(other).expanduser()))
    except UsageError as exc:
        raise UsageError(f"--compare-model: {str(exc).removeprefix('--model: ')}") from None


def selection(second: Any, layer_sel: Any, head_sel: Any) -> tuple[list[int], list[int]]:
    """The layers and heads ``--layers`` and ``--heads`` pick of the second model (sorted
    layers); one line naming ``--compare-model`` when one is not there. Called before
    any model runs, and again for side B."""
    try:
        layers = sorted(resolve(layer_sel, second.num_layers, "--layers", "layer"))
        heads = resolve(head_sel, second.num_heads, "--heads", "head")
    except UsageError as exc:
        raise UsageError(f"--compare-model: {second.name}: {exc}") from None
    return layers, heads


def _check_same_tokenizer(first: Any, second: Any) -> None:
    va, vb = first.vocabulary(), second.vocabulary()
    if va == vb:
        return
    if len(va) != len(vb):
        detail = f"vocabularies of {len(va):,} and {len(vb):,} tokens"
    else:
        differ = sorted(set(va) - set(vb))
        detail = (
            f"{len(differ):,} of {len(va):,} tokens differ, e.g. {differ[0]!r}"
            if differ
            else "the same tokens under other ids"
        )
    raise UsageError(
        f"--compare-model: {second.name} has another tokenizer than {first.name} ({detail}); "
        "a comparison of models needs the same tokens on both sides"
    )


def describe(source: Any) -> str:
    """A model as the weights file's metadata names it, as ``attnkit show`` names its
    first model: name (kind, layers × heads)."""
    size = f"{count(source.num_layers, 'layer')} × {count(source.num_heads, 'head')}"
    return f"{source.name} ({source.kind}, {size})"


@dataclass
class SecondSide:
    """The second side of a comparison, and what the page and the terminal say of it."""

    run: Any
    names: tuple[str, str]
    what: str  # "text" or "model"
    text: str
    model_name: str
    model: str  # as the metadata names it (:func:`describe`)

    def page_sets(self, first: Any) -> Any:
        """The page's sets: a :class:`~attnkit.viz.compare.Comparison` of both runs."""
        from ..viz import compare

        return compare(first.sets, self.run.sets, names=self.names)

    def picture_sets(self, first: Any) -> list[Any]:
        """Both sides' sets for the layers × heads picture, named by side."""
        return [replace(s, name=f"{side} {s.name}")
                for side, run in (("A", first), ("B", self.run)) for s in run.sets]  # fmt: skip

    def notes(self) -> list[str]:
        """Side B's facts for the page (its notes, a truncated input)."""
        out = [f"B: {n}" for s in self.run.sets for n in s.notes]
        n = len(self.run.tokens)
        if self.run.total_tokens > n:
            out.append(f"B: the input has {self.run.total_tokens} tokens; it was truncated to {n}.")
        return out

    def summary(self, comparison: Any) -> list[str]:
        """Lines for the terminal: what B is, and whether the page draws A − B."""
        b = f"B: {self.model_name}, {count(len(self.run.tokens), 'token')}"
        lines = [b, "B " + tokens_line(self.run.tokens)]
        if comparison.why is None:
            lines.append("compared: both sides in sync, and A − B (the same tokens)")
        else:
            lines.append(f"compared side by side only: {comparison.why}")
        return lines


def _side_name(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= _NAME else one[: _NAME - 1] + "…"


def run_second(
    args: argparse.Namespace,
    source: Any,
    second: Any,
    options: RunOptions,
    *,
    layer_sel: Any,
    head_sel: Any,
) -> SecondSide | None:
    """Run side B with side A's options (None when nothing is compared).

    ``source`` is side A's checkpoint, already loaded; ``second`` is
    :func:`open_second`'s checkpoint (None for ``--compare``); ``options`` is side A's
    :class:`~attnkit.viz.options.RunOptions`, whose layers and heads B takes again from
    ``layer_sel`` and ``head_sel`` (its own numbers of them).
    """
    from ..models import bert, hf

    text2: str | None = getattr(args, "compare", None)
    try:
        if second is not None:
            return _second_model(source, second, options, layer_sel=layer_sel, head_sel=head_sel)
        if text2 is not None:
            return _second_text(source, options, text2.strip(), layer_sel=layer_sel,
                                head_sel=head_sel)  # fmt: skip
    except (bert.CheckpointError, hf.CheckpointError) as exc:
        flag = "--compare-model" if second is not None else "--compare"
        raise UsageError(f"{flag}: {exc}") from None
    return None


def _second_text(source: Any, options: RunOptions, text2: str, *, layer_sel: Any,
                 head_sel: Any) -> SecondSide:  # fmt: skip
    """The same model on a second text."""
    from ..viz.notebook import attend

    if source.content_tokens(text2) == 0:
        raise UsageError("--compare: the second text gives no tokens (only invisible characters)")
    layers = sorted(resolve(layer_sel, source.num_layers, "--layers", "layer"))
    heads = resolve(head_sel, source.num_heads, "--heads", "head")
    side = replace(options, text=text2, pair=None, layers=layers, heads=heads, generate=0,
                   seed=None)  # fmt: skip
    run = attend(source, side)
    names = (f"“{_side_name(options.text)}”", f"“{_side_name(text2)}”")
    return SecondSide(run, names, "text", text2, source.name, describe(source))


def prepare(source: Any, second: Any) -> None:
    """Before side A runs: build the second model and check it pairs with the first.

    ``source`` is side A's checkpoint, loaded; ``second`` is :func:`open_second`'s
    (nothing to do when it is None).
    """
    if second is None:
        return
    from ..models import bert, hf

    if (source.kind == "encoder-decoder") != (second.kind == "encoder-decoder"):
        raise UsageError(
            f"--compare-model: {source.name} is an {source.kind} and {second.name} an "
            f"{second.kind}; their kinds of attention do not pair up"
        )
    try:
        second.load()
    except (bert.CheckpointError, hf.CheckpointError) as exc:
        raise UsageError(f"--compare-model: {exc}") from None
    _check_same_tokenizer(source, second)


def _second_model(source: Any, second: Any, options: RunOptions, *, layer_sel: Any,
                  head_sel: Any) -> SecondSide:  # fmt: skip
    """The same text on a second model with the same tokenizer (checked by :func:`prepare`)."""
    from ..viz.notebook import attend

    layers, heads = selection(second, layer_sel, head_sel)
    limit = min(options.max_length, second.max_tokens)
    side = replace(options, max_length=limit, layers=layers, heads=heads, generate=0, seed=None)
    run = attend(second, side)
    return SecondSide(
        run, (source.name, second.name), "model", options.text, second.name, describe(second)
    )


def subtitle(side: SecondSide, shown: str) -> str:
    """The page's line under the title: both texts, or the one text."""
    if side.what == "text":
        return f"A: {shown}  ‖  B: {elide_text(side.text, 2000)}"
    return shown
