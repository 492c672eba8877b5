"""attention() and the layers under ``torch.autocast`` (CPU, bfloat16 and float16).

Under autocast a call runs as torch's ``scaled_dot_product_attention`` does: its
float inputs in autocast's dtype. So the call must equal, bit for bit, the same call
with the inputs (and a learned score) given in that dtype without autocast, on every
backend, forward and backward (a backward run after the autocast block, as torch's
training loop runs it); its gradients come back in the inputs' own dtypes.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.nn import MultiheadAttention

from cases import make_case, matrix_backends
from reference import oracle
from tolerance import assert_close_to_scale, half_grad_rel, half_rel, half_rounded_weights_rel

CPU_BACKENDS = matrix_backends("cpu")
SCORES = ("dot", "scaled_dot", "bilinear", "additive", "gaussian")
LOW = (torch.bfloat16, torch.float16)


def _leaves(case: object, dtype: torch.dtype) -> list[torch.Tensor]:
    """q, k, v of ``case`` as fresh leaves of ``dtype`` that require gradients."""
    return [t.detach().to(dtype).requires_grad_(True) for t in (case.q, case.k, case.v)]  # type: ignore[attr-defined]


def _parameters_in(score: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``score`` with its parameters in ``dtype`` and its buffers (a fixed
    Gaussian bandwidth) as they are: autocast casts the weights its matmuls use."""
    copied = copy.deepcopy(score)
    for p in copied.parameters():
        p.data = p.data.to(dtype)
    return copied


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("score_name", SCORES)
@pytest.mark.parametrize("mask_name", ["key_padding", "causal", "bias"])
def test_a_call_under_autocast_is_the_call_in_autocast_s_dtype(
    backend: str, score_name: str, mask_name: str, low: torch.dtype
) -> None:
    case = make_case(score_name, mask_name, (2, 4, 2, 6, 9, 8, 5), seed=3)
    if not attnkit.explain(case.q.to(low), case.k.to(low), case.v.to(low),
                           score=_parameters_in(case.score, low), mask=case.mask,
                           backend=backend, return_weights=True).reasons[backend] == []:  # fmt: skip
        pytest.skip(f"{backend} does not run this call in {low}")
    # under autocast: float32 inputs and score, the backward after the block
    q, k, v = _leaves(case, torch.float32)
    score = case.score
    with torch.autocast("cpu", dtype=low):
        out, w, lse = attnkit.attention(
            q, k, v, score=score, mask=case.mask, backend=backend,
            return_weights=True, return_lse=True,
        )  # fmt: skip
    grad = torch.randn_like(out, dtype=torch.float32)
    out.backward(grad)
    # the same call with everything given in autocast's dtype, no autocast
    q_low, k_low, v_low = _leaves(case, low)
    score_low = _parameters_in(case.score, low)
    out_low, w_low, lse_low = attnkit.attention(
        q_low, k_low, v_low, score=score_low, mask=case.mask, backend=backend,
        return_weights=True, return_lse=True,
    )  # fmt: skip
    out_low.backward(grad.to(low))
    assert out.dtype == low and q.grad is not None and q.grad.dtype == torch.float32
    for got, want in ((out, out_low), (w, w_low), (lse, lse_low)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    for t, t_low in zip((q, k, v), (q_low, k_low, v_low), strict=True):
        assert t.grad is not None and t_low.grad is not None
        assert torch.equal(t.grad, t_low.grad.float())
    for (name, p), p_low in zip(score.named_parameters(), score_low.parameters(), strict=True):
        assert p.grad is not None and p_low.grad is not None, name
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, p_low.grad.float()), name
    # and against the float64 oracle on the rounded inputs
    ref, _, _ = oracle(*(t.detach().double().numpy() for t in (q_low, k_low, v_low)),
                       score=case.score_spec, mask=case.mask_spec)  # fmt: skip
    assert_close_to_scale(out.double(), torch.from_numpy(ref), rel=half_rounded_weights_rel(low))


def test_mixed_dtypes_under_autocast_run_as_sdpa_runs_them() -> None:
    # q from an autocast Linear (bfloat16), k and v float32 (a rotary embedding, as in
    # transformers' Llama): torch casts all three, where attention() once refused them
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g).to(torch.bfloat16).requires_grad_(True)
    k, v = (torch.randn(2, 4, 9, 8, generator=g).requires_grad_(True) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        got = attnkit.attention(q, k, v, is_causal=True)
        explained = attnkit.explain(q, k, v, is_causal=True)
    assert got.dtype == want.dtype == torch.bfloat16 and explained.chosen is not None
    assert_close_to_scale(got.double(), want.double(), rel=half_rel(torch.bfloat16))
    got.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16
    assert k.grad is not None and k.grad.dtype == torch.float32


def test_the_score_module_is_left_as_it_was() -> None:
    case = make_case("bilinear", "none", (1, 2, 2, 3, 4, 5, 3), seed=1)
    before = {n: p.detach().clone() for n, p in case.score.named_parameters()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attnkit.attention(case.q, case.k, case.v, score=case.score)
    for n, p in case.score.named_parameters():
        assert type(p) is torch.nn.Parameter and p.dtype == torch.float32
        assert torch.equal(p, before[n])


def test_float64_inputs_are_left_in_float64() -> None:
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attnkit.attention(q, q, q).dtype == torch.float64


@pytest.mark.torch_feature("compile")
def test_compiled_under_autocast_equals_eager() -> None:
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return attnkit.attention(q, k, v, mask=masks.causal())

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), f(q, k, v)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)


@pytest.mark.parametrize("need_weights", [False, True])
def test_the_drop_in_under_autocast_matches_torch_s_layer(need_weights: bool) -> None:
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    ours = MultiheadAttention(16, 4, batch_first=True)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 7, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_w = theirs(x, x, x, key_padding_mask=pad, need_weights=need_weights)
        got, got_w = ours(x, x, x, key_padding_mask=pad, need_weights=need_weights)
    assert got.dtype == want.dtype
    assert_close_to_scale(got.double(), want.double(), rel=half_grad_rel(torch.bfloat16))
    if need_weights:
        assert got_w is not None and want_w is not None and got_w.dtype == want_w.dtype
        assert_close_to_scale(got_w.double(), want_w.double(), rel=half_grad_rel(torch.bfloat16))


def test_a_llama_under_autocast_runs_on_attnkit_as_on_sdpa() -> None:
    # its rotary embedding gives float32 q and k beside a bfloat16 v: refused once
    transformers = pytest.importorskip("transformers")
    import attnkit.integrations.transformers as hf_attnkit

    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, vocab_size=100,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    ours = copy.deepcopy(theirs)
    ours.set_attn_implementation(hf_attnkit.IMPLEMENTATION)
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = theirs(input_ids=ids).logits
        got = ours(input_ids=ids).logits
    assert got.dtype == want.dtype == torch.bfloat16
    assert_close_to_scale(got.double(), want.double(), rel=half_grad_rel(torch.bfloat16))
    got.float().sum().backward()
    assert all(p.grad is not None for p in ours.parameters() if p.requires_grad)


def _call(layer_name: str, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = {"MultiheadAttention": lambda: layer(x, x, x), "SelfAttention": lambda: layer(x),
           "Einsum": lambda: layer(x, x)}[layer_name]()  # fmt: skip
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("layer_name", ["MultiheadAttention", "SelfAttention", "Einsum"])
def test_layers_take_an_activation_autocast_made(layer_name: str) -> None:
    # a Linear under autocast gives bfloat16 beside the layer's float32 parameters:
    # torch's layer takes it, attnkit's once refused it
    from attnkit.nn import EinsumMultiHeadAttention, SelfAttention

    torch.manual_seed(0)
    before = torch.nn.Linear(16, 16)
    layers = {
        "MultiheadAttention": lambda: MultiheadAttention(16, 4, batch_first=True),
        "SelfAttention": lambda: SelfAttention(16, 4),
        "Einsum": lambda: EinsumMultiHeadAttention(4, 4, query_features=16),
    }
    layer = layers[layer_name]()
    x = torch.randn(2, 7, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = before(x)
        assert h.dtype == torch.bfloat16
        out = _call(layer_name, layer, h)
    # the same layer on the float32 activation, under the same autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h32 = h.float()
        want = _call(layer_name, layer, h32)
    assert torch.equal(out.float(), want.float())
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in layer.parameters())


def test_attention_backward_takes_what_attention_returned_under_autocast() -> None:
    case = make_case("scaled_dot", "causal", (2, 4, 2, 6, 9, 8, 5), seed=4)
    q, k, v = _leaves(case, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, lse = attnkit.attention(q, k, v, mask=case.mask, return_lse=True)
        grad = torch.randn_like(out)
        dq, dk, dv, _ = attnkit.attention_backward(q, k, v, out, lse, grad, mask=case.mask)
    out.backward(grad)
    for t, d in zip((q, k, v), (dq, dk, dv), strict=True):
        assert t.grad is not None and d.dtype == t.dtype
        assert_close_to_scale(d, t.grad, rel=half_grad_rel(torch.bfloat16))


def test_a_backward_inside_the_autocast_block_is_the_backward_after_it() -> None:
    # chunked's backward once ran its float32 sums in bfloat16 there (ten times the error);
    # a kernel's backward runs with autocast off, as its forward ran
    backend = "chunked"
    case = make_case("scaled_dot", "key_padding", (2, 4, 2, 6, 9, 8, 5), seed=5)
    grads = []
    for inside in (True, False):
        q, k, v = _leaves(case, torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attnkit.attention(q, k, v, mask=case.mask, backend=backend)
            if inside:
                out.float().sum().backward()
        if not inside:
            out.float().sum().backward()
        grads.append([t.grad for t in (q, k, v)])
    for inside_grad, after_grad in zip(*grads, strict=True):
        assert torch.equal(inside_grad, after_grad)


def test_a_kv_cache_decodes_under_autocast_as_one_pass() -> None:
    from attnkit.nn import SelfAttention

    torch.manual_seed(0)
    layer = SelfAttention(32, num_heads=4, causal=True, num_kv_heads=2).eval()
    x = torch.randn(1, 10, 32)
    cache = layer.new_cache(batch_size=1, max_len=16)  # float32, the layer's dtype
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = layer(x)
        steps = [layer(x[:, :6], cache=cache)]
        steps += [layer(x[:, i : i + 1], cache=cache) for i in range(6, 10)]
    # (one step and the full pass run kernels of other shapes: bfloat16 rounding apart)
    got = torch.cat(steps, dim=1)
    assert got.dtype == full.dtype == torch.bfloat16
    assert_close_to_scale(got.double(), full.double(), rel=half_grad_rel(torch.bfloat16))
