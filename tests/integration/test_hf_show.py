"""`attnkit show --model` on today's families: every layer streamed through attnkit.

The viewer switches a transformers model to attn_implementation="attnkit" and
reduces each attention call's exact weights as it happens. The reduced weights
must equal the model's own eager weights for families with grouped K/V heads,
sliding windows, softcapping, sinks and T5's relative position bias, also when
the recorder takes the heads a few at a time, and no family may fall back to
the eager weights.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.integrations.transformers import attention as hf_attention  # noqa: E402
from attnkit.integrations.transformers import family_reason  # noqa: E402
from attnkit.viz import stream  # noqa: E402
from attnkit.viz.sources import text_run as hf_run  # noqa: E402

from tolerance import FLOAT32_CHAIN_REL, assert_close_to_scale  # noqa: E402

transformers.logging.set_verbosity_error()

WORDS = "the cat sat on a mat because it was tired and then slept".split()
TEXT = "the cat sat on a mat because it was tired and then it slept on the mat"


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "</s>", *WORDS])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]", eos_token="</s>"
    )


def _decoder(name: str) -> torch.nn.Module:
    common = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32,
              "vocab_size": 32, "initializer_range": 0.2}  # fmt: skip
    extra = {
        "gemma2": {"sliding_window": 4, "attn_logit_softcapping": 2.0, "query_pre_attn_scalar": 8},
        "gpt_oss": {"sliding_window": 4, "num_local_experts": 2, "num_experts_per_tok": 1},
        "qwen3": {},
    }[name]
    cfg = transformers.AutoConfig.for_model(name, **common, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    if name == "gpt_oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    return model.eval()


@pytest.fixture(autouse=True)
def no_fallback(monkeypatch) -> None:
    def refuse(out, router):
        raise AssertionError("the model's attention did not reach attnkit")

    monkeypatch.setattr(hf_run, "_feed_collected", refuse)


@pytest.mark.parametrize(
    ("name", "chunked"),
    [("gemma2", False), ("gemma2", True), ("gpt_oss", True), ("qwen3", False)],
    ids=["gemma2-whole", "gemma2-row_blocks", "gpt_oss-row_blocks", "qwen3-whole"],
)
def test_decoders_stream_their_eager_weights(name: str, chunked: bool, tok, monkeypatch) -> None:
    if chunked:
        monkeypatch.setattr(stream, "BLOCK_CELLS", 1)  # one query row (and its keys) at a time
    model = _decoder(name)
    (s,) = hf_run.attend(model, tok, "decoder", TEXT, max_length=64, n_layers=2, n_heads=4).sets
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    calls: list[int] = []
    through = hf_attention.attention
    monkeypatch.setattr(
        hf_attention, "attention", lambda *a, **k: calls.append(1) or through(*a, **k)
    )
    with torch.no_grad():
        want = torch.stack([a[0] for a in model(ids, output_attentions=True).attentions])
    assert not calls  # switched back: the plain forward is the model's eager attention
    assert_close_to_scale(s.dense, want.numpy(), rel=FLOAT32_CHAIN_REL)


def test_t5_streams_encoder_decoder_and_cross_attention(tok) -> None:
    reason = family_reason("t5")
    if reason is not None:
        pytest.skip(reason)  # (attnkit show then reads the eager weights instead)
    cfg = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, d_ff=32,
                                num_heads=4, vocab_size=32, relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, decoder_start_token_id=0,
                                dropout_rate=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation="eager").eval()
    target = "it was tired"
    run = hf_run.attend(model, tok, "encoder-decoder", TEXT, target, max_length=64, n_layers=2,
                        n_heads=4, n_decoder_layers=2)  # fmt: skip
    src = torch.tensor([tok(TEXT)["input_ids"]])
    dec = torch.tensor([[0, *tok(target)["input_ids"][:-1]]])
    with torch.no_grad():
        out = model(input_ids=src, decoder_input_ids=dec, output_attentions=True)
    sets = (out.encoder_attentions, out.decoder_attentions, out.cross_attentions)
    for s, weights in zip(run.sets, sets, strict=True):
        want = torch.stack([w[0] for w in weights]).numpy()
        assert_close_to_scale(s.dense, want, rel=FLOAT32_CHAIN_REL)
