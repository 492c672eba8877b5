"""Infinitely far Gaussian keys: calls and checks shared by the conformance suite and the
triton backend's tests.

Under the Gaussian score ``-‖q - k‖²/2σ²`` a key holding an inf (and no NaN) is
infinitely far from every query: its weight is 0, whatever its value holds, and no
(query, key) pair uses it, so it adds nothing to any gradient, its own included, even
when a query elsewhere holds an inf or a NaN (README: the pair rule).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import attnkit
from attnkit import masks

from reference import oracle
from tolerance import FLOAT32_REL, FLOAT64_REL, assert_close_to_scale

B, H, HK, L, S, E, EV = 2, 4, 2, 5, 7, 4, 3  # two query heads per key head
FAR = ((0, 1, 2), (1, 0, 6), (1, 1, 0))  # (batch, key head, key) of the far keys
MASKS = ("none", "causal", "valid_lens", "key_padding")


def far_key_call(
    mask_name: str,
    value_poison: float,
    query_poison: float | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> dict[str, Any]:
    """A Gaussian call whose keys FAR hold +inf or -inf in one component and whose values
    there hold ``value_poison``; with ``query_poison``, query row (0, 2, 3) holds it too.

    Returns q, k, v (in ``dtype``, drawn in float64), the mask, its oracle spec with the
    far keys removed (what the answer must equal), the far keys (B, Hk, S), the poisoned
    query rows (B, H, L) and the tolerance relative to scale (1e-9 in float64).
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, HK, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, HK, S, EV, generator=g, dtype=torch.float64)
    far = np.zeros((B, HK, S), dtype=bool)
    for n, (b, h, j) in enumerate(FAR):
        k[b, h, j, n % E] = float("inf") if n % 2 == 0 else float("-inf")
        v[b, h, j] = value_poison
        far[b, h, j] = True
    bad_q = np.zeros((B, H, L), dtype=bool)
    if query_poison is not None:
        q[0, 2, 3, 0] = query_poison  # its key head holds the far key (0, 1, 2)
        bad_q[0, 2, 3] = True
    mask, spec = _mask(mask_name)
    keep_far = np.repeat(~far, H // HK, axis=1)[:, :, None, :]  # (B, H, 1, S)
    removed = ("keep", keep_far) if spec is None else ("and", spec, ("keep", keep_far))
    rel = FLOAT64_REL if dtype == torch.float64 else FLOAT32_REL
    q, k, v = (t.to(dtype) for t in (q, k, v))
    return {"q": q, "k": k, "v": v, "mask": mask, "removed": removed, "far": far,
            "bad_q": bad_q, "rel": rel}  # fmt: skip


def _mask(name: str) -> tuple[masks.Mask | None, tuple[Any, ...] | None]:
    if name == "none":
        return None, None
    if name == "causal":
        return masks.causal("bottom_right"), ("causal", "bottom_right")
    if name == "valid_lens":
        return masks.valid_lens(torch.tensor([4, 7])), ("valid_lens", np.array([4, 7]), False)
    if name == "key_padding":
        pad = torch.zeros(B, S, dtype=torch.bool)
        pad[0, [0, 5]] = True
        return masks.key_padding(pad), ("key_padding", pad.numpy())
    raise ValueError(name)


def runs(call: dict[str, Any], backend: str) -> bool:
    ex = attnkit.explain(call["q"], call["k"], call["v"], score="gaussian", mask=call["mask"],
                         backend=backend, return_weights=True, return_lse=True)  # fmt: skip
    return not ex.reasons[backend]


def check_far_keys_get_weight_zero(call: dict[str, Any], backend: str) -> None:
    """Output, weights and lse equal the oracle with the far keys masked out: finite, the
    far keys' weights exactly 0, whatever their values hold."""
    q, k, v = call["q"], call["k"], call["v"]
    out, w, lse = attnkit.attention(q, k, v, score="gaussian", mask=call["mask"],
                                    return_weights=True, return_lse=True, backend=backend)  # fmt: skip
    clean_k = torch.where(torch.isinf(k), torch.zeros((), dtype=k.dtype), k)
    clean_v = torch.where(torch.isfinite(v), v, torch.zeros((), dtype=v.dtype))
    want = oracle(q.double().numpy(), clean_k.double().numpy(), clean_v.double().numpy(),
                  score=("gaussian", 1.0), mask=call["removed"])  # fmt: skip
    for name, got, ref in zip(("out", "weights", "lse"), (out, w, lse), want, strict=True):
        assert_close_to_scale(got, torch.from_numpy(np.ascontiguousarray(ref)), rel=call["rel"],
                              what=f"{backend} {name}")  # fmt: skip
    far_q = np.repeat(call["far"], H // HK, axis=1)[:, :, None, :]  # (B, H, 1, S)
    assert (w.numpy()[np.broadcast_to(far_q, w.shape)] == 0).all()


def gradients(call: dict[str, Any], backend: str) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of a fixed loss whose output gradient is finite on every row."""
    leaves = [t.clone().requires_grad_() for t in (call["q"], call["k"], call["v"])]
    out, lse = attnkit.attention(*leaves, score="gaussian", mask=call["mask"], return_lse=True,
                                 backend=backend)  # fmt: skip
    g = torch.Generator().manual_seed(2)
    d_out = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    d_lse = torch.randn(lse.shape, generator=g, dtype=torch.float64).to(lse.dtype)
    return torch.autograd.grad([out, lse], leaves, [d_out, d_lse])


def check_far_keys_get_no_gradient(call: dict[str, Any], backend: str) -> None:
    """The far keys' gradient and their values' gradient are exactly 0 (no pair uses
    them), a query elsewhere holding an inf or a NaN; every gradient entry the float64
    reference backend gives finite, this backend gives the same."""
    dq, dk, dv = gradients(call, backend)
    far = torch.from_numpy(call["far"])
    assert torch.equal(dk[far], torch.zeros_like(dk[far])), f"{backend}: far keys' gradient"
    assert torch.equal(dv[far], torch.zeros_like(dv[far])), f"{backend}: far values' gradient"
    as64 = {n: call[n].double() for n in ("q", "k", "v")}
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv),
                               gradients({**call, **as64}, "reference"), strict=True):  # fmt: skip
        fin = torch.isfinite(want)
        assert_close_to_scale(got[fin], want[fin], rel=call["rel"], what=f"{backend} {name}")
