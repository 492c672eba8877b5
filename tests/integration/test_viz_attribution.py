"""viz.explain() against each method's definition, in float64, on tiny offline models.

The references are written here from the papers: the model runs on its own eager
attention with output_attentions=True, autograd gives the gradients of the returned
weights and of each head's output (the input of the output projection), and the
test builds input × gradient, Chefer's R, rollout and Michel's head importance from
them. Integrated gradients and input × gradient are also held to captum's
IntegratedGradients and InputXGradient on the embeddings, with the same baseline,
steps and method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from attnkit import viz  # noqa: E402

from tolerance import (  # noqa: E402
    FLOAT32_STORED_REL,
    FLOAT32_ULPS_REL,
    FLOAT64_MODEL_REL,
    FLOAT64_REL,
    QUADRATURE_REL,
    assert_close_to_scale,
)

transformers.logging.set_verbosity_error()

WORDS = "the cat sat on a mat because it was tired and then slept".split()
TEXT = "the cat sat on a mat because it was tired"
OTHER = "a cat slept on the mat"


def _tokenizer(template: bool) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {t: i for i, t in enumerate([*specials, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]",
    )  # fmt: skip


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(WORDS) + 4,
                                  n_positions=32, initializer_range=0.3, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).double().eval()


def _bert_config(**extra: Any) -> Any:
    return transformers.BertConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
                                   intermediate_size=32, vocab_size=len(WORDS) + 4,
                                   max_position_embeddings=32, initializer_range=0.3,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   **extra)  # fmt: skip


def _bert_classifier() -> torch.nn.Module:
    torch.manual_seed(1)
    cfg = _bert_config(num_labels=3)
    return transformers.BertForSequenceClassification(cfg).double().eval()


def _bert() -> torch.nn.Module:
    torch.manual_seed(2)
    return transformers.BertModel(_bert_config(), add_pooling_layer=False).double().eval()


def _projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each layer's output projection: its input is every head's output, side by side."""
    if hasattr(model, "transformer"):
        return [block.attn.c_proj for block in model.transformer.h]
    encoder = model.bert.encoder if hasattr(model, "bert") else model.encoder
    return [layer.attention.output.dense for layer in encoder.layer]


def _set_eager(model: torch.nn.Module) -> None:
    model.set_attn_implementation("eager")


class Reference:
    """One eager forward and backward of y, with every quantity the methods need."""

    def __init__(self, model: torch.nn.Module, tok: Any, text: str,
                 objective: Callable[[Any], torch.Tensor]) -> None:  # fmt: skip
        _set_eager(model)
        ids = torch.tensor([tok(text)["input_ids"]])
        self.embeds = model.get_input_embeddings()(ids).detach()  # (1, L, D)
        x = self.embeds.clone().requires_grad_(True)
        heads: list[torch.Tensor] = []

        def keep(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            args[0].retain_grad()
            heads.append(args[0])

        hooks = [p.register_forward_pre_hook(keep) for p in _projections(model)]
        try:
            out = model(inputs_embeds=x, output_attentions=True)
        finally:
            for h in hooks:
                h.remove()
        for a in out.attentions:
            a.retain_grad()
        self.y = objective(out)
        self.y.backward()
        n_heads = out.attentions[0].shape[1]
        self.input_x_gradient = (x * x.grad)[0].sum(-1)  # (L,)
        self.attentions = [a[0].detach() for a in out.attentions]  # (H, L, L) each
        self.importance = torch.stack([
            (o * o.grad)[0].reshape(o.shape[1], n_heads, -1).sum(dim=(0, 2)).abs() for o in heads
        ])  # (layers, H)  # fmt: skip
        r = torch.eye(ids.shape[1], dtype=torch.float64)
        for a in out.attentions:
            cam = (a.grad * a)[0].clamp(min=0).mean(0)  # (L, L)
            r = r + cam @ r
        self.chefer = r
        roll = None
        for a in self.attentions:
            m = 0.5 * a.mean(0) + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype)
            m = m / m.sum(-1, keepdim=True)
            roll = m if roll is None else m @ roll
        self.rollout = roll


def _lm_top(out: Any) -> torch.Tensor:
    logits = out.logits[0, -1]
    return logits[logits.argmax()]


def _class_top(out: Any) -> torch.Tensor:
    return out.logits[0, out.logits[0].argmax()]


def _similarity(model: torch.nn.Module, tok: Any) -> Callable[[Any], torch.Tensor]:
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([tok(OTHER)["input_ids"]])).last_hidden_state
    pooled = ref[0].mean(0)

    def y(out: Any) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(
            out.last_hidden_state[0].mean(0), pooled, dim=0
        )

    return y


CASES = {
    "gpt2": (_gpt2, False, lambda m, t: _lm_top, None, -1),
    "bert-classifier": (_bert_classifier, True, lambda m, t: _class_top, None, 0),
    "bert-similarity": (_bert, True, _similarity, OTHER, None),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest) -> Any:
    build, template, objective, compare, row = CASES[request.param]
    model, tok = build(), _tokenizer(template)
    ref = Reference(model, tok, TEXT, objective(model, tok))
    return model, tok, compare, row, ref


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = FLOAT64_MODEL_REL) -> None:
    assert_close_to_scale(got, want, rel=rel)


def test_each_method_is_its_definition(case: Any) -> None:
    model, tok, compare, row, ref = case
    a = viz.explain(model, tok, TEXT, method="attention_x_gradient", compare=compare)
    assert a.target_value == pytest.approx(float(ref.y.detach()), rel=FLOAT64_REL)
    assert a.scores.shape == (len(a.tokens),) == (ref.embeds.shape[1],)
    want_row = ref.chefer.mean(0) if row is None else ref.chefer[row]
    _close(a.relevance, ref.chefer)
    _close(a.scores, want_row)
    _close(a.head_importance, ref.importance)
    x = viz.explain(model, tok, TEXT, method="input_x_gradient", compare=compare)
    _close(x.scores, ref.input_x_gradient)
    _close(x.head_importance, ref.importance)
    r = viz.explain(model, tok, TEXT, method="rollout", compare=compare)
    assert r.head_importance is None
    _close(r.relevance, ref.rollout)
    _close(r.scores, ref.rollout.mean(0) if row is None else ref.rollout[row])
    # the model is back on its own attention
    assert model.config._attn_implementation == "eager"


def _forward_func(model: torch.nn.Module, tok: Any, compare: str | None, target: Any) -> Any:
    if compare is not None:
        with torch.no_grad():
            pooled = (
                model(input_ids=torch.tensor([tok(compare)["input_ids"]]))
                .last_hidden_state[0]
                .mean(0)
            )

        def sim(e: torch.Tensor) -> torch.Tensor:
            h = model(inputs_embeds=e).last_hidden_state.mean(1)  # (k, D)
            return torch.nn.functional.cosine_similarity(h, pooled[None], dim=-1)

        return sim
    if target.kind == "class":
        return lambda e: model(inputs_embeds=e).logits[:, target.index]
    return lambda e: model(inputs_embeds=e).logits[:, target.position, target.index]


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid", "riemann_middle"])
def test_integrated_gradients_equal_captum_and_complete(case: Any, method: str) -> None:
    captum_attr = pytest.importorskip("captum.attr")
    model, tok, compare, _, ref = case
    steps = 64 if method == "gausslegendre" else 9
    ig = viz.explain(model, tok, TEXT, method="integrated_gradients", steps=steps,
                     compare=compare, integration=method)  # fmt: skip
    _set_eager(model)
    fn = _forward_func(model, tok, compare, ig.target)
    want = captum_attr.IntegratedGradients(fn).attribute(
        ref.embeds, baselines=torch.zeros_like(ref.embeds), n_steps=steps, method=method,
        internal_batch_size=16,
    )[0].sum(-1)  # fmt: skip
    _close(ig.scores, want, FLOAT32_STORED_REL)
    _close(ig.head_importance, ref.importance)
    assert ig.baseline_value == pytest.approx(
        float(fn(torch.zeros_like(ref.embeds))[0].detach()), rel=FLOAT64_REL
    )
    if method == "gausslegendre":
        gap = ig.target_value - ig.baseline_value
        assert float(ig.scores.sum()) == pytest.approx(gap, rel=QUADRATURE_REL)
        ixg = (
            captum_attr.InputXGradient(fn)
            .attribute(ref.embeds.clone().requires_grad_(True))[0]
            .sum(-1)
        )
        _close(
            viz.explain(model, tok, TEXT, method="input_x_gradient", compare=compare).scores, ixg
        )


def test_language_model_targets() -> None:
    model, tok = _gpt2(), _tokenizer(False)
    _set_eager(model)
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0]  # (L, V)
    mat = tok.convert_tokens_to_ids("mat")
    a = viz.explain(model, tok, TEXT, target=(3, "mat"), method="input_x_gradient")
    assert (a.target.kind, a.target.position, a.target.index) == ("next_token", 3, mat)
    assert a.target_value == pytest.approx(float(logits[3, mat]), rel=FLOAT64_REL)
    assert torch.all(a.scores[4:] == 0) and torch.any(a.scores[:4] != 0)  # causal: 0..3 only
    b = viz.explain(model, tok, TEXT, target=-2, method="rollout")
    assert b.target.position == len(b.tokens) - 2
    assert b.target.index == int(logits[-2].argmax())
    c = viz.explain(model, tok, TEXT, target="cat")
    assert (c.target.position, c.target.index) == (len(c.tokens) - 1, 1 + WORDS.index("cat") + 3)
    assert c.target_value == pytest.approx(float(logits[-1, c.target.index]), rel=FLOAT64_REL)


def test_classifier_targets_by_index_and_name() -> None:
    model, tok = _bert_classifier(), _tokenizer(True)
    model.config.id2label = {0: "neg", 1: "neutral", 2: "pos"}
    model.config.label2id = {"neg": 0, "neutral": 1, "pos": 2}
    a = viz.explain(model, tok, TEXT, target="pos", method="input_x_gradient")
    b = viz.explain(model, tok, TEXT, target=2, method="input_x_gradient")
    assert a.target == b.target and a.target.label == "pos" and a.target.position == 0
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=0)


def test_grouped_query_heads_are_exact() -> None:
    """∂y/∂A read as (∂y/∂o)·Vᵀ with one key/value head serving two query heads."""
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=32,
                                   vocab_size=len(WORDS) + 4, initializer_range=0.3)  # fmt: skip
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    tok = _tokenizer(False)
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    ref_model_heads = [layer.self_attn.o_proj for layer in model.model.layers]
    _set_eager(model)
    x = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    heads: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        args[0].retain_grad()
        heads.append(args[0])

    hooks = [m.register_forward_pre_hook(keep) for m in ref_model_heads]
    out = model(inputs_embeds=x, output_attentions=True)
    for h in hooks:
        h.remove()
    for w in out.attentions:
        w.retain_grad()
    _lm_top(out).backward()
    r = torch.eye(ids.shape[1], dtype=torch.float64)
    for w in out.attentions:
        r = r + (w.grad * w)[0].clamp(min=0).mean(0) @ r
    importance = torch.stack([(o * o.grad)[0].reshape(o.shape[1], 2, -1).sum(dim=(0, 2)).abs()
                              for o in heads])  # fmt: skip
    a = viz.explain(model, tok, TEXT)
    # Llama's eager attention takes its softmax in float32, whatever the model's dtype
    _close(a.relevance, r, FLOAT32_ULPS_REL)
    _close(a.head_importance, importance, FLOAT32_ULPS_REL)


def test_checkpoint_folder(tmp_path: Any) -> None:
    model, tok = _gpt2().float(), _tokenizer(False)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    a = viz.explain(tmp_path, None, TEXT, method="input_x_gradient")
    b = viz.explain(model, tok, TEXT, method="input_x_gradient")
    assert a.tokens == b.tokens and a.target == b.target
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=0)


def test_errors_before_compute() -> None:
    gpt2, bert, tok = _gpt2(), _bert(), _tokenizer(False)

    def refuse(module: Any, args: Any, kwargs: Any) -> None:
        raise AssertionError("the model ran")

    for m in (gpt2, bert):
        m.register_forward_pre_hook(refuse, with_kwargs=True)
    bad = [
        (gpt2, {"method": "saliency"}, "method"),
        (gpt2, {"method": "integrated_gradients", "steps": 0}, "steps"),
        (gpt2, {"integration": "simpson"}, "integration"),
        (gpt2, {"target": 99}, "target"),
        (gpt2, {"target": "cat mat"}, "target"),
        (gpt2, {"target": 1.5}, "target"),
        (gpt2, {"compare": OTHER}, "compare"),
        (bert, {}, "compare"),
        (bert, {"compare": OTHER, "target": 0}, "target"),
    ]
    for model, kwargs, name in bad:
        with pytest.raises(ValueError, match=f"^{name}: "):
            viz.explain(model, tok, TEXT, **kwargs)
    with pytest.raises(ValueError, match=r"^text: "):
        viz.explain(gpt2, tok, "  ")
    with pytest.raises(TypeError, match=r"^tokenizer: "):
        viz.explain(gpt2, None, TEXT)
    with pytest.raises(ValueError, match=r"^target: 'dog' is not in this tokenizer's vocabulary"):
        viz.explain(gpt2, tok, TEXT, target="dog")  # (one token: the unknown one)
    wide = _tokenizer(False)
    wide.add_tokens([f"w{i}" for i in range(40)])  # ids past the model's 17 rows
    with pytest.raises(ValueError, match=r"^text: ids \[\d+\] are not in the model's vocabulary"):
        viz.explain(gpt2, wide, TEXT + " w39")


def test_generation_errors_before_compute() -> None:
    gpt2, tok = _gpt2(), _tokenizer(False)
    gpt2.register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    ids = tok(TEXT)["input_ids"]
    for bad, pattern in (
        ([*ids, 10**6], r"^ids: ids \[1000000\] are not in the model's vocabulary"),
        ([*ids, -5], r"^ids: ids \[-5\]"),
        ([*ids, 1.5], r"^ids: expected token ids"),
        (ids * 4, r"^ids: 40 ids, more than the 32 positions"),
    ):
        with pytest.raises(ValueError, match=pattern):
            viz.explain_generation(gpt2, tok, bad, 3)


def test_the_caller_s_modes_are_kept() -> None:
    """explain runs the model in eval mode with autograd on, and hands it back as it was:
    in train mode with its dropout, inside the caller's no_grad or inference_mode."""
    model, tok = _gpt2(), _tokenizer(False)
    want = viz.explain(model, tok, TEXT, method="input_x_gradient")
    model.train()
    model.transformer.h[0].attn.eval()  # (a module in its own mode is kept too)
    modes = {name: m.training for name, m in model.named_modules()}
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            got = viz.explain(model, tok, TEXT, method="input_x_gradient")
            steps = viz.explain_generation(model, tok, tok(TEXT)["input_ids"], 8)
        torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=0)
        assert steps.scores.shape == (2, 9)
        assert {name: m.training for name, m in model.named_modules()} == modes


def test_a_decoder_classifier_explains_the_token_it_pools() -> None:
    """A decoder classifier pools its last token that is not padding: with the padding id
    at the end of the text (pad = eos, as fine-tuned GPT-2s have it), the logits
    explained are those of model(input_ids), at the pooled position."""
    from tokenizers import processors

    tok = _tokenizer(False)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A [PAD]", special_tokens=[("[PAD]", 0)]
    )
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(WORDS) + 4,
                                  n_positions=32, initializer_range=0.3, num_labels=3,
                                  pad_token_id=0)  # fmt: skip
    torch.manual_seed(5)
    model = transformers.GPT2ForSequenceClassification(cfg).double().eval()
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    assert int(ids[0, -1]) == 0
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]  # (C,)
    a = viz.explain(model, tok, TEXT, method="input_x_gradient")
    assert a.target.index == int(logits.argmax())
    assert a.target_value == pytest.approx(float(logits.max()), rel=FLOAT64_REL)
    b = viz.explain(model, tok, TEXT, target=a.target.index)
    assert b.target.position == ids.shape[1] - 2  # (the last token that is not padding)
    assert_close_to_scale(b.scores, b.relevance[ids.shape[1] - 2], rel=0.0)


def test_a_bidirectional_lm_head_is_not_taken_as_causal() -> None:
    """A BertLMHeadModel built without is_decoder attends both ways although its class
    name says LM head: Chefer's R is the full product at a length where a causal model's
    would skip the upper half (above 256 tokens)."""
    cfg = _bert_config()
    cfg.max_position_embeddings = 320
    torch.manual_seed(6)
    model = transformers.BertLMHeadModel(cfg).double().eval()
    tok = _tokenizer(False)
    text = " ".join(WORDS[i % len(WORDS)] for i in range(300))
    ref = Reference(model, tok, text, _lm_top)
    a = viz.explain(model, tok, text)
    assert len(a.tokens) == 300  # (every word is one token)
    _close(a.relevance, ref.chefer)


def test_integrated_gradients_of_a_decoder_classifier_without_a_pad_id() -> None:
    """GPT-2's classifier has no pad_token_id by default, and transformers refuses it more
    than one row: integrated gradients, several points a forward, pools each row's last
    token all the same, and equals captum's (which runs one point a forward here)."""
    captum_attr = pytest.importorskip("captum.attr")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(WORDS) + 4,
                                  n_positions=32, initializer_range=0.3, num_labels=3)  # fmt: skip
    torch.manual_seed(6)
    model = transformers.GPT2ForSequenceClassification(cfg).double().eval()
    assert model.config.pad_token_id is None
    tok = _tokenizer(False)
    ig = viz.explain(model, tok, TEXT, method="integrated_gradients", steps=8)
    assert model.config.pad_token_id is None
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    embeds = model.get_input_embeddings()(ids).detach()  # (1, L, D)
    index = ig.target.index
    want = captum_attr.IntegratedGradients(
        lambda e: model(inputs_embeds=e).logits[:, index]
    ).attribute(embeds, baselines=torch.zeros_like(embeds), n_steps=8,
                internal_batch_size=1)[0].sum(-1)  # fmt: skip
    _close(ig.scores, want, FLOAT32_STORED_REL)


def test_a_config_that_returns_tuples_is_explained() -> None:
    """return_dict=False in a model's config: explain asks for its output record."""
    model, tok = _bert_classifier(), _tokenizer(True)
    want = viz.explain(model, tok, TEXT, method="input_x_gradient")
    model.config.return_dict = False
    got = viz.explain(model, tok, TEXT, method="input_x_gradient")
    assert got.target == want.target
    torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=0)


def test_integer_like_targets_and_captum_s_riemann_floor() -> None:
    """A numpy integer or a 0-d tensor (a model's argmax) is a target like an int; a
    Riemann sum needs 2 points, as in captum."""
    np = pytest.importorskip("numpy")
    model, tok = _gpt2(), _tokenizer(False)
    want = viz.explain(model, tok, TEXT, target=3, method="input_x_gradient")
    for target in (np.int64(3), torch.tensor(3)):
        got = viz.explain(model, tok, TEXT, target=target, method="input_x_gradient")
        assert got.target == want.target
    for integration in ("riemann_left", "riemann_right", "riemann_middle"):
        with pytest.raises(ValueError, match=r"^steps: expected an int >= 2, got 1"):
            viz.explain(model, tok, TEXT, method="integrated_gradients", steps=1,
                        integration=integration)  # fmt: skip


def test_a_caller_s_autocast_leaves_the_attribution_in_the_model_s_dtype() -> None:
    # under bfloat16 autocast most tokens' relevance rounded to one value once
    model, tok = _gpt2().float(), _tokenizer(False)
    want = viz.explain(model, tok, TEXT, method="attention_x_gradient")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = viz.explain(model, tok, TEXT, method="attention_x_gradient")
    assert got.scores.dtype == torch.float32
    assert torch.equal(got.scores, want.scores)
    assert torch.equal(got.head_importance, want.head_importance)
