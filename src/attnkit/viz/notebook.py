"""The model side of :func:`attnkit.viz.show`: a model (or folder), a tokenizer and text.

:func:`attend` is the one model run of ``attnkit show`` and :func:`attnkit.viz.show`:
a loaded source and one :class:`~attnkit.viz.options.RunOptions`; :func:`run_model`
resolves the model the same way as ``attnkit show``
(:func:`attnkit.viz.sources.open_source`), checks the run as ``attnkit show`` checks
its flags (:func:`check_run`, before the model is built) and runs it there;
:func:`from_generate` turns what transformers' ``generate(...,
output_attentions=True, return_dict_in_generate=True)`` returns into one
page set with a step slider; :func:`from_bertviz` reads bertviz's
encoder-decoder arguments.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .attention_set import layer_numbers

if TYPE_CHECKING:
    from .options import RunOptions

__all__ = [
    "attend",
    "check_counts",
    "check_length",
    "check_run",
    "check_text",
    "from_bertviz",
    "from_generate",
    "is_model",
    "layer_numbers",
    "run_model",
    "run_options",
]

_BERTVIZ = ("encoder_attention", "decoder_attention", "cross_attention", "encoder_tokens",
            "decoder_tokens")  # fmt: skip


def is_model(x: Any) -> bool:
    """A model or a checkpoint folder, rather than weights."""
    return isinstance(x, (nn.Module, str, Path))


def run_model(
    model: Any,
    tokenizer: Any,
    text: str | None,
    *,
    pair: str | None = None,
    max_length: int | None = None,
    generate: int = 0,
    seed: int | None = None,
    layers: Sequence[int] | None = None,
    top_k: int = 16,
    words: bool = False,
    special: bool = True,
    neuron_window: tuple[int | None, int | None] | str | None = None,
    progress: bool = True,
) -> Any:
    """Run a model on ``text`` with streaming capture; an :class:`~attnkit.viz.sources.text_run.AttentionRun`.

    The arguments make one :class:`~attnkit.viz.options.RunOptions` (:meth:`RunOptions.of
    <attnkit.viz.options.RunOptions.of>`), which :func:`run_options` runs.

    Args:
        model: a transformers model, an attnkit :class:`~attnkit.models.bert.Bert`,
            or a checkpoint folder (str or Path; BERT family or any transformers model).
        tokenizer: the model's tokenizer (None for an attnkit BERT model or a folder).
        text: the input.
        pair: a second sentence (an encoder-decoder's decoder text), or None.
        max_length: truncate to this many tokens (default: the model's positions).
        generate: a decoder generates this many tokens.
        seed: sample them with this seed (None: greedy).
        layers: layers to show (default all).
        top_k: keys kept per query row on a long page.
        words: the word view (subword pieces merged; see :mod:`attnkit.viz.positions`).
        special: False: leave the special tokens out and renormalise each row.
        neuron_window: the queries the neuron view keeps past its budget: (start, stop)
            positions, or a token's text to centre the window on.
        progress: progress on stderr (:mod:`attnkit.viz.progress`).
    """
    from .options import RunOptions

    options = RunOptions.of(
        check_text(text), pair=pair, max_length=max_length, generate=generate, seed=seed,
        layers=layers, top_k=top_k, words=words, special=special, neuron_window=neuron_window,
        progress=progress,
    )  # fmt: skip
    return run_options(model, tokenizer, options)


def run_options(model: Any, tokenizer: Any, options: RunOptions) -> Any:
    """The model resolved as ``attnkit show`` resolves ``--model``
    (:func:`.sources.open_source`), loaded, and run with ``options`` by :func:`attend`.

    Args:
        model: as for :func:`run_model`.
        tokenizer: its tokenizer (or None).
        options: the run (:class:`~attnkit.viz.options.RunOptions`).
    """
    from .sources import open_source

    check_text(options.text)
    source = open_source(model, tokenizer)
    options = check_run(source, options)
    source.load(generate=bool(options.generate))
    run = attend(source, options)
    layers = options.layers if options.layers is not None else range(source.num_layers)
    run.layers = list(layers)
    return run


def check_run(source: Any, options: RunOptions) -> RunOptions:
    """``options`` checked against a source opened but not built, as ``attnkit show``
    checks its flags: the same refusals, each naming the argument of
    :func:`attnkit.viz.show`, before any model is built or run.

    Args:
        source: a :class:`~attnkit.viz.sources.TextSource` (its sizes, from the config).
        options: the run.

    Returns:
        ``options`` with ``layers`` as the layer numbers the run captures: negative
        numbers counted from the end, each once, in the order the layers run.

    Raises:
        ValueError: ``max_length`` not a positive number of tokens, more than the
            model's positions or fewer than its special tokens; ``generate`` not 0 to
            4096 tokens, or leaving no room for the prompt; ``seed`` without
            ``generate``; ``generate`` with ``pair``; ``include_layers`` out of range.
    """
    check_counts(options.max_length, options.generate, options.seed, options.pair)
    layers = options.layers
    if layers is not None:
        layers = sorted(layer_numbers(layers, source.num_layers, "the model has"))
    check_length(source, options.max_length, options.generate, options.pair)
    return replace(options, layers=layers)


def _same(name: str) -> str:
    return name


def check_counts(
    max_length: Any, generate: Any, seed: Any, pair: Any, *, spell: Callable[[str], str] = _same
) -> None:
    """The run's counts on their own, before any model is opened: ``max_length`` a
    positive number of tokens (or None), ``generate`` 0 to 4096 tokens, ``seed`` only
    with ``generate``, and ``generate`` without ``pair``.

    Args:
        spell: how the caller spells an argument's name in its messages (``attnkit
            show`` gives its flags); default the Python name.

    Raises:
        ValueError: the first count that breaks those rules, naming its argument.
    """
    if max_length is not None and (not _is_int(max_length) or max_length < 1):
        raise ValueError(
            f"{spell('max_length')}: expected a positive number of tokens, got {max_length!r}"
        )
    if not _is_int(generate) or not 0 <= generate <= 4096:
        raise ValueError(f"{spell('generate')}: expected 0 to 4096 tokens, got {generate!r}")
    if seed is not None and not generate:
        how = "generate=N" if spell is _same else f"{spell('generate')} N"
        raise ValueError(f"{spell('seed')}: only with {how} (it seeds the sampling)")
    if generate and pair is not None:
        names = f"{spell('generate')}, {spell('pair')}"
        raise ValueError(f"{names}: a generated text continues one prompt")


def check_length(
    source: Any,
    max_length: int | None,
    generate: int,
    pair: Any,
    *,
    spell: Callable[[str], str] = _same,
) -> int:
    """The input's length against a source opened but not built (counts already checked
    by :func:`check_counts`).

    Args:
        source: its ``max_tokens`` (the model's positions) and ``special_tokens``.
        max_length: the tokens asked for (None: the model's positions).
        generate: tokens to generate after the prompt.
        pair: a second text, or None.
        spell: as for :func:`check_counts`.

    Returns:
        The input's length: ``max_length``, or the model's positions.

    Raises:
        ValueError: ``max_length`` more than the model's positions or fewer than its
            special tokens; ``generate`` leaving no room for the prompt.
    """
    limit = source.max_tokens
    if max_length is not None and max_length > limit:
        raise ValueError(
            f"{spell('max_length')}: {max_length} is more than the model's {limit} positions"
        )
    n = limit if max_length is None else max_length
    if generate and generate >= n:
        raise ValueError(
            f"{spell('generate')}: {generate} tokens leave no room for the prompt in {n} positions"
        )
    # BERT: [CLS] and [SEP] (and a second [SEP] for a pair); models without special tokens: one.
    special = source.special_tokens
    minimum = max(1, special + (1 if pair is not None and special else 0))
    if n < minimum:
        raise ValueError(
            f"{spell('max_length')}: expected at least {minimum} (the special tokens), got {n}"
        )
    return n


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_text(text: Any) -> str:
    """``text`` when it is a str with something besides whitespace, else ValueError."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text: expected the text to run the model on, got {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text: character {exc.start} is U+{ord(text[exc.start]):04X}, half of a "
            "character (a lone surrogate, e.g. from bytes decoded with surrogateescape); "
            "expected text a tokenizer can read"
        ) from None
    return text


def attend(source: Any, options: RunOptions) -> Any:
    """Run a loaded :class:`~attnkit.viz.sources.Source` with one
    :class:`~attnkit.viz.options.RunOptions`: the one model run of ``attnkit show``
    and :func:`attnkit.viz.show`.

    Tokens, streaming capture of the chosen layers and heads, and every layer reduced
    while it runs (:mod:`attnkit.viz.reduce`), with progress on stderr unless
    ``options.progress`` is False.

    Args:
        source: the model, loaded (:meth:`~attnkit.viz.sources.Source.load`).
        options: the run: text, pair, layers, heads, generation, budget and view.

    Returns:
        An :class:`~attnkit.viz.sources.text_run.AttentionRun`: its page sets (each
        (layers, heads, Q, K) reduced), tokens and notes.
    """
    from .progress import quiet

    with quiet(not options.progress):
        return source.attend(
            options.text, options.pair, max_length=options.max_length, layers=options.layers,
            heads=options.heads, generate_tokens=options.generate, seed=options.seed,
            budget=options.budget(), view=options.view,
        )  # fmt: skip


def from_bertviz(attentions: Any, tokens: Any, extra: Mapping[str, Any]) -> tuple[Any, Any]:
    """bertviz's ``encoder_attention=``, ``decoder_attention=``, ``cross_attention=``,
    ``encoder_tokens=``, ``decoder_tokens=`` as a list of attention sets."""
    from .attention_set import AttentionSet

    unknown = sorted(set(extra) - set(_BERTVIZ))
    if unknown:
        raise TypeError(f"show: unexpected argument(s) {', '.join(unknown)}")
    if attentions is not None:
        raise ValueError("attentions: give either the weights or bertviz's encoder_attention=...")
    enc_tokens: Any = extra.get("encoder_tokens")
    dec_tokens: Any = extra.get("decoder_tokens")
    sets = []
    if extra.get("encoder_attention") is not None:
        sets.append(AttentionSet("encoder self-attention", extra["encoder_attention"], enc_tokens))
    if extra.get("decoder_attention") is not None:
        sets.append(AttentionSet("decoder self-attention", extra["decoder_attention"], dec_tokens))
    if extra.get("cross_attention") is not None:
        sets.append(AttentionSet("cross-attention", extra["cross_attention"], dec_tokens,
                                 key_tokens=enc_tokens))  # fmt: skip
    if not sets:
        raise ValueError("encoder_attention, decoder_attention, cross_attention: give at least one")
    needs = (("encoder_tokens", enc_tokens, "encoder_attention", "cross_attention"),
             ("decoder_tokens", dec_tokens, "decoder_attention", "cross_attention"))  # fmt: skip
    for name, given, *users in needs:
        used = [u for u in users if extra.get(u) is not None]
        if given is None and used:
            verb = "needs" if len(used) == 1 else "need"
            raise ValueError(f"{name}: {' and '.join(used)} {verb} them (the tokens of its rows "
                             "or keys)")  # fmt: skip
    return sets, None


def from_generate(
    outputs: Any, tokens: Sequence[str], *, name: str = "self-attention (causal)"
) -> Any:
    """What ``model.generate(ids, output_attentions=True, return_dict_in_generate=True)`` returns,
    as one :class:`~attnkit.viz.AttentionSet` with a step slider on the page.

    ``outputs.attentions`` holds one tuple of per-layer weights per step: the
    prompt's (1, heads, L, L) first, then one (1, heads, 1, L + t) row per new
    token. The last generated token was never fed back, so it has no row: the set
    covers the first ``L + N - 1`` tokens.

    Args:
        outputs: the result of ``generate`` (a decoder-only model).
        tokens: the tokens of ``outputs.sequences[0]`` (at least ``L + N - 1``).
        name: the set's name on the page.

    Example::

        out = model.generate(ids, max_new_tokens=8, output_attentions=True,
                             return_dict_in_generate=True)
        tokens = tokenizer.convert_ids_to_tokens(out.sequences[0])
        attnkit.viz.to_html([attnkit.viz.from_generate(out, tokens)], None, "gen.html")
    """
    from .attention_set import AttentionSet

    steps = getattr(outputs, "attentions", None)
    if not steps or not isinstance(steps[0], (tuple, list)):
        raise ValueError(
            "outputs: expected generate(..., output_attentions=True, return_dict_in_generate=True)"
            "'s result, whose .attentions holds one tuple of layers per step"
        )
    first = steps[0]
    if not first or any(not step or step[0] is None for step in steps):
        raise ValueError(
            "outputs: its .attentions holds no weights (empty tuples or None): the model ran "
            "an attention that returns none (transformers' sdpa or flash); load it with "
            'attn_implementation="attnkit" or "eager" and generate again'
        )
    n_layers = len(first)
    n_heads, L = int(first[0].shape[1]), int(first[0].shape[-1])
    n = L + len(steps) - 1
    if len(tokens) < n:
        raise ValueError(
            f"tokens: expected at least {n} tokens (prompt + steps), got {len(tokens)}"
        )
    grid = torch.zeros(n_layers, n_heads, n, n)  # (layers, heads, n, n)
    for li in range(n_layers):
        grid[li, :, :L, :L] = first[li][0].float()
    for t, step in enumerate(steps[1:]):
        for li in range(n_layers):
            row = step[li][0, :, -1].float()  # (heads, L + t + 1)
            grid[li, :, L + t, : row.shape[-1]] = row
    return AttentionSet(name=name, weights=grid, tokens=list(tokens)[:n],
                        generated_start=L if n > L else None)  # fmt: skip
