"""The sdpa backend's paths: double backward, decoding routes, non-finite inputs without
host syncs and the CUDA lse op choice."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
from attnkit import _host, masks, mods, scores
from attnkit._inputs import validate_inputs
from attnkit.backends.dispatch import get_backend
from attnkit.backends.sdpa import SDPABackend, plan
from attnkit.backends.sdpa.backend import _tile_gradients
from attnkit.backends.sdpa.lse import cuda_lse_op
from attnkit.backends.sdpa.run import call, has_lower_right

from cases import qkv
from tolerance import FLOAT32_CALL_REL, FLOAT64_REL, assert_close_to_scale


def _qkv(B: int, H: int, L: int, S: int, E: int = 4, seed: int = 0,
         dtype: torch.dtype = torch.float64):  # type: ignore[no-untyped-def]  # fmt: skip
    return qkv(B, H, L, S, E, seed=seed, dtype=dtype)


@pytest.mark.parametrize(
    "mask",
    [
        None,
        masks.causal(),
        masks.causal("bottom_right"),
        masks.valid_lens(torch.tensor([2, 4])),
        masks.keep(torch.rand(3, 4, generator=torch.Generator().manual_seed(1)) < 0.7),
        masks.key_padding(torch.tensor([[False, False, True, False], [False] * 4])),
    ],
    ids=["none", "causal", "causal_br", "valid_lens", "keep", "key_padding"],
)
@pytest.mark.parametrize("want", ["output", "weights", "gaussian"])
def test_double_backward_on_every_path(mask: masks.Mask | None, want: str) -> None:
    q, k, v = (t.requires_grad_(True) for t in _qkv(2, 2, 3, 4, E=2))  # E=2: gradgradcheck's
    score = scores.Gaussian(1.3) if want == "gaussian" else "scaled_dot"  # cost is per input
    kw: dict[str, Any] = {"mask": mask, "backend": "sdpa", "score": score}

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        return attnkit.attention(q, k, v, return_weights=want == "weights", **kw)

    assert torch.autograd.gradgradcheck(f, (q, k, v), fast_mode=True)


@pytest.mark.parametrize(
    "kw",
    [{}, {"mask": masks.causal(), "mods": mods.alibi(2, causal=True)}, {"score": "gaussian"}],
    ids=["plain", "causal+alibi", "gaussian"],
)
def test_double_backward_through_the_lse(kw: dict[str, Any]) -> None:
    """The lse's backward is the fused backward from (out, lse), which has no second
    derivative: under create_graph it recomputes the call as materialized math. Its
    gradient had no graph, so a Hessian through the lse was silently 0."""
    q, k, v = (t.requires_grad_(True) for t in _qkv(1, 2, 2, 3, E=2))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        out, lse = attnkit.attention(q, k, v, return_lse=True, backend="sdpa", **kw)
        return out, lse

    assert torch.autograd.gradgradcheck(f, (q, k, v), fast_mode=True)


@pytest.mark.parametrize("backend", ["sdpa", "chunked", "reference"])
@pytest.mark.parametrize("return_lse", [False, True], ids=["output", "lse"])
def test_self_attention_of_one_tensor_under_create_graph(backend: str, return_lse: bool) -> None:
    """attention(x, x, x): the backward recorded for double backward (create_graph=True)
    took the gradient of x once per slot, each the whole of it: x's gradient was 3 times
    the plain backward's (gradgradcheck passes either way: it differentiates that
    gradient, not checks it)."""
    (x,) = (t.requires_grad_(True) for t in _qkv(2, 2, 4, 4, E=3)[:1])

    def loss() -> torch.Tensor:
        res = attnkit.attention(x, x, x, mask=masks.causal(), backend=backend,
                                return_lse=return_lse)  # fmt: skip
        return res[0].sum() + res[1].sum() if return_lse else res.sum()

    (plain,) = torch.autograd.grad(loss(), [x])
    (graphed,) = torch.autograd.grad(loss(), [x], create_graph=True)
    assert graphed.grad_fn is not None
    assert_close_to_scale(graphed.detach(), plain, rel=FLOAT64_REL)


def test_double_backward_with_grouped_heads() -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    k.requires_grad_(True)
    v.requires_grad_(True)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=masks.causal(), backend="sdpa")

    assert torch.autograd.gradgradcheck(f, (q, k, v), fast_mode=True)


def test_gaussian_beyond_the_fused_backwards_terms() -> None:
    """A Gaussian call whose dot form's terms are beyond what the fused backward keeps
    (keys of scale 30, terms of about 1e3 logits): the fused kernel's output, bit for bit
    the call's without gradients, with the tiles' gradients, twice differentiable."""
    gen = torch.Generator().manual_seed(2)
    q, k = (torch.randn(11, 5, generator=gen, dtype=torch.float64) * 30 for _ in "qk")
    v = torch.randn(11, 4, generator=gen, dtype=torch.float64)
    q, k, v = (t[:5].requires_grad_(True) for t in (q, k, v))  # (5, 5), (5, 5), (5, 4)
    kw: dict[str, Any] = {"score": scores.Gaussian(1.0), "mask": masks.causal()}
    assert _tile_gradients(validate_inputs(q, k, v, **kw), get_backend("chunked"))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, **kw, backend="sdpa")

    with torch.no_grad():
        plain = f(q, k, v)
    assert torch.equal(f(q, k, v), plain)
    assert torch.autograd.gradcheck(f, (q, k, v))
    assert torch.autograd.gradgradcheck(f, (q, k, v), fast_mode=True)


def _inputs(L: int, S: int, mask: masks.Mask | None, **kw: Any) -> Any:
    q, k, v = _qkv(1, 2, L, S, E=8, dtype=torch.float32)
    return validate_inputs(q, k, v, mask=mask, **kw)


def test_decoding_routes() -> None:
    br = masks.causal("bottom_right")
    one = _inputs(1, 40, br)
    assert plan.causal_shift(one) == 39
    assert plan.causal_route(one, 39) == "none"  # one new token sees its whole cache
    assert plan.is_direct(one)
    few = _inputs(4, 40, br)
    assert plan.causal_shift(few) == 36
    assert plan.causal_route(few, 36) == "dense"  # CPU: torch would build the mask too
    assert SDPABackend().materialized_masks(few) == []
    many = _inputs(plan.DECODE_ROWS + 1, 200, br)
    assert SDPABackend().materialized_masks(many)
    assert SDPABackend().materialized_masks(_inputs(5, 5, masks.window(1, 0)))


@pytest.mark.parametrize("L", [1, 3, 7])
def test_decoding_matches_reference(L: int) -> None:
    q, k, v = _qkv(2, 2, L, 9, dtype=torch.float32)
    br = masks.causal("bottom_right")
    got = attnkit.attention(q, k, v, mask=br, backend="sdpa")
    want = attnkit.attention(q, k, v, mask=br, backend="reference")
    assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL)


@pytest.mark.skipif(not has_lower_right(), reason="torch has no lower-right causal bias")
def test_lower_right_bias_call_matches_reference_and_keeps_the_policy() -> None:
    q, k, v = _qkv(1, 2, 3, 6, dtype=torch.float32)
    v[0, 0, 5] = float("nan")  # the last key: seen by the last query only
    out, _ = call(q, k, v, attn_mask=None, is_causal=False, lower_right=True, dropout_p=0.0,
                  scale=0.5, gqa=False, want_lse=False)  # fmt: skip
    v_clean = v.clone()
    v_clean[0, 0, 5] = 0.0
    want = attnkit.attention(q, k, v_clean, mask=masks.causal("bottom_right"), scale=0.5,
                             backend="reference")  # fmt: skip
    assert_close_to_scale(out[0, :, :2], want[0, :, :2], rel=FLOAT32_CALL_REL)
    assert_close_to_scale(out[0, 1], want[0, 1], rel=FLOAT32_CALL_REL)
    assert out[0, 0, 2].isnan().all()


class _NoSync(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default):
            raise AssertionError(f"host sync on the call path: {func}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("score", ["scaled_dot", scores.Gaussian(1.5)], ids=["dot", "gaussian"])
@pytest.mark.parametrize(
    "mask",
    [None, masks.causal(), masks.valid_lens(torch.tensor([3, 5]))],
    ids=["none", "causal", "valid_lens"],
)
def test_nonfinite_policy_without_host_reads(
    mask: masks.Mask | None, score: scores.Score | str
) -> None:
    q, k, v = _qkv(2, 2, 5, 5, dtype=torch.float32)
    q[:, :, 1, 0] = float("nan")  # a used query row
    v[:, :, 4] = float("nan")  # the last value: masked out for all but the last row under causal
    with _host.device_semantics(), _NoSync():
        got = attnkit.attention(q, k, v, mask=mask, score=score, backend="sdpa")
    v_clean = v.clone()
    v_clean[:, :, 4] = 0.0
    q_clean = q.clone()
    q_clean[:, :, 1, 0] = 0.0
    want = attnkit.attention(q_clean, k, v_clean, mask=mask, score=score, backend="reference")
    assert got[:, :, 1].isnan().all()
    rows = [0, 2, 3] if isinstance(mask, masks.CausalMask) else []
    if isinstance(mask, masks.ValidLensMask):  # batch 0 keeps keys 0..2: the NaN value is padding
        assert_close_to_scale(
            got[0, :, [0, 2, 3, 4]], want[0, :, [0, 2, 3, 4]], rel=FLOAT32_CALL_REL
        )
    for r in rows:
        assert_close_to_scale(got[:, :, r], want[:, :, r], rel=FLOAT32_CALL_REL)
    if mask is None:
        assert got.isnan().all()  # every row uses the NaN value


def test_a_row_whose_every_key_is_nan_is_nan() -> None:
    q, k, v = _qkv(1, 1, 3, 2, dtype=torch.float32)
    k[..., 0] = float("nan")
    got = attnkit.attention(q, k, v, backend="sdpa")
    assert got.isnan().all()


def test_cuda_lse_op_choice() -> None:
    assert cuda_lse_op(torch.float16, 64, has_mask=False) == "flash"
    assert cuda_lse_op(torch.bfloat16, 60, has_mask=False) == "flash"  # padded to 64
    assert cuda_lse_op(torch.float16, 64, has_mask=True) == "efficient"
    assert cuda_lse_op(torch.float32, 64, has_mask=False) == "efficient"
    assert cuda_lse_op(torch.float16, 320, has_mask=False) == "efficient"
    assert cuda_lse_op(torch.float64, 64, has_mask=False) is None


@pytest.mark.parametrize("modifier", ["symmetric_alibi", "softcap"])
def test_the_kernel_refuses_scores_it_cannot_apply_instead_of_dropping_them(
    modifier: str,
) -> None:
    """Asked (past dispatch) to run a call whose scores keep a position table (a
    symmetric ALiBi without a causal mask) or a softcap, sdpa's forward raises: its
    kernel has no place for them, and dropping them would be a wrong answer."""
    q, k, v = (t.float() for t in _qkv(1, 2, 4, 4))
    modifier_of = {"symmetric_alibi": mods.alibi(2), "softcap": mods.softcap(5.0)}
    inputs = validate_inputs(q, k, v, mods=[modifier_of[modifier]])
    backend = SDPABackend()
    with pytest.raises(RuntimeError, match="position table or a softcap"):
        backend.forward(inputs)


def test_the_cuda_lse_kernels_keep_the_call_s_alignment_and_dtype() -> None:
    """FlashAttention aligns a causal mask with L != S to the bottom-right corner, where
    attnkit's causal() is top-left: half-precision calls with an lse (weights, sinks)
    took flash there (outputs 1.4 off). The efficient kernel, top-left, takes them now.
    No CUDA kernel returns a float64 lse: such calls are left to the other backends
    (they raised inside sdpa)."""
    from attnkit.backends.sdpa import lse

    if lse.CUDA_FLASH_OP is None or lse.CUDA_EFFICIENT_OP is None:
        pytest.skip("this torch has no CUDA lse kernels")
    assert lse.cuda_lse_op(torch.float16, 64, has_mask=False, square=True) == "flash"
    assert lse.cuda_lse_op(torch.float16, 64, has_mask=False, square=False) == "efficient"
    assert lse.cuda_lse_op(torch.float64, 64, has_mask=False) is None
    cuda = torch.device("cuda")
    assert lse.has_lse_kernel(cuda, torch.bfloat16) and not lse.has_lse_kernel(cuda, torch.float64)


def test_sdpa_s_reasons_for_alibi_name_what_stops_it() -> None:
    """A causal ALiBi with a softcap was refused as "symmetric ALiBi without a causal
    mask", as was a symmetric one under a causal mask combined with another: the
    softcap has its own reason, and the symmetric form's says what it needs."""
    q = torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(0))
    capped = attnkit.explain(q, q, q, mods=[mods.alibi(2, causal=True), mods.softcap(5.0)])
    assert capped.reasons["sdpa"] == ["score modifier(s) softcap not supported"]
    mask = masks.causal() & masks.valid_lens(torch.tensor([6]))
    (why,) = attnkit.explain(q, q, q, mods=[mods.alibi(2)], mask=mask).reasons["sdpa"]
    assert why.startswith("symmetric ALiBi is not a dot product unless the call's whole mask")
    assert attnkit.explain(q, q, q, mods=[mods.alibi(2)], mask=masks.causal()).chosen == "sdpa"
