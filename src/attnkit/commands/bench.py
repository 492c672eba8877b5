"""``attnkit bench``: the benchmark suites side by side, as a table and JSON.

Every argument is checked before any case runs (bad ones exit 2 with one line):
the JSON file's folder must exist and be writable, the budget must be a finite
number of seconds >= 0, the suite must exist on the device, and ``--device cuda``
needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = "benchmarks side by side with torch SDPA and plain math"

QUICK_NOTE = (
    "quick mode: tiny shapes that only check every case runs; at these sizes fixed "
    "per-call costs outweigh the work, so a ratio of the two times says nothing about "
    "attnkit's speed and no speedup or verdict is shown (run without --quick for those)"
)


def budget_seconds(text: str) -> float:
    """``--budget``: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds >= 0, got {text!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..bench import all_suite_names

    parser.add_argument(
        "--suite",
        default="all",
        choices=all_suite_names(),
        help=(
            "which cases to run; 'all' leaves out the suites run on their own: 'overhead', "
            "'models' and 'show' (default: %(default)s)"
        ),
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cpu or cuda: the GPU cases, or the overhead suite on the GPU (default: %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny shapes, no memory runs: checks every case works, in seconds (default: off)",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="also write the results as JSON to FILE (default: none)"
    )
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the peak-memory runs (each side once in a child process; default: they run, except with --quick)",
    )
    memory.add_argument(
        "--memory",
        action="store_true",
        help="run the peak-memory children with --quick too (default: off)",
    )
    parser.add_argument(
        "--budget",
        type=budget_seconds,
        default=None,
        metavar="SECONDS",
        help="timing budget per case; at least 3 pairs run (default: 8, 0.2 with --quick)",
    )


def json_path_problem(path: str) -> str | None:
    """Why ``--json FILE`` cannot be written (checked before anything runs), or None.

    The file is opened for appending (an existing one is left as it is) or created
    and removed again, so what the OS would refuse at the end is refused now.
    """
    target = Path(path)
    parent = target.parent
    if not parent.is_dir():
        return f"--json: the folder {str(parent)!r} does not exist; expected an existing folder"
    if target.is_dir():
        return f"--json: {path!r} is a folder; expected a file name"
    existed = target.exists()
    try:
        with open(target, "a", encoding="utf-8"):
            pass
        if not existed:
            target.unlink()
    except OSError as exc:
        return f"--json: cannot write {path!r}: {exc.strerror or exc}"
    return None


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{unit}"


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def _notes(r: Any, judged: bool = True) -> str:
    parts = []
    if judged and r.extra_s is not None and r.attnkit_s is not None and r.attnkit_s < 1e-3:
        parts.append(f"{r.extra_s * 1e6:+.1f} µs/call")
    parts += [f"{name.replace('_', ' ')} {value}" for name, value in r.counts.items()]
    if "attnkit_tflops" in r.figures:
        parts.append(
            f"TFLOP/s {r.figures['attnkit_tflops']:.1f} vs {r.figures['baseline_tflops']:.1f}"
        )
    if "show_s" in r.figures:
        f = r.figures
        head = (
            f"(show − start-up) ÷ forward {f['ratio']:.2f}×"
            if "ratio" in f
            else "show no slower than its start-up (within the start-up's noise)"
        )
        parts.append(
            f"{head} (show {f['show_s']:.1f} s, start-up {f['startup_s']:.1f} s, forward "
            f"{f['forward_s']:.1f} s); page {f['page_mib']:.1f} MiB, peak "
            f"{f['peak_gib']:.2f} GiB"
        )
    stages = {n: f for n, f in r.figures.items() if n.startswith("stage_")}
    if stages:
        parts.append(
            "stages µs: "
            + ", ".join(f"{n[6:-3].replace('_', ' ')} {f:.1f}" for n, f in stages.items())
        )
    if "explain_ratio" in r.figures:
        f = r.figures
        parts.append(
            f"(show --explain − show) ÷ (forward + backward) {f['explain_ratio']:.2f}× (show "
            f"--explain {f['explain_show_s']:.1f} s, show {f['plain_show_s']:.1f} s, forward + "
            f"backward {f['forward_backward_s']:.1f} s)"
        )
    if "floor_ms" in r.figures:
        parts.append(f"copy floor {r.figures['floor_ms']:.2f} ms")
    if r.backend:
        parts.append(f"backend {r.backend}")
    if r.error:
        parts.append(r.error)
    return "; ".join(parts)


def _row(r: Any, judged: bool = True) -> list[str]:
    met = {True: "yes", False: "NO", None: "-"}
    verdicts = [v for v in (r.met, r.mem_met) if v is not None]
    ok = met[all(verdicts)] if verdicts else "-"
    times = [r.name, _time(r.attnkit_s), _time(r.baseline_s)]
    verdict = [_fmt(r.speedup, ".2f", "×"), r.target, ok if r.error is None else "ERROR"]
    memory = [_fmt(r.attnkit_mib, ".1f"), _fmt(r.baseline_mib, ".1f"), _notes(r, judged)]
    if not judged:
        return [*times, "ERROR" if r.error else "ran", *memory]
    return [*times, *verdict, *memory]


def _judged_order(results: list[Any]) -> list[Any]:
    """The cases where attnkit wins most first, failures last."""
    return sorted(
        results, key=lambda r: (r.error is not None, r.speedup is None, -(r.speedup or 0.0))
    )


def table(results: list[Any], *, judged: bool = True) -> str:
    """The results as a text table, the cases where attnkit wins most first.

    ``judged=False`` (quick mode): no speedup, target or verdict columns, and the
    cases in the order they ran.
    """
    if judged:
        results = _judged_order(results)
        head = ["case", "attnkit", "baseline", "speedup", "target", "met"]
    else:
        head = ["case", "attnkit", "baseline", "status"]
    head += ["attnkit MiB", "base MiB", "notes"]
    rows = [_row(r, judged) for r in results]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def legend(results: list[Any]) -> str:
    """What each row of :func:`table` compares: its baseline and the shape it measured.

    One line per case, in the table's order, after a heading; a case that failed before
    its sides were built says so instead of a baseline and a shape.
    """
    width = max((len(r.name) for r in results), default=0)
    lines = ["baseline and shape of each case (the 'baseline' column times the baseline):"]
    for r in results:
        base = r.baseline_name if r.baseline_name not in ("", "-") else "not built"
        shape = r.shape if r.shape not in ("", "-") else "not built"
        lines.append(f"  {r.name:<{width}}  baseline: {base}; shape: {shape}")
    return "\n".join(lines)


def _fail(message: str) -> int:
    print(f"attnkit bench: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from ..bench import machine_info, run_case, suite_cases
    from ..bench.gpu_runner import cuda_missing, run_gpu_case
    from ..bench.show import ShowCase, run_show_case
    from ..bench.show_explain import ExplainCase, run_explain_case

    if args.json is not None and (problem := json_path_problem(args.json)) is not None:
        return _fail(problem)
    try:
        cases = suite_cases(args.suite, args.device)
    except ValueError as exc:
        return _fail(str(exc))
    if args.device == "cuda" and (missing := cuda_missing()) is not None:
        return _fail(f"--device cuda: {missing}")
    gpu = args.device == "cuda" and args.suite != "overhead"
    info = machine_info()
    if args.device == "cuda":
        import torch

        info["gpu"] = torch.cuda.get_device_name()
    mode = "quick" if args.quick else "full"
    memory = not args.no_memory and (args.memory or not args.quick) and args.device == "cpu"
    where = info.get("gpu") or f"{info['cpu']}, {info['cores']} cores"
    print(
        f"attnkit bench --suite {args.suite} --device {args.device} ({mode}): {where}, "
        f"torch {info['torch']} ({info['threads']} threads), additive: {info['additive_kernel']}",
        file=sys.stderr,
    )
    results = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.name} ...", end="", file=sys.stderr, flush=True)
        if isinstance(case, ShowCase):
            r = run_show_case(case, quick=args.quick)
        elif isinstance(case, ExplainCase):
            r = run_explain_case(case, quick=args.quick)
        elif gpu:
            r = run_gpu_case(_quick_gpu(case) if args.quick else case)  # type: ignore[arg-type]
            if args.quick:  # targets speak of the full shapes only
                r.met = r.mem_met = None
        else:
            r = run_case(case, quick=args.quick, memory=memory, budget_s=args.budget)  # type: ignore[arg-type]
        results.append(r)
        note = f" speedup {r.speedup:.2f}×" if r.speedup is not None and not args.quick else ""
        note += f" {r.error}" if r.error else ""
        print(f" done{note}", file=sys.stderr, flush=True)
    if args.quick:
        print(QUICK_NOTE)
        print(table(results, judged=False))
        print("times: median per call of interleaved pairs; MiB = peak extra")
        print(legend(results))
    else:
        print(table(results))
        print(legend(_judged_order(results)))
        print(
            "speedup = baseline time / attnkit time (median of interleaved pairs); MiB = peak extra"
        )
    if args.json:
        from .. import __version__

        payload = {
            "suite": args.suite,
            "device": args.device,
            "mode": mode,
            "attnkit": __version__,
            "budget_s": args.budget,
            # read again after the cases: what they ran on (the additive kernel is built,
            # or found missing, by the first call that needs it)
            "machine": {**info, **machine_info()},
            "cases": [r.to_json() for r in results],
        }
        try:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(payload, fh, indent=2)
        except OSError as exc:
            print(f"attnkit bench: error: cannot write --json {args.json}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


def _quick_gpu(case: Any) -> Any:
    from dataclasses import replace

    return replace(case, shape=case.shape.small())
