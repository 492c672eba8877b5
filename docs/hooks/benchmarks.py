"""mkdocs hook: the performance page carries BENCHMARKS.md as it is in the repository.

A page holding the line ``<!-- BENCHMARKS.md -->`` gets, in its place, the body of the
repository's BENCHMARKS.md (its title left out, each heading one level down), so the
site's figures are the measured ones and never a copy that drifts. A link from that
file to a page of the site is pointed at the page; a link to another file of the
repository becomes its plain text.

The tables of the suites in ``PLOTS`` are also drawn, read from those same tables when
the site is built: one SVG per suite under ``images/benchmarks/`` of the site, placed
right under its table, with each case's ratio against its peer as a bar and its target
as a line. A table that cannot be read (its section gone, a column renamed, a cell
that is neither a figure nor ``-``, a target in a form not known here) fails the build
with a ``PluginError`` naming it, rather than leaving a plot out or drawing a wrong one.
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path
from typing import Any, NamedTuple

MARKER = "<!-- BENCHMARKS.md -->"
ROOT = Path(__file__).resolve().parents[2]
IMAGES = "images/benchmarks"


class TableError(ValueError):
    """A table of BENCHMARKS.md that the plots cannot be drawn from."""


class Table(NamedTuple):
    """A Markdown table: the heading it sits under, its columns and its rows of cells.

    A column name repeated in the header gets `` (2)``, `` (3)``... after its first
    use, so every column has its own key. ``end`` is the index of the table's last line.
    """

    heading: str
    columns: tuple[str, ...]
    rows: tuple[dict[str, str], ...]
    end: int


class Series(NamedTuple):
    """One set of bars: a label and, per case, a ratio (None: the table gives none)."""

    label: str
    values: tuple[float | None, ...]


class Panel(NamedTuple):
    """One chart: its cases, its series, a target line per case and the axis label."""

    title: str
    cases: tuple[str, ...]
    series: tuple[Series, ...]
    targets: tuple[float | None, ...]
    xlabel: str
    digits: str = ".2f"


class Plot(NamedTuple):
    """How to draw one suite from its table.

    Attributes:
        name: the file name (``images/benchmarks/NAME.svg``).
        heading: the start of the heading the table sits under.
        title: the plot's title.
        speed: (series label, column) for each speed ratio drawn.
        memory: the (attnkit MiB, peer MiB) columns, or None where the table has none.
    """

    name: str
    heading: str
    title: str
    speed: tuple[tuple[str, str], ...] = (("speedup", "speedup"),)
    memory: tuple[str, str] | None = None


PLOTS: tuple[Plot, ...] = (
    Plot(
        "cpu",
        "Run of record for this revision",
        "CPU suite, run of record",
        memory=("attnkit MiB", "baseline MiB"),
    ),
    Plot(
        "overhead",
        "Overhead suite (CPU)",
        "Overhead suite (CPU)",
        speed=(("1 thread", "speedup, extra"), ("2 threads", "speedup, extra (2)")),
    ),
    Plot(
        "models",
        "Models suite (CPU)",
        "Models suite (CPU)",
        memory=("attnkit MiB", "baseline MiB"),
    ),
    Plot(
        "gpu",
        "GPU suite",
        "GPU suite (one run, indicative)",
        memory=("attnkit MiB", "peer MiB"),
    ),
)

TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")
_RATIO = re.compile(r"^(?:\*\*)?(\d+(?:\.\d+)?)×")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
# Targets with a line: "≥ 2×", "≥ 1/1.1× SDPA" (attnkit's speedup at least that), and
# "≤ 1.1× torch's time", "≤ 1.05×, 0 breaks" (attnkit's time at most that: speedup ≥ 1/x).
_AT_LEAST = re.compile(r"^≥ (?:(\d+(?:\.\d+)?)/)?(\d+(?:\.\d+)?)×")
_AT_MOST = re.compile(r"^≤ (\d+(?:\.\d+)?)×(?:,| torch's time| SDPA|$)")
_MEMORY = re.compile(r"≤ 1/(\d+(?:\.\d+)?) memory")
# Targets that are not a ratio of times: no line. Any other form is an error.
_NO_LINE = re.compile(
    r"^(-|linear memory|< \d+ MiB extra|≤ SDPA \+ \d+ µs|≤ [\d.]+ × \(plain \+ copy floor.*\))$"
)


def _cells(line: str) -> list[str]:
    """The cells of a table row (a ``\\|`` stays inside its cell)."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def parse_tables(text: str) -> list[Table]:
    """Every table of ``text`` (Markdown) outside code blocks, with its heading."""
    lines = text.splitlines()
    tables: list[Table] = []
    heading = ""
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(lines[i])):
            heading = match.group(2)
        elif (
            not fenced
            and line.startswith("|")
            and i + 1 < len(lines)
            and _SEPARATOR.match(lines[i + 1].strip())
        ):
            columns: list[str] = []
            for name in _cells(line):
                repeat = sum(1 for c in columns if c == name or c.startswith(f"{name} ("))
                columns.append(name if repeat == 0 else f"{name} ({repeat + 1})")
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                cells = _cells(lines[j])
                if len(cells) != len(columns):
                    raise TableError(
                        f"BENCHMARKS.md, table under {heading!r}, line {j + 1}: "
                        f"{len(cells)} cells for {len(columns)} columns"
                    )
                rows.append(dict(zip(columns, cells, strict=True)))
                j += 1
            tables.append(Table(heading, tuple(columns), tuple(rows), j - 1))
            i = j
            continue
        i += 1
    return tables


def ratio(cell: str) -> float | None:
    """``"2.03×"``, ``"0.74×, +5.0 µs"`` or ``"**0.5×**"`` -> the ratio; ``"-"`` -> None."""
    if cell == "-":
        return None
    match = _RATIO.match(cell)
    if match is None:
        raise TableError(f"not a ratio: {cell!r}")
    return float(match.group(1))


def mebibytes(cell: str) -> float | None:
    """``"17.9"`` -> 17.9; ``"-"`` -> None."""
    if cell == "-":
        return None
    if not _NUMBER.match(cell):
        raise TableError(f"not a size in MiB: {cell!r}")
    return float(cell)


def targets(cell: str) -> tuple[float | None, float | None]:
    """A target cell -> (the least speedup, the least peer ÷ attnkit memory), None where it sets none."""
    memory = _MEMORY.search(cell)
    least_memory = float(memory.group(1)) if memory else None
    if match := _AT_LEAST.match(cell):
        if match.group(1):  # "≥ 1/1.1×"
            return float(match.group(1)) / float(match.group(2)), least_memory
        return float(match.group(2)), least_memory
    if match := _AT_MOST.match(cell):
        return 1.0 / float(match.group(1)), least_memory
    if _NO_LINE.match(cell):
        return None, least_memory
    raise TableError(f"a target in a form the plots do not read: {cell!r}")


def table_for(tables: list[Table], plot: Plot) -> Table:
    """The one table under ``plot.heading`` that has a ``case`` column."""
    found = [t for t in tables if t.heading.startswith(plot.heading) and "case" in t.columns]
    if len(found) != 1:
        raise TableError(
            f"BENCHMARKS.md: {len(found)} tables with a 'case' column under a heading "
            f"starting {plot.heading!r}, where the {plot.name!r} plot needs exactly one"
        )
    return found[0]


def panels(table: Table, plot: Plot) -> list[Panel]:
    """The charts of one suite: speed ratios, and peak-memory ratios where the table has them."""
    needed = ["case", "target", *(column for _, column in plot.speed), *(plot.memory or ())]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise TableError(
            f"BENCHMARKS.md, table under {table.heading!r}: no column {missing} "
            f"(it has {list(table.columns)})"
        )
    try:
        cases = tuple(row["case"] for row in table.rows)
        goals = [targets(row["target"]) for row in table.rows]
        speed = tuple(
            Series(label, tuple(ratio(row[column]) for row in table.rows))
            for label, column in plot.speed
        )
        result = [
            Panel(
                "speed: peer's time ÷ attnkit's (higher is faster)",
                cases,
                speed,
                tuple(g[0] for g in goals),
                "speedup (×, log scale)",
            )
        ]
        if plot.memory is not None:
            ours, theirs = plot.memory
            values = []
            for row in table.rows:
                a, b = mebibytes(row[ours]), mebibytes(row[theirs])
                values.append(b / a if a and b else None)
            result.append(
                Panel(
                    "peak memory: peer's ÷ attnkit's (higher uses less)",
                    cases,
                    (Series("memory", tuple(values)),),
                    tuple(g[1] for g in goals),
                    "memory ratio (×, log scale)",
                    ".3g",
                )
            )
    except TableError as error:
        raise TableError(f"BENCHMARKS.md, table under {table.heading!r}: {error}") from None
    if all(v is None for s in speed for v in s.values):
        raise TableError(f"BENCHMARKS.md, table under {table.heading!r}: no speed ratio at all")
    return result


def draw(title: str, charts: list[Panel]) -> bytes:
    """An SVG of the charts side by side: one horizontal bar per case, targets as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullLocator

    met, missed, plain = "#2e7d32", "#c62828", "#607d8b"
    n = len(charts[0].cases)
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "attnkit", "font.size": 10}):
        fig, axes = plt.subplots(
            1,
            len(charts),
            figsize=(5.2 * len(charts) + 1.4, 0.36 * n + 1.6),
            sharey=True,
            squeeze=False,
        )
        for ax, chart in zip(axes[0], charts, strict=True):
            height = 0.8 / len(chart.series)
            shown = [v for s in chart.series for v in s.values if v] + [
                t for t in chart.targets if t
            ]
            for k, series in enumerate(chart.series):
                for y, (value, goal) in enumerate(zip(series.values, chart.targets, strict=True)):
                    if value is None:
                        continue
                    colour = plain if goal is None else (met if value >= goal else missed)
                    offset = (k - (len(chart.series) - 1) / 2) * height
                    ax.barh(y + offset, value, height * 0.9, color=colour, alpha=1 - 0.35 * k)
                    label = f"{value:{chart.digits}}×"
                    ax.text(value * 1.04, y + offset, label, va="center", fontsize=8)
            for y, goal in enumerate(chart.targets):
                if all(series.values[y] is None for series in chart.series):
                    ax.text(1.0, y, " no ratio: the table gives none", va="center", fontsize=8,
                            color=plain)  # fmt: skip
                if goal is not None:
                    ax.plot([goal, goal], [y - 0.45, y + 0.45], color="black", lw=1.6)
            ax.axvline(1.0, color="#999999", lw=0.8, ls=":")
            ax.set_xscale("log")
            low, high = min([*shown, 1.0]), max([*shown, 1.0])
            ax.set_xlim(low / 1.6, high * 2.2)
            ticks = [t for t in TICKS if low / 1.6 <= t <= high * 2.2]
            if len(ticks) > 8:  # every other one, 1x kept
                ticks = ticks[ticks.index(1.0) % 2 :: 2]
            ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_yticks(range(n), chart.cases)
            ax.set_ylim(n - 0.5, -0.5)
            ax.set_title(chart.title, fontsize=10)
            ax.set_xlabel(chart.xlabel)
            ax.grid(axis="x", which="major", color="#e0e0e0", lw=0.6)
            ax.set_axisbelow(True)
        if len(charts[0].series) > 1:
            shades = ", ".join(
                f"{s.label} ({'dark' if k == 0 else 'light'})"
                for k, s in enumerate(charts[0].series)
            )
            axes[0][0].set_title(f"{charts[0].title}\nbars per case: {shades}", fontsize=10)
        handles = [
            Patch(color=met, label="target met"),
            Patch(color=missed, label="target not met"),
            Patch(color=plain, label="no ratio target"),
            Line2D([], [], color="black", lw=1.6, label="target"),
            Line2D([], [], color="#999999", lw=0.8, ls=":", label="1× (parity)"),
        ]
        columns = len(handles) if len(charts) > 1 else 3
        fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=9, frameon=False)
        fig.suptitle(title, fontsize=11)
        fig.tight_layout(rect=(0, 0.1 if len(charts) == 1 else 0.06, 1, 1))
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", facecolor="white", metadata={"Date": None})
        plt.close(fig)
    return buffer.getvalue()


def figures(text: str) -> dict[str, tuple[Table, list[Panel]]]:
    """Each plot's table and charts, read from BENCHMARKS.md's ``text``; TableError if one fails."""
    tables = parse_tables(text)
    return {plot.name: (table := table_for(tables, plot), panels(table, plot)) for plot in PLOTS}


def benchmarks_markdown(page_dir: str) -> str:
    """BENCHMARKS.md's body for a page in ``page_dir`` (relative to docs/), plots included."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    up = "../" * len(Path(page_dir).parts)
    lines = text.splitlines()
    tables = parse_tables(text)
    ends = sorted(((table_for(tables, plot).end, plot) for plot in PLOTS), key=lambda e: -e[0])
    for end, plot in ends:  # from the last table up, so each index still holds
        alt = f"{plot.title}: each case's ratio against its peer as a bar, its target as a line"
        image = f'<img src="{up}{IMAGES}/{plot.name}.svg" alt="{html.escape(alt)}">'
        lines[end + 1 : end + 1] = ["", f'<figure class="benchmark-plot">{image}</figure>']
    text = "\n".join(lines) + "\n"
    text = re.sub(r"\A# .*\n", "", text)

    def link(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+://|#", target):
            return match.group(0)
        if target.startswith("docs/"):
            return f"[{label}]({up}{target.removeprefix('docs/')})"
        return label

    text = re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", link, text)
    fenced = False
    lines = []
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("#"):
            line = "#" + line
        lines.append(line)
    return "\n".join(lines)


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    try:
        drawn = figures((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    except TableError as error:
        raise PluginError(f"benchmark plots: {error}") from None
    for plot in PLOTS:
        content = draw(plot.title, drawn[plot.name][1])
        files.append(File.generated(config, f"{IMAGES}/{plot.name}.svg", content=content))
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        page_dir = str(Path(page.file.src_uri).parent)
        return markdown.replace(MARKER, benchmarks_markdown("" if page_dir == "." else page_dir))
    return markdown
