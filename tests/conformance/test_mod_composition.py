"""Several modifiers of one kind compose as written, on every CPU backend that takes them,
against the float64 oracle: two softcaps apply one after the other, two ALiBis or two
T5 biases add, two sinks each join the softmax; mixed with other kinds, in order.
Output, weights and lse against the oracle; gradients of q, k, v and of every learnable
parameter against the float64 reference backend.

(Regression: with two softcaps the chunked tiles, and so the default call, applied
only the last one.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, mods

from cases import CPU_BACKENDS, make_case, np_of
from reference import oracle
from tolerance import FLOAT64_REL, assert_close_to_scale

H = 3
SHAPE = (2, H, H, 6, 8, 5, 4)  # (B, H, Hk, L, S, E, Ev)
GQA_SHAPE = (2, 4, 2, 6, 8, 5, 4)


def _combo(
    name: str, heads: int
) -> tuple[list[mods.Mod], list[tuple[Any, ...]], list[torch.Tensor]]:
    """(mods, oracle specs, learnable tensors) of a named combination."""
    g = torch.Generator().manual_seed(3)

    def param(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=g, dtype=torch.float64) + 0.1).requires_grad_()

    if name == "two_softcaps":
        return [mods.softcap(0.9), mods.softcap(2.5)], [("softcap", 0.9), ("softcap", 2.5)], []
    if name == "two_alibis":
        a, b = param(heads), param(1)
        ms = [mods.alibi(a), mods.alibi(b, causal=True, q_offset=4)]
        return ms, [("alibi", a, False, 0, 0), ("alibi", b.expand(heads), True, 4, 0)], [a, b]
    if name == "two_causal_alibis":  # both fold into sdpa's key bias
        a, b = param(heads), param(heads)
        ms = [mods.alibi(a, causal=True), mods.alibi(b, causal=True, align="bottom_right")]
        specs = [("alibi", a, True, 0, 0), ("alibi", b, True, SHAPE[4] - SHAPE[3], 0)]
        return ms, specs, [a, b]
    if name == "two_relpos":
        t1, t2 = param(16, heads), param(8, 1)
        ms = [mods.relative_position_bias(t1, 16, 20),
              mods.relative_position_bias(t2, 8, 10, bidirectional=False, k_offset=2)]  # fmt: skip
        specs = [("relpos", t1, 16, 20, True, 0, 0),
                 ("relpos", t2.expand(8, heads), 8, 10, False, 0, 2)]  # fmt: skip
        return ms, specs, [t1, t2]
    if name == "two_sinks":
        s1, s2 = param(heads), param(1)
        return (
            [mods.sinks(s1), mods.sinks(s2)],
            [("sinks", s1), ("sinks", s2.expand(heads))],
            [s1, s2],
        )
    if name == "bias_then_two_softcaps":
        a, t = param(heads), param(8, heads)
        ms = [mods.alibi(a), mods.relative_position_bias(t, 8, 10), mods.softcap(1.2),
              mods.softcap(0.7)]  # fmt: skip
        specs = [("alibi", a, False, 0, 0), ("relpos", t, 8, 10, True, 0, 0), ("softcap", 1.2),
                 ("softcap", 0.7)]  # fmt: skip
        return ms, specs, [a, t]
    if name == "softcap_alibi_softcap":  # a bias between two caps: the order matters
        a = param(heads)
        ms = [mods.softcap(1.5), mods.alibi(a), mods.softcap(0.8)]
        return ms, [("softcap", 1.5), ("alibi", a, False, 0, 0), ("softcap", 0.8)], [a]
    raise ValueError(name)


COMBOS = ("two_softcaps", "two_alibis", "two_causal_alibis", "two_relpos", "two_sinks", "bias_then_two_softcaps",
          "softcap_alibi_softcap")  # fmt: skip


def _spec(s: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(x.detach().numpy() if isinstance(x, torch.Tensor) else x for x in s)


def _refused(params: Mapping[str, Any]) -> bool:
    """Whether the parameters' backend refuses their combination of modifiers."""
    shape = params["shape"]
    case = make_case("scaled_dot", params["mask_name"], shape, seed=2, dtype=torch.float64)
    ms, _, _ = _combo(params["combo"], shape[1])
    ex = attnkit.explain(case.q, case.k, case.v, mask=case.mask, mods=ms, return_weights=True,
                         return_lse=True, backend=params["backend"])  # fmt: skip
    return bool(ex.reasons[params["backend"]])


@pytest.mark.pairwise(unsupported=_refused)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mask_name", ["none", "causal_bottom_right", "key_padding"])
@pytest.mark.parametrize("shape", [SHAPE, GQA_SHAPE], ids=["mha", "gqa"])
@pytest.mark.parametrize("combo", COMBOS)
def test_modifiers_of_one_kind_compose(combo: str, shape: tuple[int, ...], mask_name: str,
                                       backend: str) -> None:  # fmt: skip
    case = make_case("scaled_dot", mask_name, shape, seed=2, dtype=torch.float64)
    ms, specs, params = _combo(combo, shape[1])
    kw: dict[str, Any] = {"mask": case.mask, "mods": ms, "backend": backend}
    ex = attnkit.explain(case.q, case.k, case.v, return_weights=True, return_lse=True, **kw)
    if ex.reasons[backend]:
        with pytest.raises(BackendNotSupportedError, match=backend):
            attnkit.attention(case.q, case.k, case.v, **kw)
        return
    out, w, lse = attnkit.attention(case.q, case.k, case.v, return_weights=True,
                                    return_lse=True, **kw)  # fmt: skip
    ref = oracle(np_of(case.q), np_of(case.k), np_of(case.v), score=case.score_spec,
                 mask=case.mask_spec, mods=[_spec(s) for s in specs])  # fmt: skip
    for name, got, want in zip(("out", "weights", "lse"), (out, w, lse), ref, strict=True):
        assert_close_to_scale(got, torch.from_numpy(want), rel=FLOAT64_REL, what=f"{combo}, {name}")
    if backend == "reference":
        return

    def grads(name: str) -> tuple[torch.Tensor, ...]:
        leaves = [t.detach().requires_grad_() for t in (case.q, case.k, case.v)]
        o, lo = attnkit.attention(*leaves, mask=case.mask, mods=ms, return_lse=True, backend=name)
        g = torch.Generator().manual_seed(1)
        loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum()
        loss = loss + (lo.nan_to_num(0.0, 0.0, 0.0) * torch.randn(lo.shape, generator=g,
                                                                  dtype=lo.dtype)).sum()  # fmt: skip
        got = torch.autograd.grad(loss, [*leaves, *params], allow_unused=True)
        return tuple(torch.zeros(()) if d is None else d for d in got)

    for i, (a, b) in enumerate(zip(grads(backend), grads("reference"), strict=True)):
        assert_close_to_scale(a, b, rel=FLOAT64_REL, what=f"grad {i}")


def test_two_softcaps_on_the_default_call_are_both_applied() -> None:
    """The report's case: the default call (chunked) applied only one of two softcaps."""
    case = make_case("scaled_dot", "none", SHAPE, seed=6, dtype=torch.float64)
    q, k, v = case.q * 3, case.k * 3, case.v  # logits large enough for the caps to bite
    got = attnkit.attention(q, k, v, mods=[mods.softcap(1.0), mods.softcap(0.5)])
    want = oracle(np_of(q), np_of(k), np_of(v), mods=[("softcap", 1.0), ("softcap", 0.5)])[0]
    one = oracle(np_of(q), np_of(k), np_of(v), mods=[("softcap", 0.5)])[0]
    assert np.abs(want - one).max() > 1e-2  # the second cap changes the answer
    assert_close_to_scale(got, torch.from_numpy(want), rel=FLOAT64_REL)


def test_the_fused_path_takes_two_alibis_and_two_sinks() -> None:
    """Composition is not a reason to leave the fused kernel: two causal ALiBis fold into
    one key bias, and sinks join after any backend."""
    case = make_case("scaled_dot", "causal_bottom_right", SHAPE, seed=1, dtype=torch.float32)
    for combo in ("two_causal_alibis", "two_sinks"):
        ms, _, _ = _combo(combo, H)
        ex = attnkit.explain(case.q, case.k, case.v, mask=case.mask, mods=ms)
        assert ex.chosen == "sdpa", (combo, ex.reasons)
