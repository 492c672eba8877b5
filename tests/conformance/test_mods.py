"""Score modifiers (attnkit.mods) on every CPU backend that claims them, against the
float64 oracle: ALiBi (both forms), T5's relative position bias, softcap, sinks and
per-head scales, with scores and masks; gradients to q, k, v and to every learnable
parameter; a deterministic table gradient; backends that decline say why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, mods

from cases import CPU_BACKENDS, make_case, np_of
from reference import oracle
from tolerance import FLOAT32_REL, FLOAT64_REL, GRADCHECK_ATOL, assert_close_to_scale

H = 4
SHAPE = (2, H, H, 7, 9, 6, 5)  # (B, H, Hk, L, S, E, Ev)


def _mods(name: str, dtype: torch.dtype) -> tuple[list[mods.Mod], list[tuple], object]:
    """(attnkit mods, oracle mod specs, scale) for a named combination."""
    g = torch.Generator().manual_seed(7)
    slopes = mods.alibi_slopes(H).to(dtype)
    table = torch.randn(32, H, generator=g, dtype=dtype)
    sink = torch.randn(H, generator=g, dtype=dtype)
    L, S = SHAPE[3], SHAPE[4]
    br = S - L  # bottom_right: the last query sits at the last key's position
    if name == "alibi":
        return [mods.alibi(slopes)], [("alibi", slopes.numpy(), False, 0, 0)], None
    if name == "alibi_causal_br":
        return ([mods.alibi(slopes, align="bottom_right")],
                [("alibi", slopes.numpy(), False, br, 0)], None)  # fmt: skip
    if name == "alibi_causal_form":
        return [mods.alibi(slopes, causal=True)], [("alibi", slopes.numpy(), True, 0, 0)], None
    if name == "relpos":
        m = mods.relative_position_bias(table, 32, 16, bidirectional=True)
        return [m], [("relpos", table.numpy(), 32, 16, True, 0, 0)], None
    if name == "relpos_decoder":
        m = mods.relative_position_bias(table, 32, 64, bidirectional=False, align="bottom_right")
        return [m], [("relpos", table.numpy(), 32, 64, False, br, 0)], None
    if name == "softcap":
        return [mods.softcap(1.5)], [("softcap", 1.5)], None
    if name == "alibi_softcap":
        return ([mods.alibi(slopes), mods.softcap(2.0)],
                [("alibi", slopes.numpy(), False, 0, 0), ("softcap", 2.0)], None)  # fmt: skip
    if name == "sinks":
        return [mods.sinks(sink)], [("sinks", sink.numpy())], None
    if name == "head_scale":
        hs = torch.tensor([0.2, 0.5, 1.0, 3.0], dtype=dtype)
        return [], [], hs
    if name == "everything":
        hs = torch.tensor([0.3, 0.5, 0.7, 0.9], dtype=dtype)
        ms = [mods.relative_position_bias(table, 32, 16), mods.softcap(3.0), mods.sinks(sink)]
        specs = [("relpos", table.numpy(), 32, 16, True, 0, 0), ("softcap", 3.0),
                 ("sinks", sink.numpy())]  # fmt: skip
        return ms, specs, hs
    raise ValueError(name)


MODS = ("alibi", "alibi_causal_br", "alibi_causal_form", "relpos", "relpos_decoder",
        "softcap", "alibi_softcap", "sinks", "head_scale", "everything")  # fmt: skip
MASKS = ("none", "causal_bottom_right", "key_padding", "document")
SCORES = ("scaled_dot", "gaussian", "additive")


def _runs(case, ms, scale, backend: str) -> bool:  # type: ignore[no-untyped-def]
    ex = attnkit.explain(case.q, case.k, case.v, score=case.score, mask=case.mask, mods=ms,
                         scale=scale, backend=backend, return_weights=True)  # fmt: skip
    return not ex.reasons[backend]


def _refused(params: Mapping[str, Any]) -> bool:
    """Whether the parameters' backend refuses their modifiers, score and mask."""
    case = make_case(params["score_name"], params["mask_name"], SHAPE, seed=5, dtype=torch.float64)
    ms, _, scale = _mods(params["mod_name"], torch.float64)
    return not _runs(case, ms, scale, params["backend"])


@pytest.mark.pairwise(unsupported=_refused)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("score_name", SCORES)
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("mod_name", MODS)
def test_modifiers_match_the_oracle(mod_name: str, mask_name: str, score_name: str,
                                    backend: str) -> None:  # fmt: skip
    case = make_case(score_name, mask_name, SHAPE, seed=5, dtype=torch.float64)
    ms, specs, scale = _mods(mod_name, torch.float64)
    if not _runs(case, ms, scale, backend):
        with pytest.raises(BackendNotSupportedError, match=backend):
            attnkit.attention(case.q, case.k, case.v, score=case.score, mask=case.mask,
                              mods=ms, scale=scale, backend=backend)  # fmt: skip
        return
    out, w, lse = attnkit.attention(case.q, case.k, case.v, score=case.score, mask=case.mask,
                                    mods=ms, scale=scale, return_weights=True, return_lse=True,
                                    backend=backend)  # fmt: skip
    scale_np = None if scale is None else scale.numpy()
    ref_out, ref_w, ref_lse = oracle(np_of(case.q), np_of(case.k), np_of(case.v),
                                     score=case.score_spec, mask=case.mask_spec,
                                     scale=scale_np, mods=specs)  # fmt: skip
    assert_close_to_scale(out, torch.from_numpy(ref_out), rel=FLOAT64_REL, what="output")
    assert_close_to_scale(w, torch.from_numpy(ref_w), rel=FLOAT64_REL, what="weights")
    assert_close_to_scale(lse, torch.from_numpy(ref_lse), rel=FLOAT64_REL, what="lse")


CLAIMS = {
    # (backend, modifier combination): runs on the fused or tiled path without falling back
    ("sdpa", "alibi_causal_form"),
    ("sdpa", "head_scale"),
    ("sdpa", "sinks"),
    ("chunked", "alibi"),
    ("chunked", "relpos"),
    ("chunked", "softcap"),
    ("chunked", "everything"),
}


@pytest.mark.parametrize("backend, mod_name", sorted(CLAIMS))
def test_backends_take_the_modifiers_they_claim(backend: str, mod_name: str) -> None:
    case = make_case("scaled_dot", "none", SHAPE, seed=1, dtype=torch.float32)
    ms, _, scale = _mods(mod_name, torch.float32)
    ex = attnkit.explain(case.q, case.k, case.v, mods=ms, scale=scale, backend=backend)
    assert ex.reasons[backend] == [], ex.reasons[backend]


def test_causal_alibi_stays_on_sdpas_fused_kernel_under_a_causal_mask() -> None:
    case = make_case("scaled_dot", "causal_bottom_right", SHAPE, seed=1, dtype=torch.float32)
    ms, _, _ = _mods("alibi_causal_br", torch.float32)
    assert attnkit.explain(case.q, case.k, case.v, mask=case.mask, mods=ms).chosen == "sdpa"
    ex = attnkit.explain(case.q, case.k, case.v, mods=mods.alibi(H))  # symmetric, no mask
    assert "symmetric ALiBi" in " ".join(ex.reasons["sdpa"]) and ex.chosen == "chunked"


@pytest.mark.parametrize("backend", ["chunked", "sdpa", "reference"])
@pytest.mark.parametrize(
    "mod_name", ["alibi_causal_br", "relpos", "softcap", "sinks", "everything"]
)
def test_gradients_reach_inputs_and_learnable_parameters(mod_name: str, backend: str) -> None:
    case = make_case("scaled_dot", "causal_bottom_right", (1, H, H, 4, 5, 3, 2), seed=9,
                     dtype=torch.float64)  # fmt: skip
    ms, _, scale = _mods(mod_name, torch.float64)
    params = []
    for m in ms:
        for t in m.tensors():
            t.requires_grad_(True)
            params.append(t)
    if not _runs(case, ms, scale, backend):
        pytest.skip(f"{backend} does not take {mod_name}")
    leaves = [t.clone().requires_grad_(True) for t in (case.q, case.k, case.v)]

    def fn(*xs: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(xs[0], xs[1], xs[2], mask=case.mask, mods=ms, scale=scale,
                                 backend=backend)  # fmt: skip

    assert torch.autograd.gradcheck(
        fn, (*leaves, *params), eps=1e-6, atol=GRADCHECK_ATOL, fast_mode=True
    )


def test_the_position_tables_gradient_is_the_same_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, H, 70, 16, generator=g) for _ in range(3))
    table = torch.randn(32, H, generator=g, requires_grad=True)
    grads = []
    for _ in range(2):
        table.grad = None
        out = attnkit.attention(q, k, v, mods=mods.relative_position_bias(table, 32, 64),
                                backend="chunked")  # fmt: skip
        out.square().sum().backward()
        assert table.grad is not None
        grads.append(table.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_bad_modifiers_are_named() -> None:
    q = torch.randn(2, H, 3, 4)
    with pytest.raises(ValueError, match="3 slopes"):
        attnkit.attention(q, q, q, mods=mods.alibi(torch.ones(3)))
    with pytest.raises(TypeError, match="mods: expected"):
        attnkit.attention(q, q, q, mods=["softcap"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="scale: a tensor scale"):
        attnkit.attention(q, q, q, scale=torch.ones(3))
    with pytest.raises(ValueError, match="positive"):
        mods.softcap(0.0)
    with pytest.raises(ValueError, match="num_buckets"):
        mods.relative_position_bias(torch.ones(16, H), 32, 64)


@pytest.mark.parametrize(("dtype", "gap"), [(torch.float32, 20.0), (torch.float64, 40.0)])
@pytest.mark.parametrize("backend", ["reference", "chunked", "sdpa"])
def test_a_sink_far_below_the_row_keeps_its_gradient(
    backend: str, dtype: torch.dtype, gap: float
) -> None:
    """The keys' share is sigmoid(lse - sink); with the sink 20 (float32) or 40 (float64)
    below the lse, sigmoid's own backward s(1 - s) rounded 1 - s to 0: the sink's
    gradient through the output was exactly 0 (true: about -2e-9 and -4e-18)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 4, generator=gen) for n in (2, 3, 3))
    sink = torch.tensor([-gap], dtype=dtype, requires_grad=True)
    out = attnkit.attention(q.to(dtype), k.to(dtype), v.to(dtype), mods=mods.sinks(sink),
                            backend=backend)  # fmt: skip
    (got,) = torch.autograd.grad(out.sum(), sink)
    s64 = sink.detach().double().requires_grad_()
    logits = q.double() @ k.double().transpose(-1, -2) / 2.0  # (1, 1, 2, 3)
    full = torch.cat([logits, s64.view(1, 1, 1, 1).expand(1, 1, 2, 1)], dim=-1)
    (want,) = torch.autograd.grad((torch.softmax(full, -1)[..., :3] @ v.double()).sum(), s64)
    assert_close_to_scale(
        got.double(), want, rel=FLOAT32_REL if dtype == torch.float32 else FLOAT64_REL
    )
