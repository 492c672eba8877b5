"""Per-head parameters against every layout, on every CPU backend, against the float64
oracle: 2-D (L, E) inputs, d2l's 3-D (B, L, E), 3-D and 4-D grouped-query heads; ALiBi
(both forms), T5's bias, tensor scales of shape (H,) and (1,), sinks; masks that run as
a ragged batch (valid_lens, per-row prefix-LM, key padding, documents) and structured
ones. Output, weights and lse against the oracle; the gradients of q, k, v and of every
learnable parameter against the float64 reference backend. A backend that declines a
call says so with BackendNotSupportedError.

(Regressions: the chunked tiles crashed on 3-D inputs with a position bias under a
ragged mask; the Gaussian score with a tensor scale and grouped-query heads crashed
on sdpa and chunked; sdpa crashed on 3-D grouped-query Gaussian calls with a NaN query
under a per-batch mask; the reference backend crashed on 2-D inputs with ALiBi or a
T5 bias.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, masks, mods

from cases import CPU_BACKENDS, np_of
from reference import oracle
from tolerance import FLOAT64_REL, assert_close_to_scale

# name: (query shape, key shape); E = 4, values Ev = 3
LAYOUTS = {
    "2d": ((5, 4), (6, 4)),
    "3d_batch": ((3, 4, 4), (3, 5, 4)),  # d2l's (B, L, E): dim -3 is read as the head dim
    "3d_gqa": ((4, 3, 4), (2, 5, 4)),  # (H, L, E) with two query heads per key head
    "4d_gqa": ((2, 4, 3, 4), (2, 2, 6, 4)),
}
MODS = ("alibi", "alibi_causal_offsets", "relpos", "scale_heads", "scale_one", "all")
MASKS = ("none", "causal", "valid_lens", "valid_lens_queries", "key_padding", "document",
         "prefix_lm")  # fmt: skip
SCORES = ("scaled_dot", "gaussian")
PER_BATCH = ("valid_lens", "valid_lens_queries", "key_padding", "document", "prefix_lm")


@dataclass
class Call:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    score: str
    mask: masks.Mask | None
    mask_spec: tuple[Any, ...] | None
    mods: list[mods.Mod]
    mod_specs: list[tuple[Any, ...]]
    scale: torch.Tensor | None
    params: list[torch.Tensor]  # learnable: slopes, tables, sinks, the scale


def _call(layout: str, mod_name: str, mask_name: str, score: str, seed: int = 0) -> Call:
    g = torch.Generator().manual_seed(seed)
    q_shape, k_shape = LAYOUTS[layout]
    q = torch.randn(*q_shape, generator=g, dtype=torch.float64)
    k = torch.randn(*k_shape, generator=g, dtype=torch.float64)
    v = torch.randn(*k_shape[:-1], 3, generator=g, dtype=torch.float64)
    H = q_shape[-3] if len(q_shape) > 2 else 1
    L, S = q_shape[-2], k_shape[-2]

    def param(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=g, dtype=torch.float64) + 0.2).requires_grad_()

    ms: list[mods.Mod] = []
    specs: list[tuple[Any, ...]] = []
    scale: torch.Tensor | None = None
    if mod_name in ("alibi", "all"):
        slopes = param(H)
        ms.append(mods.alibi(slopes))
        specs.append(("alibi", slopes, False, 0, 0))
    if mod_name == "alibi_causal_offsets":
        slopes = param(1)
        ms.append(mods.alibi(slopes, causal=True, q_offset=7, k_offset=3))
        specs.append(("alibi", slopes.expand(H), True, 7, 3))
    if mod_name in ("relpos", "all"):
        table = param(8, H)
        ms.append(mods.relative_position_bias(table, 8, 12))
        specs.append(("relpos", table, 8, 12, True, 0, 0))
    if mod_name == "all":
        sink = param(H)
        ms.append(mods.sinks(sink))
        specs.append(("sinks", sink))
    if mod_name in ("scale_heads", "all"):
        scale = param(H)
    if mod_name == "scale_one":
        scale = param(1)
    mask, mask_spec = _mask(mask_name, q_shape[0] if len(q_shape) > 2 else 0, L, S, g)
    params = [t for m in ms for t in m.tensors()] + ([scale] if scale is not None else [])
    return Call(q, k, v, score, mask, mask_spec, ms, specs, scale, params)


def _mask(
    name: str, B: int, L: int, S: int, g: torch.Generator
) -> tuple[masks.Mask | None, tuple[Any, ...] | None]:
    """A mask whose per-batch dim is the call's first dim (B) and its oracle spec."""
    if name == "none":
        return None, None
    if name == "causal":
        return masks.causal("bottom_right"), ("causal", "bottom_right")
    if name == "valid_lens":
        lens = torch.randint(1, S + 1, (B,), generator=g)
        return masks.valid_lens(lens), ("valid_lens", lens.numpy(), False)
    if name == "valid_lens_queries":
        lens = torch.randint(1, min(L, S) + 1, (B,), generator=g)
        return masks.valid_lens(lens, queries=True), ("valid_lens", lens.numpy(), True)
    if name == "key_padding":
        pad = torch.rand(B, S, generator=g) < 0.3
        pad[:, 0] = False
        return masks.key_padding(pad), ("key_padding", pad.numpy())
    if name == "document":
        ids = torch.randint(0, 2, (B, max(L, S)), generator=g).sort(dim=1).values
        q_ids, k_ids = ids[:, :L], ids[:, :S]
        return masks.document(q_ids, key_ids=k_ids), ("document", q_ids.numpy(), k_ids.numpy())
    if name == "prefix_lm":
        prefix = torch.randint(0, S + 1, (B,), generator=g)
        return masks.prefix_lm(prefix), ("prefix_lm", prefix.numpy(), "top_left")
    raise ValueError(name)


def _np(t: Any) -> Any:
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t


def _oracle(c: Call) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    specs = [tuple(_np(x) for x in s) for s in c.mod_specs]
    score_spec = ("gaussian", 1.0) if c.score == "gaussian" else (c.score,)
    return oracle(np_of(c.q), np_of(c.k), np_of(c.v), score=score_spec, mask=c.mask_spec,
                  scale=None if c.scale is None else _np(c.scale), mods=specs)  # fmt: skip


def _attend(c: Call, backend: str, **kw: Any) -> Any:
    return attnkit.attention(c.q, c.k, c.v, score=c.score, mask=c.mask, mods=c.mods,
                             scale=c.scale, backend=backend, **kw)  # fmt: skip


def _runs(c: Call, backend: str) -> bool:
    ex = attnkit.explain(c.q, c.k, c.v, score=c.score, mask=c.mask, mods=c.mods, scale=c.scale,
                         backend=backend, return_weights=True, return_lse=True)  # fmt: skip
    return not ex.reasons[backend]


def _grads(c: Call, backend: str) -> list[torch.Tensor]:
    """Gradients of q, k, v and every parameter of a fixed random loss of (out, lse)."""
    leaves = [c.q, c.k, c.v]
    for t in leaves:
        t.requires_grad_(True)
    out, lse = _attend(c, backend, return_lse=True)
    g = torch.Generator().manual_seed(9)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
    loss = loss + (lse.nan_to_num(0.0, 0.0, 0.0) * torch.randn(lse.shape, generator=g,
                                                               dtype=lse.dtype)).sum()  # fmt: skip
    got = torch.autograd.grad(loss, [*leaves, *c.params], allow_unused=True)
    for t in leaves:
        t.requires_grad_(False)
    return [torch.zeros_like(t) if d is None else d for t, d in zip([*leaves, *c.params], got,
                                                                     strict=True)]  # fmt: skip


def _refused(params: Mapping[str, Any]) -> bool:
    """Whether the parameters name a call that is skipped or that the backend refuses."""
    layout, mask_name = params["layout"], params["mask_name"]
    if layout == "2d" and mask_name in PER_BATCH:
        return True
    return not _runs(
        _call(layout, params["mod_name"], mask_name, params["score"]), params["backend"]
    )


@pytest.mark.pairwise(unsupported=_refused)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("mod_name", MODS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_head_parameters_follow_the_layout(layout: str, mod_name: str, mask_name: str,
                                               score: str, backend: str) -> None:  # fmt: skip
    if layout == "2d" and mask_name in PER_BATCH:
        pytest.skip("a per-batch mask needs a leading dim")
    c = _call(layout, mod_name, mask_name, score)
    if not _runs(c, backend):
        with pytest.raises(BackendNotSupportedError, match=backend):
            _attend(c, backend)
        return
    out, w, lse = _attend(c, backend, return_weights=True, return_lse=True)
    ref_out, ref_w, ref_lse = _oracle(c)
    for name, got, want in (("out", out, ref_out), ("weights", w, ref_w), ("lse", lse, ref_lse)):
        assert_close_to_scale(got, torch.from_numpy(np.ascontiguousarray(want)), rel=FLOAT64_REL,
                              what=name)  # fmt: skip
    if backend == "reference":
        return
    for i, (got_g, want_g) in enumerate(zip(_grads(c, backend), _grads(c, "reference"),
                                            strict=True)):  # fmt: skip
        assert_close_to_scale(got_g, want_g, rel=FLOAT64_REL, what=f"gradient {i}")


def test_the_reported_calls_run_and_match_the_oracle() -> None:
    """The four calls of the report, as written there, on the default dispatch."""
    g = torch.Generator().manual_seed(4)
    # 3-D d2l inputs, ALiBi and a T5 bias, a ragged mask (the chunked tiles crashed)
    q, k, v = (torch.randn(2, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    lens = torch.tensor([2, 3])
    for m, spec in ((mods.alibi(1), ("alibi", np.array([2.0**-8]), False, 0, 0)),
                    (mods.relative_position_bias(torch.ones(32, 1, dtype=torch.float64)),
                     ("relpos", np.ones((32, 2)), 32, 128, True, 0, 0))):  # fmt: skip
        got = attnkit.attention(q, k, v, mask=masks.valid_lens(lens), mods=m)
        want = oracle(np_of(q), np_of(k), np_of(v), mask=("valid_lens", lens.numpy(), False),
                      mods=[spec])[0]  # fmt: skip
        assert_close_to_scale(got, torch.from_numpy(want), rel=FLOAT64_REL)
    # the Gaussian with a tensor scale, grouped-query heads (sdpa and chunked crashed)
    q = torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
    for scale in (torch.tensor([0.5, 0.7, 1.1, 1.3], dtype=torch.float64),
                  torch.tensor([0.6], dtype=torch.float64)):  # fmt: skip
        got = attnkit.attention(q, k, v, score="gaussian", scale=scale)
        want = oracle(np_of(q), np_of(k), np_of(v), score=("gaussian", 1.0),
                      scale=np.broadcast_to(scale.numpy(), (4,)))[0]  # fmt: skip
        assert_close_to_scale(got, torch.from_numpy(want), rel=FLOAT64_REL)
    # 3-D grouped-query heads, the Gaussian, a per-batch mask, one NaN in the query (sdpa)
    q = torch.randn(4, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
    q[1, 2, 3] = float("nan")
    lens = torch.tensor([3, 4, 5, 2])
    want = oracle(np_of(q.nan_to_num(0.0)), np_of(k), np_of(v), score=("gaussian", 1.0),
                  mask=("valid_lens", lens.numpy(), False))[0]  # fmt: skip
    want[1, 2] = np.nan  # the row that uses the NaN
    for backend in ("sdpa", "chunked", "reference", None):
        got = attnkit.attention(q, k, v, score="gaussian", mask=masks.valid_lens(lens),
                                backend=backend)  # fmt: skip
        assert_close_to_scale(got, torch.from_numpy(want), rel=FLOAT64_REL)
    # 2-D inputs with ALiBi or a T5 bias on the reference backend (it crashed)
    q = torch.randn(5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(6, 8, generator=g, dtype=torch.float64) for _ in range(2))
    table = torch.randn(32, 1, generator=g, dtype=torch.float64)
    for m, spec in ((mods.alibi(1), ("alibi", np.array([2.0**-8]), False, 0, 0)),
                    (mods.relative_position_bias(table),
                     ("relpos", table.numpy(), 32, 128, True, 0, 0))):  # fmt: skip
        want = oracle(np_of(q), np_of(k), np_of(v), mods=[spec])[0]
        for backend in ("reference", "chunked", None):
            got = attnkit.attention(q, k, v, mods=m, backend=backend)
            assert got.shape == (5, 8)
            assert_close_to_scale(got, torch.from_numpy(want), rel=FLOAT64_REL)
