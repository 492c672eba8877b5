"""``attnkit bench --suite show``: the suite is registered, and its quick case runs end to end
(a tiny GPT-2 built here, ``attnkit show`` and the forward in fresh processes)."""

from __future__ import annotations

import pytest

from attnkit.bench import SUITES, suite_cases
from attnkit.bench.show import SHOW_CASES, run_show_case
from attnkit.bench.show_explain import EXPLAIN_CASES, run_explain_case
from attnkit.commands.bench import table

from tolerance import TIMING_SPREAD_REL

pytest.importorskip("transformers")


def test_the_show_suite_is_its_own() -> None:
    assert SUITES["show"] == ("show_2k", "show_8k", "show_explain_2k")
    assert not set(SUITES["show"]) & set(SUITES["all"])
    assert suite_cases("show") == (*SHOW_CASES, *EXPLAIN_CASES)
    assert EXPLAIN_CASES[0].target == "(show --explain − show) ≤ 3× (forward + backward)"
    assert SHOW_CASES[0].target == "(show − start-up) ≤ 2× forward; page ≤ 20 MiB, peak ≤ 3 GiB"


@pytest.mark.slow  # three fresh processes that load transformers: 14 s of the default run
def test_quick_case_measures_show_start_up_and_forward() -> None:
    r = run_show_case(SHOW_CASES[0], quick=True)
    assert r.error is None, r.error
    f = r.figures
    assert f["show_s"] > 0 and f["startup_s"] > 0 and f["forward_s"] > 0
    if f["show_s"] > f["startup_s"]:
        assert f["ratio"] == pytest.approx(
            (f["show_s"] - f["startup_s"]) / f["forward_s"], rel=TIMING_SPREAD_REL
        )
        assert "(show − start-up) ÷ forward" in table([r])
    else:  # the short text's show within the start-up's noise: no negative duration
        assert "ratio" not in f and r.attnkit_s is None
        assert "show no slower than its start-up" in table([r])
    assert 0 < f["page_mib"] < 1 and 0 < f["peak_gib"] < 4
    assert r.met is None and r.mem_met is None  # quick shapes are not judged


@pytest.mark.slow  # five fresh processes that load transformers
def test_quick_explain_case_measures_explain_against_forward_and_backward() -> None:
    r = run_explain_case(EXPLAIN_CASES[0], quick=True)
    assert r.error is None, r.error
    f = r.figures
    assert f["explain_show_s"] > 0 and f["plain_show_s"] > 0 and f["forward_backward_s"] > 0
    want = (f["explain_show_s"] - f["plain_show_s"]) / f["forward_backward_s"]
    assert f["explain_ratio"] == pytest.approx(want, rel=TIMING_SPREAD_REL)
    assert r.met is None  # quick shapes are not judged
    assert "(show --explain − show) ÷ (forward + backward)" in table([r])


def test_a_show_no_slower_than_its_start_up_reports_no_negative_time() -> None:
    # a --quick run once printed "show_8k -46396.4 µs ... -46.02×"
    from attnkit.bench.runner import CaseResult
    from attnkit.bench.show import _fill

    res = CaseResult("show_8k", SHOW_CASES[1].target, "8,000 tokens", "forward")
    _fill(res, SHOW_CASES[1], [4.427], [4.474], [0.001], [-47.0], 0.5, 1.0, True)
    assert res.attnkit_s is None and res.speedup is None and res.ratios == []
    assert "ratio" not in res.figures and res.figures["show_s"] == 4.427
    row = table([res]).splitlines()[-1]
    assert row.split()[:2] == ["show_8k", "-"]  # no time
    assert "show no slower than its start-up" in row
