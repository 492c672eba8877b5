"""Measure context-parallel attention: time and memory per rank for P = 1, 2, 4, ...

``python -m attnkit.distributed.bench --world 1 2 4 --seq 4096`` starts P gloo
processes on this machine (P = 1 runs :func:`attnkit.attention` on the full
sequence) and reports, per strategy, the median forward+backward time and per
rank the bytes saved for backward (tensors autograd keeps between forward and
backward, counted once per storage) and the growth of peak resident memory.
The processes share this machine's cores, so times measure the algorithm plus
oversubscription, not a cluster.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .. import masks
from ..functional import attention
from .api import context_parallel_attention
from .layout import shard

__all__ = ["main", "measure", "model_rows"]


def _saved_bytes(fn: Any) -> tuple[Any, int]:
    """Run ``fn()`` and count the bytes of distinct storages autograd saves for backward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, sum(seen.values())


def _run(rank: int, world: int, port: int, cfg: dict[str, Any], out_dir: str) -> None:
    torch.set_num_threads(max(1, cfg["threads"] // world))
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600)
        )
    B, H, N, E = cfg["batch"], cfg["heads"], cfg["seq"], cfg["dim"]
    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(B, H, N, E, generator=gen) for _ in range(3)]  # (B, H, N, E) each
    mask = masks.causal() if cfg["causal"] else None
    if world > 1:
        local = [shard(t, rank=rank, world_size=world, layout=cfg["layout"]) for t in full]
    else:
        local = full
    del full
    q, k, v = (t.contiguous().requires_grad_() for t in local)
    if world > 1:  # connections and buffers of the process group are set up lazily
        tiny = q[:, :, :1].detach().clone().requires_grad_()
        context_parallel_attention(tiny, tiny, tiny, strategy=cfg["strategy"]).sum().backward()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def step() -> torch.Tensor:
        if world == 1:
            return attention(q, k, v, mask=mask)
        return context_parallel_attention(
            q, k, v, mask=mask, layout=cfg["layout"], strategy=cfg["strategy"]
        )

    times, saved = [], 0
    for i in range(cfg["repeats"] + 1):
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        out, saved = _saved_bytes(step)
        out.sum().backward()
        if world > 1:
            dist.barrier()
        if i > 0:  # the first run warms up
            times.append(time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    report = {"time_s": statistics.median(times), "saved_bytes": saved, "rss_growth": rss_growth}
    Path(out_dir, f"{rank}.json").write_text(json.dumps(report))
    if world > 1:
        dist.destroy_process_group()


def measure(world: int, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """One configuration on ``world`` processes; returns each rank's report."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_run, args=(world, port, cfg, out_dir), nprocs=world, join=True)
        return [json.loads(Path(out_dir, f"{r}.json").read_text()) for r in range(world)]


def model_rows(
    seqs: tuple[int, ...] = (32_768, 131_072, 1_048_576),
    worlds: tuple[int, ...] = (2, 4, 8, 16, 32, 64),
    *,
    heads: int = 32,
    dim: int = 128,
    elem_bytes: int = 2,
    flops: float = 400e12,
    intra_bw: float = 450e9,
    inter_bw: float = 50e9,
    gpus_per_node: int = 8,
    latency: float = 10e-6,
    causal: bool = True,
) -> list[dict[str, float]]:
    """The forward communication/compute model of docs/context-parallel.md, one row per
    (sequence length, P): per ring step, the time to compute one (N/P x N/P) block
    (half of it under a balanced causal mask) against the time to pass one K/V shard;
    and the all-to-all's exchange time (not overlapped) against its compute."""
    rows = []
    for n in seqs:
        for p in worlds:
            bw = intra_bw if p <= gpus_per_node else inter_bw
            shard_len = n / p
            work = 0.5 if causal else 1.0
            step_compute = work * 4 * heads * shard_len**2 * dim / flops
            step_comm = latency + 2 * heads * shard_len * dim * elem_bytes / bw
            ring = p * max(step_compute, step_comm)
            a2a_comm = 2 * (latency + 4 * heads * shard_len * dim * elem_bytes * (p - 1) / p / bw)
            a2a = p * step_compute + a2a_comm
            rows.append(
                {
                    "seq": n,
                    "P": p,
                    "step_compute_ms": step_compute * 1e3,
                    "step_comm_ms": step_comm * 1e3,
                    "ring_ms": ring * 1e3,
                    "ring_exposed_ms": p * max(0.0, step_comm - step_compute) * 1e3,
                    "a2a_ms": a2a * 1e3 if heads % p == 0 else float("nan"),
                    "a2a_comm_ms": a2a_comm * 1e3,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--world", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--layout", default="zigzag", choices=["zigzag", "contiguous"])
    parser.add_argument("--strategies", nargs="+", default=["ring", "all_to_all"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", action="store_true", help="print the model table only")
    args = parser.parse_args(argv)
    if args.model:
        print(
            "| N | P | ring step compute (ms) | ring step K/V transfer (ms) | ring fwd (ms) | "
            "exposed comm (ms) | all-to-all fwd (ms) | of which exchange (ms) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for row in model_rows():
            print(
                f"| {row['seq']} | {row['P']} | {row['step_compute_ms']:.3g} | "
                f"{row['step_comm_ms']:.3g} | {row['ring_ms']:.3g} | {row['ring_exposed_ms']:.3g} | "
                f"{row['a2a_ms']:.3g} | {row['a2a_comm_ms']:.3g} |"
            )
        return
    cfg = {k: v for k, v in vars(args).items() if k not in ("world", "strategies", "model")}
    mib = 1 << 20
    print(
        f"B={args.batch} H={args.heads} N={args.seq} E={args.dim} float32 "
        f"causal={args.causal} layout={args.layout} threads={args.threads}"
    )
    print(
        "| P | strategy | fwd+bwd (s) | saved for backward per rank (MiB) | peak RSS growth per rank (MiB) |"
    )
    print("|---|---|---|---|---|")
    for world in args.world:
        for strategy in ["-"] if world == 1 else args.strategies:
            reports = measure(world, {**cfg, "strategy": strategy})
            t = max(r["time_s"] for r in reports)
            saved = max(r["saved_bytes"] for r in reports) / mib
            rss = max(r["rss_growth"] for r in reports) / mib
            print(f"| {world} | {strategy} | {t:.3f} | {saved:.1f} | {rss:.1f} |")


if __name__ == "__main__":
    main()
