"""attn_implementation="attnkit" against "eager" on tiny random transformers models.

Each family is built from a config (no download): logits, the weights returned
with output_attentions, the gradients of a loss and 20 greedy tokens of
generate() must agree with the model's own eager attention, and every attention
call must reach attnkit with symbolic masks and the family's score modifiers.
Logits, weights and gradients (float32) are compared relative to each tensor's own
scale (tests/tolerance.py), never element by element: a gradient element near 0
differs by rounding that depends on the CPU's kernels, not on attnkit.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnkit.integrations.transformers as hf_attnkit  # noqa: E402
from attnkit.integrations.transformers import attention as hf_attention  # noqa: E402

from tolerance import FLOAT32_REL, ZERO_GRAD_REL, assert_close_to_scale  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB, LENGTH, PAD = 100, 13, 3
DECODER = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
           "vocab_size": VOCAB, "initializer_range": 0.2}  # fmt: skip


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], torch.nn.Module]
    expect: frozenset[str]  # mask kinds and modifier kinds its calls must show
    kind: str = "decoder"  # "decoder", "encoder" or "seq2seq"


def _causal_lm(config_cls: str, **extra: object) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        cfg = getattr(transformers, config_cls)(**{**DECODER, **extra})
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")

    return build


def _gpt_oss() -> torch.nn.Module:
    model = _causal_lm("GptOssConfig", sliding_window=4, num_local_experts=4,
                       num_experts_per_tok=2, intermediate_size=32)()  # fmt: skip
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)  # sinks that take a real share
    return model


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                                  initializer_range=0.2, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=VOCAB, initializer_range=0.2,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    return transformers.AutoModel.from_config(cfg, attn_implementation="eager")


def _t5() -> torch.nn.Module:
    cfg = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, d_ff=64,
                                num_heads=4, vocab_size=VOCAB, relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, dropout_rate=0.0,
                                decoder_start_token_id=0)  # fmt: skip
    return transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation="eager")


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", _causal_lm("LlamaConfig"), frozenset({"causal", "key_padding"})),
        Family("qwen3", _causal_lm("Qwen3Config"), frozenset({"causal"})),
        Family("mistral", _causal_lm("MistralConfig", sliding_window=4), frozenset({"window"})),
        Family(
            "gemma2",
            _causal_lm(
                "Gemma2Config",
                sliding_window=4,
                attn_logit_softcapping=2.0,
                query_pre_attn_scalar=8,
            ),
            frozenset({"window", "causal", "softcap"}),
        ),
        Family("gpt_oss", _gpt_oss, frozenset({"window", "causal", "sinks"})),
        Family("gpt2", _gpt2, frozenset({"causal"})),
        Family("bert", _bert, frozenset({"key_padding"}), "encoder"),
        Family(
            "t5", _t5, frozenset({"causal", "key_padding", "relative_position_bias"}), "seq2seq"
        ),
    )
}


class Spy:
    """Every attnkit.attention call the integration makes: mask and modifier kinds."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def __call__(self, q, k, v, *, mask=None, mods=None, dropout_p=0.0, **kw):  # type: ignore[no-untyped-def]
        self.calls.append({
            "kinds": set() if mask is None else set(mask.kinds()),
            "mods": {m.kind for m in mods or ()},
            "heads": (q.shape[1], k.shape[1]),
            "dropout_p": dropout_p,
        })  # fmt: skip
        return hf_attention_attention(q, k, v, mask=mask, mods=mods, dropout_p=dropout_p, **kw)


hf_attention_attention = hf_attention.attention


def _models(family: Family, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, ...]:
    """(eager model, the same weights with attnkit's attention); skips a family whose
    attention does not reach attnkit in the installed transformers, naming the release
    that changes it."""
    torch.manual_seed(0)
    eager = family.build().eval().to(dtype)
    reason = hf_attnkit.family_reason(eager.config.model_type)
    if reason is not None:
        pytest.skip(reason)
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation(hf_attnkit.IMPLEMENTATION)
    return eager, ours


def _inputs(family: Family) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Model inputs with padding, and which output positions are real (B, L) bool."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, LENGTH), generator=g)
    mask = torch.ones_like(ids)
    if family.kind == "decoder":
        mask[1, :PAD] = 0  # left padding, as generate() pads
    else:
        mask[1, -PAD:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family.kind == "seq2seq":
        inputs["decoder_input_ids"] = torch.randint(1, VOCAB, (2, 7), generator=g)
        return inputs, torch.ones(2, 7, dtype=torch.bool)
    return inputs, mask.bool()


def _attention_sets(out: object) -> list[tuple[torch.Tensor, ...]]:
    names = ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions")
    return [getattr(out, n) for n in names if getattr(out, n, None)]


@dataclass
class Run:
    """One forward and backward of the eager model and of attnkit's."""

    eager: torch.nn.Module
    ours: torch.nn.Module
    outs: list[object]  # model outputs (eager, ours)
    mains: list[torch.Tensor]  # logits or last hidden states (eager, ours)
    real: torch.Tensor  # (B, L) real output positions
    calls: list[dict[str, object]]  # what attnkit's calls saw


_RUNS: dict[str, Run] = {}


def _run(name: str) -> Run:
    """The family's run, made once for the tests that read it."""
    if name in _RUNS:
        return _RUNS[name]
    family = FAMILIES[name]
    eager, ours = _models(family)
    inputs, real = _inputs(family)
    spy = Spy()
    hf_attention.attention = spy
    try:
        outs, mains = [], []
        for model in (eager, ours):
            out = model(**inputs, output_attentions=True)
            main = out.logits if hasattr(out, "logits") else out.last_hidden_state
            weights = torch.Generator().manual_seed(2)
            grad = torch.randn(main[real].shape, generator=weights, dtype=main.dtype)
            (main[real] * grad).sum().backward()
            outs.append(out)
            mains.append(main.detach())
    finally:
        hf_attention.attention = hf_attention_attention
    _RUNS[name] = Run(eager, ours, outs, mains, real, spy.calls)
    return _RUNS[name]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_logits_and_gradients_equal_eager(name: str) -> None:
    family = FAMILIES[name]
    run = _run(name)
    e_main, a_main = run.mains
    assert_close_to_scale(a_main[run.real], e_main[run.real], what="logits")
    grads = [p.grad for p in run.eager.parameters() if p.grad is not None]
    model_scale = max(float(g.abs().max()) for g in grads)
    named = zip(run.eager.named_parameters(), run.ours.named_parameters(), strict=True)
    for (n, p_e), (_, p_a) in named:
        if p_e.grad is None:
            assert p_a.grad is None, n
            continue
        assert p_a.grad is not None, n
        if float(p_e.grad.abs().max()) < ZERO_GRAD_REL * model_scale:
            error = float((p_a.grad - p_e.grad).abs().max()) / model_scale
            assert error <= FLOAT32_REL, f"{n}.grad: error {error:.3g} of the model's scale"
        else:
            assert_close_to_scale(p_a.grad, p_e.grad, what=f"{n}.grad")
    # Every call went through attnkit with symbolic masks and the family's modifiers.
    assert run.calls
    seen = set().union(*(c["kinds"] | c["mods"] for c in run.calls))  # type: ignore[operator]
    assert family.expect <= seen, seen
    assert not seen & {"keep", "bias"}, seen
    if family.kind == "decoder" and name not in ("gpt2",):
        assert all(c["heads"] == (4, 2) for c in run.calls)  # grouped K/V heads stay grouped


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_weights_equal_eager(name: str) -> None:
    family = FAMILIES[name]
    if name == "gpt2":
        pytest.skip(
            "GPT-2 never passes output_attentions to its attention function (its attention "
            "module keeps it in transformers 5.0.0 to 5.2.0, its model drops it from 5.3.0 "
            f"on; installed: {transformers.__version__}): no implementation but eager can "
            "return its weights; attnkit.viz.capture sees them"
        )
    run = _run(name)
    e_out, a_out = run.outs
    assert len(_attention_sets(a_out)) == (3 if family.kind == "seq2seq" else 1)
    for e_set, a_set in zip(_attention_sets(e_out), _attention_sets(a_out), strict=True):
        assert len(a_set) == len(e_set)
        for layer, (e_w, a_w) in enumerate(zip(e_set, a_set, strict=True)):
            rows = (
                run.real
                if family.kind == "decoder"
                else torch.ones(e_w.shape[0], e_w.shape[2], dtype=torch.bool)
            )
            e_w, a_w = e_w.permute(0, 2, 1, 3)[rows], a_w.permute(0, 2, 1, 3)[rows]  # (rows, H, S)
            assert_close_to_scale(a_w, e_w, what=f"weights of layer {layer}")


@pytest.mark.parametrize("name", sorted(n for n, f in FAMILIES.items() if f.kind != "encoder"))
def test_generate_gives_eager_tokens(name: str, monkeypatch) -> None:
    family = FAMILIES[name]
    eager, ours = _models(family)
    inputs, _ = _inputs(family)
    inputs.pop("decoder_input_ids", None)
    spy = Spy()
    monkeypatch.setattr(hf_attention, "attention", spy)
    tokens = []
    with torch.no_grad():
        for model in (eager, ours):
            tokens.append(model.generate(**inputs, max_new_tokens=8, min_new_tokens=8,
                                         do_sample=False, pad_token_id=0))  # fmt: skip
    assert spy.calls  # the attention reached attnkit
    assert tokens[0].shape[1] >= 8
    assert torch.equal(tokens[1], tokens[0])


def test_packed_sequences_reach_attnkit_as_documents(monkeypatch) -> None:
    """Several sequences packed in one row (position ids restarting, no padding mask, no
    cache): transformers finds the packing and attnkit receives document masks."""
    eager, ours = _models(FAMILIES["llama"])
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2],
                              [0, 1, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4]])  # fmt: skip
    spy = Spy()
    monkeypatch.setattr(hf_attention, "attention", spy)
    with torch.no_grad():
        want = eager(input_ids=ids, position_ids=positions, use_cache=False).logits
        got = ours(input_ids=ids, position_ids=positions, use_cache=False).logits
    assert_close_to_scale(got, want, what="logits")
    kinds = set().union(*(c["kinds"] for c in spy.calls))  # type: ignore[arg-type]
    assert "document" in kinds and not kinds & {"keep", "bias"}, kinds


def test_from_pretrained_and_dropout_in_training(tmp_path, monkeypatch) -> None:
    eager, _ = _models(FAMILIES["llama"])
    eager.config.attention_dropout = 0.25
    eager.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="attnkit"
    )
    spy = Spy()
    monkeypatch.setattr(hf_attention, "attention", spy)
    ids = torch.tensor([[5, 6, 7, 8]])
    model.train()(ids)
    model.eval()(ids)
    assert [c["dropout_p"] for c in spy.calls] == [0.25, 0.25, 0.0, 0.0]


def test_static_cache_generate_gives_eager_tokens() -> None:
    eager, ours = _models(FAMILIES["llama"])
    inputs, _ = _inputs(FAMILIES["llama"])
    with torch.no_grad():
        tokens = [
            m.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                       pad_token_id=0, cache_implementation="static")
            for m in (eager, ours)
        ]  # fmt: skip
    assert torch.equal(tokens[1], tokens[0])


def test_importing_attnkit_imports_no_transformers() -> None:
    code = (
        "import sys, attnkit, attnkit.integrations, attnkit.viz.sources.streaming, attnkit.viz; "
        "sys.exit('transformers' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_float_4d_mask_with_a_fully_blocked_row_equals_eager() -> None:
    """A 4-D float mask in transformers' convention (finfo.min blocks) whose row 0 blocks
    every key: eager (and sdpa) spread that row evenly over all keys, finfo.min + q·k
    being finfo.min, and the later rows read it as a key and value. attnkit must give
    the same row, or every later position moves (25% of the logits when that row was
    the softmax of q·k instead); with the gradients of the same loss."""
    eager, ours = _models(FAMILIES["llama"])
    ids = torch.randint(1, VOCAB, (1, 10), generator=torch.Generator().manual_seed(2))
    keep = torch.ones(10, 10, dtype=torch.bool).tril()
    keep[0] = False
    low = torch.finfo(torch.float32).min
    mask = torch.zeros(1, 1, 10, 10).masked_fill(~keep, low)
    got, want = (m(input_ids=ids, attention_mask=mask).logits for m in (ours, eager))
    assert_close_to_scale(got, want, rel=FLOAT32_REL)
    got.sum().backward()
    want.sum().backward()
    for (name, a), b in zip(ours.named_parameters(), eager.parameters(), strict=True):
        if a.grad is not None and "k_proj.bias" not in name:
            assert_close_to_scale(a.grad, b.grad, rel=FLOAT32_REL, what=name)


def test_a_t5_like_table_that_buckets_otherwise_keeps_its_own_bias() -> None:
    """Pix2Struct's text decoder has T5's table, buckets and distance but no is_decoder
    flag, and buckets one way: its bias must be the model's own, not T5's two-way
    reading of the table (0.26 of the logits before, 1.15 with a sharper table)."""
    cfg = transformers.Pix2StructTextConfig(vocab_size=64, hidden_size=32, d_kv=8, d_ff=64,
                                            num_layers=2, num_heads=4,
                                            relative_attention_num_buckets=8,
                                            relative_attention_max_distance=16,
                                            dropout_rate=0.0)  # fmt: skip
    cfg.initializer_range = 0.3  # (its init reads it; the config does not set it)
    torch.manual_seed(0)
    eager = transformers.Pix2StructTextModel(cfg).double().eval()
    with torch.no_grad():
        for m in eager.modules():
            if getattr(m, "has_relative_attention_bias", False):
                m.relative_attention_bias.weight.normal_(0, 2.0)
    ours = copy.deepcopy(eager)
    eager.set_attn_implementation("eager")
    try:
        ours.set_attn_implementation("attnkit")
    except ValueError:  # (a transformers whose Pix2Struct computes its attention itself)
        pytest.skip("this transformers' Pix2Struct does not take attention functions")
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    got, want = (m(input_ids=ids).logits for m in (ours, eager))
    assert_close_to_scale(got, want, rel=FLOAT32_REL)
    got.sum().backward()
    want.sum().backward()
    for (name, a), b in zip(ours.named_parameters(), eager.parameters(), strict=True):
        if a.grad is not None:
            assert_close_to_scale(a.grad, b.grad, rel=FLOAT32_REL, what=name)


def test_a_t5_table_with_more_added_keeps_the_model_s_bias() -> None:
    """UDOP adds layout distances to its first layer's T5 bias: the bias the model passed
    is not the table's alone, so it stays an additive mask (it was replaced by the
    table's, 6% of the logits)."""
    from attnkit.integrations.transformers.position_bias import position_bias_mod

    torch.manual_seed(0)
    table = torch.nn.Embedding(8, 2)
    module = torch.nn.Module()
    module.has_relative_attention_bias = True
    module.relative_attention_bias = table
    module.relative_attention_num_buckets = 8
    module.relative_attention_max_distance = 16
    module.is_decoder = False
    from attnkit import mods

    made = mods.relative_position_bias(table.weight, 8, 16, True)
    own = made.logits(torch.zeros(1, 2, 5, 5), 5, 5).detach()  # (1, H, L, S)
    mod, mask = position_bias_mod(module, own.clone(), 5, 0, 0)
    assert mod is not None and mask is None  # T5's own: the modifier
    more = own + 0.5 * torch.randn(1, 2, 5, 5)  # (1, H, L, S): T5's and the layout's
    mod, mask = position_bias_mod(module, more, 5, 0, 0)
    assert mod is None and mask is not None
    torch.testing.assert_close(mask.tensor, more, rtol=0, atol=0)
    # the same tensor, once found T5's own, then added to in place: read again
    bias = own.clone()
    assert position_bias_mod(module, bias, 5, 0, 0)[0] is not None
    bias += 0.5
    mod, mask = position_bias_mod(module, bias, 5, 0, 0)
    assert mod is None and mask is not None
    with torch.inference_mode():  # (a tensor without a version: read once, no error)
        bias = own.clone()
        for _ in range(2):
            assert position_bias_mod(module, bias, 5, 0, 0)[0] is not None


def test_what_attnkit_cannot_run_is_refused_by_name() -> None:
    """BLOOM builds its mask through the mask function and adds ALiBi to it; a family
    passing per-query sinks or sparse key selections: clear errors, not a crash inside
    transformers or numbers without the sinks (0.93 of Inkling2's logits)."""
    cfg = transformers.BloomConfig(n_layer=1, hidden_size=16, n_head=2, vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="attnkit")
    ids = torch.randint(1, VOCAB, (1, 5))
    try:
        got = model(ids).logits
    except ValueError as exc:
        assert re.match(r'BLOOM computes its attention .*="sdpa" or "eager" for it$', str(exc))
    else:  # (a release whose BLOOM builds its own mask never asks the mask function)
        model.set_attn_implementation("eager")
        assert_close_to_scale(got, model(ids).logits, rel=FLOAT32_REL)
    q = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    for name in ("sinks", "indices", "block_indices"):
        with pytest.raises(ValueError, match=rf"^{name}: Module passes its attention"):
            hf_attention.attnkit_attention(module, q, q, q, None, **{name: torch.zeros(1)})
    carried = hf_attnkit.attnkit_mask(1, 4, 4)
    for use in (lambda m: m[:, :, :1], lambda m: m + 1.0, lambda m: m.to(torch.float32),
                lambda m: m.size(), lambda m: m.dtype, lambda m: m.device):  # fmt: skip
        with pytest.raises(TypeError, match=r"^attention_mask: this model computes with"):
            use(carried)
    # (XGLM, TrOCR, MVP, LED read .size(), Doge .dtype: an AttributeError before; it still
    # is one, so that hasattr answers)
    assert not hasattr(carried, "dtype") and carried.shape == (1, 1, 4, 4)


def test_a_4d_mask_wider_than_a_sliding_cache_s_keys_is_refused() -> None:
    """A user's (1, 1, 4, 14) mask over every position, after a sliding-window layer kept
    only the last keys: its first columns were taken for them, wrong logits without an
    error (eager and sdpa fail on the sizes)."""
    cfg = transformers.MistralConfig(**{**DECODER, "sliding_window": 8})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model.set_attn_implementation(hf_attnkit.IMPLEMENTATION)
    ids = torch.randint(1, VOCAB, (1, 14), generator=torch.Generator().manual_seed(0))
    q, k = torch.arange(10, 14)[:, None], torch.arange(14)[None]
    keep = (k <= q) & (k > q - 8)  # (4, 14): causal, in the window
    mask4d = torch.zeros(1, 1, 4, 14).masked_fill(~keep, float("-inf"))
    with torch.no_grad():
        cache = model(ids[:, :10], use_cache=True).past_key_values
        with pytest.raises(ValueError, match="covers 14 keys, but the call has"):
            model(ids[:, 10:], attention_mask=mask4d, past_key_values=cache,
                  position_ids=torch.arange(10, 14)[None])  # fmt: skip
