"""The triton backend under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors).

Every score × mask kind at one small odd shape against the float64 oracle
(output, weights, lse) and the float64 reference backend (gradients of q, k, v
and the score's parameters); then odd shapes and batch ranks, half precision,
head-averaged weights, fully masked rows and the backend's reasons.
"""

from __future__ import annotations

from interpreted_triton import interpreted_triton  # first: sets TRITON_INTERPRET=1

# isort: split

import copy
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, masks, scores
from attnkit.backends.records import BackwardCall, OutputGrads
from attnkit.backends.triton import TritonBackend

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # tests/ for the shared oracle
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cases import (
    Case,
    assert_within_tolerance,
    make_case,
    make_score,
    np_of,
    plain_math,
)
from nonfinite_cases import (
    FIXED_MASKS,
    check_poisoned,
    fixed_masks,
    key_positions,
    poison_inputs,
    query_positions,
)
from reference import oracle
from tolerance import (
    FLOAT32_CALL_REL,
    FLOAT32_GRAD_REL,
    FLOAT32_TILED_GRAD_REL,
    assert_close_to_scale,
)

SCORES = ("scaled_dot", "bilinear", "gaussian", "additive")  # "dot": see the shapes test
MASKS = (
    "none",
    "keep",
    "keep_heads",
    "bias",
    "tf_padding",
    "valid_lens",
    "valid_lens_2d",
    "valid_lens_queries",
    "key_padding",
    "causal",
    "causal_bottom_right",
    "window",
    "window_bottom_right",
    "causal_and_padding",
    "bias_and_window",
)
SHAPE = (2, 2, 1, 3, 17, 12, 8)  # (B, H, Hk, L, S, E, Ev): GQA, L < S, E padded, 2 key blocks


@pytest.fixture(scope="module", autouse=True)
def triton_registered() -> Iterator[None]:
    """The backend under the interpreter for this module only (tests/interpreted_triton.py)."""
    with interpreted_triton():
        yield


_assert_close = assert_within_tolerance  # the suite's one tolerance rule (tests/cases.py)


def _run(case: Case, backend: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """[output, weights, lse, then the gradients of q, k, v and the score's parameters] of
    one call, the gradients of a fixed random loss on the output, the weights and the
    lse (its finite entries)."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (case.q, case.k, case.v))
    score = copy.deepcopy(case.score).to(dtype)
    mask = case.mask.to(dtype) if isinstance(case.mask, torch.Tensor) else case.mask
    out, w, lse = attnkit.attention(
        q, k, v, score=score, mask=mask, return_weights=True, return_lse=True, backend=backend
    )
    finite_lse = torch.where(torch.isfinite(lse), lse, torch.zeros((), dtype=lse.dtype))
    gen = torch.Generator().manual_seed(5)
    loss = sum(
        (t * torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)).sum()
        for t in (out, w, finite_lse)
    )
    grads = torch.autograd.grad(loss, [q, k, v, *score.parameters()])
    return [out.detach(), w.detach(), lse.detach(), *grads]


PLAN_MASKS = ("document_causal", "document_spread", "prefix_lm", "window_or_padding",
              "not_causal_and_lens")  # fmt: skip
"""Mask kinds that reach the kernels only through the block plan (documents, | and ~)."""


def _oracle_matrix() -> list[Any]:
    """Every other mask kind with scaled_dot or additive in turn (the dot-form and the
    tanh kernel bodies, each under a quarter of the mask kinds), the Gaussian with a
    compound mask, two plan-only masks with scaled_dot; the rest of the score x mask
    product (every mask kind with every score) under ``slow``."""
    compound = ("causal_and_padding",)
    bodies = ("scaled_dot", "additive")
    quick = [
        (s, m)
        for s in SCORES
        for n, m in enumerate(MASKS)
        if (n % 2 == 0 and s == bodies[(n // 2) % 2]) or (m in compound and s == "gaussian")
    ]
    rest = [
        pytest.param(s, m, marks=pytest.mark.slow)
        for s in SCORES
        for m in MASKS
        if (s, m) not in quick
    ]
    plan = [
        ("scaled_dot", m) if m in ("document_spread", "window_or_padding")
        else pytest.param("scaled_dot", m, marks=pytest.mark.slow)
        for m in PLAN_MASKS
    ]  # fmt: skip
    return [*quick, *rest, *plan]


@pytest.mark.parametrize("score_name, mask_name", _oracle_matrix())
def test_matches_oracle_with_gradients(score_name: str, mask_name: str) -> None:
    case = make_case(score_name, mask_name, SHAPE, seed=17)
    out, w, lse, *grads = _run(case, "triton", torch.float32)
    ref_out, ref_w, ref_lse = oracle(
        np_of(case.q), np_of(case.k), np_of(case.v), score=case.score_spec, mask=case.mask_spec
    )
    p_out, p_w, p_lse = plain_math(case)
    assert out.dtype == case.q.dtype and lse.dtype == torch.float32
    _assert_close(np_of(out), ref_out, np_of(p_out), "output")
    _assert_close(np_of(w), ref_w, np_of(p_w), "weights")
    _assert_close(np_of(lse), ref_lse, np_of(p_lse), "lse")
    ref_grads = _run(case, "reference", torch.float64)[3:]
    assert len(grads) == len(ref_grads) == 3 + len(list(case.score.parameters()))
    for n, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        assert torch.isfinite(g).all(), f"gradient {n}: not finite"
        scale = max(float(r.abs().max()), 1.0)
        assert_close_to_scale(g, r, rel=FLOAT32_TILED_GRAD_REL, scale=scale, what=f"gradient {n}")


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "mask"),
    [
        ((2, 1, 1, 8), (2, 1, 1, 8), None),  # L = S = 1
        pytest.param(  # one batch dim, L < S
            (3, 3, 8), (3, 17, 8), masks.causal("bottom_right"), marks=pytest.mark.slow
        ),
        pytest.param(  # L > S, top-left
            (2, 2, 33, 16), (2, 2, 3, 16), masks.causal(), marks=pytest.mark.slow
        ),
        ((2, 2, 2, 5, 12), (1, 1, 1, 7, 12), masks.window(1, 2)),  # rank-3 batch, GQA + broadcast
        ((2, 2, 17, 12), (1, 33, 12), masks.valid_lens(torch.tensor([0, 20]))),  # an empty row
    ],
)
def test_shapes_and_batch_ranks(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...], mask: masks.Mask | None
) -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(q_shape, generator=gen, requires_grad=True)
    k = torch.randn(kv_shape, generator=gen, requires_grad=True)
    v = torch.randn(*kv_shape[:-1], 5, generator=gen, requires_grad=True)
    out, lse = attnkit.attention(q, k, v, score="dot", mask=mask, return_lse=True, backend="triton")
    ref_out, ref_lse = attnkit.attention(
        *(t.double() for t in (q, k, v)),
        score="dot",
        mask=mask,
        return_lse=True,
        backend="reference",
    )
    assert out.shape == ref_out.shape
    assert_close_to_scale(out.double(), ref_out)
    assert_close_to_scale(lse.double(), ref_lse)
    got = torch.autograd.grad(out.sum(), [q, k, v])
    ref = torch.autograd.grad(ref_out.sum(), [q, k, v])  # float64 sums, cast back
    for g, r in zip(got, ref, strict=True):
        assert g.shape == r.shape
        assert_close_to_scale(g.double(), r.double())


SPREAD_IDS = [[0, 1, 0, 1, 2, 2, 0, 1, 2, 2, 0], [3, 3, 3, -1, 3, 3, 4, 4, -1, 4, 3]]  # not runs
WIDE_IDS = [
    [2**31, 2**31 + 2**32, 2**31, 7, 7, -(2**40), 2**62, 2**62, 2**31, 2**31 + 2**32, 7]
] * 2


@pytest.mark.parametrize(
    "ids, causal",
    [
        pytest.param(SPREAD_IDS, False, id="spread-False"),
        pytest.param(SPREAD_IDS, True, id="spread-True"),
        pytest.param(WIDE_IDS, False, id="beyond_int32-False"),
        pytest.param(WIDE_IDS, True, id="beyond_int32-True", marks=pytest.mark.slow),
    ],
)
def test_documents_in_any_order_and_of_any_size(ids: list[list[int]], causal: bool) -> None:
    """Document ids the kernels hold in int32 after the lowering renumbers them: ids that
    are not runs, and ids 2**32 apart, stay their own documents. By default the wide ids
    without the causal clause (the renumbering does not depend on it; the spread ids meet
    it); the wide ids with it under ``slow``."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 2, 11, 8, generator=gen, requires_grad=True) for _ in range(3))
    mask = masks.document(torch.tensor(ids))
    mask = mask & masks.causal() if causal else mask
    out, lse = attnkit.attention(q, k, v, mask=mask, return_lse=True, backend="triton")
    t64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = attnkit.attention(*t64, mask=mask, return_lse=True, backend="reference")
    assert_close_to_scale(out, ref_out, rel=FLOAT32_CALL_REL, what="output")
    assert_close_to_scale(lse, ref_lse, rel=FLOAT32_CALL_REL, what="lse")
    got = torch.autograd.grad(out.sum(), [q, k, v])
    for g, r in zip(got, torch.autograd.grad(ref_out.sum(), t64), strict=True):
        assert_close_to_scale(g, r, rel=FLOAT32_GRAD_REL, what="gradient")


@pytest.mark.parametrize(
    "score_name, dtype",
    [
        pytest.param("scaled_dot", torch.float16, id="scaled_dot-float16"),
        pytest.param("gaussian", torch.bfloat16, id="gaussian-bfloat16"),
        pytest.param(
            "scaled_dot", torch.bfloat16, id="scaled_dot-bfloat16", marks=pytest.mark.slow
        ),
        pytest.param("gaussian", torch.float16, id="gaussian-float16", marks=pytest.mark.slow),
    ],
)
def test_half_precision_within_twice_plain_math(score_name: str, dtype: torch.dtype) -> None:
    """Each half dtype and each kernel body (dot form, Gaussian) once by default; the
    other two pairs under ``slow``."""
    case = make_case(score_name, "causal_and_padding", SHAPE, seed=23)
    half = make_case(score_name, "causal_and_padding", SHAPE, seed=23, dtype=dtype)
    q, k, v = (t.detach().requires_grad_() for t in (half.q, half.k, half.v))
    out, lse = attnkit.attention(
        q, k, v, score=half.score, mask=half.mask, return_lse=True, backend="triton"
    )
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_out, _, ref_lse = oracle(
        np_of(half.q), np_of(half.k), np_of(half.v), score=case.score_spec, mask=case.mask_spec
    )
    p_out, _, p_lse = plain_math(half)
    _assert_close(np_of(out), ref_out, np_of(p_out), f"{dtype} output")
    _assert_close(np_of(lse), ref_lse, np_of(p_lse.float()), f"{dtype} lse")
    grads = torch.autograd.grad(out.float().sum(), [q, k, v])
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


@pytest.mark.slow
def test_head_mean_weights_match_the_per_head_average() -> None:
    case = make_case("gaussian", "causal_and_padding", (2, 4, 2, 17, 19, 8, 8), seed=29)
    args = (case.q, case.k, case.v)
    _, mean = attnkit.attention(
        *args, score=case.score, mask=case.mask, return_weights="mean", backend="triton"
    )
    _, ref = attnkit.attention(
        *(t.double() for t in args),
        score=case.score,
        mask=case.mask,
        return_weights="mean",
        backend="reference",
    )
    assert mean.shape == (2, 17, 19)
    assert_close_to_scale(mean.double(), ref)
    q = case.q.detach().requires_grad_()  # with grad: per-head weights, averaged by torch
    _, mean_grad = attnkit.attention(
        q, case.k, case.v, score=case.score, mask=case.mask, return_weights="mean", backend="triton"
    )
    assert_close_to_scale(mean_grad.double(), ref)
    (g,) = torch.autograd.grad(mean_grad.square().sum(), [q])
    assert g.abs().sum() > 0 and torch.isfinite(g).all()


@pytest.mark.parametrize(
    "score_name, masks_taken",
    [
        pytest.param("scaled_dot", "even", marks=pytest.mark.slow),
        pytest.param("gaussian", "odd", marks=pytest.mark.slow),
        pytest.param("scaled_dot", "odd", marks=pytest.mark.slow),
        pytest.param("gaussian", "even", marks=pytest.mark.slow),
        pytest.param("additive", "even", marks=pytest.mark.slow),
        pytest.param("additive", "odd", marks=pytest.mark.slow),
    ],
)
def test_non_finite_inputs_follow_the_policy(score_name: str, masks_taken: str) -> None:
    """The conformance suite's non-finite cases (see conformance/test_nonfinite.py):
    NaN or inf in queries, keys and values behind the fixed mask kinds (the poisons take
    turns: each mask kind meets both over the places). By default scaled_dot behind every
    other mask kind and the Gaussian score behind the rest, so that each mask kind is
    met once; every score behind every mask kind under ``slow``."""
    q, k, v = poison_inputs(score_name, seed=71)
    score, _ = make_score(
        score_name, q.shape[-1], k.shape[-1], torch.Generator().manual_seed(72), torch.float32
    )
    for n, mask_name in enumerate(FIXED_MASKS):
        if n % 2 != (masks_taken == "odd"):
            continue
        mask, keep = fixed_masks()[mask_name]
        for m, where in enumerate(("query", "key", "value")):
            positions = query_positions() if where == "query" else key_positions()
            poison = float("nan") if (n + m) % 2 == 0 else float("inf")
            ran = check_poisoned(
                q, k, v, score, mask, keep, where, poison, positions, "triton", "cpu"
            )
            assert ran, f"triton refused {score_name} with {mask_name}"


@pytest.mark.parametrize("score_name", ["scaled_dot", "gaussian"])
def test_accelerator_path_reads_nothing_on_the_host(score_name: str) -> None:
    """Under device semantics (every tensor treated as an accelerator's) the value flags
    and key cleaning run as tensor operations for every call, and give the same answers:
    finite inputs, and a NaN value behind a causal mask."""
    from attnkit import _host

    q, k, v = poison_inputs(score_name, seed=73)
    score, _ = make_score(
        score_name, q.shape[-1], k.shape[-1], torch.Generator().manual_seed(74), torch.float32
    )
    mask = masks.causal("bottom_right")
    v_nan = v.clone()
    v_nan[0, 0, -1] = float("nan")  # used by the last query row only
    for values in (v, v_nan):
        want = attnkit.attention(q, k, values, score=score, mask=mask, backend="reference")
        with _host.device_semantics():
            got = attnkit.attention(q, k, values, score=score, mask=mask, backend="triton")
        assert_close_to_scale(got, want)
    assert torch.isnan(got[0, :, -1]).all() and torch.isfinite(got[0, :, :-1]).all()


def test_fully_masked_rows_give_zero_output_and_gradients() -> None:
    gen = torch.Generator().manual_seed(31)
    q = torch.randn(2, 2, 17, 12, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 17, 12, generator=gen, requires_grad=True)  # 2 key tiles, 1 partial
    v = torch.randn(2, 2, 17, 8, generator=gen, requires_grad=True)
    mask = masks.valid_lens(torch.tensor([0, 9]), queries=True) & masks.window(2, 0)
    out, w, lse = attnkit.attention(
        q, k, v, mask=mask, return_weights=True, return_lse=True, backend="triton"
    )
    assert not out[0].any() and not w[0].any() and torch.isneginf(lse[0]).all()
    assert not out[1, :, 9:].any() and torch.isneginf(lse[1, :, 9:]).all()
    assert torch.isfinite(lse[1, :, :9]).all()
    gq, gk, gv = torch.autograd.grad(out.sum(), [q, k, v])
    assert not gq[0].any() and not gk[0].any() and not gv[0].any()
    assert not gq[1, :, 9:].any() and gq[1, :, :9].abs().sum() > 0
    assert all(torch.isfinite(g).all() for g in (gq, gk, gv))


def test_reasons_it_cannot_run() -> None:
    q = torch.randn(2, 2, 5, 8)
    assert os.environ["TRITON_INTERPRET"] == "1"
    backend = TritonBackend()
    assert backend.is_available() is None
    assert "cpu" in backend.device_types
    ex = attnkit.explain(q, q, q, dropout_p=0.1, backend="triton")
    assert ex.chosen is None and any("dropout" in r for r in ex.reasons["triton"])
    ex = attnkit.explain(q.double(), q.double(), q.double(), backend="triton")
    assert any("float64" in r for r in ex.reasons["triton"])
    wide = torch.randn(1, 2, 300)
    ex = attnkit.explain(wide, wide, wide, backend="triton")
    assert any("exceed" in r for r in ex.reasons["triton"])
    with pytest.raises(BackendNotSupportedError, match="triton"):
        attnkit.attention(q, q, q, dropout_p=0.1, backend="triton")
    additive = scores.Additive(8, 8, 5)
    ex = attnkit.explain(q, q, q, score=additive, backend="triton")
    assert ex.chosen == "triton" and "Additive" in ex.note


def test_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    backend = TritonBackend()
    assert backend.device_types == frozenset({"cuda"})
    from attnkit._inputs import validate_inputs

    q = torch.randn(1, 3, 4)
    reasons = backend.not_supported_reasons(validate_inputs(q, q, q))
    assert any("TRITON_INTERPRET" in r for r in reasons)


@pytest.mark.parametrize(
    "score_name, mask_name",
    [
        ("scaled_dot", "causal"),
        pytest.param("gaussian", "key_padding", marks=pytest.mark.slow),
        pytest.param("additive", "document", marks=pytest.mark.slow),
    ],
)
def test_backward_from_the_global_lse_adds_up_over_key_blocks(
    score_name: str, mask_name: str
) -> None:
    """``TritonBackend.backward`` given the global (out, lse) of two key blocks: their
    gradients add up to the whole call's (as a context-parallel ring uses them)."""
    from attnkit._inputs import validate_inputs

    case = make_case(score_name, mask_name, (2, 2, 1, 6, 6, 5, 3), seed=4)  # GQA
    leaves = [t.clone().requires_grad_(True) for t in (case.q, case.k, case.v)]
    params = list(case.score.parameters())
    out, lse = attnkit.attention(*leaves, score=case.score, mask=case.mask, return_lse=True,
                                 backend="reference")  # fmt: skip
    gen = torch.Generator().manual_seed(2)
    d_out, d_lse = torch.randn(out.shape, generator=gen), torch.randn(lse.shape, generator=gen)
    live = torch.isfinite(lse)
    ref = torch.autograd.grad([out, torch.where(live, lse, 0.0)], [*leaves, *params],
                              [d_out, d_lse], allow_unused=True)  # fmt: skip
    be = attnkit.get_backend("triton")
    L, S = case.q.shape[-2], case.k.shape[-2]
    got_q = torch.zeros_like(case.q)
    got_k, got_v, got_p = [], [], [torch.zeros_like(p) for p in params]
    for k0, k1 in ((0, 4), (4, S)):
        mask = case.mask.shard(0, k0, L, k1 - k0, L, S) if case.mask is not None else None
        inputs = validate_inputs(case.q, case.k[..., k0:k1, :], case.v[..., k0:k1, :],
                                 score=case.score, mask=mask)  # fmt: skip
        dq, dk, dv, dp = be.backward(
            BackwardCall(inputs, OutputGrads(out.detach(), lse.detach(), d_out, d_lse), params)
        )
        got_q += dq
        got_k.append(dk)
        got_v.append(dv)
        for acc, x in zip(got_p, dp, strict=True):
            if x is not None:
                acc += x
    got = [got_q, torch.cat(got_k, -2), torch.cat(got_v, -2), *got_p]
    for a, r in zip(got, ref, strict=True):
        assert_close_to_scale(a, torch.zeros_like(a) if r is None else r)


@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_gradients_out_of_a_poisons_reach_equal_the_zeroed_call(where: str) -> None:
    """The backward keeps NaN to the pairs that use it: a NaN in row 2 of head 0 (a
    query, key or value) under a causal mask reaches that head's rows from 2 on (a key or
    value) or row 2 only (a query), and the keys and values those rows use; every other
    gradient entry equals the same call's with the NaN zeroed."""
    g = torch.Generator().manual_seed(81)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    d_out = torch.randn(1, 2, 6, 8, generator=g)
    poisoned = {"query": q, "key": k, "value": v}[where]

    def grads(value: float) -> list[torch.Tensor]:
        inputs = [t.clone() for t in (q, k, v)]
        inputs[["query", "key", "value"].index(where)][0, 0, 2] = value
        leaves = [t.requires_grad_() for t in inputs]
        out = attnkit.attention(*leaves, mask=masks.causal(), backend="triton")
        return list(torch.autograd.grad(out, leaves, d_out))

    assert poisoned is not None
    got, want = grads(float("nan")), grads(0.0)
    rows = slice(2, 3) if where == "query" else slice(2, None)  # rows the NaN reaches
    keys = slice(0, rows.stop)  # keys and values those rows use (causal)
    reached = [torch.zeros(1, 2, 6, 8, dtype=torch.bool) for _ in range(3)]
    reached[0][0, 0, rows] = True
    reached[1][0, 0, keys] = True
    reached[2][0, 0, keys] = True
    for n, (a, b, r) in enumerate(zip(got, want, reached, strict=True)):
        assert torch.isfinite(a[~r]).all(), f"gradient {n}: NaN outside the poison's reach"
        assert_close_to_scale(a[~r], b[~r])


@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("value", [False, True])
def test_a_keep_of_one_value_for_every_pair(S: int, value: bool) -> None:
    """A keep mask with no real dim ((1, 1): one value broadcast to every pair) is read,
    not dropped: all False blocks every pair."""
    g = torch.Generator().manual_seed(82)
    q, k, v = (
        torch.randn(1, 1, 7, 4, generator=g),
        *(torch.randn(1, 1, S, 4, generator=g) for _ in range(2)),
    )
    mask = masks.keep(torch.full((1, 1), value))
    got = attnkit.attention(q, k, v, mask=mask, backend="triton")
    want = attnkit.attention(q, k, v, mask=mask, backend="reference")
    assert_close_to_scale(got, want)
