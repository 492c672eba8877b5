"""The native CPU kernels as torch ops: against float64 math, against their pure-torch
fallbacks, on meta tensors and under torch.compile(fullgraph=True)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import torch
import torch.nn.functional as F

from attnkit.kernels import _native, additive, softmax
from attnkit.kernels.finite import rows_settled
from attnkit.kernels.rows import row_top_k
from attnkit.viz.blocks import LongStore, overview_block

from tolerance import (
    FLOAT32_CALL_REL,
    FLOAT32_ULPS_REL,
    assert_close_elementwise,
    assert_close_to_scale,
)

T = TypeVar("T")


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Build into a folder of this module (never the user's cache); state restored after."""
    folder = tmp_path_factory.mktemp("kernel-cache") / "kernels"
    patch = pytest.MonkeyPatch()
    patch.setenv("ATTNKIT_CACHE_DIR", str(folder))
    patch.delenv("ATTNKIT_NO_COMPILE", raising=False)
    _native._reset_for_tests()
    yield folder
    patch.undo()
    _native._reset_for_tests()


def _torch_only(fn: Callable[[], T]) -> T:
    """``fn()`` with the compiled library hidden: the ops' pure-torch fallback."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_native, "library", lambda: None)
        return fn()


def _kernel_or_skip() -> None:
    if _native.library() is None:
        pytest.skip(f"no compiled kernel here: {_native.status()}")


# ------------------------------------------------------------------ exp_rows_


def _logits_with_nonfinite(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (..., C) with -inf, +inf, NaN and near-overflow entries, and a finite shift."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(*shape, generator=g) * 5
    rows = s.view(-1, shape[-1])  # (R, C)
    rows[:, 0] = float("-inf")
    C = shape[-1]
    if C > 3:
        rows[0, 2] = float("nan")
        rows[-1, C - 1] = float("inf")  # the scalar tail (C is odd) or a vector lane
        rows[-1, 3] = float("inf")
    if C > 8:
        rows[0, 4:8] = torch.tensor([88.0, 88.5, 88.7, 89.5])  # e^x near float32's maximum
    finite = torch.where(s.isfinite(), s, torch.zeros(()))
    shift = finite.amax(-1).clamp(min=0)  # (...)
    if C > 8:
        shift.view(-1)[0] = 0.0  # keep the near-overflow entries of row 0 as they are
    return s, shift


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 5, 33), (4, 1)])
def test_exp_rows_matches_float64_math(shape: tuple[int, ...]) -> None:
    s, shift = _logits_with_nonfinite(shape, seed=0)
    ref = torch.exp((s - shift.unsqueeze(-1)).double()).float()  # float32 argument and result
    got = s.clone()
    sums = softmax.exp_rows_(got, shift, want_sum=True)
    assert sums is not None
    assert_close_elementwise(got, ref, rel=FLOAT32_ULPS_REL)
    ref_sums = torch.exp((s - shift.unsqueeze(-1)).double()).sum(-1).float()
    assert_close_elementwise(sums, ref_sums, rel=FLOAT32_ULPS_REL)
    assert (got[..., 0] == 0).all()


@pytest.mark.parametrize("shape", [(3, 17), (2, 5, 33), (7, 8)])
def test_exp_rows_kernel_equals_its_torch_fallback(shape: tuple[int, ...]) -> None:
    _kernel_or_skip()
    s, shift = _logits_with_nonfinite(shape, seed=1)
    fast, slow = s.clone(), s.clone()
    fast_sums = softmax.exp_rows_op(fast, shift)
    slow_sums = _torch_only(lambda: softmax.exp_rows_op(slow, shift))
    assert_close_elementwise(fast, slow, rel=FLOAT32_ULPS_REL)
    assert_close_elementwise(fast_sums, slow_sums, rel=FLOAT32_ULPS_REL)
    # the same non-finite pattern: a position is inf/NaN in one exactly when in the other
    assert torch.equal(fast.isnan(), slow.isnan()) and torch.equal(fast.isinf(), slow.isinf())


def _masked_logits(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Finite logits (..., C) with blocked (-inf) keys, a row blocked whole, keys far below
    the row max (exp of 0 in float32), and each row's max (0 for the blocked row)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(*shape, generator=g) * 8
    rows = s.view(-1, shape[-1])  # (R, C)
    rows[:, 1::3] = float("-inf")  # blocked keys, in the vector lanes and the tail
    rows[0, :] = float("-inf")  # a row that keeps no key
    if shape[-1] > 2:
        rows[-1, 2] = rows[-1, 0] - 200.0  # weight exactly 0 after the exp
    shift = torch.where(s.isfinite(), s, torch.full((), float("-inf"))).amax(-1)  # (...)
    return s, torch.where(shift.isfinite(), shift, torch.zeros(()))


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 5, 33), (4, 1), (2, 40)])
def test_exp_rows_entropy_matches_float64_math(shape: tuple[int, ...]) -> None:
    """One pass gives exp(s - shift), the row sums, sum e * (s - shift) and the count of
    e > 0, as float64 math gives them from the same float32 arguments."""
    s, shift = _masked_logits(shape, seed=2)
    x = (s - shift.unsqueeze(-1)).double()  # (..., C)
    e = torch.exp(x)
    got = s.clone()
    sums, px, positive = softmax.exp_rows_entropy_(got, shift)
    assert_close_elementwise(got, e.float(), rel=FLOAT32_ULPS_REL)
    assert_close_elementwise(sums, e.sum(-1).float(), rel=FLOAT32_ULPS_REL)
    assert_close_to_scale(px.double(), torch.nansum(x * e, dim=-1), rel=FLOAT32_ULPS_REL)
    assert torch.equal(positive, (got > 0).sum(-1).to(positive.dtype))
    assert not px.isnan().any()  # a blocked key's -inf * 0 adds 0


@pytest.mark.parametrize("shape", [(3, 17), (2, 5, 33), (7, 8)])
def test_exp_rows_entropy_kernel_equals_its_torch_fallback(shape: tuple[int, ...]) -> None:
    _kernel_or_skip()
    s, shift = _masked_logits(shape, seed=3)
    fast, slow = s.clone(), s.clone()
    fast_figures = softmax.exp_rows_entropy_op(fast, shift)
    slow_figures = _torch_only(lambda: softmax.exp_rows_entropy_op(slow, shift))
    assert_close_elementwise(fast, slow, rel=FLOAT32_ULPS_REL)
    for a, b in zip(fast_figures, slow_figures, strict=True):
        assert_close_to_scale(a, b, rel=FLOAT32_ULPS_REL)


# ------------------------------------------------------------------ row_top_k


@pytest.mark.parametrize("keys", [3, 16, 129, 1001, 8003])
@pytest.mark.parametrize("k", [1, 5, 16])
def test_row_top_k_is_exact(keys: int, k: int) -> None:
    """The one-pass top-k: torch.topk's weights, largest first, at the keys it names
    (distinct; equal weights, zeros among them, take the lower key first), and the max
    and sum of every block of 64 keys (the last one short)."""
    _kernel_or_skip()
    g = torch.Generator().manual_seed(keys * 31 + k)
    w = torch.softmax(torch.randn(2, 9, keys, generator=g) * 4, -1)  # (h, r, S)
    w[:, :, keys // 2] = 0.0  # exact zeros and a zero row: ties
    w[1, 3] = 0.0
    w[0, 2, :] = w[0, 2, 0]  # a row of equal weights
    got = row_top_k(w, k, 64)
    assert got is not None
    vals, idx, bmax, bsum = got
    padded = F.pad(w, (0, max(0, k - keys)))  # keys past S: weight 0
    assert torch.equal(vals, torch.topk(padded, k, dim=-1).values)
    assert torch.equal(torch.gather(padded, 2, idx), vals)
    assert bool((idx.sort(-1).values.diff(dim=-1) > 0).all())
    assert torch.equal(idx[0, 2], torch.arange(k))  # equal weights: the lowest keys, in order
    nb = -(-keys // 64)
    full = torch.full((2, 9, nb * 64), -1.0)
    full[..., :keys] = w
    assert torch.equal(bmax, full.view(2, 9, nb, 64).amax(-1))
    sums = full.clamp_min(0).view(2, 9, nb, 64).double().sum(-1)  # (h, r, nb)
    assert_close_to_scale(bsum.double(), sums, rel=FLOAT32_ULPS_REL)


@pytest.mark.parametrize("keys", [600, 4099])
@pytest.mark.parametrize("k", [5, 16, 17, 40])
def test_row_top_k_is_a_stable_sort_s_first_k(keys: int, k: int) -> None:
    """The top-k's group bound and its skipped groups change nothing: every row's k keys
    and weights are those of a stable descending sort (equal weights: the lower key first,
    -0 equal to +0; NaN last), for peaked rows, a row whose best keys crowd its end, one
    whose best weight repeats across many groups, rows of NaN, signed zeros and +inf, and
    rows of fewer distinct weights than k, with k up to the vector slots and past them."""
    _kernel_or_skip()
    g = torch.Generator().manual_seed(keys + 7 * k)
    w = torch.softmax(torch.randn(3, 8, keys, generator=g) * 6, -1)  # (h, r, S): peaked
    w[0, 0, -40:] += torch.rand(40, generator=g)  # the best keys at the end, together
    w[0, 1, torch.randperm(keys, generator=g)[:50]] = 0.5  # one best weight, 50 times
    w[0, 2, ::7] = float("nan")
    w[0, 3] = 0.0
    w[0, 3, 1::2] = -0.0
    w[0, 3, torch.randperm(keys, generator=g)[:3]] = float("inf")
    w[0, 4] = torch.randint(0, 3, (keys,), generator=g).float() / 4  # three values
    w[0, 5, : k + 3] = 0.0  # the first keys (the scan's start) below the rest
    got = row_top_k(w, k, 64)
    assert got is not None
    vals, idx = got[0], got[1]
    ranked = torch.where(torch.isnan(w), -1.0, w)  # NaN is never chosen: below every weight
    want_vals, want_idx = torch.sort(ranked, dim=-1, descending=True, stable=True)
    assert torch.equal(idx, want_idx[..., :k])
    assert torch.equal(vals, want_vals[..., :k])


def test_row_top_k_fills_with_nan_keys_only_past_the_rest() -> None:
    """Where fewer than k keys are not NaN, the NaN keys fill the slots left, with weight
    -1, after the padding's weight 0 (as its docstring says)."""
    _kernel_or_skip()
    w = torch.tensor([[0.5, float("nan"), 0.25], [float("nan")] * 3])  # (r, S), S < k
    got = row_top_k(w, 5, 64)
    assert got is not None
    assert got[0].tolist() == [[0.5, 0.25, 0.0, 0.0, -1.0], [0.0, 0.0, -1.0, -1.0, -1.0]]
    assert got[1].tolist() == [[0, 2, 3, 4, 1], [3, 4, 0, 1, 2]]


# ------------------------------------------------------------------ rows_settled


def _settled_in_torch(t: torch.Tensor) -> bool:
    """What rows_settled answers, from torch: all finite, and no row all ±0."""
    return bool(torch.isfinite(t).all()) and bool((t != 0).any(-1).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cols", [1, 7, 16, 67])
def test_rows_settled_is_torch_s_answer(dtype: torch.dtype, cols: int) -> None:
    """The one-pass check of a kernel's output says True exactly where every value is
    finite and every row holds a nonzero: NaN, ±inf, a row of +0 or -0, a row whose one
    nonzero is a subnormal, in a vector lane or the scalar tail, in row-major rows and in
    the (B, L, H, E) memory order torch's CPU kernel returns as (B, H, L, E)."""
    _kernel_or_skip()
    g = torch.Generator().manual_seed(cols)
    tiny = torch.finfo(dtype).tiny / 4  # a subnormal of this dtype
    edits: list[tuple[tuple[int, ...], float] | None] = [
        None,
        ((1, 2, 3, cols - 1), float("nan")),
        ((0, 0, 0, 0), float("inf")),
        ((1, 1, 4, cols // 2), float("-inf")),
    ]
    for edit in edits:
        for zero_row, sign, lone in [(None, 1.0, 0.0), ((0, 2, 1), 1.0, 0.0),
                                     ((1, 0, 4), -1.0, 0.0), ((0, 1, 2), 1.0, tiny)]:  # fmt: skip
            t = torch.randn(2, 3, 5, cols, generator=g).to(dtype)  # (B, H, L, C)
            if edit is not None:
                t[edit[0]] = edit[1]
            if zero_row is not None:
                t[zero_row] = sign * 0.0
                t[(*zero_row, cols - 1)] = lone
            for view in (t, t.transpose(1, 2).contiguous().transpose(1, 2)):
                assert rows_settled(view) == _settled_in_torch(t), (edit, zero_row, lone)


def test_rows_settled_cannot_tell_elsewhere() -> None:
    """Where it cannot read a tensor in one pass it answers False, "not shown", so the
    caller checks in full: float64, rows not laid out one after another, an empty
    tensor, a scalar, and no compiled library."""
    t = torch.randn(2, 3, 4, 5)  # (B, H, L, C)
    assert not rows_settled(t.double())
    assert not rows_settled(t.transpose(0, 1))
    assert not rows_settled(t[..., :3])
    assert not rows_settled(t[..., :0])
    assert not rows_settled(torch.tensor(1.0))
    assert not _torch_only(lambda: rows_settled(t))


def test_long_store_gives_the_same_page_with_and_without_the_kernel() -> None:
    """LongStore's one-pass path and its torch path (sub-block maxima, pruned top-k) keep
    the same overviews and top-k weights, on row blocks not aligned to its blocks."""
    _kernel_or_skip()
    g = torch.Generator().manual_seed(12)
    Q = K = 301
    w = torch.softmax(torch.randn(3, Q, K, generator=g) * 5, -1)  # (h, Q, K)
    b = overview_block(Q, K, 16)

    def fill() -> dict[str, torch.Tensor]:
        store = LongStore(1, 3, Q, K, b, 8)
        for a, e in ((0, 50), (50, 51), (51, Q)):
            store.add(0, slice(0, 3), a, w[:, a:e, : max(e, 9)].contiguous())
        return store.finish()

    fast, slow = fill(), _torch_only(fill)
    for name in ("pooled_max", "topk_weight"):
        assert torch.equal(fast[name], slow[name]), name
    assert_close_to_scale(fast["pooled_mean"], slow["pooled_mean"], rel=FLOAT32_ULPS_REL)


# ------------------------------------------------------------------ additive


def _additive_operands(
    R: int, M: int, N: int, H: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    qh, kh = torch.randn(R, M, H, generator=g) * 3, torch.randn(R, N, H, generator=g) * 3
    return qh, kh, torch.randn(H, generator=g), torch.randn(R, M, N, generator=g)


@pytest.mark.parametrize(
    "R, M, N, H", [(1, 1, 1, 1), (2, 3, 17, 9), (1, 5, 4, 33), (1, 3, 5, 16), (2, 2, 3, 47)]
)
def test_additive_logits_match_float64_math(R: int, M: int, N: int, H: int) -> None:
    qh, kh, w, _ = _additive_operands(R, M, N, H, seed=2)
    qh[0, 0, 0] = float("-inf")  # tanh(-inf) = -1
    kh[-1, -1, -1] = float("inf")
    if N > 1:
        kh[0, 1, H // 2] = float("nan")  # key 1 of row-set 0 is NaN for every query
    ref = additive.logits_torch(qh.double(), kh.double(), w.double())
    got = additive.logits(qh, kh, w)
    assert_close_to_scale(got.double(), ref)
    if N > 1:
        assert got[0, :, 1].isnan().all() and not got[0, :, 0].isnan().any()


@pytest.mark.parametrize(
    "R, M, N, H", [(1, 1, 1, 1), (2, 3, 17, 9), (1, 5, 4, 33), (1, 3, 5, 16), (2, 2, 3, 47)]
)
def test_additive_grads_match_float64_math(R: int, M: int, N: int, H: int) -> None:
    qh, kh, w, up = _additive_operands(R, M, N, H, seed=3)
    q64, k64, w64 = (t.double().requires_grad_() for t in (qh, kh, w))
    (additive.logits_torch(q64, k64, w64) * up.double()).sum().backward()
    got = additive.grads(qh, kh, w, up)
    for mine, exact in zip(got, (q64.grad, k64.grad, w64.grad), strict=True):
        assert exact is not None
        assert_close_to_scale(mine.double(), exact)


@pytest.mark.parametrize("R, M, N, H", [(2, 3, 17, 9), (1, 5, 4, 33)])
def test_additive_kernel_equals_its_torch_fallback(R: int, M: int, N: int, H: int) -> None:
    _kernel_or_skip()
    qh, kh, w, up = _additive_operands(R, M, N, H, seed=4)
    qh[0, 0, 0] = float("-inf")
    assert_close_to_scale(
        additive.logits_op(qh, kh, w),
        _torch_only(lambda: additive.logits_op(qh, kh, w)),
    )
    qh[0, 0, 0] = 0.5
    fast = additive.grads_op(qh, kh, w, up)
    slow = _torch_only(lambda: additive.grads_op(qh, kh, w, up))
    for a, b in zip(fast, slow, strict=True):
        assert_close_to_scale(a, b)


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_a_nan_key_with_zero_upstream_gradient_stays_out_of_the_gradients(
    use_kernel: bool,
) -> None:
    """A masked-out pair (upstream gradient 0) contributes nothing, whatever it holds."""
    if use_kernel:
        _kernel_or_skip()
    qh, kh, w, up = _additive_operands(1, 3, 5, 11, seed=5)
    kh[0, 2, 4] = float("nan")
    up[0, :, 2] = 0.0  # key 2 is masked out for every query

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return additive.grads_op(qh, kh, w, up)

    dq, dk, dw = run() if use_kernel else _torch_only(run)
    assert dq.isfinite().all() and dw.isfinite().all()
    assert dk[0, [0, 1, 3, 4]].isfinite().all() and not dk[0, 2].any()
    clean = kh.clone()
    clean[0, 2] = 0.0
    ref = additive.grads_torch(qh.double(), clean.double(), w.double(), up.double())
    for mine, exact in zip((dq, dk, dw), ref, strict=True):
        assert_close_to_scale(mine.double(), exact)


# ------------------------------------------------------------------ meta, fake, compile


def test_ops_run_on_meta_tensors_without_computing() -> None:
    qh, kh = torch.empty(2, 3, 8, device="meta"), torch.empty(2, 5, 8, device="meta")
    w, up = torch.empty(8, device="meta"), torch.empty(2, 3, 5, device="meta")
    assert additive.logits(qh, kh, w).shape == (2, 3, 5)
    dq, dk, dw = additive.grads(qh, kh, w, up)
    assert (dq.shape, dk.shape, dw.shape) == (qh.shape, kh.shape, w.shape)
    assert all(t.device.type == "meta" for t in (dq, dk, dw))
    s = torch.empty(4, 6, device="meta")
    sums = softmax.exp_rows_(s, torch.empty(4, device="meta"), want_sum=True)
    assert sums is not None and sums.shape == (4,) and sums.device.type == "meta"


def test_the_ops_are_registered_in_the_attnkit_namespace() -> None:
    ops = torch.ops.attnkit
    assert ops.additive_logits.default is not None
    assert ops.additive_grads.default is not None
    schema = ops.exp_rows_.default._schema
    assert schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write


def _softmax_of_additive(qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    s = additive.logits(qh, kh, w)  # (R, M, N)
    sums = softmax.exp_rows_(s, s.amax(-1), want_sum=True)  # s becomes exp(s - max)
    assert sums is not None
    return s / sums.unsqueeze(-1)


def _small_operands(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _additive_operands(2, 3, 5, 9, seed=seed)


def test_the_compiled_graph_calls_each_op_as_one_node() -> None:
    torch._dynamo.reset()
    targets: list[str] = []

    def record(
        gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]
    ) -> Callable[..., object]:
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    qh, kh, w, _ = _small_operands(seed=6)
    torch.compile(_softmax_of_additive, fullgraph=True, backend=record)(qh, kh, w)
    assert "attnkit.additive_logits.default" in targets
    assert "attnkit.exp_rows_.default" in targets


def test_ops_compile_fullgraph_with_aot_eager() -> None:
    torch._dynamo.reset()
    qh, kh, w, up = _small_operands(seed=7)
    ref = torch.softmax(additive.logits_torch(qh, kh, w), dim=-1)
    compiled = torch.compile(_softmax_of_additive, fullgraph=True, backend="aot_eager")
    assert_close_to_scale(compiled(qh, kh, w), ref, rel=FLOAT32_CALL_REL)

    grads = torch.compile(additive.grads, fullgraph=True, backend="aot_eager")
    for got, exact in zip(grads(qh, kh, w, up), additive.grads_torch(qh, kh, w, up), strict=True):
        assert_close_to_scale(got, exact)


@pytest.mark.slow  # about 13 s; by default tests/integration/test_nn_compile.py compiles
# AdditiveAttention (both ops, through the chunked backend) under inductor
def test_ops_compile_fullgraph_with_inductor() -> None:
    torch._dynamo.reset()
    qh, kh, w, _ = _small_operands(seed=8)
    ref = torch.softmax(additive.logits_torch(qh, kh, w), dim=-1)
    compiled = torch.compile(_softmax_of_additive, fullgraph=True)
    assert_close_to_scale(compiled(qh, kh, w), ref, rel=FLOAT32_CALL_REL)


def test_calling_the_ops_imports_no_dynamo(private_cache: Path) -> None:
    """The ops are plain library ops: calling them (a chunked call with a dot and an
    additive score, and the viewer's exp-and-entropy pass) never imports
    ``torch._dynamo``. A ``custom_op``'s first call does: about a second, and after
    ``init_process_group`` that import keeps the default group alive past
    ``destroy_process_group`` (torch binds it as a default argument then)."""
    code = (
        "import sys, torch, attnkit\n"
        "from attnkit.kernels import softmax\n"
        "x = torch.randn(1, 2, 33, 8)\n"
        "attnkit.attention(x, x, x, backend='chunked')\n"
        "attnkit.attention(x, x, x, score=attnkit.scores.Additive(8, 8, 16), backend='chunked')\n"
        "s = torch.randn(4, 40)\n"
        "softmax.exp_rows_entropy_(s, s.amax(-1))\n"
        "from attnkit.kernels import _native\n"
        "print(_native.library() is not None, 'torch._dynamo' in sys.modules)\n"
    )
    env = dict(os.environ, ATTNKIT_CACHE_DIR=str(private_cache))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    built, dynamo = done.stdout.split()
    assert built == "True", "the native library did not build: the ops were not exercised"
    assert dynamo == "False", "a kernel call imported torch._dynamo"


def test_without_posix_user_ids_the_kernels_fall_back_and_say_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # os.getuid (the private cache's checks) raised AttributeError on Windows, where
    # only an OSError was caught: the additive score failed instead of running in torch
    from attnkit.kernels import _native_ops

    monkeypatch.delattr(os, "getuid")
    monkeypatch.delenv("ATTNKIT_NO_COMPILE", raising=False)
    lib, why = _native._try_build()
    assert lib is None and why == "pure torch: the C kernel is built on POSIX systems only"
    if not all(hasattr(torch.ops.attnkit, name) for name in _native_ops.OPS):
        ok, why = _native_ops._try_build()
        assert not ok and "POSIX systems only" in why


def test_peak_memory_reads_zero_without_the_resource_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnkit.bench import runner

    monkeypatch.setitem(sys.modules, "resource", None)  # as on Windows: no such module
    assert runner._max_rss_kib() == 0
