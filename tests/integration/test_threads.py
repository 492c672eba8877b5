"""Threads sharing score modules, masks and call plans: a call never changes what another
thread sees (issue 19, row 4).

A half-precision call computes its softmax in float32, so a score's parameters are
cast for it; the cast is a shallow copy (``attnkit.scores.Score.cast``), never
the module itself. The tests run the real concurrency: several threads released at
once by a barrier, each repeating calls on the same module, and compare every result
with the one computed alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

import attnkit
from attnkit import masks, scores

THREADS = 4


def run_threads(work: Callable[[int], None], threads: int = THREADS) -> list[BaseException]:
    """Run ``work(i)`` in ``threads`` threads released together; return their errors."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def target(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as e:
            with lock:
                errors.append(e)

    pool = [threading.Thread(target=target, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in pool), "a thread did not finish"
    return errors


def _inputs(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 9, 8, generator=gen).to(dtype)
    k = torch.randn(2, 2, 11, 6, generator=gen).to(dtype)
    v = torch.randn(2, 2, 11, 5, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_shared_half_bilinear_across_threads(dtype: torch.dtype) -> None:
    """One bf16/fp16 Bilinear used by 4 threads at once on every CPU backend: no call
    raises, each result equals the serial one bitwise, and the module keeps its dtype
    and values."""
    torch.manual_seed(0)
    score = scores.Bilinear(8, 6, dtype=dtype)
    before = score.weight.detach().clone()
    mask = masks.valid_lens(torch.tensor([7, 11]))
    calls = [
        (backend, m, seed)
        for backend in ("sdpa", "chunked", "reference")
        for m in (None, mask)
        for seed in range(2)
    ]

    def one(backend: str, m: masks.Mask | None, seed: int) -> torch.Tensor:
        q, k, v = _inputs(dtype, seed)
        return attnkit.attention(q, k, v, score=score, mask=m, backend=backend)

    want = [one(*c) for c in calls]
    results: dict[tuple[int, int], torch.Tensor] = {}

    def work(i: int) -> None:
        for rep in range(6):
            for n, c in enumerate(calls):
                results[i, rep * len(calls) + n] = one(*c)

    errors = run_threads(work)
    assert not errors, f"{len(errors)} calls failed, first: {errors[0]!r}"
    for (_, n), got in results.items():
        torch.testing.assert_close(got, want[n % len(calls)], rtol=0, atol=0)
    assert score.weight.dtype == dtype
    assert torch.equal(score.weight.detach(), before)


def test_shared_modules_with_gradients_across_threads() -> None:
    """Learnable scores (bf16 Bilinear, Additive, Gaussian bandwidth) shared by threads
    that each take gradients of their own calls: every gradient equals the serial one."""
    torch.manual_seed(1)
    shared = [
        scores.Bilinear(8, 6, dtype=torch.bfloat16),
        scores.Additive(8, 6, 4, dtype=torch.bfloat16),
    ]
    gauss = scores.Gaussian(1.3, learnable=True).to(torch.bfloat16)

    def grads(n: int) -> list[torch.Tensor]:
        q, k, v = _inputs(torch.bfloat16, n)
        if n % 3 == 2:
            score: scores.Score = gauss
            k = k[..., :8] if k.shape[-1] >= 8 else torch.cat([k, k[..., :2]], -1)  # (.., 8)
        else:
            score = shared[n % 3]
        q.requires_grad_(True)
        out = attnkit.attention(q, k, v, score=score, mask=masks.causal("bottom_right"))
        params = [q, *score.parameters()]
        return list(torch.autograd.grad(out.float().square().sum(), params))

    want = [grads(n) for n in range(6)]
    got: dict[tuple[int, int], list[torch.Tensor]] = {}

    def work(i: int) -> None:
        for rep in range(4):
            for n in range(6):
                got[i, rep * 6 + n] = grads(n)

    errors = run_threads(work)
    assert not errors, f"{len(errors)} calls failed, first: {errors[0]!r}"
    for (_, n), g in got.items():
        for a, b in zip(g, want[n % 6], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    for s in (*shared, gauss):
        assert all(p.dtype == torch.bfloat16 for p in s.parameters())


def test_plans_and_masks_shared_across_threads() -> None:
    """Plain calls (the per-shape plan cache), masks holding tensors (the block-plan
    cache) and forced backends (``use_backend``, per thread) from several threads at
    once: each thread gets its own backend and the serial results."""
    mask = masks.key_padding(torch.tensor([[False] * 9 + [True] * 2, [False] * 11]))
    shapes = [(2, 2, L, 8) for L in (3, 9, 16)]
    names = ("sdpa", "chunked", "reference")

    def one(n: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(n)
        q = torch.randn(shapes[n % 3], generator=gen)
        k, v = torch.randn(2, 2, 11, 8, generator=gen), torch.randn(2, 2, 11, 8, generator=gen)
        plain = attnkit.attention(q, k, v, mask=masks.causal("bottom_right"))
        padded = attnkit.attention(q, k, v, mask=mask)
        return torch.cat([plain, padded], dim=-1)

    want = {(i, n): _forced(names[i % 3], one, n) for i in range(THREADS) for n in range(6)}
    got: dict[tuple[int, int], torch.Tensor] = {}
    chosen: dict[int, set[str]] = {i: set() for i in range(THREADS)}

    def work(i: int) -> None:
        with attnkit.use_backend(names[i % 3]):
            for _ in range(3):
                for n in range(6):
                    got[i, n] = one(n)
                q = torch.randn(shapes[i % 3])
                chosen[i].add(attnkit.explain(q, q, q).chosen or "")

    errors = run_threads(work)
    assert not errors, f"{len(errors)} calls failed, first: {errors[0]!r}"
    for key, g in got.items():
        torch.testing.assert_close(g, want[key], rtol=0, atol=0)
    for i, seen in chosen.items():
        assert seen == {names[i % 3]}, f"thread {i} forced {names[i % 3]}, ran {seen}"


def _forced(name: str, fn: Callable[[int], torch.Tensor], n: int) -> torch.Tensor:
    with attnkit.use_backend(name):
        return fn(n)


@pytest.mark.slow
def test_eight_threads_13200_calls() -> None:
    """8 threads, 1,650 calls each, over 330 distinct calls (plain calls of many shapes,
    so the plan, dispatch and block-plan caches fill and clear under them; masks holding
    tensors shared by every thread; a shared bf16 Bilinear): each result equals the
    serial one bitwise."""
    import random

    bilinear = scores.Bilinear(8, 8, dtype=torch.bfloat16)
    shared_masks = [
        masks.valid_lens(torch.tensor([3, 7])),
        masks.key_padding(torch.rand(2, 7, generator=torch.Generator().manual_seed(2)) < 0.3),
        masks.causal("bottom_right"),
        None,
    ]
    calls = []
    for n in range(330):
        gen = torch.Generator().manual_seed(100 + n)
        L = 1 + n % 11
        half = n % 3 == 0
        dtype = torch.bfloat16 if half else torch.float32
        q = torch.randn(2, 2, L, 8, generator=gen).to(dtype)
        k = torch.randn(2, 2, 7, 8, generator=gen).to(dtype)
        v = torch.randn(2, 2, 7, 8, generator=gen).to(dtype)
        score: scores.Score | str = bilinear if half else ("dot", "scaled_dot", "gaussian")[n % 3]
        calls.append((q, k, v, score, shared_masks[n % 4], (None, "chunked", "reference")[n % 3]))

    def one(n: int) -> torch.Tensor:
        q, k, v, score, mask, backend = calls[n]
        return attnkit.attention(q, k, v, score=score, mask=mask, backend=backend)

    want = [one(n) for n in range(len(calls))]
    bad: list[int] = []

    def work(i: int) -> None:
        order = list(range(len(calls))) * 5
        random.Random(i).shuffle(order)
        for n in order:
            if not torch.equal(one(n), want[n]):
                bad.append(n)

    errors = run_threads(work, threads=8)
    assert not errors, f"{len(errors)} threads failed, first: {errors[0]!r}"
    assert not bad, f"{len(bad)} results differ from the serial ones, e.g. call {bad[0]}"
