"""Child process of :func:`attnkit.bench.runner.measure_memory`: one side of one case, once.

``python -m attnkit.bench._child CASE {attnkit,baseline} [--quick]`` prints one
JSON line with the side's peak extra memory in MiB.
"""

from __future__ import annotations

import json
import sys

from .runner import peak_since, reset_peak
from .suites import cpu_case


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    names = [a for a in argv if not a.startswith("--")]
    case = cpu_case(names[0]) if names else None
    if len(names) != 2 or case is None or names[1] not in ("attnkit", "baseline"):
        print(
            "usage: python -m attnkit.bench._child CASE {attnkit,baseline} [--quick]",
            file=sys.stderr,
        )
        return 2
    side = names[1]
    warm = getattr(case.build(True), side)  # thread pools, lazily built kernels, caches
    if warm is not None:
        warm()
    fn = getattr(case.build(quick), side)
    if fn is None:
        print(f"case {case.name} has no {side} side", file=sys.stderr)
        return 2
    start = reset_peak()
    fn()
    print(
        json.dumps({"case": case.name, "side": side, "peak_extra_mib": round(peak_since(start), 2)})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
