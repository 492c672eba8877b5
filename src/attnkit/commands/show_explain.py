"""``attnkit show --explain [METHOD]``: an Explain view of which tokens and heads the output
depends on (:func:`attnkit.viz.explain` on the same checkpoint and text: the flags make one
:class:`attnkit.viz.options.ExplainOptions`, which
:func:`attnkit.viz.attribution.explain_with` runs, as :func:`attnkit.viz.explain` does).

The target is :func:`attnkit.viz.explain`'s default: a causal LM's top next token at the
last position, a classifier's top class, and for an encoder without a head the cosine
similarity with ``--compare TEXT2``; with ``--image``, an image classifier's top class
(:func:`attnkit.viz.explain_image`: attention × gradient or rollout).
Under ``--generate N`` each generated token in turn
is the target (:func:`attnkit.viz.explain_generation`): a steps ×
sources matrix that follows the page's step slider. Every refusal is one line before any
compute: an option the Explain view cannot follow (``--pair``, ``--words``,
``--no-special``, ``--compare-model``), an encoder without a head and without
``--compare``, ``--compare`` on a model that has a target of its own, an
encoder-decoder.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .show_args import UsageError

__all__ = [
    "DEFAULT_METHOD",
    "add_arguments",
    "check",
    "check_image",
    "check_model",
    "model_directory",
    "run",
    "run_image",
    "summary",
]

DEFAULT_METHOD = "attention_x_gradient"

# Options the Explain view cannot follow, with why.
_REFUSED = (
    ("pair", "--pair", None, "explain attributes one text's output; leave --pair out"),
    ("words", "--words", False, "the relevance belongs to tokens, not words"),
    (
        "no_special",
        "--no-special",
        False,
        "the relevance is of every token the model read, special tokens included",
    ),
    (
        "compare_model",
        "--compare-model",
        None,
        "a comparison of models has no one target; explain each model on its own",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--explain [METHOD]``."""
    from ..viz.attribution import METHODS

    parser.add_argument(
        "--explain",
        metavar="METHOD",
        nargs="?",
        const=DEFAULT_METHOD,
        default=None,
        choices=METHODS,
        help="add an Explain view: each token's relevance to the model's output, each head's "
        "importance and the relevance matrix (attnkit.viz.explain). METHOD: one of "
        f"{', '.join(METHODS)}; given without METHOD: {DEFAULT_METHOD}. The target: a causal "
        "LM's top next token at the end, a classifier's top class, an encoder's similarity "
        "with --compare TEXT2; under --generate, each generated token in turn (default: no "
        "Explain view)",
    )


def check(args: argparse.Namespace) -> None:
    """``--explain`` against the other options (arithmetic only, before any model is read)."""
    if getattr(args, "explain", None) is None:
        return
    for attr, flag, unset, why in _REFUSED:
        if getattr(args, attr, unset) not in (unset, None):
            raise UsageError(f"--explain and {flag}: {why}")


def model_directory(model: Path | None) -> Path:
    """The checkpoint folder :func:`attnkit.viz.explain` loads: ``--model`` or the default."""
    if model is not None:
        return model
    from ..models.bert.loading import default_checkpoint

    return default_checkpoint()


def check_model(args: argparse.Namespace, directory: Path, name: str) -> None:
    """The model's kind against ``--explain`` and ``--compare``, from its config (no weights
    are read): an encoder without a head needs ``--compare``; other models refuse it.
    ``name`` is the model's name for messages."""
    if getattr(args, "explain", None) is None:
        return
    from ..viz.attribution import checkpoint_kind

    try:
        kind, _ = checkpoint_kind(directory)
    except ValueError as exc:
        raise UsageError(f"--explain: {exc}") from None
    text2 = getattr(args, "compare", None)
    if kind == "encoder" and text2 is None:
        raise UsageError(
            f"--explain: {name} is an encoder without a head; give --compare TEXT2 to explain "
            "the cosine similarity of the two texts' mean-pooled embeddings"
        )
    if kind != "encoder" and text2 is not None:
        what = "a causal LM" if kind == "lm" else "a classifier"
        raise UsageError(
            f"--explain and --compare: {name} is {what}, whose target is its own output; "
            "--compare is the target only of an encoder without a head"
        )


def run(args: argparse.Namespace, model: Any, tokenizer: Any, text: str, max_length: int,
        page_run: Any = None) -> Any:  # fmt: skip
    """:func:`attnkit.viz.explain` on the model and the text, cut at ``max_length`` tokens
    as the page is; under ``--generate``, every generated token of ``page_run`` (the page's
    run: its ids and tokens) in turn; None without ``--explain``.

    ``model`` and ``tokenizer``: the page's own model and its tokenizer when it is a
    transformers model built with its head (its weights are read once), else the
    checkpoint folder (str) and None."""
    method = getattr(args, "explain", None)
    if method is None:
        return None
    from ..viz import attribution, attribution_steps
    from ..viz.options import ExplainOptions, GenerationOptions

    text2 = getattr(args, "compare", None)
    try:
        if getattr(args, "generate", 0) and page_run is not None:
            steps = GenerationOptions(tuple(page_run.ids), page_run.used_tokens,
                                      tuple(page_run.tokens), method)  # fmt: skip
            return attribution_steps.explain_generation_with(model, tokenizer, steps)
        options = ExplainOptions(text, method=method, max_length=max_length,
                                 compare=None if text2 is None else text2.strip())  # fmt: skip
        return attribution.explain_with(model, tokenizer, options)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--explain: {exc}") from None


def summary(a: Any) -> str:
    """One line for the terminal: what was explained, and the most relevant tokens."""
    from .show_report import elide_text

    if getattr(a, "prompt_length", None) is not None:
        n = len(a.target_ids)
        return (
            f"explained ({a.method.replace('_', ' ')}): each of the {n} generated tokens from "
            "the tokens before it (a steps × sources matrix on the page)"
        )
    scores = [float(v) for v in a.scores]
    top = sorted(range(len(scores)), key=lambda i: -abs(scores[i]))[:5]
    most = ", ".join(f"{a.tokens[i]!r} {scores[i]:+.3g}" for i in top)
    return elide_text(
        f"explained ({a.method.replace('_', ' ')}): the {a.target} = {a.target_value:.4g}; "
        f"most relevant: {most}",
        300,
    )


def check_image(args: argparse.Namespace, checkpoint: Any) -> None:
    """``--explain`` with ``--image``: a method that reads attention alone, and a checkpoint
    whose config names an image classifier (no weights are read)."""
    if getattr(args, "explain", None) is None:
        return
    from ..viz.attribution_image import IMAGE_METHODS, image_classifier_name

    if args.explain not in IMAGE_METHODS:
        raise UsageError(
            f"--explain {args.explain} and --image: a picture is explained by "
            f"{' or '.join(IMAGE_METHODS)} (the other methods read a text's input embeddings)"
        )
    if image_classifier_name(checkpoint.config) is None:
        raise UsageError(
            f"--explain and --image: {checkpoint.name} has no classification head (its config "
            "names no ...ForImageClassification); a picture's target is a classifier's top class"
        )


def run_image(args: argparse.Namespace, checkpoint: Any, picture: Any) -> Any:
    """:func:`attnkit.viz.explain_image` on the checkpoint (an
    :class:`~attnkit.models.hf_vision.ImageCheckpoint`, whose model the page ran) and the
    picture (None without ``--explain``)."""
    if getattr(args, "explain", None) is None:
        return None
    from ..viz.attribution_image import explain_image

    try:
        return explain_image(checkpoint, picture, method=args.explain)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--explain: {exc}") from None
