"""Context-parallel attention across 2 and 4 gloo processes against single-process attention().

One process group per world size runs every case in a loop (starting processes is
the expensive part): each rank builds the same full tensors from a fixed seed,
keeps its shard, runs :func:`attnkit.distributed.context_parallel_attention`
forward and backward, and compares its output, lse and gradients (query, key,
value, score parameters summed across ranks) with ``attnkit.attention`` on the
full sequence in float64. Bad input must raise on every rank; collectives are
guarded by the process group's timeout and the parent kills a group that does not
finish, so a hang fails the test instead of stalling the suite. The default run
starts one group of 2 ranks for one representative case (``ONE_CASE``); every case on
2 and 4 ranks is marked slow.
"""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import attnkit
from attnkit import distributed as cp
from attnkit import masks, scores
from attnkit.distributed import ring
from attnkit.nn import MultiheadAttention, SelfAttention

from cases import packed_ids
from gloo_ranks import free_port, read_report, report_and_leave, run_ranks
from tolerance import FLOAT64_REL, assert_close_to_scale, half_parts_grad_rel

GROUP_DEADLINE_S = 240
B, H, E = 2, 4, 3

SCORES = ("dot", "scaled_dot", "bilinear", "additive", "gaussian")
MASKS = (
    "none",
    "causal",
    "causal_bottom_right",
    "window",
    "window_bottom_right",
    "valid_lens",
    "valid_lens_rows",
    "valid_lens_queries",
    "key_padding",
    "keep",
    "bias",
    "combined",
)
PACKED_MASKS = (
    "document",
    "document_causal",
    "prefix_lm",
    "window_or_padding",
    "not_causal_and_lens",
)
"""The kinds packed training needs (documents, prefix LM, | and ~), L = S."""


def _make_score(name: str) -> str | scores.Score:
    torch.manual_seed(5)
    if name == "bilinear":
        return scores.Bilinear(E, E, dtype=torch.float64)
    if name == "additive":
        return scores.Additive(E, E, 4, dtype=torch.float64)
    if name == "gaussian":
        return scores.Gaussian(1.3, learnable=True).to(torch.float64)
    return name


def _make_mask(name: str, L: int, S: int, seed: int) -> masks.Mask | None:
    gen = torch.Generator().manual_seed(seed)
    if name == "none":
        return None
    if name == "causal":
        return masks.causal()
    if name == "causal_bottom_right":
        return masks.causal("bottom_right")
    if name == "window":
        return masks.window(2, 1)
    if name == "window_bottom_right":
        return masks.window(3, 0, "bottom_right")
    if name == "valid_lens":
        return masks.valid_lens(torch.tensor([S - 3, 1]))
    if name == "valid_lens_rows":
        return masks.valid_lens(torch.randint(0, S + 1, (B, L), generator=gen))
    if name == "valid_lens_queries":  # the later query rows are padding: some ranks have no row
        return masks.valid_lens(torch.tensor([min(L, S) - 4, 2]), queries=True)
    if name == "key_padding":
        pad = torch.rand(B, S, generator=gen) < 0.3
        pad[1] = True  # a batch element with every key padded
        return masks.key_padding(pad)
    if name == "keep":
        return masks.keep(torch.rand(B, 1, L, S, generator=gen) < 0.7)
    if name in ("document", "document_causal"):
        doc = masks.document(packed_ids(B, L, gen))  # (B, N): the queries' and keys' ids
        return doc & masks.causal() if name == "document_causal" else doc
    if name == "prefix_lm":
        return masks.prefix_lm(torch.tensor([L // 2, 0]))
    if name == "window_or_padding":
        return masks.window(1, 1) | masks.key_padding(torch.rand(B, S, generator=gen) < 0.8)
    if name == "not_causal_and_lens":
        return ~masks.causal() & masks.valid_lens(torch.tensor([S - 2, S // 2]))
    bias = torch.randn(B, H, L, S, generator=gen, dtype=torch.float64)
    bias = bias.masked_fill(torch.rand(B, H, L, S, generator=gen) < 0.2, float("-inf"))
    if name == "bias":
        return masks.bias(bias)
    pad = torch.rand(B, S, generator=gen) < 0.2
    return masks.causal("bottom_right") & masks.key_padding(pad) & masks.bias(bias)


def _close(what: str, got: torch.Tensor, want: torch.Tensor, failures: list[str]) -> None:
    try:
        assert_close_to_scale(got, want, rel=FLOAT64_REL, what=what)
    except AssertionError as exc:
        failures.append(f"{what}: {str(exc).splitlines()[0:3]}")


def _run_case(
    rank: int,
    world: int,
    score_name: str,
    mask_name: str,
    layout: str,
    strategy: str,
    L: int,
    S: int,
    failures: list[str],
) -> None:
    """One comparison: forward (out, lse) and backward (q, k, v, score parameters)."""
    tag = f"{score_name}/{mask_name}/{layout}/{strategy}/L={L},S={S}"
    torch.manual_seed(L * 100 + S)
    q = torch.randn(B, H, L, E, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, S, E, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, S, E + 1, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(B, H, L, E + 1, dtype=torch.float64)
    d_lse = torch.randn(B, H, L, dtype=torch.float64)
    score = _make_score(score_name)
    mask = _make_mask(mask_name, L, S, seed=L + S)
    params = [] if isinstance(score, str) else list(score.parameters())

    out_ref, lse_ref = attnkit.attention(q, k, v, score=score, mask=mask, return_lse=True)
    live = torch.isfinite(lse_ref)
    loss_ref = (out_ref * d_out).sum() + torch.where(live, lse_ref * d_lse, 0).sum()
    grads_ref = torch.autograd.grad(loss_ref, [q, k, v, *params])

    def mine(t: torch.Tensor) -> torch.Tensor:
        return cp.shard(t.detach(), rank=rank, world_size=world, layout=layout)  # type: ignore[arg-type]

    q_r, k_r, v_r = (mine(t).requires_grad_() for t in (q, k, v))
    out, lse = cp.context_parallel_attention(
        q_r, k_r, v_r, score=score, mask=mask, layout=layout,  # type: ignore[arg-type]
        strategy=strategy, return_lse=True,
    )  # fmt: skip
    live_r = torch.isfinite(lse)
    d_lse_r = mine(d_lse.unsqueeze(-1)).squeeze(-1)  # (B, H, L_r)
    loss = (out * mine(d_out)).sum() + torch.where(live_r, lse * d_lse_r, 0).sum()
    for p in params:
        p.grad = None
    loss.backward()
    if not isinstance(score, str):
        cp.all_reduce_grads(score)

    def full(t: torch.Tensor) -> torch.Tensor:
        return cp.unshard(t, layout=layout)  # type: ignore[arg-type]

    _close(f"{tag} output", full(out), out_ref.detach(), failures)
    _close(f"{tag} lse", full(lse.unsqueeze(-1)).squeeze(-1), lse_ref.detach(), failures)
    for name, got, want in zip(("dq", "dk", "dv"), (q_r, k_r, v_r), grads_ref, strict=False):
        assert got.grad is not None
        _close(f"{tag} {name}", full(got.grad), want, failures)
    for i, (p, want) in enumerate(zip(params, grads_ref[3:], strict=True)):
        assert p.grad is not None
        _close(f"{tag} score parameter {i}", p.grad, want, failures)


def _expect_error_everywhere(
    what: str, call: Callable[[], Any], failures: list[str], kinds: tuple[type, ...]
) -> None:
    try:
        call()
    except kinds:
        return
    except Exception as exc:
        failures.append(f"{what}: raised {type(exc).__name__}: {exc}")
        return
    failures.append(f"{what}: no error")


def _error_cases(rank: int, world: int, failures: list[str]) -> int:
    """Bad input raises on every rank and leaves the group usable; returns cases run."""
    torch.manual_seed(0)
    n = 2 * world + 1
    x = torch.randn(B, H, n, E, dtype=torch.float64)
    mine = cp.shard(x, rank=rank, world_size=world, layout="zigzag")
    # shard shapes differ across ranks (feature dim)
    odd = torch.randn(B, H, mine.shape[-2], E + 1, dtype=torch.float64) if rank == 1 else mine
    _expect_error_everywhere(
        "mismatched shards",
        lambda: cp.context_parallel_attention(odd, odd, odd),
        failures,
        (cp.ContextParallelError,),
    )
    # one rank's own argument is bad: every rank raises the same error, naming that rank
    bad_mask: Any = torch.ones(B, H, n, n, dtype=torch.bool) if rank == 0 else None
    _expect_error_everywhere(
        "a bad argument on rank 0",
        lambda: cp.context_parallel_attention(mine, mine, mine, mask=bad_mask),
        failures,
        (cp.ContextParallelError,),
    )
    # lengths that do not follow the layout's cut
    wrong = x[..., : (3 if rank == 0 else 1), :].contiguous()
    _expect_error_everywhere(
        "shard lengths off the layout",
        lambda: cp.context_parallel_attention(wrong, wrong, wrong),
        failures,
        (cp.ContextParallelError,),
    )
    # a strategy that cannot apply: heads do not divide by the world size
    three = torch.randn(B, world + 1, mine.shape[-2], E, dtype=torch.float64)
    _expect_error_everywhere(
        "all_to_all with heads % P != 0",
        lambda: cp.context_parallel_attention(three, three, three, strategy="all_to_all"),
        failures,
        (cp.ContextParallelError,),
    )
    # a mask that does not describe the full sequence
    _expect_error_everywhere(
        "a mask of the shard's size",
        lambda: cp.context_parallel_attention(
            mine,
            mine,
            mine,
            mask=masks.key_padding(torch.zeros(B, mine.shape[-2], dtype=torch.bool)),
        ),
        failures,
        (cp.ContextParallelError,),
    )
    # a group of one rank
    solo = dist.new_group(ranks=[0])
    if rank == 0:
        _expect_error_everywhere(
            "a group of size 1",
            lambda: cp.context_parallel_attention(mine, mine, mine, group=solo),
            failures,
            (cp.ContextParallelError,),
        )
    # a gradient penalty (create_graph=True): exact on the all-to-all, refused by the ring
    # (its block backwards have no graph: the penalty's terms were dropped silently)
    gen = torch.Generator().manual_seed(3)  # (the same on every rank: rank 1 drew more above)
    four = torch.randn(B, 2 * world, n, E, generator=gen, dtype=torch.float64, requires_grad=True)
    full = attnkit.attention(four, four, four, mask=masks.causal())
    (d_full,) = torch.autograd.grad(full.sum(), [four], create_graph=True)
    (want,) = torch.autograd.grad(full.sum() + (d_full**2).sum(), [four])
    part = cp.shard(four.detach(), rank=rank, world_size=world).requires_grad_()
    out = cp.context_parallel_attention(part, part, part, mask=masks.causal(),
                                        strategy="all_to_all")  # fmt: skip
    (d_part,) = torch.autograd.grad(out.sum(), [part], create_graph=True)
    (got,) = torch.autograd.grad(out.sum() + (d_part**2).sum(), [part])
    _close("gradient penalty, all_to_all", cp.unshard(got), want, failures)
    ring_out = cp.context_parallel_attention(part, part, part, mask=masks.causal(),
                                             strategy="ring")  # fmt: skip
    _expect_error_everywhere(
        "a gradient penalty through the ring",
        lambda: torch.autograd.grad(ring_out.sum(), [part], create_graph=True),
        failures,
        (cp.ContextParallelError,),
    )
    # the group still works after the errors
    out = cp.context_parallel_attention(mine, mine, mine, mask=masks.causal())
    ref = cp.shard(attnkit.attention(x, x, x, mask=masks.causal()), rank=rank, world_size=world)
    _close("after errors", out, ref, failures)
    return 8


def _layer_cases(rank: int, world: int, failures: list[str]) -> int:
    """ContextParallel(SelfAttention / MultiheadAttention) against the plain layer."""
    n, hidden = 2 * world + 3, 8
    torch.manual_seed(3)
    x = torch.randn(B, n, hidden, dtype=torch.float64)
    layers: list[tuple[torch.nn.Module, dict[str, Any]]] = [
        (SelfAttention(hidden, num_heads=2, dtype=torch.float64), {"mask": masks.causal()}),
        (
            MultiheadAttention(hidden, 2, batch_first=True, dtype=torch.float64),
            {"attn_mask": masks.window(2, 1), "need_weights": False},
        ),
    ]
    for layer, kwargs in layers:
        name = type(layer).__name__
        x_full = x.clone().requires_grad_()
        args = (x_full,) if isinstance(layer, SelfAttention) else (x_full, x_full, x_full)
        ref = layer(*args, **kwargs)
        ref = ref[0] if isinstance(ref, tuple) else ref
        d_out = torch.randn_like(ref)
        ref_grads = torch.autograd.grad((ref * d_out).sum(), [x_full, *layer.parameters()])
        x_mine = cp.shard(x, rank=rank, world_size=world, dim=1).requires_grad_()
        wrapped = cp.ContextParallel(layer)
        args = (x_mine,) if isinstance(layer, SelfAttention) else (x_mine, x_mine, x_mine)
        out = wrapped(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        (out * cp.shard(d_out, rank=rank, world_size=world, dim=1)).sum().backward()
        cp.all_reduce_grads(layer)
        _close(f"{name} output", cp.unshard(out.detach(), dim=1), ref.detach(), failures)
        assert x_mine.grad is not None
        _close(f"{name} dx", cp.unshard(x_mine.grad, dim=1), ref_grads[0], failures)
        for p, want in zip(layer.parameters(), ref_grads[1:], strict=True):
            assert p.grad is not None
            _close(f"{name} parameter grad", p.grad, want, failures)
        # outside the wrapper the layer runs as before, on the full sequence
        plain = layer(*((x,) * len(args)), **kwargs)
        plain = plain[0] if isinstance(plain, tuple) else plain
        _close(f"{name} unwrapped", plain, ref.detach(), failures)
    return len(layers)


def _autocast_case(rank: int, world: int, failures: list[str]) -> int:
    """The ring under bfloat16 autocast, backward after the block, against one process
    under the same autocast (its backward once got the float32 queries beside the
    bfloat16 output and refused them)."""
    n = 2 * world + 3
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, n, 8, generator=g) for _ in range(3))  # (B, H, n, 8)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    mine = [cp.shard(t, rank=rank, world_size=world, dim=2).requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = attnkit.attention(*full, mask=masks.causal())
        out = cp.context_parallel_attention(*mine, mask=masks.causal(), strategy="ring")
    d_out = torch.randn(ref.shape, generator=g)
    ref.float().mul(d_out).sum().backward()
    out.float().mul(cp.shard(d_out, rank=rank, world_size=world, dim=2)).sum().backward()
    try:
        assert out.dtype == ref.dtype == torch.bfloat16
        rel = half_parts_grad_rel(torch.bfloat16, world)  # (one key block per rank)
        got = cp.unshard(out.detach().float(), dim=2)
        assert_close_to_scale(got, ref.detach().float(), rel=rel, what="autocast output")
        for t, t_full in zip(mine, full, strict=True):
            assert t.grad is not None and t_full.grad is not None and t.grad.dtype == t.dtype
            got = cp.unshard(t.grad, dim=2)
            assert_close_to_scale(got, t_full.grad, rel=rel, what="autocast gradient")
    except AssertionError as exc:
        failures.append(f"autocast ring: {str(exc).splitlines()[0:3]}")
    return 1


def _cases(world: int) -> list[tuple[str, str, str, str, int, int]]:
    """(score, mask, layout, strategy, L, S), lengths odd (uneven shards).

    The ring evaluates the mask block by block: on 2 ranks every score x mask kind x
    layout. The all-to-all runs one call over the full sequence: every mask kind with
    two scores and every score with the combined mask. On 4 ranks (the same code with
    longer rings, uneven hops and K/V gradients coming home from further away) every
    mask kind with one score and every score with the combined mask, per strategy.
    The packed-training kinds (documents, prefix LM, | and ~): on 2 ranks with three
    scores on the ring and one on the all-to-all, on 4 ranks two of them with one."""
    n = 4 * world + 3
    out = []
    for layout in ("zigzag", "contiguous"):
        for strategy in ("ring", "all_to_all"):
            for score in SCORES:
                for mask in MASKS:
                    if world == 2 and strategy == "ring":
                        wanted = True
                    elif world == 2:
                        wanted = score in ("scaled_dot", "additive") or mask == "combined"
                    else:
                        wanted = score == "additive" or mask == "combined"
                    if wanted:
                        out.append((score, mask, layout, strategy, n, n))
            for mask in PACKED_MASKS:
                if world == 2 and strategy == "ring":
                    wanted_scores: tuple[str, ...] = ("scaled_dot", "additive", "gaussian")
                elif world == 2 or mask in ("document_causal", "window_or_padding"):
                    wanted_scores = ("scaled_dot",)
                else:
                    wanted_scores = ()
                out += [(score, mask, layout, strategy, n, n) for score in wanted_scores]
            for mask in ("causal_bottom_right", "window_bottom_right", "combined"):
                out.append(("scaled_dot", mask, layout, strategy, n - 2, n + 2))  # L != S
            out.append(("scaled_dot", "valid_lens_queries", layout, strategy, n + 2, n - 2))
    return out


ONE_CASE = ("additive", "combined", "zigzag", "ring")
"""The default run's representative: 2 ranks, the ring over a zigzag layout, the combined
mask (bottom-right causal, key padding and a bias) and a score with parameters, forward
and backward. Every case, the bad-input checks and the layers on 2 and 4 ranks are slow."""


def _plan(world: int, every: bool) -> list[tuple[str, str, str, str, int, int]]:
    """The cases one group runs: all of ``_cases(world)``, or the default representative."""
    cases = _cases(world)
    return cases if every else [c for c in cases if c[:4] == ONE_CASE and c[4] == c[5]]


def _worker(rank: int, world: int, port: int, out_dir: str, every: bool) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    ring.BACKWARD_ROWS = 4  # the ring's backward recomputes blocks in pieces of 4 rows
    failures: list[str] = []
    ran = 0
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
        )
        for case in _plan(world, every):
            _run_case(rank, world, *case, failures)
            ran += 1
        ran += _autocast_case(rank, world, failures)
        if every:
            ran += _error_cases(rank, world, failures)
            ran += _layer_cases(rank, world, failures)
    except Exception:
        failures.append(traceback.format_exc())
    finally:
        report_and_leave(Path(out_dir, f"rank{rank}.json"), {"ran": ran, "failures": failures})


@pytest.mark.parametrize(
    ("world", "every"),
    [
        pytest.param(2, False, id="2-one_case"),
        pytest.param(2, True, id="2", marks=pytest.mark.slow),
        pytest.param(4, True, id="4", marks=pytest.mark.slow),
    ],
)
def test_context_parallel_matches_single_process(world: int, every: bool, tmp_path: Path) -> None:
    run_ranks(_worker, world, (world, free_port(), str(tmp_path), every), str(tmp_path),
              GROUP_DEADLINE_S)  # fmt: skip
    expected = len(_plan(world, every)) + 1 + (8 + 2 if every else 0)
    for rank in range(world):
        report = read_report(tmp_path / f"rank{rank}.json", rank)
        assert report["failures"] == [], f"rank {rank}: " + "\n".join(report["failures"][:10])
        assert report["ran"] == expected
