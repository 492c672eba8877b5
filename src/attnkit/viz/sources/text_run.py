"""Running a transformers model on one input with streaming capture, and generating.

:func:`attend` runs an encoder, a decoder or an encoder-decoder once and
:func:`generate` continues a decoder's prompt by N tokens through its KV cache,
each reducing the attention of every layer while it is produced (see
:mod:`attnkit.viz.sources.streaming`). Both return an :class:`AttentionRun` ready
for :func:`attnkit.viz.to_html`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..model_modes import evaluating
from ..options import PageView, ViewOptions
from ..progress import Progress
from ..reduce import Budget, ReducedSet, SetReducer
from ..stream import Router
from ..tokens import TokenText, display_tokens, encoding_tokens
from .streaming import streaming_attention, supports_streaming

__all__ = [
    "AttentionRun",
    "attend",
    "generate",
    "head_dim",
    "kind_of_module",
    "run_header",
    "run_text",
]


@dataclass
class AttentionRun:
    """The attention of one input, ready for :func:`attnkit.viz.to_html`.

    Attributes:
        sets: one reduced set per kind of attention (one for encoders and
            decoders; encoder, decoder and cross for encoder-decoders).
        tokens: the input's tokens as text (the first set's queries).
        total_tokens: how many tokens the input makes before truncation.
        notes: facts about the run for the page (a truncated decoder text).
        used_tokens: how many tokens the model ran on (the prompt's, for a generation);
            0 = as many as ``tokens`` (which counts words in a word view).
        ids: a generation's token ids, prompt then generated (empty for other runs).
        layers: the model's numbers of the layers the sets hold, in their order (empty
            where not recorded).
    """

    sets: list[ReducedSet]
    tokens: list[str]
    total_tokens: int
    notes: list[str] = field(default_factory=list)
    used_tokens: int = 0
    ids: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)


def kind_of_module(name: str) -> str:
    """The kind of attention a module of an encoder-decoder computes, from its name."""
    low = name.lower()
    if "encdec" in low or "encoder_attn" in low or "cross" in low:
        return "cross"
    if low.startswith("encoder") or ".encoder." in low or low.startswith("model.encoder"):
        return "encoder"
    return "decoder"


def _encode(tokenizer: Any, text: str, pair: str | None, **options: Any) -> Any:
    """The tokenizer's encoding of one input, with offsets where the tokenizer gives them."""
    fast = bool(getattr(tokenizer, "is_fast", False))
    return tokenizer(text, pair, add_special_tokens=True, return_offsets_mapping=fast,
                     return_special_tokens_mask=True, **options)  # fmt: skip


def head_dim(config: Any, n_heads: int) -> int:
    """The width of one head's q and k, from a transformers config."""
    for name in ("head_dim", "d_kv", "attention_head_size"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 64
    return max(1, int(width) // max(1, n_heads))


def run_header(tokens: int, n_layers: int, n_heads: int, reducer: SetReducer) -> str:
    """The line printed before a run: tokens, layers × heads and the kind of page."""
    kind = (
        f"long page (block overviews and the top {reducer.store.k} keys of every row)"
        if reducer.store is not None
        else "dense page (every weight)"
    )
    view = " (word view)" if reducer.rows_map is not None and reducer.rows_map.merges else ""
    return f"{tokens:,} tokens, {n_layers} layers × {n_heads} heads, {kind}{view}"


def _forward(model: nn.Module, router: Router, **inputs: Any) -> Any:
    """One forward with streaming capture (or, for models that cannot switch, collected weights)."""
    inputs["return_dict"] = True  # (a config may say False: its outputs are then tuples)
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
            router.done()


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
    view: ViewOptions | None = None,
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
        view: words or tokens, special tokens or not, the neuron window.

    Raises:
        WordsError, WindowError (ValueErrors): the view cannot be made of this input.
    """
    if kind == "encoder-decoder":
        return _attend_seq2seq(model, tokenizer, text, pair if pair is not None else text,
                               max_length, n_layers, n_decoder_layers or n_layers, n_heads,
                               layers, heads, budget, view)  # fmt: skip
    total = len(tokenizer(text, pair, add_special_tokens=True)["input_ids"])
    enc = _encode(tokenizer, text, pair, truncation="longest_first", max_length=max_length)
    ids = list(enc["input_ids"])
    L = len(ids)
    tokens = encoding_tokens(tokenizer, enc, [text] if pair is None else [text, pair])
    page = PageView(view, tokens)
    budget = budget or Budget()
    page.set_window()
    name = "self-attention" + (" (causal)" if kind == "decoder" else "")
    reducer = SetReducer(name, n_layers, n_heads, L, L, layers=layers, heads=heads, budget=budget,
                         **page.reducer_args())  # fmt: skip
    page.check_window(reducer, head_dim(model.config, n_heads))
    progress = Progress(n_layers, "layer", header=run_header(L, n_layers, n_heads, reducer),
                        tokens=L)  # fmt: skip
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
    s = page.finish(reducer.finish(), pair_start=pair_start)
    return AttentionRun([s], s.tokens, total, used_tokens=L)


def _shifted_right(tokens: TokenText, start: str) -> TokenText:
    """The decoder's input: a start token (special), then the target's tokens but the last."""
    words = None if tokens.words is None else [0, *(w + 1 for w in tokens.words[:-1])]
    partial = None if tokens.partial is None else [False, *tokens.partial[:-1]]
    return TokenText(shown=[start, *tokens.shown[:-1]], raw=[start, *tokens.raw[:-1]],
                     special=[True, *tokens.special[:-1]], words=words,
                     word_source=tokens.word_source, partial=partial)  # fmt: skip


def _attend_seq2seq(
    model: nn.Module, tokenizer: Any, text: str, target: str, limit: int, n_enc: int, n_dec: int,
    n_heads: int, layers: Sequence[int] | None, heads: Sequence[int] | None,
    budget: Budget | None, view: ViewOptions | None,
) -> AttentionRun:  # fmt: skip
    total_src = len(tokenizer(text)["input_ids"])
    total_tgt = len(tokenizer(target)["input_ids"])
    src_enc = _encode(tokenizer, text, None, truncation=True, max_length=limit)
    tgt_enc = _encode(tokenizer, target, None, truncation=True, max_length=limit)
    src, tgt_ids = list(src_enc["input_ids"]), list(tgt_enc["input_ids"])
    cfg = model.config
    start = getattr(cfg, "decoder_start_token_id", None)
    if start is None:
        start = getattr(cfg, "pad_token_id", 0) or 0
    dec = [int(start), *tgt_ids[:-1]]  # shifted right, as in training
    L, T = len(src), len(dec)
    src_t = encoding_tokens(tokenizer, src_enc, [text])
    start_raw = str(tokenizer.convert_ids_to_tokens([int(start)])[0])
    dec_t = _shifted_right(encoding_tokens(tokenizer, tgt_enc, [target]), start_raw)
    budget = budget or Budget()
    enc_view, dec_view = PageView(view, src_t), PageView(view, dec_t)
    cross_view = PageView(view, dec_t, src_t)
    d = head_dim(cfg, n_heads)
    enc_layers = [x for x in (layers or range(n_enc)) if x < n_enc]
    dec_layers = [x for x in (layers or range(n_dec)) if x < n_dec]
    enc_view.set_window()
    dec_view.set_window()
    cross_view.window = dec_view.window
    reducers = {
        "encoder": SetReducer("encoder self-attention", n_enc, n_heads, L, L, layers=enc_layers,
                              heads=heads, budget=budget, **enc_view.reducer_args()),
        "decoder": SetReducer("decoder self-attention (causal)", n_dec, n_heads, T, T,
                              layers=dec_layers, heads=heads, budget=budget,
                              **dec_view.reducer_args()),
        "cross": SetReducer("cross-attention (decoder → encoder)", n_dec, n_heads, T, L,
                            layers=dec_layers, heads=heads, positional=False, budget=budget,
                            **cross_view.reducer_args(keys=True)),
    }  # fmt: skip
    enc_view.check_window(reducers["encoder"], d)
    dec_view.check_window(reducers["decoder"], d)
    header = run_header(L, n_enc, n_heads, reducers["encoder"]) + f"; decoder {T:,} tokens"
    progress = Progress(n_enc + 2 * n_dec, "layer", header=header, tokens=L + T)
    router = Router(reducers, kind_of_module, progress)
    x = torch.tensor([src], dtype=torch.long)  # (1, L)
    y = torch.tensor([dec], dtype=torch.long)  # (1, T)
    try:
        _forward(model, router, input_ids=x, attention_mask=torch.ones_like(x),
                 decoder_input_ids=y)  # fmt: skip
    finally:
        progress.close()
    sets = [
        enc_view.finish(reducers["encoder"].finish()),
        dec_view.finish(reducers["decoder"].finish()),
        cross_view.finish(reducers["cross"].finish(), keys=src_t, cross=True),
    ]
    notes = []
    if total_tgt > limit:
        notes.append(f"The decoder text has {total_tgt} tokens; truncated to {limit}.")
    return AttentionRun(sets, sets[0].tokens, total_src, notes, used_tokens=L)


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
    view: ViewOptions | None = None,
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
        view: the neuron window (the word view and dropping special tokens need every
            token before the run: not with generation).
    """
    if view is not None and (view.words or view.drop_special):
        raise ValueError(
            "view: the word view and dropping special tokens need every token before the "
            "run; generated tokens are not known then"
        )
    total = len(tokenizer(text)["input_ids"])
    enc = _encode(tokenizer, text, None, truncation=True, max_length=max(1, max_length - steps))
    prompt = list(enc["input_ids"])
    L = len(prompt)
    n = L + steps
    prompt_t = encoding_tokens(tokenizer, enc, [text])
    budget = budget or Budget()
    blank = TokenText([*prompt_t.shown, *[""] * steps], [*prompt_t.raw, *[""] * steps],
                      [*prompt_t.special, *[False] * steps])  # fmt: skip
    page = PageView(view, blank)
    page.set_window()
    reducer = SetReducer("self-attention (causal)", n_layers, n_heads, n, n, layers=layers,
                         heads=heads, budget=budget, **page.reducer_args())  # fmt: skip
    page.check_window(reducer, head_dim(model.config, n_heads))
    header = run_header(n, n_layers, n_heads, reducer) + f", {steps} of them generated"
    progress = Progress(n_layers * (steps + 1), "layer", header=header, tokens=n)
    router = Router({"self": reducer}, progress=progress)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    ids = list(prompt)
    past = None
    # the cache's keyword and output field: "cache" from transformers 5.24 on (where
    # "past_key_values" is deprecated), "past_key_values" before
    cache = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    step_ids = torch.tensor([prompt], dtype=torch.long)  # (1, L)
    try:
        for t in range(steps + 1):
            out = _forward(model, router, input_ids=step_ids, use_cache=True,
                           **{cache: past})  # fmt: skip
            if t == steps:
                break
            past = out[cache]
            logits = out.logits[0, -1].float()  # (vocab,)
            if gen is None:
                nxt = int(torch.argmax(logits))
            else:
                nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            ids.append(nxt)
            step_ids = torch.tensor([[nxt]], dtype=torch.long)  # (1, 1)
    finally:
        progress.close()
    offsets = enc.get("offset_mapping")
    spans = [*offsets, *[None] * steps] if offsets is not None else None
    tokens = display_tokens(tokenizer, ids, texts=[text], offsets=spans)
    s = page.finish(reducer.finish(), tokens, generated_start=L)
    return AttentionRun([s], s.tokens, total, used_tokens=L, ids=[int(i) for i in ids])


def run_text(
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
    generate_tokens: int = 0,
    seed: int | None = None,
    refuse: Callable[[str], Exception] | None = None,
    **options: Any,
) -> AttentionRun:
    """One text run of a transformers model: :func:`generate` when ``generate_tokens`` > 0
    (a decoder only), else :func:`attend`. The one choice for a model you hold
    (:class:`attnkit.viz.sources.ModelSource`) and a checkpoint folder
    (:class:`attnkit.viz.sources.TransformersSource`).

    Args:
        model, tokenizer, kind, text, pair: as for :func:`attend` (``pair`` is not
            given to :func:`generate`: a generated text continues one prompt).
        max_length, n_layers, n_heads: as for :func:`attend`; n_decoder_layers: an
            encoder-decoder's decoder layers.
        generate_tokens: a decoder generates this many tokens after ``text`` (0: none).
        seed: with ``generate_tokens``, sample with this seed (None: greedy).
        refuse: the error raised for ``generate_tokens`` on a model that is not a decoder,
            made from its kind (default: a ValueError naming the kind).
        **options: ``layers``, ``heads``, ``budget`` and ``view``, as for :func:`attend`.

    Returns:
        an :class:`AttentionRun`. The model runs in eval mode (no dropout); each module's
        ``training`` flag is restored after, even on error.
    """
    if generate_tokens > 0 and kind != "decoder":
        raise (refuse or _not_a_decoder)(kind)
    with evaluating(model):
        if generate_tokens > 0:
            return generate(model, tokenizer, text, generate_tokens, max_length=max_length,
                            n_layers=n_layers, n_heads=n_heads, seed=seed,
                            **options)  # fmt: skip
        return attend(model, tokenizer, kind, text, pair, max_length=max_length,
                      n_layers=n_layers, n_heads=n_heads, n_decoder_layers=n_decoder_layers,
                      **options)  # fmt: skip


def _not_a_decoder(kind: str) -> Exception:
    return ValueError(f"generate: needs a decoder (a causal language model), got an {kind}")
