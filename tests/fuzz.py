"""The non-finite fuzz campaign: random calls under attack, each held to the policy.

Every case is drawn from ``(seed, index)`` alone, so a finding is reproduced by its
index (``run_case(draw(seed, i))``). Three kinds of case:

- ``poison``: NaN, +inf or -inf at random positions of the query, key or value; a
  random score, mask (tests/cases.py), shape (GQA too), CPU backend, output flags;
  host-readable or under ``device_semantics`` (the accelerator paths). The forward
  must follow the policy: rows that use a poisoned position are NaN (for a NaN) and
  every other row equals the same call with the poisoned positions zeroed. With
  gradients (a linear, a squared or a NaN-dropping loss) every gradient entry outside
  the poison's reach equals the zeroed call's (see :func:`reach`), and an entry that is
  NaN where the float64 reference backend gives a finite value is a *NaN-gradient
  finding beyond the reference*.
- ``planned``: a ``poison`` case on a plain call's repeated path: a dot score by name,
  no mask or a mask without tensors, output only, values as wide as the keys (what
  torch's fused kernel takes as it is), made once with finite inputs of the
  same shapes before the poisoned call.
- ``all_masked``: every key masked (``valid_lens`` 0, ``key_padding`` all True, keep
  all False, a -inf bias, ...) with NaN or inf anywhere, grad mode on: output 0, lse
  -inf, weights 0 and every gradient 0, never NaN.
- ``threads``: one half-precision score module shared by threads calling at once:
  every result equals the serial one and the module keeps its dtype.

Run as a script for the campaign's counts (``python tests/fuzz.py --cases 20000``).
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attnkit
from attnkit import masks
from attnkit._host import device_semantics

from cases import MASKS, SCORES, make_mask, make_score, matrix_backends
from nonfinite_cases import random_poison_case

BACKENDS: tuple[str, ...] = matrix_backends("cpu")
PLAIN_SCORES = ("dot", "scaled_dot")
PLAIN_MASKS = ("none", "causal", "causal_bottom_right", "window", "window_bottom_right")
ALL_MASKED = ("valid_lens", "key_padding", "keep", "bias", "queries", "causal_padding", "tf")
E, EV = 4, 3


@dataclass
class Report:
    """Counts of a campaign; ``mismatches`` and ``nan_beyond_reference`` describe cases."""

    cases: int = 0
    calls: int = 0
    skipped: int = 0
    grad_cases: int = 0
    mismatches: list[str] = field(default_factory=list)
    nan_beyond_reference: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.cases} cases ({self.grad_cases} with gradients, {self.skipped} not run by "
            f"their backend), {self.calls} backend calls: {len(self.mismatches)} mismatches, "
            f"{len(self.nan_beyond_reference)} NaN-gradient findings beyond the reference"
        )


@dataclass
class Case:
    kind: str
    index: int
    rng: random.Random
    seed: int


def draw(seed: int, index: int) -> Case:
    """Case ``index`` of the campaign with ``seed``."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choices(["poison", "planned", "all_masked", "threads"], weights=[70, 10, 19, 1])[0]
    return Case(kind, index, rng, rng.randrange(2**31))


# ---------------------------------------------------------------- calls


def _call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score: Any,
    mask: Any,
    backend: str,
    want_w: bool,
    want_lse: bool,
    strict: bool,
) -> dict[str, torch.Tensor]:
    def run() -> Any:
        return attnkit.attention(q, k, v, score=score, mask=mask, backend=backend,
                                 return_weights=want_w, return_lse=want_lse)  # fmt: skip

    if strict:
        with device_semantics():
            res = run()
    else:
        res = run()
    res = res if isinstance(res, tuple) else (res,)
    names = ["out"] + (["weights"] if want_w else []) + (["lse"] if want_lse else [])
    return dict(zip(names, res, strict=True))


def _loss(res: dict[str, torch.Tensor], kind: str, gen: torch.Generator) -> torch.Tensor:
    """A scalar from the results: ``linear`` (a finite output gradient everywhere),
    ``square`` (NaN output gradients on NaN rows), ``drop`` (NaN entries dropped)."""
    total = torch.zeros((), dtype=torch.float64)
    for name, t in res.items():
        g = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)
        if name == "lse":
            t = torch.where(torch.isneginf(t), 0.0, t)  # an empty row's lse is a constant
        if kind == "square" and name == "out":
            t = t.square()
        elif kind == "drop":
            t = t.nan_to_num(0.0, 0.0, 0.0)
        total = total + (t * g).sum().double()
    return total


def _grads(
    res: dict[str, torch.Tensor], leaves: list[torch.Tensor], kind: str, seed: int
) -> list[torch.Tensor]:
    loss = _loss(res, kind, torch.Generator().manual_seed(seed))
    got = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, got, strict=True)]


def runs(
    backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, strict: bool, **kw: Any
) -> bool:
    """True when ``backend`` takes this call (under ``device_semantics`` with ``strict``)."""
    if strict:
        with device_semantics():
            return not attnkit.explain(q, k, v, backend=backend, **kw).reasons[backend]
    return not attnkit.explain(q, k, v, backend=backend, **kw).reasons[backend]


# ---------------------------------------------------------------- poison


def reach(
    keep: np.ndarray, where: str, positions: np.ndarray, Hk: int
) -> tuple[np.ndarray, np.ndarray]:
    """The poison's reach: rows (B, Hq, L) that use a poisoned position, and key/value
    positions (B, Hk, S) that such a row uses. Gradients of queries in those rows, of
    keys and values at those positions, and of score parameters when any row is
    reached, make no promise; every other gradient entry is the zeroed call's.

    keep: (B, Hq, L, S) pairs the mask keeps; positions: (B, Hq, L) for the query,
    (B, Hk, S) for the key or value."""
    B, Hq, _, S = keep.shape
    if where == "query":
        rows = positions & keep.any(-1)  # (B, Hq, L)
    else:
        group = np.repeat(positions, Hq // Hk, axis=1)[:, :, None, :]  # (B, Hq, 1, S)
        rows = (keep & group).any(-1)  # (B, Hq, L)
    used = (keep & rows[..., None]).any(2)  # (B, Hq, S): keys the reached rows use
    return rows, used.reshape(B, Hk, Hq // Hk, S).any(2)  # (B, Hk, S)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and
                    torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))  # fmt: skip
    tol = 1e-4 * max(1.0, float(b.abs().max()) if b.numel() else 1.0)
    return bool(((a - b).abs() <= tol + 1e-3 * b.abs()).all())


def run_poison(case: Case, report: Report) -> None:
    """A ``poison`` case, or a ``planned`` one: a plain call (a dot score by name, no mask
    or a mask without tensors, output only) made once with finite inputs of the same
    shapes first, so the poisoned call is the repeat of a plan (:mod:`attnkit._plans`)."""
    rng = case.rng
    planned = case.kind == "planned"
    score_name, mask_name = rng.choice(SCORES), rng.choice(MASKS)
    if planned:
        score_name, mask_name = rng.choice(PLAIN_SCORES), rng.choice(PLAIN_MASKS)
    backend, where = rng.choice(BACKENDS), rng.choice(["query", "key", "value"])
    poison = rng.choice([math.nan, math.inf, -math.inf])
    Bn, Hk, Ln, Sn = rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 10), rng.randint(1, 10)
    Hq = Hk * rng.choice([1, 2])
    strict, grad = rng.random() < 0.3, rng.random() < 0.5
    want_w, want_lse = rng.random() < 0.3, rng.random() < 0.4
    if planned:
        want_w = want_lse = False  # a plan is for calls that return the output only
    loss_kind = rng.choice(["linear", "square", "drop"])
    gen = torch.Generator().manual_seed(case.seed)
    q, k, v, score, mask, keep, positions = random_poison_case(
        score_name, mask_name, where, (Bn, Hq, Hk, Ln, Sn), gen, E if planned else EV
    )
    keep = np.broadcast_to(keep, (Bn, Hq, Ln, Sn))
    kw = {"score": score, "mask": mask, "return_weights": want_w, "return_lse": want_lse}
    if not runs(backend, q, k, v, strict, **kw) or (
        grad and not runs(backend, q.requires_grad_(True), k, v, strict, **kw)
    ):
        report.skipped += 1
        return
    q = q.detach()
    pos_t = torch.from_numpy(np.ascontiguousarray(positions))
    idx = {"query": 0, "key": 1, "value": 2}[where]
    poisoned, zeroed = [t.clone() for t in (q, k, v)], [t.clone() for t in (q, k, v)]
    zeroed[idx][pos_t] = 0.0
    if where == "value":
        poisoned[idx][pos_t] = poison
    else:
        col = rng.randrange(poisoned[idx].shape[-1])
        poisoned[idx][..., col][pos_t] = poison
    rows, keys = reach(keep, where, positions, Hk)
    what = (
        f"case {case.index}: {backend}{' (device semantics)' if strict else ''} {score_name} "
        f"{mask_name} {where}={poison} B{Bn} Hq{Hq} Hk{Hk} L{Ln} S{Sn} w{want_w:d} lse{want_lse:d}"
    )
    call = dict(score=score_name if planned else score, mask=mask, backend=backend,
                want_w=want_w, want_lse=want_lse, strict=strict)  # fmt: skip
    params = [p for p in score.parameters()] if grad else []
    for p in params:
        p.requires_grad_(True)
    if planned:
        _call(*[t.clone().requires_grad_(grad) for t in zeroed], **call)  # type: ignore[arg-type]
        what += " planned"
    results = []
    for tensors in (poisoned, zeroed):
        leaves = [t.clone().requires_grad_(grad) for t in tensors]
        try:
            res = _call(*leaves, **call)  # type: ignore[arg-type]
            report.calls += 1
            g = _grads(res, leaves + params, loss_kind, case.seed) if grad else None
        except Exception as e:
            report.mismatches.append(f"{what}: raised {type(e).__name__}: {e}")
            return
        results.append((res, g))
    (got, g_got), (want, g_want) = results
    bad = _forward_findings(got, want, rows, where, poison)
    if grad:
        report.grad_cases += 1
        assert g_got is not None and g_want is not None
        bad += _grad_findings(g_got, g_want, rows, keys, where, len(params))
        ref = _reference_grads(poisoned, score, mask, want_w, want_lse, loss_kind, case.seed)
        report.calls += 1
        beyond = [
            n for n, (a, r) in enumerate(zip(g_got, ref, strict=True))
            if (torch.isnan(a) & torch.isfinite(r)).any()
        ]  # fmt: skip
        if beyond:
            report.nan_beyond_reference.append(f"{what} {loss_kind}: NaN in grads {beyond}")
    if bad:
        report.mismatches.append(f"{what}{' ' + loss_kind if grad else ''}: {'; '.join(bad)}")


def _forward_findings(
    got: dict[str, torch.Tensor],
    want: dict[str, torch.Tensor],
    rows: np.ndarray,
    where: str,
    poison: float,
) -> list[str]:
    out: list[str] = []
    clean = torch.from_numpy(~rows)
    for name, g in got.items():
        g, w = g.detach(), want[name].detach()
        sel = torch.ones_like(clean) if where == "value" and name != "out" else clean
        if not _close(g[sel], w[sel]):
            out.append(f"{name} differs from the zeroed call on rows that use no poison")
    dirty = torch.from_numpy(rows)
    if dirty.any() and math.isnan(poison):
        if not got["out"].detach()[dirty].isnan().all():
            out.append("a row using the NaN is not all NaN")
        if "lse" in got and where != "value" and not got["lse"].detach()[dirty].isnan().all():
            out.append("the lse of a row using the NaN is not NaN")
    return out


def _grad_findings(
    got: list[torch.Tensor],
    want: list[torch.Tensor],
    rows: np.ndarray,
    keys: np.ndarray,
    where: str,
    n_params: int,
) -> list[str]:
    out: list[str] = []
    free_rows = torch.from_numpy(~rows)  # (B, Hq, L)
    free_keys = torch.from_numpy(~keys)  # (B, Hk, S)
    names = ["query", "key", "value"] + [f"param{i}" for i in range(n_params)]
    for n, (a, b) in enumerate(zip(got, want, strict=True)):
        if n >= 3 and rows.any():
            continue
        sel = free_rows if n == 0 else free_keys if n < 3 else None
        a_s, b_s = (a, b) if sel is None else (a[sel], b[sel])
        if not _close(a_s, b_s):
            kind = "NaN" if a_s.isnan().any() else "a different value"
            out.append(f"d{names[n]}: {kind} outside the poison's reach")
    return out


def _reference_grads(
    tensors: list[torch.Tensor],
    score: Any,
    mask: Any,
    want_w: bool,
    want_lse: bool,
    loss_kind: str,
    seed: int,
) -> list[torch.Tensor]:
    """Gradients of the same poisoned call on the reference backend in float64."""
    s64 = copy.deepcopy(score).double()
    params = [p for p in s64.parameters() if p.requires_grad]
    leaves = [t.double().requires_grad_(True) for t in tensors]
    res = _call(*leaves, score=s64, mask=mask, backend="reference", want_w=want_w,
                want_lse=want_lse, strict=False)  # fmt: skip
    return _grads(res, leaves + params, loss_kind, seed)


# ---------------------------------------------------------------- all masked


def _all_masked(name: str, B: int, L: int, S: int) -> masks.Mask:
    """A mask that keeps no key for any query."""
    none = torch.ones(B, S, dtype=torch.bool)
    if name == "valid_lens":
        return masks.valid_lens(torch.zeros(B, dtype=torch.long))
    if name == "key_padding":
        return masks.key_padding(none)
    if name == "keep":
        return masks.keep(torch.zeros(L, S, dtype=torch.bool))
    if name == "bias":
        return masks.bias(torch.full((L, S), -math.inf))
    if name == "queries":
        return masks.valid_lens(torch.zeros(B, dtype=torch.long), queries=True)
    if name == "causal_padding":
        return masks.causal("bottom_right") & masks.key_padding(none)
    if name == "tf":
        return masks.tf(torch.ones(B, 1, 1, S))
    raise ValueError(name)


def run_all_masked(case: Case, report: Report) -> None:
    """Every key masked, non-finite values anywhere, grad mode on: all zero, never NaN."""
    rng = case.rng
    score_name, mask_name, backend = (
        rng.choice(SCORES),
        rng.choice(ALL_MASKED),
        rng.choice(BACKENDS),
    )
    Bn, Hk, Ln, Sn = rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 9), rng.randint(1, 9)
    Hq = Hk * rng.choice([1, 2])
    strict, want_w, want_lse = rng.random() < 0.3, rng.random() < 0.3, rng.random() < 0.4
    grad = rng.random() < 0.6
    gen = torch.Generator().manual_seed(case.seed)
    Ek = E + 2 if score_name in ("bilinear", "additive") else E
    q = torch.randn(Bn, Hq, Ln, E, generator=gen)
    k = torch.randn(Bn, Hk, Sn, Ek, generator=gen)
    v = torch.randn(Bn, Hk, Sn, EV, generator=gen)
    for t in (q, k, v):
        if rng.random() < 0.6:
            t[torch.rand(t.shape, generator=gen) < 0.2] = rng.choice(
                [math.nan, math.inf, -math.inf]
            )
    score, _ = make_score(score_name, E, Ek, gen, torch.float32)
    mask = _all_masked(mask_name, Bn, Ln, Sn)
    kw = {"score": score, "mask": mask, "return_weights": want_w, "return_lse": want_lse}
    leaves = [t.requires_grad_(grad and rng.random() < 0.7) for t in (q, k, v)]
    if not runs(backend, *leaves, strict, **kw):
        report.skipped += 1
        return
    params = [p for p in score.parameters()] if grad else []
    what = (
        f"case {case.index}: all masked ({mask_name}), {backend}"
        f"{' (device semantics)' if strict else ''} {score_name} B{Bn} Hq{Hq} Hk{Hk} L{Ln} "
        f"S{Sn} w{want_w:d} lse{want_lse:d} grad{grad:d}"
    )
    try:
        with torch.enable_grad():
            res = _call(*leaves, score=score, mask=mask, backend=backend, want_w=want_w,
                        want_lse=want_lse, strict=strict)  # fmt: skip
        report.calls += 1
        wanted = [t for t in leaves + params if t.requires_grad]
        grads = _grads(res, wanted, "square", case.seed) if wanted else []
    except Exception as e:
        report.mismatches.append(f"{what}: raised {type(e).__name__}: {e}")
        return
    bad = []
    for name, t in res.items():
        t = t.detach()
        ok = bool(torch.isneginf(t).all()) if name == "lse" else bool((t == 0).all())
        if not ok:
            bad.append(
                f"{name} is not {'-inf' if name == 'lse' else '0'} ({int(t.isnan().sum())} NaN)"
            )
    if grads:
        report.grad_cases += 1
    for n, g in enumerate(grads):
        if not bool((g == 0).all()):
            bad.append(f"gradient {n} is not 0 ({int(g.isnan().sum())} NaN)")
    if bad:
        report.mismatches.append(f"{what}: {'; '.join(bad)}")


# ---------------------------------------------------------------- threads


def run_threads_case(case: Case, report: Report, threads: int = 4) -> None:
    """One half-precision learnable score shared by threads calling at once."""
    rng = case.rng
    dtype = rng.choice([torch.bfloat16, torch.float16])
    score_name = rng.choice(["bilinear", "additive", "gaussian"])
    gen = torch.Generator().manual_seed(case.seed)
    Ek = E + 2 if score_name != "gaussian" else E
    if score_name == "gaussian":
        score: Any = attnkit.scores.Gaussian(1.4, learnable=True).to(dtype)
    else:
        score = make_score(score_name, E, Ek, gen, torch.float32)[0].to(dtype)
    calls = []
    for _ in range(4):
        Bn, Ln, Sn = rng.randint(1, 2), rng.randint(1, 9), rng.randint(1, 9)
        mask, _ = make_mask(rng.choice(MASKS), Bn, 2, Ln, Sn, gen, dtype)
        tensors = [torch.randn(Bn, 2, n, d, generator=gen).to(dtype)
                   for n, d in ((Ln, E), (Sn, Ek), (Sn, EV))]  # fmt: skip
        calls.append((rng.choice(BACKENDS), mask, tensors))
    before = [p.detach().clone() for p in score.parameters()]

    def one(n: int) -> torch.Tensor | None:
        backend, mask, (q, k, v) = calls[n]
        if not runs(backend, q, k, v, False, score=score, mask=mask):
            return None
        return attnkit.attention(q, k, v, score=score, mask=mask, backend=backend)

    want = [one(n) for n in range(len(calls))]
    got: list[tuple[int, torch.Tensor | None]] = []
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def work() -> None:
        barrier.wait()
        for _ in range(3):
            for n in range(len(calls)):
                try:
                    got.append((n, one(n)))
                except Exception as e:
                    errors.append(f"{type(e).__name__}: {e}")

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    report.calls += len(calls) + len(got)
    what = f"case {case.index}: {threads} threads sharing a {dtype} {score_name}"
    if errors:
        report.mismatches.append(f"{what}: {len(errors)} calls raised, first {errors[0]}")
    differ = sum(1 for n, g in got if not _same(g, want[n]))
    if differ:
        report.mismatches.append(f"{what}: {differ} results differ from the serial ones")
    changed = any(p.dtype != dtype or not torch.equal(p.detach(), b)
                  for p, b in zip(score.parameters(), before, strict=True))  # fmt: skip
    if changed:
        report.mismatches.append(f"{what}: the module's parameters changed")


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return bool(torch.equal(a, b))


# ---------------------------------------------------------------- campaign

RUNNERS: dict[str, Callable[[Case, Report], None]] = {
    "poison": run_poison,
    "planned": run_poison,
    "all_masked": run_all_masked,
    "threads": run_threads_case,
}


def run_case(case: Case, report: Report) -> None:
    report.cases += 1
    RUNNERS[case.kind](case, report)


def campaign(cases: int, seed: int, start: int = 0) -> Report:
    """Cases ``start .. start + cases`` of the campaign with ``seed``."""
    report = Report()
    for i in range(start, start + cases):
        run_case(draw(seed, i), report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--show", type=int, default=20, help="findings to print")
    parser.add_argument("--backend", action="append", help="only these backends")
    args = parser.parse_args(argv)
    if args.backend:
        global BACKENDS
        BACKENDS = tuple(args.backend)
    report = campaign(args.cases, args.seed, args.start)
    print(report.line())
    for line in (report.mismatches + report.nan_beyond_reference)[: args.show]:
        print(" ", line)
    return 1 if report.mismatches or report.nan_beyond_reference else 0


if __name__ == "__main__":
    raise SystemExit(main())
