"""Compiled generation through transformers keeps one graph with attnkit, as with sdpa.

With a static KV cache, transformers prepares each decode step's mask ahead of the
compiled forward and hands it in: what changes from step to step (the query's
position, which keys are filled) must reach the graph as tensor data, never as Python
values dynamo guards on. A tiny model of each family generates twice through a
forward compiled with ``fullgraph=True, dynamic=False``; attnkit must build no more
graphs than sdpa (``torch._dynamo.utils.counters``) and give sdpa's tokens. Each
family's check compiles a model twice (seconds on a cold cache): all run under ``slow``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo
import torch._dynamo.utils

transformers = pytest.importorskip("transformers")

import attnkit.integrations.transformers  # noqa: E402,F401  (registers "attnkit")

from tolerance import FLOAT32_CALL_REL, assert_close_to_scale  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB = 100
DECODER = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
           "vocab_size": VOCAB}  # fmt: skip


def _llama() -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**DECODER))


def _qwen3() -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**DECODER))


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB)
    return transformers.AutoModelForCausalLM.from_config(cfg)


FAMILIES: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": _llama,
    "qwen3": _qwen3,
    "gpt2": _gpt2,
}

pytestmark = pytest.mark.torch_feature("compile")


def _graphs_and_tokens(build: Callable[[], torch.nn.Module], implementation: str):  # type: ignore[no-untyped-def]
    """Graphs dynamo built for two static-cache generations of a compiled forward, and
    the tokens of each."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = build().eval()
    model.set_attn_implementation(implementation)
    model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False, backend="eager")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 7), generator=g)
    padding = torch.ones_like(ids)
    padding[1, :2] = 0  # left padding, as generate() pads a batch
    tokens = []
    with torch.no_grad():
        for _ in range(2):
            out = model.generate(input_ids=ids, attention_mask=padding, max_new_tokens=6,
                                 min_new_tokens=6, do_sample=False, pad_token_id=0,
                                 cache_implementation="static")  # fmt: skip
            tokens.append(out)
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"]), tokens


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) for n in sorted(FAMILIES)],
)
def test_static_cache_generation_compiles_as_often_as_sdpa(name: str) -> None:
    sdpa_graphs, sdpa_tokens = _graphs_and_tokens(FAMILIES[name], "sdpa")
    graphs, tokens = _graphs_and_tokens(FAMILIES[name], "attnkit")
    assert sdpa_graphs >= 1  # (the forward was compiled)
    assert graphs <= sdpa_graphs, f"attnkit built {graphs} graphs, sdpa {sdpa_graphs}"
    for ours, theirs in zip(tokens, sdpa_tokens, strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(tokens[0], tokens[1])


@pytest.mark.slow
def test_an_encoder_with_a_tokenizer_s_int64_padding_compiles_under_inductor() -> None:
    """A bidirectional encoder's mask is nothing but key padding, which tokenizers give as
    int64: inductor compiles its lowering (a bool mask padded, then selected at clamped
    columns, did not compile on the CPU) and the compiled forward gives sdpa's numbers."""
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=VOCAB)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    padding = torch.ones_like(ids)  # (B, L) int64, as a tokenizer returns it
    padding[1, 6:] = 0
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(input_ids=ids, attention_mask=padding).last_hidden_state
        model.set_attn_implementation("attnkit")
        torch._dynamo.reset()
        got = torch.compile(model)(input_ids=ids, attention_mask=padding).last_hidden_state
    kept = padding.bool()
    assert_close_to_scale(got[kept], want[kept], rel=FLOAT32_CALL_REL)


@pytest.mark.slow
def test_sliding_window_static_cache_generation_compiles_with_dynamic_shapes() -> None:
    """A sliding-window model (Mistral) with left padding, its forward compiled with
    dynamo's default dynamic shapes: the recompile for the decode steps reads the key
    padding's strides as symbols, where a Python branch on them failed ("Cannot
    construct ConstantVariable for value of type torch.SymInt"). Tokens equal sdpa's."""
    cfg = transformers.MistralConfig(**DECODER, sliding_window=4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 11), generator=g)
    padding = torch.ones_like(ids)
    padding[1, :3] = 0
    tokens = []
    for implementation in ("sdpa", "attnkit"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        model.set_attn_implementation(implementation)
        model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
        with torch.no_grad():
            tokens.append(model.generate(input_ids=ids, attention_mask=padding,
                                         max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                         pad_token_id=0, cache_implementation="static"))  # fmt: skip
    assert torch.equal(tokens[1], tokens[0])
