"""explain_generation(): each generated token of a causal LM in turn as the target.

A generation of N tokens after a prompt of L gives N targets: the logit of generated
token ``ids[p]`` at position ``p - 1``, explained from the tokens before it
(``ids[:p]``, the prompt and the tokens generated earlier), exactly as
:func:`attnkit.viz.explain` explains that input with ``target=(p - 1, token)``. The
rows, one per generated token, make a steps × sources matrix (as inseq draws one):
row t holds the relevance of sources ``0 .. L + t - 1`` and NaN after them, where the
source did not exist yet.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .attribution import _GRADIENT, METHODS, _attribute, _kind, _load, _Task, check_ids
from .attribution_records import GenerationAttribution
from .model_modes import gradients_on
from .options import GenerationOptions

__all__ = ["GenerationAttribution", "explain_generation", "explain_generation_with"]


def explain_generation(
    model: Any,
    tokenizer: Any,
    ids: Sequence[int],
    prompt_length: int,
    *,
    tokens: Sequence[str] | None = None,
    method: str = "attention_x_gradient",
    steps: int = 32,
) -> GenerationAttribution:
    """Explain each generated token of a causal LM from the tokens before it.

    Args:
        model: a transformers causal LM whose attention can run on
            ``attn_implementation="attnkit"``, or its checkpoint folder (str or Path).
        tokenizer: its tokenizer (None for a folder: its own).
        ids: (n,) the prompt's token ids, then the N generated ones.
        prompt_length: L, in 1 .. n - 1.
        tokens: the n tokens as shown (default: the tokenizer's pieces).
        method: as for :func:`attnkit.viz.explain`.
        steps: integrated gradients' points on the path.

    Returns:
        a :class:`GenerationAttribution`: ``scores`` (N, n - 1), ``target_values`` (N,),
        ``head_importance`` (N, layers, heads) for the gradient methods.

    Raises:
        ValueError, TypeError: before any compute: an unknown method, a model that is not
            a causal LM, ids that are not ints of the model's vocabulary or more than its
            positions, a prompt length outside 1 .. n - 1.
    """
    options = GenerationOptions(tuple(ids), prompt_length,
                                None if tokens is None else tuple(tokens), method, steps)  # fmt: skip
    return explain_generation_with(model, tokenizer, options)


def explain_generation_with(
    model: Any, tokenizer: Any, options: GenerationOptions
) -> GenerationAttribution:
    """:func:`explain_generation` with one :class:`~attnkit.viz.options.GenerationOptions`:
    the one attribution of a generation for :func:`explain_generation` and ``attnkit show
    --generate N --explain``.

    Args:
        model, tokenizer: as for :func:`explain_generation`.
        options: the ids, prompt length, shown tokens, method and steps.
    """
    ids, prompt_length, tokens = options.ids, options.prompt_length, options.tokens
    method, steps = options.method, options.steps
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
    if isinstance(model, (str, Path)):
        model, own = _load(Path(model))
        tokenizer = tokenizer if tokenizer is not None else own
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a transformers causal LM, got {type(model).__name__}")
    kind, _ = _kind(model)
    if kind != "lm":
        raise ValueError(
            "model: each generated token is a target only of a causal LM; "
            f"{type(model).__name__} is not one (explain takes it as: {kind})"
        )
    ids = _as_ids(ids)
    check_ids(model, list(ids), "ids")
    n = len(ids)
    cfg = model.config
    positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if positions is not None and n > int(positions):
        raise ValueError(
            f"ids: {n} ids, more than the {int(positions)} positions of "
            f"{type(model).__name__}; give a shorter prompt or fewer generated tokens"
        )
    if (
        isinstance(prompt_length, bool)
        or not isinstance(prompt_length, int)
        or not (1 <= prompt_length < n)
    ):
        raise ValueError(
            f"prompt_length: expected 1 to {n - 1} of the {n} ids, got {prompt_length!r}"
        )
    shown = list(tokens) if tokens is not None else list(tokenizer.convert_ids_to_tokens(list(ids)))
    if len(shown) != n:
        raise ValueError(f"tokens: expected {n}, one per id, got {len(shown)}")
    device = next(model.parameters()).device
    rows, values, heads = [], [], []
    with gradients_on():  # (inside a caller's no_grad or inference_mode too)
        x = torch.tensor([list(ids)], dtype=torch.long, device=device)  # (1, n)
        attributions = []
        for p in range(prompt_length, n):
            task = _Task(model, "lm", True, x[:, :p], shown[:p], (p - 1, ids[p]), tokenizer)
            attributions.append(_attribute(task, method, steps, "gausslegendre"))
    for p, a in zip(range(prompt_length, n), attributions, strict=True):
        row = torch.full((n - 1,), float("nan"), dtype=torch.float64)  # (n - 1,)
        row[:p] = a.scores.detach().double().cpu()
        rows.append(row)
        values.append(a.target_value)
        if a.head_importance is not None:
            heads.append(a.head_importance.detach().double().cpu())
    return GenerationAttribution(
        tokens=shown,
        prompt_length=prompt_length,
        method=method,
        scores=torch.stack(rows),  # (N, n - 1)
        target_ids=[int(i) for i in ids[prompt_length:]],
        target_values=torch.tensor(values, dtype=torch.float64),  # (N,)
        head_importance=torch.stack(heads) if method in _GRADIENT else None,  # (N, layers, H)
    )


def _as_ids(ids: Sequence[Any]) -> tuple[int, ...]:
    """The ids as ints (Python, NumPy or one-element integer tensors); ValueError else."""
    out = []
    for i in ids:
        try:
            if isinstance(i, bool):
                raise TypeError
            out.append(operator.index(i))
        except (TypeError, RuntimeError):
            raise ValueError(f"ids: expected token ids (ints), got {i!r} among them") from None
    return tuple(out)
