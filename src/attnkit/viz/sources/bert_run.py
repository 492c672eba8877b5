"""A BERT-family encoder on one input, its attention reduced layer by layer as it runs.

Every self-attention layer of :class:`~attnkit.models.bert.Bert` calls
:func:`attnkit.attention`; the recorder of :mod:`attnkit.viz.stream` reduces
each call's exact weights while the model runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from ...models.bert.modeling import Bert
from ..model_modes import evaluating
from ..options import PageView, ViewOptions
from ..progress import Progress
from ..reduce import Budget, SetReducer
from ..stream import Router, streaming
from ..tokens import encoding_tokens
from .text_run import AttentionRun, run_header

__all__ = ["attend"]


def attend(
    model: Bert,
    text: str,
    pair: str | None = None,
    *,
    max_length: int | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: Budget | None = None,
    view: ViewOptions | None = None,
) -> AttentionRun:
    """Run the encoder on ``text`` (and ``pair``) and reduce every layer's attention.

    Args:
        model: a loaded :class:`Bert` with its tokenizer; it runs in eval mode (no
            dropout) and each module's ``training`` flag is restored after.
        text, pair: the input, or a sentence pair.
        max_length: truncate to this many tokens (default: the model's positions).
        layers, heads: what to show (default all).
        budget: what the page keeps.
        view: words or tokens, special tokens or not, the neuron window.

    Raises:
        WordsError, WindowError (ValueErrors): the view cannot be made of this input.
    """
    cfg = model.config
    limit = cfg.max_tokens if max_length is None else max_length
    pairs = None if pair is None else [pair]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation is reported by the caller, in one line
        (enc,) = model.encode_tokens([text], pairs, max_length=limit)
    ids = list(enc.ids)
    L = len(ids)
    tokens = encoding_tokens(model.tokenizer, enc, [text] if pair is None else [text, pair])
    page = PageView(view, tokens)
    budget = budget or Budget()
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    page.set_window()
    reducer = SetReducer("self-attention", n_layers, n_heads, L, L, layers=layers, heads=heads,
                         budget=budget, **page.reducer_args())  # fmt: skip
    page.check_window(reducer, cfg.hidden_size // n_heads)
    progress = Progress(n_layers, "layer", header=run_header(L, n_layers, n_heads, reducer),
                        tokens=L)  # fmt: skip
    router = Router({"self": reducer}, progress=progress)
    x = torch.tensor([ids], dtype=torch.long)  # (1, L)
    types = torch.tensor([list(enc.type_ids)], dtype=torch.long)  # (1, L)
    try:
        with torch.no_grad(), evaluating(model), streaming(model, router):
            model(x, torch.ones_like(x), types)
    finally:
        progress.close()
    second = [i for i, t in enumerate(enc.type_ids) if t == 1]
    start = second[0] if pair is not None and second and second[0] > 0 else None
    s = page.finish(reducer.finish(), pair_start=start)
    return AttentionRun([s], s.tokens, model.count_tokens(text, pair), used_tokens=L)
