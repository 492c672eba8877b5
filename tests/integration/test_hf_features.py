"""What the integration learns about the installed transformers, and what it tells.

The record comes from public signatures only; ``attnkit explain --transformers``
prints it and names, for what a release lacks, the release that has it.
"""

from __future__ import annotations

import inspect
import sys

import pytest

transformers = pytest.importorskip("transformers")

import transformers.masking_utils as mu  # noqa: E402

from attnkit.cli import main  # noqa: E402
from attnkit.integrations.transformers import FEATURES, family_reason  # noqa: E402
from attnkit.integrations.transformers.features import version_tuple  # noqa: E402


def test_the_record_reads_the_installed_mask_signature() -> None:
    params = inspect.signature(mu.sdpa_mask).parameters
    assert FEATURES.version == transformers.__version__
    want = "offsets" if "q_length" in params else "cache_position"
    assert FEATURES.mask_positions == want
    # the releases' own history: cache_position up to 5.3.0, q_length from 5.4.0 on
    newer = version_tuple(transformers.__version__) >= (5, 4, 0)
    assert FEATURES.mask_positions == ("offsets" if newer else "cache_position")


def test_families_that_do_not_reach_attnkit_name_the_release_that_does() -> None:
    old = family_reason("t5", "5.14.1")
    assert old is not None and "5.14.1" in old and "5.15.0" in old
    assert family_reason("t5", "5.15.0") is None and family_reason("llama", "5.0.0") is None
    assert "every release" in (family_reason("bloom", "5.24.0") or "")
    assert "every release" in (family_reason("falcon", "5.24.0") or "")
    assert version_tuple("5.15.0.dev0") == (5, 15, 0) and version_tuple("5") == (5, 0, 0)


def test_explain_prints_what_the_installed_transformers_offers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "--transformers"]) == 0
    out = capsys.readouterr().out
    assert f"transformers {transformers.__version__}" in out
    t5 = family_reason("t5")
    assert (t5 if t5 is not None else "T5 reaches attnkit") in out
    assert "5.15.0" in out and "GPT-2" in out


def test_a_deprecated_mask_parameter_is_not_passed() -> None:
    # transformers 5.17 deprecated sdpa_mask's allow_torch_fix (it still takes it, and
    # warns): a parameter no code of the function reads is not passed
    from attnkit.integrations.transformers import features

    def deprecated(a: int, allow_torch_fix: bool = True, **kwargs: object) -> int:
        """allow_torch_fix: Deprecated and has no effect."""
        return a

    def used(a: int, allow_torch_fix: bool = True) -> int:
        return a if allow_torch_fix else -a

    assert not features._reads(deprecated, "allow_torch_fix")
    assert features._reads(used, "allow_torch_fix")
    assert features._reads(len, "anything")  # no source: assume it is read


def test_without_transformers_the_message_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnkit.integrations.transformers import features

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'attnkit\[transformers\]'"):
        features.learn()
