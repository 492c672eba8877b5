"""Context parallelism with document ids in any order and with per-head tensor scales.

Both strategies against one process (the float64 reference backend on the full
sequence): forward (output, lse) and gradients (query, key, value, and a learnable
per-head scale summed across the ranks), on 2 gloo ranks (4 under ``slow``).

- Document ids that are not one run per document (``[0, 1, 0, 1, ...]``, padding
  inside a document): the all-to-all runs one call over the full sequence, where
  sdpa's ragged path must take each document whole, and the ring evaluates the mask
  block by block.
- A learnable bias mask gets its gradient through the all-to-all (each rank's part,
  summed); the ring, whose backward gives a mask none, refuses it (one-process test).
- A per-head scale (H,) travels like a score parameter: the ranks agree on its shape,
  dtype and a checksum of its values, the all-to-all gives each rank its heads' part,
  and ranks passing different scales raise the same error everywhere.
"""

from __future__ import annotations

import datetime
import os
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import attnkit
from attnkit import distributed as cp
from attnkit import masks
from attnkit.distributed import comm

from gloo_ranks import free_port, read_report, report_and_leave, run_ranks
from tolerance import FLOAT64_REL, assert_close_to_scale

B, H, E = 2, 4, 3
GROUP_DEADLINE_S = 240


def _spread_ids(n: int, seed: int) -> torch.Tensor:
    """(B, n) ids: documents interleaved, padding inside them, never sorted runs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, 3, (B, n), generator=g)  # (B, n)
    ids[:, 0::3] = 1  # document 1 returns every third position
    ids[1, 1::4] = 2**40  # a large id among small ones
    return ids


def _mask(name: str, n: int) -> masks.Mask:
    doc = masks.document(_spread_ids(n, seed=n))
    if name == "document_spread":
        return doc
    if name == "document_spread_causal":
        return doc & masks.causal()
    assert name == "document_spread_lens"
    return doc & masks.valid_lens(torch.tensor([n - 2, n // 2]), queries=True)


def _close(what: str, got: torch.Tensor, want: torch.Tensor, failures: list[str]) -> None:
    try:
        assert_close_to_scale(got, want, rel=FLOAT64_REL, what=what)
    except AssertionError as exc:
        failures.append(f"{what}: {str(exc).splitlines()[:3]}")


def _compare(
    rank: int, world: int, tag: str, layout: str, strategy: str, n: int, failures: list[str],
    *, mask: masks.Mask | None = None, score: str = "scaled_dot", scale: torch.Tensor | None = None,
    learnt: tuple[torch.Tensor, ...] = (),
) -> None:  # fmt: skip
    """One call: output, lse and gradients against the reference backend on one process;
    ``learnt``: the mask's tensors that require grad (each rank's part summed)."""
    torch.manual_seed(n + len(tag))
    q, k = (torch.randn(B, H, n, E, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(B, H, n, E + 1, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(B, H, n, E + 1, dtype=torch.float64)
    d_lse = torch.randn(B, H, n, dtype=torch.float64)
    extra = [scale] if scale is not None and scale.requires_grad else []
    extra += learnt
    out_ref, lse_ref = attnkit.attention(q, k, v, score=score, mask=mask, scale=scale,
                                         return_lse=True, backend="reference")  # fmt: skip
    live = torch.isfinite(lse_ref)
    loss_ref = (out_ref * d_out).sum() + torch.where(live, lse_ref * d_lse, 0).sum()
    grads_ref = torch.autograd.grad(loss_ref, [q, k, v, *extra])

    def mine(t: torch.Tensor) -> torch.Tensor:
        return cp.shard(t.detach(), rank=rank, world_size=world, layout=layout)  # type: ignore[arg-type]

    def full(t: torch.Tensor) -> torch.Tensor:
        return cp.unshard(t, layout=layout)  # type: ignore[arg-type]

    q_r, k_r, v_r = (mine(t).requires_grad_() for t in (q, k, v))
    out, lse = cp.context_parallel_attention(
        q_r, k_r, v_r, score=score, mask=mask, scale=scale, layout=layout,  # type: ignore[arg-type]
        strategy=strategy, return_lse=True,
    )  # fmt: skip
    d_lse_r = mine(d_lse.unsqueeze(-1)).squeeze(-1)  # (B, H, L_r)
    loss = (out * mine(d_out)).sum() + torch.where(torch.isfinite(lse), lse * d_lse_r, 0).sum()
    for t in extra:
        t.grad = None
    loss.backward()
    _close(f"{tag} output", full(out.detach()), out_ref.detach(), failures)
    _close(f"{tag} lse", full(lse.detach().unsqueeze(-1)).squeeze(-1), lse_ref.detach(), failures)
    for name, got, want in zip(("dq", "dk", "dv"), (q_r, k_r, v_r), grads_ref, strict=False):
        assert got.grad is not None
        _close(f"{tag} {name}", full(got.grad), want, failures)
    for t, want in zip(extra, grads_ref[3:], strict=True):
        assert t.grad is not None
        comm.all_reduce(t.grad, None, "a gradient")  # each rank's part, summed
        _close(f"{tag} d {'scale' if t is scale else 'bias'}", t.grad, want, failures)


def _disagreeing_scales(rank: int, world: int, failures: list[str]) -> int:
    """Ranks passing different per-head scales raise the same error on every rank."""
    x = cp.shard(torch.randn(B, H, 2 * world + 1, E, dtype=torch.float64), rank=rank,
                 world_size=world)  # fmt: skip
    bad: list[tuple[str, Any, str]] = [
        ("values", torch.tensor([1.0, 2.0, 3.0, 4.0 + rank], dtype=torch.float64), "checksums"),
        ("float and tensor", 0.5 if rank == 0 else torch.full((H,), 0.5), "per-head tensor"),
        ("shapes", torch.ones(1 if rank == 0 else H, dtype=torch.float64), "different shapes"),
    ]
    for what, scale, expected in bad:
        try:
            cp.context_parallel_attention(x, x, x, scale=scale)
            failures.append(f"scales that differ ({what}): no error")
        except cp.ContextParallelError as exc:
            if expected not in str(exc) or "scale" not in str(exc):
                failures.append(f"scales that differ ({what}): {exc}")
    return len(bad)


def _cases(world: int) -> list[tuple[str, str, str, str]]:
    """(what, layout, strategy, mask or score): both strategies, both layouts."""
    out = []
    for layout in ("zigzag", "contiguous"):
        for strategy in ("ring", "all_to_all"):
            for mask in ("document_spread", "document_spread_causal", "document_spread_lens"):
                out.append(("mask", layout, strategy, mask))
            for score in ("scaled_dot", "gaussian"):
                out.append(("scale", layout, strategy, score))
        out.append(("bias", layout, "all_to_all", "learnt_bias"))  # (the ring refuses it)
    return out


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    failures: list[str] = []
    ran = 0
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
        )
        n = 4 * world + 3  # uneven shards
        for what, layout, strategy, name in _cases(world):
            tag = f"{name}/{layout}/{strategy}"
            if what == "mask":
                _compare(rank, world, tag, layout, strategy, n, failures, mask=_mask(name, n))
            elif what == "bias":
                bias = torch.randn(1, H, n, n, dtype=torch.float64).requires_grad_()
                _compare(rank, world, tag, layout, strategy, n, failures,
                         mask=masks.bias(bias), learnt=(bias,))  # fmt: skip
            else:
                scale = torch.tensor([0.3, 0.7, 1.1, 2.0], dtype=torch.float64).requires_grad_()
                _compare(rank, world, tag, layout, strategy, n, failures, mask=masks.causal(),
                         score=name, scale=scale)  # fmt: skip
            ran += 1
        ran += _disagreeing_scales(rank, world, failures)
    except Exception:
        failures.append(traceback.format_exc())
    finally:
        report_and_leave(Path(out_dir, f"rank{rank}.json"), {"ran": ran, "failures": failures})


@pytest.mark.parametrize("world", [pytest.param(w, marks=pytest.mark.slow) for w in (2, 4)])
def test_documents_in_any_order_and_per_head_scales_match_one_process(
    world: int, tmp_path: Path
) -> None:
    run_ranks(_worker, world, (world, free_port(), str(tmp_path)), str(tmp_path),
              GROUP_DEADLINE_S)  # fmt: skip
    for rank in range(world):
        report = read_report(tmp_path / f"rank{rank}.json", rank)
        assert report["failures"] == [], f"rank {rank}: " + "\n".join(report["failures"][:10])
        assert report["ran"] == len(_cases(world)) + 3
