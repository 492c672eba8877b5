"""One list of score names for attention(score=...) and ``attnkit explain --score``."""

from __future__ import annotations

import argparse
import re
import typing

import pytest
import torch

import attnkit
from attnkit import _score_names, scores
from attnkit.commands import explain as explain_cmd


def _cli_choices() -> list[str]:
    parser = argparse.ArgumentParser()
    explain_cmd.add_arguments(parser)
    (action,) = [a for a in parser._actions if "--score" in a.option_strings]
    assert action.choices is not None
    return list(action.choices)


def test_cli_offers_exactly_the_shared_names() -> None:
    assert _cli_choices() == list(_score_names.ALL)
    assert set(_score_names.ALL) == set(_score_names.NAMED) | set(_score_names.NEEDS_WEIGHTS)
    assert {"dot", "scaled_dot", "gaussian", "bilinear", "additive"} <= set(_score_names.ALL)


def test_the_type_of_a_score_name_lists_exactly_the_names_attention_takes() -> None:
    # scores.ScoreName is what a type checker offers for attention(score=...).
    assert set(typing.get_args(scores.ScoreName)) == set(_score_names.NAMED)


def test_the_type_of_a_kernel_lists_exactly_the_kernels_nadaraya_watson_takes() -> None:
    from attnkit.nn import classic

    for kernel in typing.get_args(classic.Kernel):
        attnkit.nn.NadarayaWatson(kernel)
    with pytest.raises(ValueError, match="kernel must be one of"):
        attnkit.nn.NadarayaWatson("triangle")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", _score_names.NAMED)
def test_every_plain_name_runs_in_attention(name: str) -> None:
    q = torch.randn(2, 5, 4)  # (B, L, E)
    out = attnkit.attention(q, q, q, score=name)
    assert out.shape == (2, 5, 4)
    assert attnkit.explain(q, q, q, score=name).chosen is not None


@pytest.mark.parametrize("name", sorted(_score_names.NEEDS_WEIGHTS))
def test_names_with_weights_are_refused_naming_the_object(name: str) -> None:
    cls = _score_names.NEEDS_WEIGHTS[name][0]
    q = torch.randn(2, 5, 4)  # (B, L, E)
    with pytest.raises(ValueError, match=rf"score: '{name}' needs learned weights.*scores\."
                       rf"{cls.__name__}\("):  # fmt: skip
        attnkit.attention(q, q, q, score=name)
    # the object the CLI describes for that name runs in attention()
    built = _score_names.build_with_weights(name, 4)
    assert isinstance(built, cls) and built.name == name
    assert attnkit.attention(q, q, q, score=built).shape == (2, 5, 4)


@pytest.mark.parametrize("name", _score_names.ALL)
def test_cli_explains_every_name(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from attnkit.cli import main

    assert main(["explain", "--score", name, "-L", "8", "-E", "4"]) == 0
    assert "chosen:" in capsys.readouterr().out


def test_unknown_name_lists_the_names() -> None:
    q = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="unknown score 'cosine'"):
        attnkit.attention(q, q, q, score="cosine")
    assert isinstance(scores.resolve_score("dot"), scores.Dot)


@pytest.mark.parametrize("name", sorted(_score_names.NEEDS_WEIGHTS))
def test_resolve_score_names_the_object_for_a_score_with_weights(name: str) -> None:
    # its docstring promised the hint; it said only "unknown score"
    how = re.escape(_score_names.NEEDS_WEIGHTS[name][1])
    with pytest.raises(ValueError, match=rf"needs learned weights.*pass a {how} object"):
        scores.resolve_score(name)
