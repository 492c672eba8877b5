"""The context-parallel fuzz: random calls over gloo ranks against one process.

Every rank draws the same cases (tests/fuzz_draws.py, without modifiers, which
context parallelism does not take): 3-D ``(H, N, E)`` and 4-D ``(B, H, N, E)`` inputs,
grouped-query heads, every score (its parameters learnable), a float or per-head tensor
scale (learnable), every mask kind on the full sequence (document ids spread or not),
the ring or the all-to-all (when the heads divide by the world size), a zigzag or
contiguous layout, uneven shards. Inputs are float64, so any difference from the
float64 reference backend on the full sequence (output, lse, and the gradients of
query, key, value and every learnable parameter, summed across the ranks) is a
defect, not rounding. An exception is a crash; the group stops at the first one (a
rank that raised may leave the others in a collective).

Run as a script: ``python tests/fuzz_cp.py --world 2 --cases 400``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attnkit
from attnkit import distributed as cp
from attnkit.distributed import comm

from fuzz_draws import Draw, fill
from gloo_ranks import free_port, read_report, report_and_leave, run_ranks
from tolerance import FLOAT64_RANKS_REL


def draw_cp(seed: int, index: int, world: int) -> tuple[Draw, str | None, str]:
    """Case ``index``: the call (full-sequence tensors), its strategy and its layout."""
    rng = random.Random(seed * 7_000_003 + index)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    N = rng.randint(world, 6 * world + 3)
    score_name = rng.choice(("dot", "scaled_dot", "bilinear", "additive", "gaussian"))
    E = rng.randint(1, 4)
    Ek = rng.randint(1, 4) if score_name in ("bilinear", "additive") else E
    Hk = rng.choice([1, world, 2 * world])
    Hq = Hk * rng.choice([1, 2])
    B = rng.randint(1, 2)
    lead = (Hq,) if rng.random() < 0.3 else (B, Hq)
    kv = (Hk,) if len(lead) == 1 else (B, Hk)
    d = Draw(rng.randrange(2**31), torch.float64, len(lead) + 2, (*lead, N, E), (*kv, N, Ek),
             rng.randint(1, 4), score_name)  # fmt: skip
    m = d.masters
    m["q"] = torch.randn(d.q_shape, generator=gen, dtype=torch.float64)
    m["k"] = torch.randn(d.k_shape, generator=gen, dtype=torch.float64)
    m["v"] = torch.randn(*d.k_shape[:-1], d.Ev, generator=gen, dtype=torch.float64)
    fill(d, rng, gen, with_mods=False)
    d.grad = True
    can_split = Hq % world == 0 and Hk % world == 0
    strategy = rng.choice(["ring", "all_to_all", None] if can_split else ["ring", None])
    return d, strategy, rng.choice(["zigzag", "contiguous"])


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    g, w = got.detach().double(), want.detach().double()
    if g.shape != w.shape:
        return False
    fin = torch.isfinite(w)
    if not torch.equal(torch.isfinite(g), fin) or not torch.equal(g[~fin], w[~fin]):
        return False
    if not bool(fin.any()):
        return True
    scale = max(float(w[fin].abs().max()), 1e-300)
    return float((g[fin] - w[fin]).abs().max()) <= FLOAT64_RANKS_REL * scale


def run_case(rank: int, world: int, seed: int, index: int) -> tuple[str, list[str]]:
    """(strategy run, what differs) of case ``index`` on this rank."""
    d, strategy, layout = draw_cp(seed, index, world)
    b = d.build()
    leaves = [t.clone().requires_grad_(True) for t in (b.q, b.k, b.v)]
    out_ref, lse_ref = attnkit.attention(*leaves, **b.kwargs, return_lse=True, backend="reference")
    gen = torch.Generator().manual_seed(d.seed)
    g_out = torch.randn(out_ref.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(lse_ref.shape, generator=gen, dtype=torch.float64)

    def loss(out: torch.Tensor, lse: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor) -> Any:
        return (out * g1).sum() + torch.where(torch.isfinite(lse), lse * g2, 0.0).sum()

    want = torch.autograd.grad(loss(out_ref, lse_ref, g_out, g_lse), leaves + b.params)

    def mine(t: torch.Tensor) -> torch.Tensor:
        return cp.shard(t.detach(), rank=rank, world_size=world, layout=layout)  # type: ignore[arg-type]

    def full(t: torch.Tensor) -> torch.Tensor:
        return cp.unshard(t, layout=layout)  # type: ignore[arg-type]

    shards = [mine(t).requires_grad_(True) for t in (b.q, b.k, b.v)]
    ex = cp.explain_context_parallel(*shards, world_size=world, seq_len=d.q_shape[-2],
                                     kv_seq_len=d.k_shape[-2],
                                     mask=b.kwargs["mask"], layout=layout,  # type: ignore[arg-type]
                                     strategy=strategy,
                                     score=b.kwargs.get("score", "scaled_dot"))  # fmt: skip
    out, lse = cp.context_parallel_attention(*shards, **b.kwargs, layout=layout,  # type: ignore[arg-type]
                                             strategy=strategy, return_lse=True)  # fmt: skip
    g_lse_r = mine(g_lse.unsqueeze(-1)).squeeze(-1)
    got = torch.autograd.grad(loss(out, lse, mine(g_out), g_lse_r), shards + b.params,
                              allow_unused=True)  # fmt: skip
    bad = []
    if not _close(full(out.detach()), out_ref):
        bad.append("output")
    if not _close(full(lse.detach().unsqueeze(-1)).squeeze(-1), lse_ref):
        bad.append("lse")
    for name, g, w in zip(("d_q", "d_k", "d_v"), got[:3], want[:3], strict=True):
        if not _close(full(g), w):
            bad.append(name)
    for n, (g, w) in enumerate(zip(got[3:], want[3:], strict=True)):
        total = torch.zeros_like(w) if g is None else g.detach().clone()
        comm.all_reduce(total, None, "a parameter's gradient")  # each rank's part, summed
        if not _close(total, w):
            bad.append(f"d_p{n}")
    return ex.chosen, bad


def _worker(rank: int, world: int, port: int, seed: int, start: int, cases: int,
            out_dir: str) -> None:  # fmt: skip
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    report: dict[str, Any] = {"cases": 0, "strategies": {}, "mismatches": [], "crash": None}
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
        )
        for i in range(start, start + cases):
            d, _, layout = draw_cp(seed, i, world)
            try:
                chosen, bad = run_case(rank, world, seed, i)
            except Exception:
                report["crash"] = f"case {i}: {d.label()} {layout}: {traceback.format_exc()}"
                break
            report["cases"] += 1
            report["strategies"][chosen] = report["strategies"].get(chosen, 0) + 1
            if bad:
                report["mismatches"].append(f"case {i}: {chosen} {layout} {d.label()}: {bad}")
    except Exception:
        report["crash"] = traceback.format_exc()
    finally:
        report_and_leave(Path(out_dir, f"rank{rank}.json"), report)


def campaign(world: int, cases: int, seed: int = 28, start: int = 0,
             deadline_s: float = 3600) -> list[dict[str, Any]]:  # fmt: skip
    """Cases ``start .. start + cases`` on ``world`` gloo ranks: every rank's report."""
    with tempfile.TemporaryDirectory() as tmp:
        run_ranks(_worker, world, (world, free_port(), seed, start, cases, tmp), tmp, deadline_s)
        return [read_report(Path(tmp, f"rank{r}.json"), r) for r in range(world)]


def summary(world: int, reports: list[dict[str, Any]]) -> list[str]:
    r0 = reports[0]
    lines = [
        f"{world} ranks: {r0['cases']} cases ({', '.join(f'{k} {n}' for k, n in sorted(r0['strategies'].items()))}); "
        f"mismatches {len(r0['mismatches'])}; crashes {sum(1 for r in reports if r['crash'])}"
    ]  # fmt: skip
    for r, rep in enumerate(reports):
        lines += [f"  rank {r}: {m}" for m in rep["mismatches"][:10]]
        if rep["crash"]:
            lines.append(f"  rank {r} crashed: {rep['crash'][-1500:]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, action="append", help="ranks (repeatable)")
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--start", type=int, default=0)
    args = parser.parse_args(argv)
    failed = False
    for world in args.world or [2, 4]:
        reports = campaign(world, args.cases, args.seed, args.start)
        print("\n".join(summary(world, reports)))
        failed |= any(r["mismatches"] or r["crash"] for r in reports)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
