"""explain(): which input tokens a transformers model's output depends on, and which heads.

:func:`explain` runs a model on a text and returns an :class:`Attribution`: one
relevance score per input token, each head's importance, the target it explains and
its value. Four methods, each as its paper defines it:

- ``"input_x_gradient"``: ``Σ_d e_{i,d} · ∂y/∂e_{i,d}``, ``e`` the output of the model's
  input embedding layer (``model.get_input_embeddings()``).
- ``"integrated_gradients"`` (Sundararajan et al., 2017): ``Σ_d e_{i,d} ∫₀¹ ∂y/∂e_{i,d}(α e)
  dα`` from zero embeddings, the integral taken at the points captum's
  ``IntegratedGradients`` uses (Gauss–Legendre by default), several points a forward.
  Complete: the scores sum to ``y(e) − y(0)`` up to the integration error.
- ``"attention_x_gradient"`` (Chefer et al., 2021, generic attention explainability):
  ``R = I``; for each layer in order ``Ā = mean_h (∇_A y ⊙ A)⁺``, ``R ← R + Ā·R``; the
  scores are the target position's row of ``R`` (returned as ``relevance``).
- ``"rollout"`` (Abnar & Zuidema, 2020), as :func:`attnkit.viz.attention_rollout`.

Head importance (Michel et al., 2019) comes with every gradient method:
``|Σ o ⊙ ∂y/∂o|`` per head, ``o`` the head's attention output before the output
projection, summed over positions and head dims. Attention weights, per-head outputs
and their gradients are read inside :func:`attnkit.attention` (see
:mod:`attnkit.viz.attribution_passes`): the model runs with
``attn_implementation="attnkit"`` for the call and is switched back after.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .attribution_passes import (
    INTEGRATIONS,
    HeadRecorder,
    chefer_relevance,
    integrated_gradients,
    on_attnkit,
    recording,
    rollout_matrix,
)
from .attribution_records import Attribution, Target
from .model_modes import evaluating, gradients_on

if TYPE_CHECKING:
    from .options import ExplainOptions

__all__ = [
    "METHODS",
    "Attribution",
    "Target",
    "check_ids",
    "checkpoint_kind",
    "explain",
    "explain_with",
]

METHODS = ("attention_x_gradient", "input_x_gradient", "integrated_gradients", "rollout")
_OWN_TOKENIZER = ", as the tokenizer encodes it: is the tokenizer the model's own?"
_GRADIENT = frozenset(("attention_x_gradient", "input_x_gradient", "integrated_gradients"))


@dataclass
class _Task:
    """A checked call: the model's kind, the input and how to get y from an output."""

    model: nn.Module
    kind: str  # "lm", "classifier" or "encoder"
    causal: bool
    ids: torch.Tensor  # (1, L)
    tokens: list[str]
    target: Any  # the caller's target, checked: (position or None, index or None)
    tokenizer: Any = None
    compare: str = ""
    reference: torch.Tensor | None = None  # (D,) the second text's pooled embedding
    # A head that reads several tokens (some image classifiers): (L,) weights over the rows
    # of R it reads, and the position its target names (None: every token).
    pool: torch.Tensor | None = None
    pool_position: int | None = 0


def _kind(model: nn.Module) -> tuple[str, bool]:
    """("lm" | "classifier" | "encoder", causal) of a transformers model."""
    from .sources import hf_kind as kind_of

    name = type(model).__name__
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "get_input_embeddings"):
        raise TypeError(f"model: expected a transformers model or a checkpoint folder, got {name}")
    hf_kind = kind_of(model)
    if hf_kind == "encoder-decoder":
        raise ValueError(
            f"model: explain takes encoders and decoders, not an encoder-decoder ({name})"
        )
    if name.endswith("ForSequenceClassification"):
        return "classifier", hf_kind == "decoder"
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "lm", True
    if getattr(model, "base_model", None) is model and hf_kind == "encoder":
        return "encoder", False
    raise ValueError(
        f"model: explain takes a causal LM, a sequence classifier or an encoder without a "
        f"head, got {name}"
    )


def checkpoint_kind(directory: str | Path) -> tuple[str, str]:
    """What :func:`explain` makes of a checkpoint folder, from its config alone (no weights
    are read): the kind and the folder's name.

    Args:
        directory: a local transformers checkpoint folder.

    Returns:
        (``"lm"`` (a decoder: loaded as a causal LM), ``"classifier"`` (its config names a
        ``...ForSequenceClassification``) or ``"encoder"`` (loaded without a head), the
        folder's name).

    Raises:
        ValueError: the folder is not a checkpoint transformers reads, or it holds an
            encoder-decoder.
    """
    ck = _checkpoint(Path(directory))
    return ("encoder" if ck.head == "none" else ck.head), ck.name


def _checkpoint(directory: Path) -> Any:
    """The folder as an :class:`attnkit.models.hf.Checkpoint` (config checked, nothing
    built); ValueError for an encoder-decoder."""
    from ..models.hf import Checkpoint

    ck = Checkpoint(directory)
    if ck.kind == "encoder-decoder":
        raise ValueError(
            f"model: explain takes encoders and decoders, not an encoder-decoder ({ck.name})"
        )
    return ck


def _load(directory: Path) -> tuple[nn.Module, Any]:
    """A checkpoint folder's model with the head its config names, and its tokenizer."""
    ck = _checkpoint(directory)
    ck.load(head=True)
    return ck.model, ck.tokenizer


def _encode(tokenizer: Any, text: str, limit: int) -> tuple[torch.Tensor, list[str]]:
    from .tokens import encoding_tokens

    fast = bool(getattr(tokenizer, "is_fast", False))
    enc = tokenizer(text, add_special_tokens=True, truncation=True, max_length=limit,
                    return_offsets_mapping=fast, return_special_tokens_mask=True)  # fmt: skip
    ids = list(enc["input_ids"])
    if not ids:
        raise ValueError(f"text: the tokenizer makes no tokens of {text!r}")
    shown = encoding_tokens(tokenizer, enc, [text]).shown
    return torch.tensor([ids], dtype=torch.long), list(shown)


def _token_id(tokenizer: Any, token: str) -> int:
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    unknown = getattr(tokenizer, "unk_token_id", None)
    if len(ids) == 1 and (ids[0] != unknown or token == getattr(tokenizer, "unk_token", None)):
        return int(ids[0])
    tid = tokenizer.convert_tokens_to_ids(token)
    if isinstance(tid, int) and tid != unknown:
        return tid
    if ids and all(i == unknown for i in ids):
        raise ValueError(
            f"target: {token!r} is not in this tokenizer's vocabulary (it makes the unknown "
            f"token {tokenizer.convert_ids_to_tokens(ids)}); give a token of the vocabulary"
        )
    raise ValueError(
        f"target: {token!r} is not one token of this tokenizer (it makes {len(ids)}: "
        f"{tokenizer.convert_ids_to_tokens(ids)}); give one token"
    )


def _check_target(kind: str, model: nn.Module, tokenizer: Any, target: Any, L: int) -> Any:
    """The target as (position or None, token/class index or None); raises before compute."""
    if target is None:
        return (None, None)
    target = _plain_int(target)
    if isinstance(target, tuple):
        target = tuple(_plain_int(t) for t in target)
    if kind == "encoder":
        raise ValueError(
            "target: an encoder without a head explains the similarity with compare=; "
            f"leave target=None (got {target!r})"
        )
    if kind == "classifier":
        n = int(getattr(model.config, "num_labels", 0) or 0)
        if isinstance(target, str):
            names = dict(getattr(model.config, "label2id", None) or {})
            if target not in names:
                raise ValueError(
                    f"target: {target!r} is not a class name of this model: {sorted(names)}"
                )
            return (None, int(names[target]))
        if isinstance(target, bool) or not isinstance(target, int) or not -n <= target < n:
            raise ValueError(
                f"target: expected a class index in [0, {n}) or a class name, got {target!r}"
            )
        return (None, target % n)
    position, token = (target if isinstance(target, tuple) and len(target) == 2 else
                       (target, None) if isinstance(target, int) else (None, target))  # fmt: skip
    if position is not None and (isinstance(position, bool) or not isinstance(position, int)
                                 or not -L <= position < L):  # fmt: skip
        raise ValueError(
            f"target: expected a position in [-{L}, {L}) of the {L} tokens, got {position!r}"
        )
    if token is not None and not isinstance(token, str):
        raise ValueError(
            f"target: expected a token (str), a position (int) or both, got {target!r}"
        )
    tid = _token_id(tokenizer, token) if token is not None else None
    return (None if position is None else position % L, tid)


def _plain_int(x: Any) -> Any:
    """A numpy integer or a 0-d integer tensor as an int (a target given as a model's
    argmax); anything else as it is."""
    if (
        isinstance(x, torch.Tensor)
        and x.ndim == 0
        and not x.is_floating_point()
        and (x.dtype != torch.bool)
    ):
        return int(x)
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    return x


def _prepare(model: Any, tokenizer: Any, text: Any, target: Any, method: str, steps: int,
             compare: Any, integration: str, max_length: Any = None) -> _Task:  # fmt: skip
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if integration not in INTEGRATIONS:
        raise ValueError(
            f"integration: expected one of {', '.join(INTEGRATIONS)}, got {integration!r}"
        )
    least = 1 if integration == "gausslegendre" else 2  # (captum's Riemann sums need 2)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < least:
        raise ValueError(f"steps: expected an int >= {least}, got {steps!r}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text: expected the text to explain, got {text!r}")
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
    ):
        raise ValueError(f"max_length: expected a positive number of tokens, got {max_length!r}")
    if isinstance(model, (str, Path)):
        model, own = _load(Path(model))
        tokenizer = tokenizer if tokenizer is not None else own
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model: expected a transformers model or a checkpoint folder, got {type(model).__name__}"
        )
    if tokenizer is None:
        raise TypeError("tokenizer: a transformers model needs its tokenizer")
    kind, causal = _kind(model)
    if kind == "encoder" and compare is None:
        raise ValueError(
            f"compare: {type(model).__name__} has no head; give compare=TEXT2 to explain the "
            "cosine similarity of the two texts' mean-pooled embeddings"
        )
    if kind != "encoder" and compare is not None:
        raise ValueError(
            f"compare: only for an encoder without a head, not a {kind} ({type(model).__name__})"
        )
    if compare is not None and (not isinstance(compare, str) or not compare.strip()):
        raise ValueError(f"compare: expected a second text, got {compare!r}")
    cfg = model.config
    limit = int(
        getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 0) or 512
    )
    if max_length is not None:
        limit = min(limit, max_length)
    ids, tokens = _encode(tokenizer, text, limit)
    check_ids(model, ids[0].tolist(), "text", _OWN_TOKENIZER)
    checked = _check_target(kind, model, tokenizer, target, ids.shape[1])
    device = next(model.parameters()).device
    task = _Task(model, kind, causal, ids.to(device), tokens, checked, tokenizer)
    if compare is not None:
        task.compare = compare
        other, _ = _encode(tokenizer, compare, limit)
        check_ids(
            model, other[0].tolist(), "compare: the tokenizer (is it the model's own?) gives ids"
        )
        with torch.no_grad(), evaluating(model):
            out = model(input_ids=other.to(device), return_dict=True)
        hidden = out.last_hidden_state  # (1, L2, D)
        task.reference = hidden[0].mean(dim=0)  # (D,)
    return task


def _objective(task: _Task, out: Any) -> tuple[torch.Tensor, Target]:
    """(y (k,), the target) from the model's output on k inputs; the default target is
    chosen from the first row (the input itself on the main pass)."""
    L = task.ids.shape[1]
    position, index = task.target
    if task.kind == "encoder":
        assert task.reference is not None
        pooled = out.last_hidden_state.mean(dim=1)  # (k, D)
        y = torch.nn.functional.cosine_similarity(
            pooled, task.reference[None].to(pooled.dtype), dim=-1
        )
        return y, Target("similarity", None, None, task.compare)
    logits = out.logits  # LM (k, L, V); classifier (k, C)
    if task.kind == "classifier":
        if index is None:
            index = int(logits[0].argmax())
        names = getattr(task.model.config, "id2label", None) or {}
        label = str(names.get(index, f"class {index}"))
        return logits[:, index], Target("class", _pooled_position(task), index, label)
    position = L - 1 if position is None else position
    if index is None:
        index = int(logits[0, position].argmax())
    label = str(task.tokenizer.decode([index]))
    return logits[:, position, index], Target("next_token", position, index, label)


def _pooled_position(task: _Task) -> int | None:
    """The token a classifier pools: the first for an encoder; for a decoder the last
    that is not padding (``config.pad_token_id``), as transformers finds it from the ids."""
    L = task.ids.shape[1]
    if task.pool is not None:
        return task.pool_position
    if not task.causal:
        return 0
    pad = getattr(task.model.config, "pad_token_id", None)
    if pad is None:
        return L - 1
    kept = (task.ids[0] != pad).nonzero()  # (n, 1)
    return int(kept[-1, 0]) if len(kept) else 0


def check_ids(model: nn.Module, ids: list[int], argument: str, hint: str = "") -> None:
    """Raise ValueError naming ``argument`` (then ``hint``) when an id is not a row of the
    model's input embedding (a tokenizer of another vocabulary, or a negative id)."""
    embed = model.get_input_embeddings()  # type: ignore[operator]
    rows = getattr(embed, "num_embeddings", None)
    bad = [i for i in ids if i < 0 or (rows is not None and i >= rows)]
    if bad:
        raise ValueError(
            f"{argument}: ids {bad[:5]} are not in the model's vocabulary of {rows} tokens "
            f"(ids 0 to {rows - 1 if rows is not None else '...'}){hint}"
        )


def _row(matrix: torch.Tensor, target: Target, pool: torch.Tensor | None = None) -> torch.Tensor:
    """The row of ``matrix`` (L, L) for the target: its position's, or the mean of all rows
    for a mean-pooled similarity; with ``pool`` (L,), the rows weighed as a classifier head
    that reads several tokens weighs them."""
    if pool is not None:
        return pool.to(matrix.dtype) @ matrix  # (L,)
    return matrix.mean(dim=0) if target.position is None else matrix[target.position]


def explain(
    model: Any,
    tokenizer: Any,
    text: str,
    *,
    target: Any = None,
    method: str = "attention_x_gradient",
    steps: int = 32,
    compare: str | None = None,
    integration: str = "gausslegendre",
    max_length: int | None = None,
) -> Attribution:
    """Attribute a model's output on ``text`` to its input tokens, and to its heads.

    Args:
        model: a transformers model (a causal LM, a sequence classifier, or an encoder
            without a head such as ``BertModel``) whose attention can run on
            ``attn_implementation="attnkit"``, or a checkpoint folder (str or Path; loaded
            offline with the head its config names, as :func:`show` loads folders).
        tokenizer: the model's tokenizer (None for a folder: its own).
        text: the input.
        target: what to explain; None = the default:

            - causal LM: the logit of its top next token at the last position. ``str``:
              that token's logit (one token of the vocabulary) at the last position;
              ``int`` p: the logit of the top next token predicted at position p (from
              tokens 0..p; negative counts from the end); ``(p, str)``: both.
            - classifier: its top class's logit; ``int``: that class; ``str``: a class
              name of ``config.label2id``.
            - encoder without a head: must be None (the similarity with ``compare``).

        method: ``"attention_x_gradient"``, ``"input_x_gradient"``,
            ``"integrated_gradients"`` or ``"rollout"`` (see :mod:`attnkit.viz.attribution`).
        steps: integrated gradients' number of points on the path (>= 1 for
            ``"gausslegendre"``; >= 2 for the Riemann sums, as captum has them).
        compare: a second text, for an encoder without a head: y is the cosine similarity
            of the two texts' mean-pooled last hidden states, attributed to ``text``'s tokens.
        integration: where integrated gradients samples the path, as captum's
            ``method=``: ``"gausslegendre"`` (default), ``"riemann_left"``,
            ``"riemann_right"``, ``"riemann_middle"`` or ``"riemann_trapezoid"`` (captum's:
            ``steps`` points from 0 to 1, each weighing 1/steps, halved at both ends, so
            the weights sum to 1 − 1/steps and the scores fall short of ``y(e) − y(0)``
            by about that fraction).
        max_length: truncate the input (and ``compare``'s text) to this many tokens, as
            ``attnkit show --max-length`` does; None (default): the model's positions.

    Returns:
        an :class:`Attribution`: ``scores`` (n_tokens,) and ``tokens``; ``head_importance``
        (layers, heads) for the gradient methods; ``relevance`` (n_tokens, n_tokens) for
        attention × gradient and rollout, whose target row (the mean of the rows for a
        similarity; row 0 for an encoder classifier, which pools its first token; for a
        decoder classifier the token it pools, its last that is not
        ``config.pad_token_id``) is ``scores``; ``target`` and ``target_value``.

    The model runs in eval mode with autograd on (inside a caller's ``no_grad`` or
    ``inference_mode`` too), and is handed back with each module's mode and its attention
    implementation as they were.

    Raises:
        ValueError, TypeError: before any compute, naming the argument: an unknown method,
            a target the model's kind cannot take (a token outside the vocabulary among
            them), a missing or unexpected ``compare``, a tokenizer whose ids the model's
            embedding does not have, a model whose attention cannot run on attnkit
            (attention methods and head importance need it), an encoder-decoder.

    Example::

        from attnkit import viz
        a = viz.explain(model, tokenizer, "The capital of France is")   # a causal LM
        a.target                  # Target(kind='next_token', position=5, index=..., ...)
        a.scores                  # (6,) relevance of each token to the top next token
        viz.explain(model, tokenizer, "The capital of France is",
                    method="integrated_gradients", steps=64).scores.sum()  # ≈ y(x) − y(0)
    """
    from .options import ExplainOptions

    options = ExplainOptions(text, target, method, steps, compare, integration, max_length)
    return explain_with(model, tokenizer, options)


def explain_with(model: Any, tokenizer: Any, options: ExplainOptions) -> Attribution:
    """:func:`explain` with one :class:`~attnkit.viz.options.ExplainOptions`: the one
    attribution of a text for :func:`explain` and ``attnkit show --explain``.

    Args:
        model, tokenizer: as for :func:`explain`.
        options: the text, target, method, steps, compare text, integration and length.
    """
    o = options
    with gradients_on():  # (inside a caller's no_grad or inference_mode too)
        task = _prepare(model, tokenizer, o.text, o.target, o.method, o.steps, o.compare,
                        o.integration, o.max_length)  # fmt: skip
        return _attribute(task, o.method, o.steps, o.integration)


def _attribute(task: _Task, method: str, steps: int, integration: str,
               pixels: torch.Tensor | None = None, extra: Any = None) -> Attribution:  # fmt: skip
    """The attribution of a checked task: its model on attnkit's attention for the call; a
    vision model's input is ``pixels`` (1, 3, H, W) (with ``extra`` keywords) instead."""
    net: Any = task.model
    with on_attnkit(net):
        if pixels is not None:
            embeds = pixels.to(next(net.parameters()).device)  # (1, 3, H, W)

            def run(x: torch.Tensor) -> Any:
                return net(pixel_values=x, return_dict=True, **(extra or {}))
        else:
            embed = net.get_input_embeddings()
            with torch.no_grad():
                embeds = embed(task.ids)  # (1, L, D)

            def run(x: torch.Tensor) -> Any:
                # The ids go in (a decoder classifier finds its padding in them) and the
                # embedding layer's output is replaced by x.
                ids = task.ids.expand(x.shape[0], -1)  # (k, L)
                handle = embed.register_forward_hook(lambda _m, _i, _o: x)
                try:
                    with _rows_without_padding(task, x.shape[0]):
                        return net(input_ids=ids, attention_mask=torch.ones_like(ids),
                                   return_dict=True)  # fmt: skip
                finally:
                    handle.remove()

        if method == "rollout":
            return _rollout(task, run, embeds)
        return _gradient(task, run, embeds, method, steps, integration)


@contextmanager
def _rows_without_padding(task: _Task, rows: int) -> Iterator[None]:
    """A decoder classifier without ``pad_token_id`` pools each row's last token, and
    transformers refuses to run it on more than one row (it cannot find padding). The
    rows here are copies of one input, with no padding: for the block, the pad id is -1,
    which no id equals, so each row pools its last token as one row would."""
    config: Any = task.model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not (task.kind == "classifier" and task.causal and rows > 1
            and getattr(text, "pad_token_id", 0) is None):  # fmt: skip
        yield
        return
    text.pad_token_id = -1
    try:
        yield
    finally:
        text.pad_token_id = None


def _rollout(task: _Task, run: Callable[[torch.Tensor], Any], embeds: torch.Tensor) -> Attribution:
    weights: list[torch.Tensor] = []

    class _Weights:
        def record(self, inputs: Any, result: Any, backend: Any) -> None:
            from .capture import _exact_weights

            weights.append(_exact_weights(inputs, result, backend)[0][0])  # (H, L, L)

    with torch.no_grad(), recording(_Weights()):
        out = run(embeds)
    y, tgt = _objective(task, out)
    matrix = rollout_matrix(weights)  # (L, L)
    scores = _row(matrix, tgt, task.pool)  # (L,)
    return Attribution(task.tokens, scores, "rollout", tgt, float(y[0]), None, matrix)


def _gradient(task: _Task, run: Callable[[torch.Tensor], Any], embeds: torch.Tensor,
              method: str, steps: int, integration: str) -> Attribution:  # fmt: skip
    recorder = HeadRecorder(layer_maps=method == "attention_x_gradient")
    x = embeds.detach().clone().requires_grad_(True)  # (1, L, D)
    with recording(recorder):
        out = run(x)
    y, tgt = _objective(task, out)
    (grad,) = torch.autograd.grad(y[0], [x])  # (1, L, D); the hooks fill the recorder
    heads = recorder.head_importance()  # (layers, H)
    value = float(y[0].detach())
    if method == "input_x_gradient":
        scores = (x.detach() * grad)[0].sum(dim=-1)  # (L,)
        return Attribution(task.tokens, scores, method, tgt, value, heads)
    if method == "integrated_gradients":
        fixed = replace(task, target=(tgt.position, tgt.index))  # the default, now chosen

        def value_of(e: torch.Tensor) -> torch.Tensor:
            return _objective(fixed, run(e))[0]

        scores, at_zero = integrated_gradients(value_of, embeds, integration, steps)
        return Attribution(task.tokens, scores, method, tgt, value, heads, baseline_value=at_zero)
    relevance = chefer_relevance(recorder.layer_map_stack(), task.causal)  # (L, L)
    scores = _row(relevance, tgt, task.pool)  # (L,)
    return Attribution(task.tokens, scores, method, tgt, value, heads, relevance)
