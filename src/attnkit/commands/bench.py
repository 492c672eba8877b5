"""``attnkit bench``: the benchmark suite side by side, as a table and JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

DESCRIPTION = "benchmarks side by side with torch SDPA and plain math"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..bench import SUITES

    parser.add_argument(
        "--suite",
        default="all",
        choices=sorted(SUITES),
        help="which cases to run (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes: checks the command works, in seconds"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the peak-memory runs (each side once in a child process)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="timing budget per case (default 8, 0.2 with --quick); at least 3 pairs run",
    )


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{unit}"


def _row(r: Any) -> list[str]:
    met = {True: "yes", False: "NO", None: "-"}
    mem = "-"
    if r.attnkit_mib is not None:
        mem = f"{r.attnkit_mib:.1f}"
    base_mem = _fmt(r.baseline_mib, ".1f")
    ok = met[r.met] if r.met is not None else met[r.mem_met]
    if r.met is not None and r.mem_met is not None:
        ok = "yes" if (r.met and r.mem_met) else "NO"
    return [
        r.name,
        _fmt(None if r.attnkit_s is None else r.attnkit_s * 1e3, ".1f"),
        _fmt(None if r.baseline_s is None else r.baseline_s * 1e3, ".1f"),
        _fmt(r.speedup, ".2f", "×"),
        r.target,
        ok if r.error is None else "ERROR",
        mem,
        base_mem,
    ]


def _table(rows: list[list[str]]) -> str:
    head = [
        "case",
        "attnkit ms",
        "baseline ms",
        "speedup",
        "target",
        "met",
        "attnkit MiB",
        "base MiB",
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..bench import CASES, SUITES, machine_info, run_case

    names = SUITES[args.suite]
    cases = [c for c in CASES if c.name in names]
    info = machine_info()
    mode = "quick" if args.quick else "full"
    print(
        f"attnkit bench --suite {args.suite} ({mode}): {info['cpu']}, {info['cores']} cores, "
        f"torch {info['torch']} ({info['threads']} threads), additive: {info['additive_kernel']}",
        file=sys.stderr,
    )
    results = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.name} ...", end="", file=sys.stderr, flush=True)
        r = run_case(case, quick=args.quick, memory=not args.no_memory, budget_s=args.budget)
        results.append(r)
        note = f" speedup {r.speedup:.2f}×" if r.speedup is not None else ""
        note += f" {r.error}" if r.error else ""
        print(f" done{note}", file=sys.stderr, flush=True)
    print(_table([_row(r) for r in results]))
    print("speedup = baseline time / attnkit time (median of interleaved pairs); MiB = peak extra")
    if args.quick:
        print("quick mode: tiny shapes that only check the command; targets are not judged")
    if args.json:
        payload = {
            "suite": args.suite,
            "mode": mode,
            "machine": info,
            "cases": [r.to_json() for r in results],
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0
