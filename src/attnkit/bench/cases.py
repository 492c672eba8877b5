"""Benchmark cases: each builds an attnkit callable and its baseline on fixed-seed inputs.

Every case has full shapes (the figures in BENCHMARKS.md) and quick shapes
(seconds, for a smoke run). ``speedup`` means baseline time / attnkit time, so
higher is better for attnkit; ``goal`` is the minimum speedup of the target.
This module holds the CPU throughput cases (``attnkit bench``, suite ``all``) and
the two records every suite shares (:class:`Sides`, :class:`BenchCase`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks, scores

__all__ = ["CASES", "BenchCase", "Sides", "max_abs_diff"]


@dataclass
class Sides:
    """The two callables of a case, built on the same inputs.

    ``check`` returns the largest absolute difference between the two results on
    the region they are compared on (None when they compute different things).
    ``repeat``: calls per timed sample (many for microsecond calls, so one sample is
    long enough to time); times are reported per call. ``counts`` returns figures
    measured once after timing (graph breaks, recompiles); ``backend`` names the
    attnkit backend that ran (from :func:`attnkit.explain`); ``sync`` ends each timed
    sample (a device synchronization for accelerator calls); ``figures`` returns
    further figures measured once after timing (a per-stage cost of the call).
    """

    attnkit: Callable[[], Any]
    baseline: Callable[[], Any] | None
    baseline_name: str
    shape: str
    check: Callable[[], float] | None = None
    repeat: int = 1
    counts: Callable[[], dict[str, int]] | None = None
    backend: Callable[[], str | None] | None = None
    sync: Callable[[], None] | None = None
    figures: Callable[[], dict[str, float]] | None = None

    @classmethod
    def compared(
        cls,
        ours: Callable[[], torch.Tensor],
        theirs: Callable[[], torch.Tensor],
        baseline_name: str,
        shape: str,
        **rest: Any,
    ) -> Sides:
        """Sides ``ours`` (attnkit) and ``theirs`` (the baseline), each returning one
        tensor of the same shape, checked by :func:`max_abs_diff` of a call of each;
        ``rest`` are the other fields."""
        return cls(
            ours, theirs, baseline_name, shape, lambda: max_abs_diff(ours(), theirs()), **rest
        )


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference of a and b (one shape, any float dtype), read in
    float32 or wider; 0.0 when they are empty."""
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


@dataclass(frozen=True)
class BenchCase:
    """One benchmark: name, target text, minimum speedup, and a builder of its sides.

    ``build(quick)`` returns the sides. ``mem_goal`` is the largest allowed
    attnkit/baseline peak extra memory ratio; ``mem_limit_mib`` an absolute cap
    on attnkit's peak extra memory; ``timed=False`` cases only measure memory.
    ``max_extra_s``: a target on the difference of per-call times instead of their
    ratio (attnkit may take at most this much longer than the baseline);
    ``count_limits``: the largest allowed value of each of the side's ``counts``;
    ``max_pairs``: interleaved pairs at most (more for noisy microsecond calls);
    ``memory=False``: no peak-memory children (nothing to learn at tiny shapes).
    """

    name: str
    suite: str
    target: str
    goal: float | None
    build: Callable[[bool], Sides]
    mem_goal: float | None = None
    mem_limit_mib: float | None = None
    timed: bool = True
    max_extra_s: float | None = None
    count_limits: tuple[tuple[str, int], ...] = ()
    max_pairs: int = 15
    memory: bool = True


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qkv(B: int, H: int, L: int, S: int, E: int, Ev: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = _gen(seed)
    q = torch.randn(B, H, L, E, generator=g)  # (B, H, L, E)
    k = torch.randn(B, H, S, E, generator=g)  # (B, H, S, E)
    v = torch.randn(B, H, S, Ev, generator=g)  # (B, H, S, Ev)
    return q, k, v


# --------------------------------------------------------------------------- 1. dense


def _dense(quick: bool) -> Sides:
    B, H, N, E = (2, 2, 64, 16) if quick else (4, 8, 2048, 64)
    q, k, v = _qkv(B, H, N, N, E, E, 1)
    return Sides.compared(
        lambda: attnkit.attention(q, k, v),
        lambda: F.scaled_dot_product_attention(q, k, v),
        "torch SDPA",
        f"B={B} H={H} L=S={N} E={E}",
    )


# --------------------------------------------------------------------------- 2. ragged


def _ragged(queries: bool) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        B, H, N, E = (4, 2, 64, 16) if quick else (16, 8, 1024, 64)
        q, k, v = _qkv(B, H, N, N, E, E, 2)
        # lengths uniform in [N/10, N], drawn stratified (one per B-quantile, in a fixed
        # shuffled order) so the batch's total work matches the distribution's mean
        strata = (torch.arange(B, dtype=torch.float64) + 0.5) / B  # (B,)
        lens = (N / 10 + (N - N / 10) * strata).round().long()  # (B,)
        lens = lens[torch.randperm(B, generator=_gen(3))]  # (B,)
        key_keep = torch.arange(N) < lens[:, None]  # (B, S)
        sdpa_mask = key_keep[:, None, None, :]  # (B, 1, 1, S)
        mask = masks.valid_lens(lens, queries=queries)

        def check() -> float:
            a = attnkit.attention(q, k, v, mask=mask)
            b = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)
            rows = key_keep if queries else torch.ones(B, N, dtype=torch.bool)  # (B, L)
            sel = rows[:, None, :, None].expand_as(a)  # (B, H, L, Ev)
            return max_abs_diff(a[sel], b[sel])

        return Sides(
            attnkit=lambda: attnkit.attention(q, k, v, mask=mask),
            baseline=lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask),
            baseline_name="SDPA + bool key mask",
            shape=f"B={B} H={H} N={N} E={E} lens~U[N/10, N] mean={float(lens.float().mean()):.0f}",
            check=check,
        )

    return build


# --------------------------------------------------------------------------- 3. causal


def _causal(quick: bool) -> Sides:
    B, H, N, E = (2, 2, 64, 16) if quick else (2, 8, 2048, 64)
    q, k, v = _qkv(B, H, N, N, E, E, 4)
    dense = torch.ones(N, N, dtype=torch.bool).tril()  # (L, S)
    mask = masks.causal()
    return Sides.compared(
        lambda: attnkit.attention(q, k, v, mask=mask),
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
        "SDPA + dense bool causal",
        f"B={B} H={H} L=S={N} E={E}",
    )


# --------------------------------------------------------------------------- 4. window


def _window(n_full: int) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        B, H, N, E, W = (1, 2, 256, 16, 32) if quick else (1, 8, n_full, 64, 256)
        q, k, v = _qkv(B, H, N, N, E, E, 5)
        mask = masks.window(W, 0)

        def dense() -> torch.Tensor:
            i = torch.arange(N)
            return (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - W)  # (L, S)

        def baseline() -> torch.Tensor:
            # the dense mask is part of what the baseline pays for
            return F.scaled_dot_product_attention(q, k, v, attn_mask=dense())

        return Sides.compared(
            lambda: attnkit.attention(q, k, v, mask=mask),
            baseline,
            "SDPA + dense bool window",
            f"B={B} H={H} N={N} E={E} window({W}, 0)",
        )

    return build


# --------------------------------------------------------------------------- 5, 7. additive


def d2l_additive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score: scores.Additive
) -> torch.Tensor:
    """The materialized additive attention of the d2l book: (B, L, S, hidden) features.

    q (B, L, Eq), k (B, S, Ek), v (B, S, Ev) -> (B, L, Ev).
    """
    qh, kh = score.W_q(q), score.W_k(k)  # (B, L, h), (B, S, h)
    feats = torch.tanh(qh.unsqueeze(2) + kh.unsqueeze(1))  # (B, L, S, h)
    logits = score.w_v(feats).squeeze(-1)  # (B, L, S)
    return torch.bmm(torch.softmax(logits, dim=-1), v)  # (B, L, Ev)


def _additive_inputs(
    B: int, L: int, hidden: int, E: int, Ev: int, grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, scores.Additive]:
    g = _gen(6)
    torch.manual_seed(6)
    score = scores.Additive(E, E, hidden)
    q = torch.randn(B, L, E, generator=g, requires_grad=grad)  # (B, L, E)
    k = torch.randn(B, L, E, generator=g, requires_grad=grad)  # (B, S, E)
    v = torch.randn(B, L, Ev, generator=g, requires_grad=grad)  # (B, S, Ev)
    return q, k, v, score


def _additive(long: bool) -> Callable[[bool], Sides]:
    """The additive score's forward against d2l's materialized one; ``long``: at a length
    the materialized features do not fit, attnkit alone."""

    def build(quick: bool) -> Sides:
        if long:
            B, L, hidden, E, Ev = (1, 512, 16, 16, 8) if quick else (1, 16384, 128, 64, 64)
        else:
            B, L, hidden, E, Ev = (2, 64, 16, 16, 8) if quick else (2, 1024, 128, 64, 64)
        q, k, v, score = _additive_inputs(B, L, hidden, E, Ev, grad=False)
        shape = f"B={B} L=S={L} hidden={hidden} E={E} Ev={Ev}"

        def ours() -> torch.Tensor:
            with torch.no_grad():
                return attnkit.attention(q, k, v, score=score)

        if long:
            return Sides(attnkit=ours, baseline=None, baseline_name="(attnkit only)", shape=shape)

        def theirs() -> torch.Tensor:
            with torch.no_grad():
                return d2l_additive(q, k, v, score)

        return Sides.compared(ours, theirs, "d2l materialized", shape)

    return build


def _additive_train(quick: bool) -> Sides:
    B, L, hidden, E, Ev = (2, 64, 16, 16, 8) if quick else (2, 1024, 128, 64, 64)
    q, k, v, score = _additive_inputs(B, L, hidden, E, Ev, grad=True)
    leaves = [q, k, v, *score.parameters()]

    def step(f: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
        for t in leaves:
            t.grad = None
        f().square().sum().backward()
        return [t.grad.clone() for t in leaves if t.grad is not None]

    def ours() -> list[torch.Tensor]:
        return step(lambda: attnkit.attention(q, k, v, score=score))

    def theirs() -> list[torch.Tensor]:
        return step(lambda: d2l_additive(q, k, v, score))

    def check() -> float:
        return max(max_abs_diff(a, b) for a, b in zip(ours(), theirs(), strict=True))

    return Sides(
        attnkit=ours,
        baseline=theirs,
        baseline_name="d2l materialized, autograd",
        shape=f"B={B} L=S={L} hidden={hidden} E={E} Ev={Ev}, forward+backward",
        check=check,
    )


# --------------------------------------------------------------------------- 6. scores


def _score_case(kind: str) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        B, H, N, E = (2, 2, 64, 16) if quick else (4, 8, 1024, 64)
        q, k, v = _qkv(B, H, N, N, E, E, 7)
        torch.manual_seed(7)
        score: scores.Score = scores.Gaussian(2.0) if kind == "gaussian" else scores.Bilinear(E, E)
        return Sides(
            attnkit=lambda: attnkit.attention(q, k, v, score=score),
            baseline=lambda: F.scaled_dot_product_attention(q, k, v),
            baseline_name="torch SDPA (dot)",
            shape=f"B={B} H={H} L=S={N} E={E}",
        )

    return build


# --------------------------------------------------------------------------- 8. weights


def _weights(quick: bool) -> Sides:
    B, H, N, E = (2, 2, 64, 16) if quick else (4, 8, 1024, 64)
    q, k, v = _qkv(B, H, N, N, E, E, 8)

    def check() -> float:
        out, w = attnkit.attention(q, k, v, return_weights=True)
        ref_w = torch.softmax(q @ k.transpose(-2, -1) / E**0.5, dim=-1)
        return max(max_abs_diff(w, ref_w), max_abs_diff(out, attnkit.attention(q, k, v)))

    return Sides(
        attnkit=lambda: attnkit.attention(q, k, v, return_weights=True),
        baseline=lambda: attnkit.attention(q, k, v),
        baseline_name="attnkit, no weights",
        shape=f"B={B} H={H} L=S={N} E={E}",
        check=check,
    )


CASES: tuple[BenchCase, ...] = (
    BenchCase("dense", "dense", "≥ 0.95× SDPA", 0.95, _dense),
    BenchCase("ragged_queries", "ragged", "≥ 2×", 2.0, _ragged(True)),
    BenchCase("ragged_keys", "ragged", "≥ 1.4×", 1.4, _ragged(False)),
    BenchCase("causal", "causal", "≥ 1.4×", 1.4, _causal),
    BenchCase("window_4096", "window", "linear memory", None, _window(4096)),
    BenchCase("window_8192", "window", "≥ 8×", 8.0, _window(8192)),
    BenchCase(
        "additive", "additive", "≥ 10×, ≤ 1/50 memory", 10.0, _additive(long=False), mem_goal=1 / 50
    ),
    BenchCase(
        "additive_16k",
        "additive",
        "< 512 MiB extra",
        None,
        _additive(long=True),
        mem_limit_mib=512,
        timed=False,
    ),
    BenchCase("gaussian", "scores", "≥ 1/1.1× SDPA", 1 / 1.1, _score_case("gaussian")),
    BenchCase("bilinear", "scores", "≥ 1/1.1× SDPA", 1 / 1.1, _score_case("bilinear")),
    BenchCase("additive_train", "training", "≥ 5×", 5.0, _additive_train),
    BenchCase("weights", "weights", "≥ 1/1.5× (no weights)", 1 / 1.5, _weights),
)
