"""Every option of the commands demo, explain and bench, and of ``attnkit`` itself, has
help text that states its default."""

from __future__ import annotations

import argparse
import importlib

import pytest

from attnkit.cli import COMMANDS, TOP_LEVEL_OPTIONS, main

OWNED = ["demo", "explain", "bench"]  # show's options are documented with show


def _parser(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"attnkit {name}")
    module.add_arguments(parser)
    return parser


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


@pytest.mark.parametrize("name", OWNED)
def test_every_option_has_help_with_its_default(name: str) -> None:
    parser = _parser(name)
    formatter = parser._get_formatter()
    options = _options(parser)
    assert options
    for action in options:
        flag = "/".join(action.option_strings)
        assert action.help and action.help is not argparse.SUPPRESS, f"{flag}: no help"
        text = formatter._expand_help(action)
        assert "default:" in text, f"{flag}: help states no default: {text!r}"
        if action.nargs != 0 and action.default not in (None, False):
            assert f"default: {action.default}" in text, f"{flag}: {text!r}"


def test_explain_help_documents_score_mask_and_queries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "-L QUERIES, --queries QUERIES query length L (default: 512)" in out
    assert "(default: scaled_dot)" in out and "scores.Additive(E, E, E)" in out
    assert 'causal: masks.causal("top_left")' in out and "(default: none)" in out


def test_top_level_usage_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flags, what in TOP_LEVEL_OPTIONS.items():
        assert what
        line = next(line for line in out.splitlines() if line.strip().startswith(flags))
        assert line.rstrip().endswith(what)
    assert main(["--version"]) == 0


def test_valid_lens_docstring_names_queries() -> None:
    from attnkit import masks

    doc = masks.valid_lens.__doc__ or ""
    assert "queries:" in doc and "(B, L)" in doc and "(B,)" in doc
