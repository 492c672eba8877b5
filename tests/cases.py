"""Random attention cases shared by the oracle tests: tensors, attnkit objects, oracle specs.

A case pairs the attnkit call (score object, mask object) with the independent
NumPy spec the oracle in reference.py understands, built from the same arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, masks, scores

from reference import oracle, oracle_mask

DEVICES: tuple[str, ...] = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
"""Devices the suite runs on: the CPU always, CUDA when torch sees a GPU."""

# Backends the matrix leaves to their own test files on a device: triton on the CPU runs
# in Triton's interpreter, far too slow for the full matrix (tests/backends/test_triton.py
# covers it at small shapes).
_SLOW_ON = {("cpu", "triton")}


def matrix_backends(device: str) -> tuple[str, ...]:
    """The backends the conformance matrix runs on ``device``: every registered backend
    that runs there and is available on this install, by dispatch priority."""
    from attnkit.backends import dispatch

    return tuple(
        name
        for name in dispatch.backends_for(device)
        if (device, name) not in _SLOW_ON and attnkit.get_backend(name).is_available() is None
    )


SCORES = ("dot", "scaled_dot", "bilinear", "additive", "gaussian")
MASKS = (
    "none",
    "keep",
    "keep_heads",
    "block",
    "bias",
    "tf_padding",
    "tf_lookahead",
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
    "document",
    "document_causal",
    "document_spread",
    "prefix_lm",
    "window_or_padding",
    "not_causal_and_lens",
)
# (B, H, Hk, L, S, E, Ev): odd sizes, L != S, Ev != E, GQA (H != Hk), a single key.
SHAPES = (
    (2, 3, 3, 5, 7, 8, 4),
    (3, 4, 2, 17, 3, 5, 6),
    (1, 2, 1, 113, 17, 3, 2),
    (2, 1, 1, 1, 1, 1, 1),
)

# Large shapes run only where a device makes them cheap: several kernel tiles per row
# and per column, odd sizes, GQA, head dims of real models.
LARGE_SHAPES = ((2, 4, 2, 257, 300, 64, 32),)


def shapes_for(device: str) -> tuple[tuple[int, ...], ...]:
    """The oracle shapes for ``device``: today's CPU sizes, plus large ones off the CPU."""
    return SHAPES if device == "cpu" else SHAPES + LARGE_SHAPES


def qkv(
    B: int,
    H: int,
    L: int,
    S: int,
    E: int,
    Ev: int | None = None,
    *,
    Hk: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev) from one seeded generator
    (Hk defaults to H, Ev to E)."""
    g = torch.Generator().manual_seed(seed)
    kv_heads = H if Hk is None else Hk
    q = torch.randn(B, H, L, E, generator=g, dtype=dtype)
    k = torch.randn(B, kv_heads, S, E, generator=g, dtype=dtype)
    v = torch.randn(B, kv_heads, S, E if Ev is None else Ev, generator=g, dtype=dtype)
    return q, k, v


def structured_masks(B: int, L: int, S: int) -> dict[str, masks.Mask]:
    """Every structured mask kind and combination for (B, ..., L, S), with an element
    that keeps no key and one whose keys are all padding."""
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(0, min(L, S) + 1, (B,), generator=g)
    lens[0] = 0  # a batch element with no keys at all
    row_lens = torch.randint(0, S + 1, (B, L), generator=g)
    pad = torch.rand(B, S, generator=g) < 0.4
    pad[-1] = True  # every key padded
    keep = torch.rand(B, 1, L, S, generator=g) < 0.7
    ids = packed_ids(B, max(L, S), g)
    return {
        "causal": masks.causal(),
        "causal_br": masks.causal("bottom_right"),
        "window": masks.window(2, 1),
        "window_br": masks.window(3, 0, "bottom_right"),
        "window_left_only": masks.window(None, 2),
        "valid_lens": masks.valid_lens(lens),
        "valid_lens_queries": masks.valid_lens(lens, queries=True),
        "valid_lens_2d": masks.valid_lens(row_lens),
        "key_padding": masks.key_padding(pad),
        "causal_and_padding": masks.causal("bottom_right") & masks.key_padding(pad),
        "window_and_lens": masks.window(4, 4) & masks.valid_lens(lens, queries=True),
        "keep_and_causal": masks.keep(keep) & masks.causal(),
        "document": masks.document(ids[:, :L], key_ids=ids[:, :S]),
        "prefix_lm": masks.prefix_lm(lens),
        "window_or_padding": masks.window(1, 1) | masks.key_padding(pad),
        "not_causal_and_lens": ~masks.causal() & masks.valid_lens(lens),
    }


@dataclass
class Case:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    score: scores.Score
    score_spec: tuple[Any, ...]
    mask: masks.Mask | torch.Tensor | None
    mask_spec: tuple[Any, ...] | None
    scale: float | None


def make_score(
    name: str, E: int, Ek: int, gen: torch.Generator, dtype: torch.dtype
) -> tuple[scores.Score, tuple[Any, ...]]:
    """An attnkit score with random parameters and its oracle spec."""
    if name == "dot":
        return scores.Dot(), ("dot",)
    if name == "scaled_dot":
        return scores.ScaledDot(), ("scaled_dot",)
    if name == "bilinear":
        s = scores.Bilinear(E, Ek, dtype=dtype)
        with torch.no_grad():
            s.weight.copy_(torch.randn(E, Ek, generator=gen, dtype=dtype) / E**0.5)
        return s, ("bilinear", s.weight.detach().double().numpy())
    if name == "additive":
        hidden = 6
        s = scores.Additive(E, Ek, hidden, dtype=dtype)
        with torch.no_grad():
            for lin in (s.W_q, s.W_k, s.w_v):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=dtype))
        return s, (
            "additive",
            s.W_q.weight.detach().double().numpy(),
            s.W_k.weight.detach().double().numpy(),
            s.w_v.weight.detach().double().numpy()[0],
        )
    if name == "gaussian":
        s = scores.Gaussian(1.7)
        return s, ("gaussian", 1.7)
    raise ValueError(name)


def make_mask(
    name: str, B: int, H: int, L: int, S: int, gen: torch.Generator, dtype: torch.dtype
) -> tuple[masks.Mask | torch.Tensor | None, tuple[Any, ...] | None]:
    """An attnkit mask for shape (B, H, L, S) and its oracle spec; some rows fully masked."""

    def rand_bool(*shape: int, p: float = 0.7) -> torch.Tensor:
        return torch.rand(*shape, generator=gen) < p

    if name == "none":
        return None, None
    if name == "keep":
        t = rand_bool(L, S)
        t[0] = False  # a fully masked row
        return masks.keep(t), ("keep", t.numpy())
    if name == "keep_heads":
        t = rand_bool(B, 1, L, S)
        return masks.keep(t), ("keep", t.numpy())
    if name == "block":
        t = rand_bool(B, H, L, S, p=0.4)
        return masks.block(t), ("block", t.numpy())
    if name == "bias":
        t = torch.randn(B, H, L, S, generator=gen, dtype=dtype)
        t[rand_bool(B, H, L, S, p=0.3)] = float("-inf")
        return t, ("bias", t.double().numpy())  # a float tensor is an additive bias
    if name == "tf_padding":
        t = (rand_bool(B, 1, 1, S, p=0.3)).to(dtype)  # 1 = masked, TF tutorial layout
        return masks.tf(t), ("tf", t.double().numpy())
    if name == "tf_lookahead":
        t = torch.triu(torch.ones(L, S), diagonal=1)  # 1 = masked
        return masks.tf(t), ("tf", t.double().numpy())
    if name == "valid_lens":
        lens = torch.randint(0, S + 1, (B,), generator=gen)
        return masks.valid_lens(lens), ("valid_lens", lens.numpy(), False)
    if name == "valid_lens_2d":
        lens = torch.randint(0, S + 1, (B, L), generator=gen)
        return masks.valid_lens(lens), ("valid_lens", lens.numpy(), False)
    if name == "valid_lens_queries":
        lens = torch.randint(0, min(L, S) + 1, (B,), generator=gen)
        return masks.valid_lens(lens, queries=True), ("valid_lens", lens.numpy(), True)
    if name == "key_padding":
        pad = rand_bool(B, S, p=0.3)
        return masks.key_padding(pad), ("key_padding", pad.numpy())
    if name == "causal":
        return masks.causal(), ("causal", "top_left")
    if name == "causal_bottom_right":
        return masks.causal("bottom_right"), ("causal", "bottom_right")
    if name == "window":
        return masks.window(2, 1), ("window", 2, 1, "top_left")
    if name == "window_bottom_right":
        return masks.window(1, 0, align="bottom_right"), ("window", 1, 0, "bottom_right")
    if name == "causal_and_padding":
        pad = rand_bool(B, S, p=0.3)
        return (
            masks.causal("bottom_right") & masks.key_padding(pad),
            ("and", ("causal", "bottom_right"), ("key_padding", pad.numpy())),
        )
    if name == "bias_and_window":
        t = torch.randn(L, S, generator=gen, dtype=dtype)
        return (
            masks.bias(t) & masks.window(None, 2),
            ("and", ("bias", t.double().numpy()), ("window", None, 2, "top_left")),
        )
    if name in ("document", "document_causal"):
        q_ids, k_ids = packed_ids(B, L, gen), packed_ids(B, S, gen)
        doc = masks.document(q_ids, key_ids=k_ids)
        spec = ("document", q_ids.numpy(), k_ids.numpy())
        if name == "document":
            return doc, spec
        return doc & masks.causal("bottom_right"), ("and", spec, ("causal", "bottom_right"))
    if name == "document_spread":  # documents that are not one run each
        q_ids = spread_ids(B, L, gen)
        k_ids = q_ids if L == S else spread_ids(B, S, gen)
        doc = masks.document(q_ids, key_ids=None if L == S else k_ids)
        return doc, ("document", q_ids.numpy(), k_ids.numpy())
    if name == "prefix_lm":
        prefix = torch.randint(0, S + 1, (B,), generator=gen)
        return masks.prefix_lm(prefix), ("prefix_lm", prefix.numpy(), "top_left")
    if name == "window_or_padding":
        pad = rand_bool(B, S, p=0.8)
        return (
            masks.window(1, 1) | masks.key_padding(pad),
            ("or", ("window", 1, 1, "top_left"), ("key_padding", pad.numpy())),
        )
    if name == "not_causal_and_lens":
        lens = torch.randint(0, S + 1, (B,), generator=gen)
        return (
            ~masks.causal() & masks.valid_lens(lens),
            ("and", ("not", ("causal", "top_left")), ("valid_lens", lens.numpy(), False)),
        )
    raise ValueError(name)


def packed_ids(B: int, N: int, gen: torch.Generator) -> torch.Tensor:
    """(B, N) document ids of packed sequences: sorted runs from 0, a padding tail of -1."""
    ids = torch.randint(0, 3, (B, N), generator=gen).sort(dim=1).values  # (B, N)
    pad = torch.rand(B, N, generator=gen).sort(dim=1).values > 0.85  # a tail of padding
    return ids.masked_fill(pad, -1)


def spread_ids(B: int, N: int, gen: torch.Generator) -> torch.Tensor:
    """(B, N) document ids in no order: interleaved documents (``[0, 1, 0, 1, ...]``) and
    padding (-1) inside a document (``[3, 3, -1, 3]``), so no document need be one run."""
    ids = torch.randint(-1, 3, (B, N), generator=gen)  # (B, N), -1 = padding
    ids[:, 0::3] = 1  # document 1 comes back every third position
    return ids


def make_case(
    score_name: str,
    mask_name: str,
    shape: tuple[int, ...],
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Case:
    """A random case built on the CPU (fixed seed) and moved to ``device``."""
    B, H, Hk, L, S, E, Ev = shape
    gen = torch.Generator().manual_seed(seed)
    Ek = E + 2 if score_name in ("bilinear", "additive") else E
    q = torch.randn(B, H, L, E, generator=gen, dtype=dtype)
    k = torch.randn(B, Hk, S, Ek, generator=gen, dtype=dtype)
    v = torch.randn(B, Hk, S, Ev, generator=gen, dtype=dtype)
    score, score_spec = make_score(score_name, E, Ek, gen, dtype)
    mask, mask_spec = make_mask(mask_name, B, H, L, S, gen, dtype)
    if device != "cpu":
        q, k, v = q.to(device), k.to(device), v.to(device)
        score = score.to(device)
        mask = mask_to(mask, device)
    return Case(q, k, v, score, score_spec, mask, mask_spec, None)


def mask_to(mask: Any, device: str) -> Any:
    """A copy of an attnkit mask (or tensor) whose tensors live on ``device``."""
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor):
        return mask.to(device)
    return mask.map_tensors(lambda t, role: t.to(device))


def plain_math(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention as a user would write it in the inputs' own dtype (the error yardstick)."""
    q, k, v = case.q, case.k, case.v
    if q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(g, dim=-3)
        v = v.repeat_interleave(g, dim=-3)
    spec = case.score_spec
    if spec[0] in ("dot", "scaled_dot"):
        logits = q @ k.transpose(-2, -1)
    elif spec[0] == "bilinear":
        logits = q @ case.score.weight @ k.transpose(-2, -1)  # type: ignore[operator]
    elif spec[0] == "additive":
        s = case.score
        feats = torch.tanh(s.W_q(q).unsqueeze(-2) + s.W_k(k).unsqueeze(-3))  # type: ignore[operator]
        logits = s.w_v(feats).squeeze(-1)  # type: ignore[operator]
    else:
        logits = -((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1) / (2 * spec[1] ** 2)
    scale = q.shape[-1] ** -0.5 if spec[0] == "scaled_dot" else 1.0
    logits = logits * scale
    L, S = q.shape[-2], k.shape[-2]
    keep, bias = oracle_mask(case.mask_spec, L, S, q.ndim - 2)
    if bias is not None:
        logits = logits + torch.from_numpy(bias).to(q.device, q.dtype)
    if keep is not None:
        keep_t = torch.from_numpy(np.ascontiguousarray(keep)).to(q.device)
        logits = logits.masked_fill(~keep_t, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    w = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return w @ v, w, lse


def np_of(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def assert_within_tolerance(got: np.ndarray, ref: np.ndarray, plain: np.ndarray, what: str) -> None:
    """The suite's tolerance rule: error against the float64 oracle at most 2x the error of
    plain same-dtype math, never held tighter than 1e-5 relative to the largest reference
    value (the float32 floor); -inf exactly where the oracle has -inf, never NaN."""
    assert not np.isnan(got).any(), f"{what}: NaN in result"
    inf_ref = np.isinf(ref)
    np.testing.assert_array_equal(np.isinf(got), inf_ref, err_msg=f"{what}: -inf pattern")
    fin = ~inf_ref
    if not fin.any():
        return
    err = np.abs(got[fin] - ref[fin]).max()
    plain_err = np.abs(plain[fin] - ref[fin]).max()
    assert np.isfinite(plain_err), f"{what}: plain same-dtype math is not finite here"
    backstop = 1e-5 * max(np.abs(ref[fin]).max(), 1.0)
    allowed = max(2 * plain_err, backstop)
    assert err <= allowed, (
        f"{what}: error {err:.3g} > allowed {allowed:.3g} (plain {plain_err:.3g})"
    )


def capabilities(case: Case, backend: str) -> tuple[bool, bool, bool]:
    """(can run at all, can return weights, can return lse) for this backend and case."""
    kw = {"score": case.score, "mask": case.mask, "backend": backend}
    runs = not attnkit.explain(case.q, case.k, case.v, **kw).reasons[backend]
    w = not attnkit.explain(case.q, case.k, case.v, return_weights=True, **kw).reasons[backend]
    lse = not attnkit.explain(case.q, case.k, case.v, return_lse=True, **kw).reasons[backend]
    return runs, w, lse


def refused(params: Mapping[str, Any]) -> bool:
    """For ``@pytest.mark.pairwise(unsupported=refused)``: whether the backend in a
    test's parameters refuses its score and mask on its device (tiny float64 inputs on
    the test's device, the CPU when it names none; a refusal depends on the score, the
    mask, the backend and the device, not on the sizes)."""
    score_name = params.get("score_name", params.get("score"))
    mask_name = params.get("mask_name", "none")
    mask_name = mask_name if mask_name in MASKS else "none"  # another test's own mask set
    device = str(params.get("device", "cpu"))
    case = make_case(
        str(score_name), str(mask_name), SHAPES[0], seed=0, dtype=torch.float64, device=device
    )
    return not capabilities(case, str(params["backend"]))[0]


def check_case(case: Case, backend: str) -> None:
    """Run ``case`` on ``backend`` (with weights and lse where it can) and hold every result
    to the oracle; a backend that declines the case must raise BackendNotSupportedError."""
    runs, want_w, want_lse = capabilities(case, backend)
    if not runs:
        with pytest.raises(BackendNotSupportedError, match=backend):
            attnkit.attention(
                case.q, case.k, case.v, score=case.score, mask=case.mask, backend=backend
            )
        return
    res = attnkit.attention(
        case.q,
        case.k,
        case.v,
        score=case.score,
        mask=case.mask,
        return_weights=want_w,
        return_lse=want_lse,
        backend=backend,
    )
    res = res if isinstance(res, tuple) else (res,)
    ref_out, ref_w, ref_lse = oracle(
        np_of(case.q), np_of(case.k), np_of(case.v), score=case.score_spec, mask=case.mask_spec
    )
    p_out, p_w, p_lse = plain_math(case)
    assert res[0].shape == ref_out.shape and res[0].dtype == case.q.dtype
    assert_within_tolerance(np_of(res[0]), ref_out, np_of(p_out), f"{backend} output")
    i = 1
    if want_w:
        assert_within_tolerance(np_of(res[i]), ref_w, np_of(p_w), f"{backend} weights")
        i += 1
    if want_lse:
        assert_within_tolerance(np_of(res[i]), ref_lse, np_of(p_lse), f"{backend} lse")


CPU_BACKENDS = matrix_backends("cpu")
"""The backends the conformance matrix runs on the CPU."""
