"""Non-finite inputs on every backend and device: the policy, case by case.

The policy: a NaN (or inf) in a position that is used propagates to the rows that use
it; a position masked out never contributes, whatever it holds.

- A query row is used when its mask keeps at least one key; key/value position j is
  used by query row i when the mask keeps (i, j). A NaN query or key makes every row
  that uses it NaN (its scores are NaN); a NaN value row makes the output rows that
  use it NaN; an inf value row makes them non-finite.
- Every row that uses no poisoned position equals, output, weights and lse, the same
  call with the poisoned positions zeroed. That covers positions removed by
  ``masks.keep``, ``valid_lens`` (keys and queries), ``key_padding``, causal and
  window masks, and a -inf bias (a pair with bias -inf is removed, whatever its score).
- An inf in a used query or key makes no promise for the rows that use it (its score
  may be +inf, -inf or NaN, depending on signs): only the other rows are checked.
- Gaussian score, an inf component in a key while the queries are finite: the distance
  ‖q - k‖² is +inf exactly, so the score is -inf and exp(-inf) = 0. The key's weight is
  exactly 0 and the row stays finite: the call equals the same call with that key
  masked out. A row whose every kept key is infinitely far therefore gets no weight
  anywhere and is treated like a fully masked row (output 0, lse -inf), not NaN.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import masks
from attnkit._host import device_semantics
from attnkit.kernels import _native_ops

from cases import MASKS, SCORES, make_score, mask_to, matrix_backends, refused
from compiled_graphs import aten_graph_code
from nonfinite_cases import (
    FIXED_MASKS,
    B,
    S,
    check_poisoned,
    fixed_masks,
    key_positions,
    poison_inputs,
    poisoned_call,
    query_positions,
    random_poison_case,
    usable,
)
from tolerance import FLOAT32_ULPS_REL, assert_close_to_scale, half_rel

CPU_BACKENDS = matrix_backends("cpu")


@pytest.mark.pairwise(unsupported=refused)
@pytest.mark.parametrize("mask_name", FIXED_MASKS)
@pytest.mark.parametrize("where", ["query", "key", "value"])
@pytest.mark.parametrize("score_name", SCORES)
def test_poisoned_positions_follow_the_policy(
    score_name: str, where: str, mask_name: str, device: str, backend: str
) -> None:
    q, k, v = poison_inputs(score_name, seed=61)
    score, _ = make_score(
        score_name, q.shape[-1], k.shape[-1], torch.Generator().manual_seed(62), torch.float32
    )
    mask, keep = fixed_masks()[mask_name]
    positions = query_positions() if where == "query" else key_positions()
    for poison in (math.nan, math.inf):
        if not check_poisoned(  # moves the inputs, score and mask to ``device``
            q, k, v, score, mask, keep, where, poison, positions, backend, device
        ):
            pytest.skip(f"{backend} does not run {score_name} (checked in the oracle tests)")


@pytest.mark.parametrize("mask_name", ["none", "causal"])
def test_gaussian_infinitely_far_keys_get_zero_weight(
    mask_name: str, device: str, backend: str
) -> None:
    """+inf / -inf in a key component: that key's weight is 0, the row stays finite and
    equals the call with the key masked out; under the causal mask row 0 sees only key 0,
    which is infinitely far, so row 0 is a fully masked row (output 0, lse -inf)."""
    q, k, v = poison_inputs("gaussian", seed=63)
    k[:, :, 0, 1] = float("inf")
    k[:, :, 4, 2] = float("-inf")
    far = torch.zeros(B, S, dtype=torch.bool)
    far[:, [0, 4]] = True
    k_zeroed = k.clone()
    k_zeroed[:, :, [0, 4]] = 0.0
    score = attnkit.scores.Gaussian(1.5).to(device)
    base = masks.causal() if mask_name == "causal" else None
    dropped = masks.key_padding(far) if base is None else base & masks.key_padding(far)
    base, dropped = mask_to(base, device), mask_to(dropped, device)
    qd, kd, vd, k_zeroed = (t.to(device) for t in (q, k, v, k_zeroed))
    # The far keys as they are, and zeroed behind a mask that drops them: a backend may
    # refuse either on this device (chunked reads a key-padding mask's lengths on the
    # host, which it does not do on CUDA), and then there is nothing to compare.
    calls = {"far keys": (kd, base), "dropped keys": (k_zeroed, dropped)}
    for what, (kc, mask) in calls.items():
        why = attnkit.explain(qd, kc, vd, score=score, mask=mask, backend=backend)
        if why.reasons[backend]:
            pytest.skip(f"{backend} on {device} refuses the {what} call: {why.reasons[backend]}")
    _, want_w, want_lse = usable(score, base, backend, qd, kd, vd)
    _, drop_w, drop_lse = usable(score, dropped, backend, qd, k_zeroed, vd)
    got = poisoned_call(qd, kd, vd, score, base, backend, want_w, want_lse)
    want = poisoned_call(qd, k_zeroed, vd, score, dropped, backend, drop_w, drop_lse)
    assert not got["out"].isnan().any()
    for name in got.keys() & want.keys():  # on the CPU every backend returns both alike
        g, w = got[name], want[name]
        assert_close_to_scale(g, w, rel=FLOAT32_ULPS_REL, what=f"{backend} {name}")
    if "weights" in got:
        assert not got["weights"][..., [0, 4]].any()
    if mask_name == "causal":
        assert not got["out"][:, :, 0].any()
        if "lse" in got:
            assert got["lse"][:, :, 0].isneginf().all()


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    score_name=st.sampled_from(SCORES),
    mask_name=st.sampled_from(MASKS),
    backend=st.sampled_from(CPU_BACKENDS),
    where=st.sampled_from(["query", "key", "value"]),
    poison=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    Bn=st.integers(1, 3),
    Hk=st.integers(1, 2),
    gqa=st.booleans(),
    Ln=st.integers(1, 12),
    Sn=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_property_poisoned_positions_follow_the_policy(
    score_name: str,
    mask_name: str,
    backend: str,
    where: str,
    poison: float,
    Bn: int,
    Hk: int,
    gqa: bool,
    Ln: int,
    Sn: int,
    seed: int,
) -> None:
    Hq = 2 * Hk if gqa else Hk
    gen = torch.Generator().manual_seed(seed)
    q, k, v, score, mask, keep, positions = random_poison_case(
        score_name, mask_name, where, (Bn, Hq, Hk, Ln, Sn), gen
    )
    assume(check_poisoned(q, k, v, score, mask, keep, where, poison, positions, backend, "cpu"))


# ---------------------------------------------------------------- fully masked rows


def _every_key_masked() -> dict[str, masks.Mask]:
    return {
        "valid_lens": masks.valid_lens(torch.zeros(B, dtype=torch.long)),
        "key_padding": masks.key_padding(torch.ones(B, S, dtype=torch.bool)),
    }


def _all_masked_call(
    score_name: str, mask_name: str, where: str, backend: str | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    q, k, v = poison_inputs(score_name, seed=64)
    {"query": q, "key": k, "value": v}[where][0, 0, 1, 0] = math.nan
    score, _ = make_score(
        score_name, q.shape[-1], k.shape[-1], torch.Generator().manual_seed(65), torch.float32
    )
    mask = _every_key_masked()[mask_name]
    want_lse = backend is None or usable(score, mask, backend, q, k, v)[2]
    res = attnkit.attention(q, k, v, score=score, mask=mask, backend=backend, return_lse=want_lse)
    return (res[0], res[1]) if want_lse else (res, None)


@pytest.mark.parametrize("where", ["key", "value", "query"])
@pytest.mark.parametrize("mask_name", ["valid_lens", "key_padding"])
@pytest.mark.parametrize("score_name", ["dot", "scaled_dot", "bilinear", "gaussian"])
def test_every_key_masked_with_a_nan_gives_zero(
    score_name: str, mask_name: str, where: str, backend: str
) -> None:
    """Issue 19, row 1: every key masked and a NaN in a masked key, value or query, in
    grad mode (the default): output 0 and lse -inf everywhere, on every backend."""
    out, lse = _all_masked_call(score_name, mask_name, where, backend)
    assert (out == 0).all(), f"{backend}: {int(out.isnan().sum())} NaN in the output"
    assert lse is None or lse.isneginf().all()


@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("mask_name", ["valid_lens", "key_padding"])
@pytest.mark.parametrize("score_name", ["dot", "gaussian"])
def test_every_key_masked_with_a_nan_gives_zero_on_the_default_path(
    score_name: str, mask_name: str, where: str
) -> None:
    """The same on the default path (no backend named), where the issue found it."""
    out, lse = _all_masked_call(score_name, mask_name, where, None)
    assert (out == 0).all(), f"{int(out.isnan().sum())} NaN in the output"
    assert lse is not None and lse.isneginf().all()


@pytest.mark.parametrize("mask_name", ["keep", "valid_lens_queries", "causal_and_padding"])
@pytest.mark.parametrize("score_name", ["dot", "bilinear", "gaussian"])
def test_nan_query_in_a_fully_masked_row_has_zero_gradients(
    score_name: str, mask_name: str, backend: str
) -> None:
    """Issue 19, row 2: a NaN query in a row that keeps no key gives that row output 0 and
    contributes nothing to any gradient: its own query's gradient is 0, and every gradient
    equals the one with that query zeroed (never NaN)."""
    q, k, v = poison_inputs(score_name, seed=66)
    score, _ = make_score(
        score_name, q.shape[-1], k.shape[-1], torch.Generator().manual_seed(67), torch.float32
    )
    mask, keep = fixed_masks()[mask_name]
    dead = ~np.broadcast_to(keep, (B, 2, q.shape[2], S)).any(-1)  # (B, H, L) rows keeping no key
    assert dead.any()
    if not usable(score, mask, backend, q, k, v)[0]:
        pytest.skip(f"{backend} does not run {score_name}")
    grads = []
    for poison in (math.nan, 0.0):
        qp = q.clone()
        qp[..., 0][torch.from_numpy(dead)] = poison
        leaves = [t.clone().requires_grad_(True) for t in (qp, k, v)]
        out = attnkit.attention(*leaves, score=score, mask=mask, backend=backend)
        assert not out.isnan().any()
        grads.append(torch.autograd.grad(out.square().sum(), leaves))
    for name, got, want in zip(("query", "key", "value"), *grads, strict=True):
        assert not got.isnan().any(), f"{backend}: NaN in the {name} gradient"
        assert_close_to_scale(got, want, rel=FLOAT32_ULPS_REL, what=f"{backend} d{name}")


def test_no_keys_at_all_with_a_nan_query_gives_zero() -> None:
    """S == 0 (no key exists): output 0 whatever the queries hold, gradients 0."""
    q = torch.full((1, 2, 3, 4), math.nan, requires_grad=True)
    k, v = torch.zeros(1, 2, 0, 4, requires_grad=True), torch.zeros(1, 2, 0, 2)
    out = attnkit.attention(q, k, v)
    assert (out == 0).all()
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert (grad == 0).all()


@pytest.mark.slow  # one compilation: about 15 s
@pytest.mark.torch_feature("compile")
def test_every_key_masked_with_a_nan_compiles_to_zero() -> None:
    """Under torch.compile(fullgraph=True) the same call gives the same zeros."""
    q, k, v = poison_inputs("dot", seed=68)
    k[0, 0, 2, 1] = math.nan
    v[1, 0, 3, 0] = math.nan
    mask = _every_key_masked()["key_padding"]
    compiled = torch.compile(lambda q, k, v: attnkit.attention(q, k, v, mask=mask), fullgraph=True)
    out = compiled(q, k, v)
    assert (out == 0).all()


def _poisoned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Finite inputs, then a NaN query row, an inf key, and a NaN value in the last key."""
    qn, ki, vn = q.clone(), k.clone(), v.clone()
    qn[0, 1, 3] = math.nan
    ki[0, 0, 5, 2] = math.inf
    vn[0, 1, -1, 0] = math.nan
    return [(q, k, v), (qn, k, v), (q, ki, v), (q, k, vn)]


@pytest.mark.torch_feature("compile")
@pytest.mark.parametrize("reads", ["host", "device"])
@pytest.mark.parametrize("mask_name", ["none", "causal", "keep"])
def test_a_traced_call_that_needs_no_gradient_follows_the_policy(
    mask_name: str, reads: str
) -> None:
    """Traced with no gradient, the sdpa route gives the eager call's answers, NaN for
    NaN, with every non-finite kind of input (aot_eager: the trace without inductor's
    compile time). ``host``: a CPU call without a mask tensor runs as one op that reads
    its output on the host; ``device``: as on an accelerator (``device_semantics``), the
    policy runs as tensor operations, with no host read."""
    gen = torch.Generator().manual_seed(69)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=gen) for _ in range(3))  # (B, H, N, E)
    keep = torch.rand(8, 8, generator=gen) > 0.3
    keep[:, 0] = True  # (L, S): every row keeps a key
    mask = {"none": None, "causal": masks.causal(), "keep": masks.keep(keep)}[mask_name]
    traced = torch.compile(
        lambda q, k, v: attnkit.attention(q, k, v, mask=mask, backend="sdpa"),
        backend="aot_eager",
        fullgraph=True,
    )
    torch._dynamo.reset()  # the same lambda's trace is cached; the reads differ by context
    with torch.no_grad():
        for inputs in _poisoned(q, k, v):
            with device_semantics() if reads == "device" else contextlib.nullcontext():
                got = traced(*inputs)
            want = attnkit.attention(*inputs, mask=mask, backend="sdpa")
            assert torch.equal(torch.isnan(got), torch.isnan(want))
            assert torch.equal(torch.isinf(got), torch.isinf(want))
            fin = torch.isfinite(want)
            assert_close_to_scale(got[fin], want[fin])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_name", ["none", "causal"])
@pytest.mark.parametrize("poison", ["query_row", "every_key", "first_key"])
def test_a_repeated_call_gives_nan_where_the_kernel_returns_zeros(
    poison: str, mask_name: str, dtype: torch.dtype
) -> None:
    """torch's CPU kernel returns zeros, not NaN, for a query row holding a NaN and for a
    row whose every key it sees is NaN. A plain plan's repeated call reads the kernel's
    output instead of the inputs, so a zero row once passed as finite: the second call of
    the same shapes gave 0 where the first gave NaN. Every call, first or repeated, gives
    the float64 reference's rows."""
    gen = torch.Generator().manual_seed(71)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen).to(dtype) for _ in range(3))  # (B, H, N, E)
    mask = masks.causal() if mask_name == "causal" else None
    attnkit.attention(q, k, v, mask=mask)  # the plan's first call, finite
    qp, kp = q.clone(), k.clone()
    if poison == "query_row":
        qp[0, 1, 3] = math.nan
    elif poison == "every_key":
        kp[0, 0] = math.nan
    else:
        kp[0, 1, 0, 2] = math.nan  # under the causal mask, row 0 sees only this key
    want = attnkit.attention(qp.double(), kp.double(), v.double(), mask=mask, backend="reference")
    for _ in range(2):
        got = attnkit.attention(qp, kp, v, mask=mask)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        fin = torch.isfinite(want)
        assert_close_to_scale(got[fin].double(), want[fin].double(), rel=half_rel(dtype))


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    causal=st.booleans(),
    where=st.sampled_from(["query", "key", "value"]),
    poison=st.sampled_from([math.nan, math.inf, -math.inf]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    Ln=st.integers(1, 9),
    Sn=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_property_the_kernel_first_paths_give_the_policy_s_rows(
    causal: bool, where: str, poison: float, dtype: torch.dtype, Ln: int, Sn: int, seed: int
) -> None:
    """A plain plan's repeated call and the compiled graph's ops (Python, and C++ where it
    builds) run torch's kernel first and then read only its output when every value is
    finite and no row is all zeros (:func:`attnkit.kernels.finite.rows_settled`, and its
    C++ twin). On random poisons of one component
    of a few query, key or value rows they give the rows of the policy's own path: NaN
    exactly where it is NaN, rows that use an inf value non-finite, and the same numbers
    in every row that uses no poisoned position (an inf query or key promises nothing
    for the rows that use it)."""
    from attnkit.backends.sdpa import run as sdpa_run

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, 4, generator=gen).to(dtype) for n in (Ln, Sn, Sn))
    rows = torch.rand(2, 2, Ln if where == "query" else Sn, generator=gen) < 0.3  # (B, H, N)
    poisoned = {"query": q, "key": k, "value": v}[where]
    poisoned[..., 0][rows] = poison
    keep = torch.ones(Ln, Sn, dtype=torch.bool)  # (L, S)
    if causal:
        keep = torch.ones(Ln, Sn, dtype=torch.bool).tril()
    used = rows if where == "query" else (keep & rows.unsqueeze(-2)).any(-1)  # (B, H, L)
    scale = 0.5
    want, _ = sdpa_run.call(q, k, v, attn_mask=None, is_causal=causal, dropout_p=0.0,
                            scale=scale, gqa=False, want_lse=False)  # fmt: skip
    runner = sdpa_run.direct_runner(
        is_causal=causal, lower_right=False, dropout_p=0.0, scale=scale, gqa=False,
        head_dim=4, readable_no_grad=True, whole_keys=sdpa_run.reads_whole_keys(q, k),
    )  # fmt: skip
    paths = [("repeated call", runner(q, k, v)),
             ("compiled op", sdpa_run._checked_call(q, k, v, causal, scale, False))]  # fmt: skip
    if _native_ops.loaded():
        for flash in (False, True):
            settled = torch.ops.attnkit.sdpa_settled.default(q, k, v, causal, scale, False, flash)
            paths.append((f"compiled C++ op (flash={flash})", settled))
    for path, got in paths:
        what = f"{path}: {where} poisoned with {poison}"
        clean = ~used
        assert_close_to_scale(got[clean].double(), want[clean].double(), rel=half_rel(dtype),
                              what=what)  # fmt: skip
        if math.isnan(poison):
            assert torch.equal(got.isnan(), want.isnan()), what
        elif where == "value":
            assert not got[used].isfinite().all(-1).any(), what  # each such row


@pytest.mark.torch_feature("compile")
def test_a_traced_causal_call_without_gradient_is_one_host_checked_op() -> None:
    """A compiled causal CPU call that needs no gradient is the one op that reads its
    output on the host: no zeroed copies of q, k and v in the graph (they cost about
    40 % of the kernel at (1, 8, 128, 64)). With a gradient, the tensor operations stay."""
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))  # (B, H, N, E)

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.causal(), backend="sdpa")

    from attnkit.backends.sdpa import run as sdpa_run

    name = sdpa_run.checked_op_name()  # the C++ op where it builds, else the Python one
    assert name == ("sdpa_settled" if _native_ops.loaded() else "sdpa_checked")
    assert f"attnkit.{name}" in aten_graph_code(call, q, k, v)
    with_grad = aten_graph_code(call, q.requires_grad_(), k, v)
    assert "sdpa_checked" not in with_grad and "sdpa_settled" not in with_grad


@pytest.mark.parametrize("backend", matrix_backends("cpu"))
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_a_poisoned_query_with_no_values_gives_the_weights_of_a_call_with_values(
    backend: str, align: str
) -> None:
    """A call that only wants its weights passes a zero-width value (the viewer does): a
    NaN query under a causal mask once raised IndexError from the policy's row check on
    sdpa (a max over zero values). Its weights are those of the same call with values."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 5, 4, generator=g)
    q[0, 0, 1, 2] = math.nan
    k = torch.randn(1, 2, 6, 4, generator=g)
    mask = masks.causal(align)  # type: ignore[arg-type]
    out, w = attnkit.attention(q, k, k.new_zeros(1, 2, 6, 0), mask=mask, return_weights=True,
                               backend=backend)  # fmt: skip
    _, want = attnkit.attention(q, k, torch.randn(1, 2, 6, 3, generator=g), mask=mask,
                                return_weights=True, backend=backend)  # fmt: skip
    assert out.shape == (1, 2, 5, 0)
    torch.testing.assert_close(w, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.torch_feature("compile")
@pytest.mark.parametrize("native", [False, True], ids=["python", "cpp"])
@pytest.mark.parametrize("poison", [False, True])
def test_the_compiled_policy_op_matches_its_fake_kernel(poison: bool, native: bool) -> None:
    """``attnkit::sdpa_checked`` (and its C++ twin ``sdpa_settled``) on heads-second views of one projection (as a layer
    passes them, grouped heads too): its output has the fake kernel's shape and row-major
    strides (a compiled graph asserts them; torch's CPU kernel can return another
    layout), on the kernel's path and on the policy's."""
    from attnkit.backends.sdpa import run as sdpa_run

    op = sdpa_run._checked_op
    if native:  # (asked as the library asks it: that also registers its fake kernel)
        if sdpa_run.checked_op_name() != "sdpa_settled":
            pytest.skip(f"no compiled ops here ({_native_ops.status()})")
        op = torch.ops.attnkit.sdpa_settled.default
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3))  # (B, L, 2E + ...)
    q = x[..., :8].view(2, 5, 4, 2).transpose(1, 2)  # (B, H, L, E), not contiguous
    k = x[..., 8:12].view(2, 5, 2, 2).transpose(1, 2)  # (B, Hk, L, E)
    v = x[..., 12:].view(2, 5, 2, 2).transpose(1, 2)  # (B, Hk, L, E)
    if poison:
        q = q.clone()
        q[0, 1, 2, 0] = math.nan
    args: tuple[object, ...] = (q, k, v, True, 0.7, True) + ((False,) if native else ())
    torch.library.opcheck(op, args, test_utils=("test_faketensor",))
    out = op(*args)
    assert out.is_contiguous() and out.shape == (2, 4, 5, 2)
    want = attnkit.attention(q, k, v, mask=masks.causal(), scale=0.7, backend="sdpa")
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    fin = torch.isfinite(want)
    assert_close_to_scale(out[fin], want[fin])
