"""The conformance fuzz: random valid calls on every CPU backend against the float64 oracle.

Each case (tests/fuzz_draws.py: layouts, grouped-query heads, scores, scales, modifiers,
masks, flags and dtypes drawn together) runs on every backend that accepts it
(``explain`` gives no reason; under ``device_semantics`` for the accelerator paths)
and every result is held to the float64 oracle (tests/reference.py): output, weights
and lse, and the gradients of the inputs and of every learnable parameter against the
float64 reference backend. A result beyond its dtype's tolerance is judged twice:

1. against plain same-dtype math: the reference backend's own error on the same call in
   the same dtype; within 4x of it (8x for gradients of half inputs) the miss is rounding
   (``tolerance``);
2. by a **float64 replay**: the same call on the same backend with the same values in
   float64. A miss that persists there is a **defect**; one that vanishes is a
   **precision** finding (a backend losing more precision than plain math).

An exception from a backend that accepted a call is a **crash**; a drawn call refused
by validation is **refused** (a draw the generator should not make, or a check that
refuses a valid call). Every case is drawn from ``(seed, index)`` alone, so a finding
is replayed by its index. A campaign passes with no finding at all: nothing is excused.

Run as a script for the campaign's counts: ``python tests/fuzz_calls.py --per-backend 20000``
(every CPU backend of the conformance matrix runs at least 20,000 cases; the slow test),
or ``--cases N [--start I] [--backend NAME]`` for a slice (``--backend triton`` with
``TRITON_INTERPRET=1`` for the Triton kernels under the interpreter).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attnkit
from attnkit._host import device_semantics

from cases import matrix_backends
from fuzz_draws import FOCUS, Built, Draw, draw
from reference import oracle
from tolerance import PLAIN_RATIO

BACKENDS: tuple[str, ...] = matrix_backends("cpu")
FORWARD_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}
GRAD_TOL = {torch.float64: 1e-7, torch.float32: 1e-3, torch.bfloat16: 8e-2, torch.float16: 2e-2}
"""Errors allowed relative to a result's largest finite magnitude, per dtype."""
REPLAY_TOL = (1e-8, 1e-6)
"""(forward, gradients) in the float64 replay."""


@dataclass
class Finding:
    index: int
    backend: str
    kind: str  # "defect", "precision", "crash" or "refused"
    what: str
    detail: str

    def line(self) -> str:
        return f"case {self.index}: {self.kind} on {self.backend}: {self.what}: {self.detail}"


@dataclass
class Report:
    """Counts of a campaign and its findings (see the module docstring)."""

    cases: int = 0
    calls: int = 0
    per_backend: Counter[str] = field(default_factory=Counter)
    grad_cases: Counter[str] = field(default_factory=Counter)
    declined: Counter[str] = field(default_factory=Counter)
    misses: int = 0
    tolerance: int = 0
    replays: int = 0
    findings: list[Finding] = field(default_factory=list)

    def of(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def lines(self) -> list[str]:
        runs = ", ".join(f"{b} {self.per_backend[b]} ({self.grad_cases[b]} with gradients)"
                         for b in sorted(self.per_backend))  # fmt: skip
        out = [
            f"{self.cases} cases, {self.calls} backend calls; cases run per backend: {runs}",
            f"misses beyond the dtype tolerance: {self.misses} (rounding within 4x plain "
            f"same-dtype math (8x for half gradients): {self.tolerance}; replayed in float64: "
            f"{self.replays})",
        ]
        out.append(", ".join(f"{kind} findings: {len(self.of(kind))}"
                             for kind in ("defect", "precision", "crash", "refused")))  # fmt: skip
        return out


# ---------------------------------------------------------------------- running


def _context(strict: bool) -> contextlib.AbstractContextManager[None]:
    return device_semantics() if strict else contextlib.nullcontext()


def _run(d: Draw, b: Built, backend: str, grad: bool) -> dict[str, torch.Tensor]:
    """The call's results (out, weights, lse) and, with ``grad``, the gradients of a fixed
    random loss on them (``d_q``, ``d_k``, ``d_v``, ``d_p0``, ...)."""
    leaves = [t.detach().clone().requires_grad_(grad) for t in (b.q, b.k, b.v)]
    with _context(d.strict), torch.set_grad_enabled(grad):
        res = attnkit.attention(*leaves, **b.kwargs, return_weights=d.want_w,
                                return_lse=d.want_lse, backend=backend)  # fmt: skip
    res = res if isinstance(res, tuple) else (res,)
    names = ["out"] + (["weights"] if d.want_w else []) + (["lse"] if d.want_lse else [])
    out = dict(zip(names, res, strict=True))
    if grad:
        gen = torch.Generator().manual_seed(d.seed)
        loss = torch.zeros((), dtype=torch.float64)
        for t in out.values():
            w = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)
            t = torch.where(torch.isneginf(t), 0.0, t)  # an empty row's lse is a constant
            loss = loss + (t * w).sum().double()
        wrt = leaves + b.params
        got = torch.autograd.grad(loss, wrt, allow_unused=True)
        for n, (t, g) in enumerate(zip(wrt, got, strict=True)):
            name = ("d_q", "d_k", "d_v")[n] if n < 3 else f"d_p{n - 3}"
            out[name] = torch.zeros_like(t) if g is None else g
    return {k: t.detach() for k, t in out.items()}


def _oracle(d: Draw, b: Built) -> dict[str, np.ndarray]:
    """The float64 oracle of a built call, in the shapes attnkit returns."""
    arrays = [t.detach().double().numpy() for t in (b.q, b.k, b.v)]
    out, w, lse = oracle(*arrays, **b.oracle_kw)
    batch, L, S = d.batch_shape, d.q_shape[-2], d.k_shape[-2]

    def fit(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        if a.shape == shape:
            return a
        if a.size == math.prod(shape):
            return a.reshape(shape)  # a head dim of 1 the oracle keeps for 2-D inputs
        return np.broadcast_to(a, shape)

    want = {"out": fit(out, (*batch, L, d.Ev))}
    if d.want_w:
        want["weights"] = fit(w, (*batch, L, S))
    if d.want_lse:
        want["lse"] = fit(lse, (*batch, L))
    return want


def _as64(t: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float64).cpu()
    return torch.from_numpy(np.array(t, dtype=np.float64))  # (a copy: a 0-d stays 0-d)


def _scale(t: np.ndarray | torch.Tensor) -> float:
    """The largest finite magnitude of ``t`` (0 when none)."""
    w = _as64(t)
    fin = w[torch.isfinite(w)]
    return float(fin.abs().max()) if fin.numel() else 0.0


GRAD_FLOOR = 0.05
"""A gradient's error is measured against at least this share of the call's largest
gradient: a gradient that is zero in exact arithmetic (a bias that is constant along
every row, T5 buckets all equal) is a sum of terms that cancel, whose rounding is of
the size of those terms, not of the sum."""


def _error(got: torch.Tensor, want: np.ndarray | torch.Tensor, floor: float = 0.0) -> float:
    """max |got - want| over want's finite entries / max(max |want| there, ``floor``)
    (1 if both are 0); inf where the infinities or NaNs differ."""
    g = got.detach().to(torch.float64).cpu()
    w = _as64(want)
    if g.shape != w.shape:
        return math.inf
    fin = torch.isfinite(w)
    if not torch.equal(torch.isfinite(g), fin) or not torch.equal(g[~fin], w[~fin]):
        if not torch.equal(torch.isnan(g), torch.isnan(w)) or not torch.equal(
            g[torch.isinf(w)], w[torch.isinf(w)]
        ):
            return math.inf
    if not bool(fin.any()):
        return 0.0
    scale = max(float(w[fin].abs().max()), floor)
    return float((g[fin] - w[fin]).abs().max()) / (scale if scale > 0 else 1.0)


def _errors(
    got: dict[str, torch.Tensor], want: dict[str, Any], dtype: torch.dtype
) -> dict[str, float]:
    """Each result's error (see :func:`_error`). Scales are floored by the call's largest
    gradient (:data:`GRAD_FLOOR`) and by the smallest normal number of ``dtype`` over its
    tolerance: a result below the dtype's range (an output of 1e-12 in float16, under a
    sink that takes nearly all the weight) is representation, not computation."""
    grads = [_scale(t) for n, t in want.items() if n.startswith("d_")]
    grad_floor = GRAD_FLOOR * max(grads, default=0.0)
    tiny = torch.finfo(dtype).tiny

    def floor(name: str) -> float:
        if name.startswith("d_"):
            return max(grad_floor, tiny / GRAD_TOL[dtype])
        return tiny / FORWARD_TOL[dtype]

    return {name: _error(got[name], want[name], floor(name)) for name in want if name in got}


def _too_big(errs: dict[str, float], dtype: torch.dtype, tol: tuple[float, float] | None = None
             ) -> list[str]:  # fmt: skip
    fwd, grd = tol or (FORWARD_TOL[dtype], GRAD_TOL[dtype])
    return [n for n, e in errs.items() if not e <= (grd if n.startswith("d_") else fwd)]


def _yardstick(name: str, dtype: torch.dtype) -> float:
    """How many times plain same-dtype math's error a result may have: ``PLAIN_RATIO``
    (4), and twice that for
    gradients of half inputs, whose backward from (out, lse) forms ``rowsum(d_out * out)``
    from the output rounded to the half dtype (as FlashAttention does), which the
    reference backend, differentiating its float32 math, does not."""
    half = dtype in (torch.float16, torch.bfloat16)
    return 2 * PLAIN_RATIO if half and name.startswith("d_") else PLAIN_RATIO


def _weights_at_most_one(w: torch.Tensor, dtype: torch.dtype) -> bool:
    """True when no finite weight exceeds 1 by more than a few roundings of ``dtype``."""
    fin = w[torch.isfinite(w)]
    return not fin.numel() or float(fin.max()) <= 1 + 8 * torch.finfo(dtype).eps


class _Case:
    """One drawn case: its oracle, reference gradients and yardsticks, computed once."""

    def __init__(self, index: int, d: Draw, report: Report) -> None:
        self.index, self.d, self.report = index, d, report
        self.built = d.build()
        self.want = _oracle(d, self.built)
        self._ref64: dict[str, torch.Tensor] | None = None
        self._plain: dict[str, float] | None = None
        self._condition: float | None = None

    def ref64(self) -> dict[str, torch.Tensor]:
        """The float64 reference backend's gradients (the gradients' oracle); empty, and a
        crash found, when the reference backend cannot give them."""
        if self._ref64 is None:
            try:
                got = _run(self.d, self.d.build(torch.float64), "reference", self.d.grad)
                self._ref64 = {k: v for k, v in got.items() if k.startswith("d_")}
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self.finding("reference", "crash", f"float64 gradients: {type(exc).__name__}: "
                             f"{first}")  # fmt: skip
                self._ref64 = {}
        return self._ref64

    def wanted(self, grad: bool) -> dict[str, Any]:
        """The oracle's results and, with ``grad``, the reference gradients (when any)."""
        want: dict[str, Any] = dict(self.want)
        if grad:
            want.update(self.ref64())
        return want

    def plain(self, grad: bool) -> dict[str, float]:
        """The reference backend's errors on the same call in the same dtype (none where it
        cannot run it: its own crash is a finding of its own check)."""
        if self._plain is None:
            try:
                got = _run(self.d, self.built, "reference", grad)
                self._plain = _errors(got, self.wanted(grad), self.d.dtype)
            except Exception:
                self._plain = {}
        return self._plain

    def out_condition(self) -> float:
        """The scale of the output's rounding: max over rows of ``sum_j w_j |v_j|``, the
        float64 reference's output for |v|. An output row is a weighted sum of values, so
        a kernel that rounds its weights or products to the dtype (torch's bfloat16 flash
        kernel rounds the weights before the values' product) is off by a few units of
        the dtype times this, however much the sum cancels: an output of 0.0035 from
        values near 1 is 12 bfloat16 units off at 1.7e-4, with every step exact to the
        dtype (conformance seed 30, case 2468). 0 where it cannot be computed."""
        if self._condition is None:
            b = self.d.build(torch.float64)
            b.v = b.v.abs()
            try:
                with _context(self.d.strict), torch.no_grad():
                    out = attnkit.attention(b.q, b.k, b.v, **b.kwargs, backend="reference")
                self._condition = _scale(out if isinstance(out, torch.Tensor) else out[0])
            except Exception:
                self._condition = 0.0
        return self._condition

    def finding(self, backend: str, kind: str, detail: str) -> None:
        self.report.findings.append(Finding(self.index, backend, kind, self.d.label(), detail))

    def check(self, backend: str) -> None:
        d, report = self.d, self.report
        grad = d.grad
        try:
            with _context(d.strict), torch.set_grad_enabled(grad):
                leaves = [t.detach().requires_grad_(grad) for t in (self.built.q, self.built.k,
                                                                    self.built.v)]  # fmt: skip
                ex = attnkit.explain(*leaves, **self.built.kwargs, return_weights=d.want_w,
                                     return_lse=d.want_lse, backend=backend)  # fmt: skip
        except (TypeError, ValueError) as exc:
            self.finding(backend, "refused", f"{type(exc).__name__}: {exc}")
            return
        if ex.reasons[backend]:
            report.declined[backend] += 1
            return
        report.per_backend[backend] += 1
        report.grad_cases[backend] += grad
        try:
            got = _run(d, self.built, backend, grad)
            report.calls += 1
        except Exception as exc:  # a crash on a call the backend accepted
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.finding(backend, "crash", f"{type(exc).__name__}: {first}")
            return
        if "weights" in got and not _weights_at_most_one(got["weights"], d.dtype):
            top = float(got["weights"][torch.isfinite(got["weights"])].max())
            self.finding(backend, "defect", f"a returned weight of {top:.6g} exceeds 1")
        errs = _errors(got, self.wanted(grad), d.dtype)
        bad = _too_big(errs, d.dtype)
        if "out" in bad:  # measured against the sum's own condition (see out_condition)
            errs["out"] = _error(got["out"], self.want["out"], self.out_condition())
            bad = _too_big(errs, d.dtype)
        if not bad:
            return
        report.misses += 1
        if backend != "reference" and d.dtype != torch.float64:
            plain = self.plain(grad)
            if all(errs[n] <= _yardstick(n, d.dtype) * plain.get(n, -1.0) for n in bad):
                report.tolerance += 1
                return
        self.replay(backend, {n: errs[n] for n in bad})

    def rounding(self, backend: str) -> bool:
        """True when a miss that vanishes in float64 is rounding by definition: the
        reference backend in a lower precision is plain same-dtype math."""
        return backend == "reference" and self.d.dtype != torch.float64

    def replay(self, backend: str, errs: dict[str, float]) -> None:
        """The same call in float64 on the same backend: a defect if the miss persists."""
        d = self.d
        report = self.report
        report.replays += 1
        shown = ", ".join(f"{n} {e:.3g}" for n, e in errs.items())
        b64 = d.build(torch.float64)
        try:
            with _context(d.strict), torch.set_grad_enabled(d.grad):
                ex = attnkit.explain(b64.q, b64.k, b64.v, **b64.kwargs, return_weights=d.want_w,
                                     return_lse=d.want_lse, backend=backend)  # fmt: skip
            if ex.reasons[backend]:
                self.finding(backend, "precision", f"{shown} (no float64 replay on {backend})")
                return
            got = _run(d, b64, backend, d.grad)
        except Exception as exc:
            self.finding(backend, "crash", f"in the float64 replay: {type(exc).__name__}: {exc}")
            return
        errs64 = _errors(got, self.wanted(d.grad), torch.float64)
        still = _too_big(errs64, torch.float64, REPLAY_TOL)
        if still:
            worst = ", ".join(f"{n} {errs64[n]:.3g}" for n in still)
            self.finding(backend, "defect", f"{worst} in float64 (in {d.dtype}: {shown})")
        elif self.rounding(backend):
            report.tolerance += 1
        else:
            self.finding(backend, "precision", f"{shown}; float64 replay exact")


def run_case(index: int, seed: int, report: Report, layouts: tuple[int, ...] = (2, 3, 4),
             backends: tuple[str, ...] = BACKENDS, focus: str | None = None) -> None:  # fmt: skip
    report.cases += 1
    d = draw(seed, index, layouts=layouts, focus=focus)
    try:
        case = _Case(index, d, report)
    except (TypeError, ValueError) as exc:
        report.findings.append(Finding(index, "-", "refused", d.label(), f"building: {exc}"))
        return
    for backend in backends:
        case.check(backend)


def campaign(cases: int, seed: int, start: int = 0, backends: tuple[str, ...] = BACKENDS,
             focus: str | None = None) -> Report:  # fmt: skip
    """Cases ``start .. start + cases`` of the campaign with ``seed`` on ``backends`` (every
    case on the extreme ``focus`` when given, see :data:`fuzz_draws.FOCUS`), on one thread
    (the calls are tiny: a pool of threads would cost more than the work)."""
    report = Report()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(start, start + cases):
            run_case(i, seed, report, backends=backends, focus=focus)
    finally:
        torch.set_num_threads(threads)
    return report


def campaign_until(per_backend: int, seed: int, max_cases: int = 200_000,
                   backends: tuple[str, ...] = BACKENDS, focus: str | None = None
                   ) -> Report:  # fmt: skip
    """Cases 0, 1, ... of the campaign with ``seed`` until each of ``backends`` has run
    ``per_backend`` of them (or ``max_cases`` were drawn), on one thread."""
    report = Report()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        i = 0
        while i < max_cases and min(report.per_backend[b] for b in backends) < per_backend:
            run_case(i, seed, report, backends=backends, focus=focus)
            i += 1
    finally:
        torch.set_num_threads(threads)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--per-backend", type=int, help="run until every backend ran this many")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--show", type=int, default=30, help="findings to print")
    parser.add_argument("--backend", action="append", help="only these backends")
    parser.add_argument("--focus", choices=FOCUS, help="every case on this extreme")
    args = parser.parse_args(argv)
    backends = tuple(args.backend) if args.backend else BACKENDS
    if args.per_backend:
        report = campaign_until(args.per_backend, args.seed, backends=backends,
                                focus=args.focus)  # fmt: skip
    else:
        report = campaign(args.cases, args.seed, args.start, backends=backends,
                          focus=args.focus)  # fmt: skip
    for line in report.lines():
        print(line)
    for f in report.findings[: args.show]:
        print(" ", f.line())
    return 1 if report.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
