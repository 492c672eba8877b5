"""Running a transformers model on one input with streaming capture, and generating.

:func:`attend` runs an encoder, a decoder or an encoder-decoder once and
:func:`generate` continues a decoder's prompt by N tokens through its KV cache,
each reducing the attention of every layer while it is produced (see
:mod:`attnkit.models.hf_capture`). Both return an :class:`AttentionRun` ready
for :func:`attnkit.viz.to_html`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..viz.reduce import Budget, ReducedSet, SetReducer
from ..viz.stream import Progress, Router
from ..viz.tokens import readable_tokens
from .hf_capture import streaming_attention, supports_streaming

__all__ = ["AttentionRun", "attend", "generate", "kind_of_module"]


@dataclass
class AttentionRun:
    """The attention of one input, ready for :func:`attnkit.viz.to_html`.

    Attributes:
        sets: one reduced set per kind of attention (one for encoders and
            decoders; encoder, decoder and cross for encoder-decoders).
        tokens: the input's tokens as text (the first set's queries).
        total_tokens: how many tokens the input makes before truncation.
        notes: facts about the run for the page (a truncated decoder text).
    """

    sets: list[ReducedSet]
    tokens: list[str]
    total_tokens: int
    notes: list[str] = field(default_factory=list)


def kind_of_module(name: str) -> str:
    """The kind of attention a module of an encoder-decoder computes, from its name."""
    low = name.lower()
    if "encdec" in low or "encoder_attn" in low or "cross" in low:
        return "cross"
    if low.startswith("encoder") or ".encoder." in low or low.startswith("model.encoder"):
        return "encoder"
    return "decoder"


def _tokens(tokenizer: Any, ids: Sequence[int]) -> tuple[list[str], list[str]]:
    raw = [str(t) for t in tokenizer.convert_ids_to_tokens(list(ids))]
    return readable_tokens(tokenizer, ids, raw), raw


def _finish(
    reducer: SetReducer, tokens: tuple[list[str], list[str]], keys: tuple[list[str], list[str]]
    | None = None, pair_start: int | None = None, generated_start: int | None = None
) -> ReducedSet:  # fmt: skip
    s = reducer.finish()
    s.tokens, raw = tokens
    s.raw_tokens = raw if raw != s.tokens else None
    if keys is not None:
        s.key_tokens, key_raw = keys
        s.key_raw_tokens = key_raw if key_raw != s.key_tokens else None
    s.pair_start = s.key_pair_start = pair_start
    s.generated_start = generated_start
    return s


def _forward(model: nn.Module, router: Router, **inputs: Any) -> Any:
    """One forward with streaming capture (or, for models that cannot switch, collected weights)."""
    with torch.no_grad():
        if supports_streaming(model):
            calls = router.calls
            with streaming_attention(model, router):
                out = model(**inputs)
            if router.calls > calls:
                return out
        out = model(**inputs, output_attentions=True)  # its attention never reached attnkit
    _feed_collected(out, router)
    return out


def _feed_collected(out: Any, router: Router) -> None:
    """Older models: their collected ``attentions`` fed to the reducers layer by layer."""
    groups = {"self": "attentions", "encoder": "encoder_attentions",
              "decoder": "decoder_attentions", "cross": "cross_attentions"}  # fmt: skip
    for kind, reducer in router.reducers.items():
        weights = getattr(out, groups[kind], None)
        if not weights:
            raise ValueError(
                "the model returned no attention weights; load it with "
                'attn_implementation="eager" (or one that calls attnkit.attention)'
            )
        for layer, w in enumerate(weights):
            reducer.add(layer, 0, w[0].float())


def attend(
    model: nn.Module,
    tokenizer: Any,
    kind: str,
    text: str,
    pair: str | None = None,
    *,
    max_length: int,
    n_layers: int,
    n_heads: int,
    n_decoder_layers: int | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: Budget | None = None,
) -> AttentionRun:
    """Run ``model`` once on ``text`` (and ``pair``) and reduce its attention.

    Args:
        model: a transformers model (eval mode).
        tokenizer: its tokenizer.
        kind: "encoder", "decoder" or "encoder-decoder".
        text: the input (the encoder's, for an encoder-decoder).
        pair: a second sentence; for an encoder-decoder the decoder's text (default ``text``).
        max_length: truncate each text to this many tokens.
        n_layers, n_heads: the model's layers (the encoder's) and heads.
        n_decoder_layers: an encoder-decoder's decoder layers.
        layers, heads: what to show (default all).
        budget: what the page keeps.
    """
    if kind == "encoder-decoder":
        return _attend_seq2seq(model, tokenizer, text, pair if pair is not None else text,
                               max_length, n_layers, n_decoder_layers or n_layers, n_heads,
                               layers, heads, budget)  # fmt: skip
    total = len(tokenizer(text, pair, add_special_tokens=True)["input_ids"])
    enc = tokenizer(text, pair, add_special_tokens=True, truncation="longest_first",
                    max_length=max_length)  # fmt: skip
    ids = list(enc["input_ids"])
    L = len(ids)
    name = "self-attention" + (" (causal)" if kind == "decoder" else "")
    reducer = SetReducer(name, n_layers, n_heads, L, L, layers=layers, heads=heads, budget=budget)
    progress = Progress(n_layers, "layer")
    router = Router({"self": reducer}, progress=progress)
    x = torch.tensor([ids], dtype=torch.long)  # (1, L)
    try:
        _forward(model, router, input_ids=x, attention_mask=torch.ones_like(x))
    finally:
        progress.close()
    pair_start = None
    if pair is not None and hasattr(enc, "sequence_ids"):
        second = [i for i, s in enumerate(enc.sequence_ids() or []) if s == 1]
        pair_start = second[0] if second and 0 < second[0] < L else None
    tokens = _tokens(tokenizer, ids)
    return AttentionRun([_finish(reducer, tokens, pair_start=pair_start)], tokens[0], total)


def _attend_seq2seq(
    model: nn.Module, tokenizer: Any, text: str, target: str, limit: int, n_enc: int, n_dec: int,
    n_heads: int, layers: Sequence[int] | None, heads: Sequence[int] | None,
    budget: Budget | None,
) -> AttentionRun:  # fmt: skip
    total_src = len(tokenizer(text)["input_ids"])
    total_tgt = len(tokenizer(target)["input_ids"])
    src = list(tokenizer(text, truncation=True, max_length=limit)["input_ids"])
    tgt_ids = list(tokenizer(target, truncation=True, max_length=limit)["input_ids"])
    cfg = model.config
    start = getattr(cfg, "decoder_start_token_id", None)
    if start is None:
        start = getattr(cfg, "pad_token_id", 0) or 0
    dec = [int(start), *tgt_ids[:-1]]  # shifted right, as in training
    L, T = len(src), len(dec)
    dec_layers = [x for x in (layers or range(n_dec)) if x < n_dec]
    reducers = {
        "encoder": SetReducer("encoder self-attention", n_enc, n_heads, L, L,
                              layers=[x for x in (layers or range(n_enc)) if x < n_enc],
                              heads=heads, budget=budget),
        "decoder": SetReducer("decoder self-attention (causal)", n_dec, n_heads, T, T,
                              layers=dec_layers, heads=heads, budget=budget),
        "cross": SetReducer("cross-attention (decoder → encoder)", n_dec, n_heads, T, L,
                            layers=dec_layers, heads=heads, positional=False, budget=budget),
    }  # fmt: skip
    progress = Progress(n_enc + 2 * n_dec, "layer")
    router = Router(reducers, kind_of_module, progress)
    x = torch.tensor([src], dtype=torch.long)  # (1, L)
    y = torch.tensor([dec], dtype=torch.long)  # (1, T)
    try:
        _forward(model, router, input_ids=x, attention_mask=torch.ones_like(x),
                 decoder_input_ids=y)  # fmt: skip
    finally:
        progress.close()
    src_t, dec_t = _tokens(tokenizer, src), _tokens(tokenizer, dec)
    sets = [
        _finish(reducers["encoder"], src_t),
        _finish(reducers["decoder"], dec_t),
        _finish(reducers["cross"], dec_t, src_t),
    ]
    notes = []
    if total_tgt > limit:
        notes.append(f"The decoder text has {total_tgt} tokens; truncated to {limit}.")
    return AttentionRun(sets, src_t[0], total_src, notes)


def generate(
    model: nn.Module,
    tokenizer: Any,
    text: str,
    steps: int,
    *,
    max_length: int,
    n_layers: int,
    n_heads: int,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    seed: int | None = None,
    budget: Budget | None = None,
) -> AttentionRun:
    """Continue ``text`` by ``steps`` tokens through the KV cache, reducing every step's attention.

    Greedy when ``seed`` is None, else sampled from the model's distribution with a
    generator seeded by ``seed``. The prompt's rows come from one forward, each new
    token's row from its own step, so the page can step through the generation.

    Args:
        model: a causal language model (``AutoModelForCausalLM``), eval mode.
        tokenizer: its tokenizer.
        text: the prompt.
        steps: tokens to generate (>= 1).
        max_length: the most tokens in all (prompt + generated); the prompt is cut to fit.
        n_layers, n_heads, layers, heads, budget: as for :func:`attend`.
        seed: sample with this seed; None = greedy.
    """
    total = len(tokenizer(text)["input_ids"])
    prompt = list(tokenizer(text, truncation=True, max_length=max(1, max_length - steps))[
        "input_ids"])  # fmt: skip
    L = len(prompt)
    n = L + steps
    reducer = SetReducer("self-attention (causal)", n_layers, n_heads, n, n, layers=layers,
                         heads=heads, budget=budget)  # fmt: skip
    progress = Progress(n_layers * (steps + 1), "step")
    router = Router({"self": reducer}, progress=progress)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    ids = list(prompt)
    past = None
    step_ids = torch.tensor([prompt], dtype=torch.long)  # (1, L)
    try:
        for t in range(steps + 1):
            out = _forward(model, router, input_ids=step_ids, past_key_values=past,
                           use_cache=True)  # fmt: skip
            if t == steps:
                break
            past = out.past_key_values
            logits = out.logits[0, -1].float()  # (vocab,)
            if gen is None:
                nxt = int(torch.argmax(logits))
            else:
                nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            ids.append(nxt)
            step_ids = torch.tensor([[nxt]], dtype=torch.long)  # (1, 1)
    finally:
        progress.close()
    tokens = _tokens(tokenizer, ids)
    s = _finish(reducer, tokens, generated_start=L)
    return AttentionRun([s], tokens[0], total)
