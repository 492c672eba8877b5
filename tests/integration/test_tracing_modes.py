"""attention() and the layers under torch's other ways of running a model: shape
propagation with fake tensors, ``torch.export`` with dynamic sizes, ``torch.jit.trace``
(refused), and copies of a layer that kept its last call's weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attnkit
from attnkit import FeatureUnavailableError, masks, scores
from attnkit._torch_features import available
from attnkit.nn import AdditiveAttention, DotProductAttention, MultiheadAttention, NadarayaWatson

from tolerance import assert_close_to_scale


def test_fake_tensors_propagate_shapes_with_the_default_policy() -> None:
    """A fake tensor has no values: the non-finite check and the masks' host reads
    skip it (they called ``.item()`` on it, which FakeTensorMode refuses)."""
    with FakeTensorMode():
        q, kv = torch.randn(2, 2, 70, 4), torch.randn(2, 2, 90, 4)
        calls = {
            "plain": {},
            "valid_lens": {"mask": masks.valid_lens(torch.tensor([5, 90]))},
            "key_padding": {"mask": masks.key_padding(torch.zeros(2, 90, dtype=torch.bool))},
            "bottom_right": {"mask": masks.causal("bottom_right"), "score": scores.Gaussian(2.0)},
            "reference": {"backend": "reference", "mask": masks.window(3)},
        }
        for name, kw in calls.items():
            assert attnkit.attention(q, kv, kv, **kw).shape == (2, 2, 70, 4), name
        x = torch.randn(5, 2, 8)
        out, weights = MultiheadAttention(8, 2)(x, x, x)
        assert out.shape == (5, 2, 8) and weights is not None and weights.shape == (2, 5, 5)


@pytest.mark.torch_feature("compile")
def test_export_with_dynamic_sizes_of_a_bottom_right_causal_mask() -> None:
    """Its offset S - L is a symbolic size under torch.export (non-strict), which the
    mask read as a tensor (an AttributeError). It stays symbolic, and the exported
    program gives the eager numbers at sizes other than the traced ones."""

    class BottomRight(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return attnkit.attention(q, k, v, mask=masks.causal("bottom_right"))

    g = torch.Generator().manual_seed(0)
    q, kv = torch.randn(2, 2, 5, 4, generator=g), torch.randn(2, 2, 7, 4, generator=g)
    L, S = torch.export.Dim("L", min=2, max=64), torch.export.Dim("S", min=2, max=64)
    exported = torch.export.export(
        BottomRight(), (q, kv, kv), dynamic_shapes=({2: L}, {2: S}, {2: S}), strict=False
    )
    for n, m in [(5, 7), (9, 4), (6, 6)]:
        q, kv = torch.randn(2, 2, n, 4, generator=g), torch.randn(2, 2, m, 4, generator=g)
        assert_close_to_scale(exported.module()(q, kv, kv), BottomRight()(q, kv, kv))


@pytest.mark.skipif(available("compile"), reason="torch.export runs at or above its floor")
def test_export_below_its_floor_is_refused_naming_export() -> None:
    # it named torch.compile only, which the exporting user never called
    class Plain(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return attnkit.attention(q, q, q)

    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(FeatureUnavailableError, match=r"torch\.export of .* needs torch >= "):
        torch.export.export(Plain(), (q,), strict=False)
    with pytest.raises(Exception, match=r"torch\.export of .* needs torch >= "):
        torch.export.export(Plain(), (q,), strict=True)  # inside dynamo's own error


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_jit_trace_is_refused_with_one_line() -> None:
    """A trace keeps the lengths read from ``valid_lens`` as constants: traced at
    [2, 6] and called at [6, 1], d2l's layer was 3.2 off; the additive score failed
    with ``unordered_map::at``."""
    g = torch.Generator().manual_seed(1)
    q, kv = torch.randn(2, 3, 4, generator=g), torch.randn(2, 6, 4, generator=g)
    lens = torch.tensor([2, 6])
    # the way out it names: compile or export, or (below their floor) running eagerly
    out = r"use torch\.compile or torch\.export" if available("compile") else r"run it eagerly"
    why = rf"^attention: torch\.jit\.trace is not supported: .* {out}"
    for layer in (DotProductAttention().eval(), AdditiveAttention(4, 4, 5).eval()):
        with pytest.raises(RuntimeError, match=why):
            torch.jit.trace(layer, (q, kv, kv, lens))
    with pytest.raises(RuntimeError, match=why):
        torch.jit.trace(lambda a, b: attnkit.attention(a, b, b), (q, kv))


def test_a_layer_copies_after_a_call_that_built_a_graph() -> None:
    """``.attention_weights`` keeps the last call's weights, part of its autograd graph,
    which ``copy.deepcopy`` refuses: the copy takes their values."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 4, generator=g, requires_grad=True)
    kv = torch.randn(2, 6, 4, generator=g)
    lens = torch.tensor([2, 6])
    layers = {
        "dot": (DotProductAttention(), (q, kv, kv, lens)),
        "additive": (AdditiveAttention(4, 4, 5), (q, kv, kv, lens)),
        "nadaraya_watson": (NadarayaWatson(learnable=True), (q[0, :, 0], kv[0, :, 0], kv[0, :, 1])),
    }
    for name, (layer, args) in layers.items():
        out = layer(*args)
        kept = layer.attention_weights
        assert kept is not None and kept.grad_fn is not None, name
        twin = copy.deepcopy(layer)
        assert twin.attention_weights is not None and twin.attention_weights.grad_fn is None
        torch.testing.assert_close(twin.attention_weights, kept.detach(), rtol=0, atol=0)
        assert layer.attention_weights is kept  # the original keeps its graph
        assert_close_to_scale(twin(*args), out)
