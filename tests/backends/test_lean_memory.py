"""The default pick builds no (L, S) matrix unless the call asks for one.

Every tensor an operation returns is watched (its storage, so a broadcast view of a
small tensor counts as small) through a forward and a backward on the CPU. A lean call
holds nothing near L × S; a mask the user gave as (B, 1, 1, S) stays that size.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import attnkit
from attnkit import masks, scores

B, H, L, S, E = 2, 1, 512, 512, 4
LEAN = L * S // 8  # far above a lean call's largest tensor (B·H·L·E = 4096 elements)


class _Largest(TorchDispatchMode):
    """The most elements any operation's result holds in its storage, and that operation."""

    def __init__(self) -> None:
        super().__init__()
        self.elements, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                n = t.untyped_storage().nbytes() // t.element_size()
                if n > self.elements:
                    self.elements, self.op = n, str(func)
        return out


def _largest(mask: masks.Mask | None, grad: bool, **kwargs: Any) -> tuple[str | None, int, str]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, E, generator=g, requires_grad=grad) for _ in range(3))
    chosen = attnkit.explain(q, k, v, mask=mask, **kwargs).chosen
    with _Largest() as seen:
        out = attnkit.attention(q, k, v, mask=mask, **kwargs)
        if grad:
            out.sum().backward()
    return chosen, seen.elements, seen.op


_g = torch.Generator().manual_seed(1)
CASES = {
    # one group of the unpadded route: its key padding went to the kernel as (B, H, L, S)
    "valid_lens": (masks.valid_lens(torch.tensor([L, 400])), {}),
    "key_padding": (masks.key_padding(torch.rand(B, S, generator=_g) < 0.2), {}),
    "key_bias": (masks.bias(torch.randn(B, 1, 1, S, generator=_g)), {}),
    "key_bias_and_padding": (
        masks.bias(torch.randn(B, 1, 1, S, generator=_g))
        & masks.key_padding(torch.rand(B, S, generator=_g) < 0.2),
        {},
    ),
    "causal": (masks.causal(), {}),
    # the Gaussian's key term: a (.., 1, S) mask that needs a gradient sent torch's kernel
    # to its math path
    "gaussian": (None, {"score": scores.Gaussian(4.0)}),
    "gaussian_learnable": (None, {"score": scores.Gaussian(4.0, learnable=True)}),
    "gaussian_valid_lens": (
        masks.valid_lens(torch.tensor([L, 400])),
        {"score": scores.Gaussian(4.0)},
    ),
}


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_builds_no_query_by_key_tensor(case: str, grad: bool) -> None:
    mask, kwargs = CASES[case]
    chosen, elements, op = _largest(mask, grad, **kwargs)
    assert chosen == "sdpa"
    assert elements < LEAN, f"{op} returned {elements} elements (L × S = {L * S})"


def test_per_query_lengths_go_to_a_backend_that_keeps_them_symbolic() -> None:
    """valid_lens of shape (B, L) became an (L, S) mask on sdpa, which explain() did not say."""
    lens = torch.arange(1, L + 1).repeat(B, 1)  # (B, L): query i sees keys 0..i
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, L, E, generator=g) for _ in range(3))
    ex = attnkit.explain(q, k, v, mask=masks.valid_lens(lens))
    assert ex.chosen == "chunked"
    assert any("per-query key ranges" in r for r in ex.reasons["sdpa"]), ex.reasons["sdpa"]


class _Float64Copies(TorchDispatchMode):
    """The largest float64 result of any operation, in elements."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.elements = max(self.elements, t.numel())
        return out


def test_the_gaussian_measure_copies_no_query_to_float64() -> None:
    # its 1/(2σ²) was taken "in the queries' dtype" from a float64 copy of every query
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, E, generator=g) for _ in range(3))
    with _Float64Copies() as seen:
        attnkit.attention(q, k, v, score=scores.Gaussian(4.0))
    assert seen.elements < q.numel() // 8
