"""The performance page's plots: read from BENCHMARKS.md's tables, and loud where they cannot be."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hook() -> ModuleType:
    path = ROOT / "docs" / "hooks" / "benchmarks.py"
    spec = importlib.util.spec_from_file_location("docs_hook_benchmarks_plots", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _hook()

SMALL = """\
# Benchmarks

```
| case | not | a table |
|---|---|---|
```

## Run of record for this revision (a machine)

| case | shape | speedup | target | met | attnkit MiB | baseline MiB |
|---|---|---|---|---|---|---|
| dense | B=4 | 0.99× | ≥ 0.95× SDPA | yes | 17.9 | 17.5 |
| additive | B=2 | 10.37× | ≥ 10×, ≤ 1/50 memory | yes | 12.5 | 2050.5 |
| additive_16k | B=1 | - | < 512 MiB extra | yes | 49.9 | - |
| gaussian | B=4 | 0.83× | ≥ 1/1.1× SDPA | **no** | 25.6 | 9.4 |

## Overhead suite (CPU)

| case | 1 thread: attnkit | baseline | speedup, extra | 2 threads: attnkit | baseline | speedup, extra | target | met |
|---|---|---|---|---|---|---|---|---|
| call | 19.2 µs | 14.2 µs | 0.74×, +5.0 µs | 14.7 µs | 9.7 µs | 0.66×, +5.0 µs | ≤ SDPA + 10 µs | yes |
| layer | 27.6 µs | 36.8 µs | 1.33×, −9.1 µs | 27.3 µs | 36.8 µs | 1.35×, −9.4 µs | ≤ 1.1× torch's time | yes |
| compiled | 479 µs | 426 µs | 0.89×, +53.8 µs | 274 µs | 229 µs | 0.84×, +45.0 µs | ≤ 1.05×, 0 breaks | **no** |

## Models suite (CPU)

| case | speedup | target | met | attnkit MiB | baseline MiB |
|---|---|---|---|---|---|
| llama | 1.00× | ≥ 0.95× sdpa | yes | 81.9 | 74.8 |
| sinks | 4.91× | - | - | 16.7 | 1538.6 |

## GPU suite (a GPU, a day)

| case | speedup | target | met | attnkit MiB | peer MiB |
|---|---|---|---|---|---|
| dense_fwd | 0.87× | ≥ 0.98× | no | 129 | 64 |
| weights | 0.22× | ≤ 1.3 × (plain + copy floor 0.06 ms) | no | 368 | 32 |
"""


def test_tables_are_read_with_their_heading_and_cells() -> None:
    tables = hook.parse_tables(SMALL)
    assert [t.heading for t in tables] == [
        "Run of record for this revision (a machine)",
        "Overhead suite (CPU)",
        "Models suite (CPU)",
        "GPU suite (a GPU, a day)",
    ]  # the one in a code block is not a table
    overhead = tables[1]
    assert overhead.columns[2:4] == ("baseline", "speedup, extra")
    assert overhead.columns[5:7] == ("baseline (2)", "speedup, extra (2)")
    assert overhead.rows[1]["speedup, extra (2)"] == "1.35×, −9.4 µs"
    assert SMALL.splitlines()[tables[0].end].startswith("| gaussian ")


def test_the_plots_carry_the_tables_numbers() -> None:
    drawn = hook.figures(SMALL)
    speed, memory = drawn["cpu"][1]
    assert speed.cases == ("dense", "additive", "additive_16k", "gaussian")
    assert speed.series[0].values == (0.99, 10.37, None, 0.83)
    assert speed.targets == pytest.approx((0.95, 10.0, None, 1 / 1.1), nan_ok=True)
    assert memory.series[0].values == pytest.approx((17.5 / 17.9, 2050.5 / 12.5, None, 9.4 / 25.6))
    assert memory.targets == (None, 50.0, None, None)
    (overhead,) = drawn["overhead"][1]
    assert [s.label for s in overhead.series] == ["1 thread", "2 threads"]
    assert overhead.series[0].values == (0.74, 1.33, 0.89)
    assert overhead.series[1].values == (0.66, 1.35, 0.84)
    assert overhead.targets == pytest.approx((None, 1 / 1.1, 1 / 1.05), nan_ok=True)
    assert drawn["models"][1][0].targets == (0.95, None)
    gpu_speed, gpu_memory = drawn["gpu"][1]
    assert gpu_speed.series[0].values == (0.87, 0.22)
    assert gpu_speed.targets == (0.98, None)
    assert gpu_memory.series[0].values == pytest.approx((64 / 129, 32 / 368))


def test_every_plot_of_the_repository_matches_its_table() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    drawn = hook.figures(text)
    assert set(drawn) == {p.name for p in hook.PLOTS}
    for plot in hook.PLOTS:
        table, charts = drawn[plot.name]
        rows = text.splitlines()[: table.end + 1][-len(table.rows) :]
        assert [r.split("|")[1].strip() for r in rows] == list(charts[0].cases)
        for (_, column), series in zip(plot.speed, charts[0].series, strict=True):
            for row, value in zip(table.rows, series.values, strict=True):
                cell = row[column]
                expected = None if cell == "-" else float(re.match(r"[*]*([\d.]+)×", cell)[1])
                assert value == expected, (plot.name, row["case"], cell)
        assert any(v is not None for v in charts[0].series[0].values)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("## Models suite (CPU)", "## Model suite"), "0 tables"),
        (("| case | speedup | target | met | attnkit MiB | baseline", "| case | speed | target | met | attnkit MiB | baseline"), "no column"),
        (("| 4.91× |", "| fast |"), "not a ratio: 'fast'"),
        (("| 81.9 |", "| 81.9 MiB |"), "not a size in MiB"),
        (("≥ 0.98× | no", "about 1× | no"), "a target in a form"),
        (("| dense_fwd | 0.87× |", "| dense_fwd | 0.87× | extra |"), "cells for"),
    ],
)  # fmt: skip
def test_a_table_the_plots_cannot_read_is_an_error(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in SMALL
    with pytest.raises(hook.TableError, match=re.escape(message)):
        hook.figures(SMALL.replace(old, new, 1))


def test_the_page_places_each_plot_under_its_table() -> None:
    text = hook.benchmarks_markdown("guides")
    for plot in hook.PLOTS:
        image = f'<img src="../images/benchmarks/{plot.name}.svg"'
        assert text.count(image) == 1, plot.name
        before = text.split(image)[0].splitlines()
        assert before[-1] == '<figure class="benchmark-plot">', plot.name
        assert before[-3].startswith("| "), plot.name  # the table's last row, a blank line


def test_a_plot_is_an_svg_with_its_cases() -> None:
    pytest.importorskip("matplotlib")
    _, charts = hook.figures(SMALL)["cpu"]
    svg = hook.draw("CPU", charts).decode()
    assert svg.startswith("<?xml") and "<svg" in svg
    for case in charts[0].cases:
        assert case in svg
    assert not re.search(r"(?:href|src)=\"(?:https?:)?//", svg)
