"""The suite's one rule for comparing floating-point results against a peer.

A float32 result computed two ways (attnkit and eager transformers, attnkit and
torch's layer, a kernel picked by one CPU and another) differs by rounding that
scales with the tensor's magnitude, not with each element's: a gradient element
of 2e-5 next to elements of 1.0 carries an error of about 1e-7 · 1.0, which an
element-wise ``rtol`` on the small element rejects. So results are compared
relative to the tensor's own scale (its largest finite magnitude):

    max |got - want| <= rel * max(|want|)         over the finite entries

with NaN and ±inf required at the same places. ``rel`` defaults to the float32
figure below; a test that computes in float64 on both sides passes a tighter one.
"""

from __future__ import annotations

import torch

__all__ = ["FLOAT32_REL", "assert_close_to_scale", "scaled_error"]

FLOAT32_REL = 1e-4
"""Relative to the tensor's scale: room for float32 rounding through a few layers
(about 1e-7 per operation, summed over reductions of a few thousand terms)."""


def scaled_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over the entries finite in ``want``, divided by max |want| there
    (1 when every finite entry of ``want`` is 0); computed in float64."""
    g = got.detach().to(torch.float64).cpu()
    w = want.detach().to(torch.float64).cpu()
    fin = torch.isfinite(w)
    if not bool(fin.any()):
        return 0.0
    scale = float(w[fin].abs().max())
    err = float((g[fin] - w[fin]).abs().max())
    return err / (scale if scale > 0 else 1.0)


def assert_close_to_scale(
    got: torch.Tensor,
    want: torch.Tensor,
    *,
    rel: float = FLOAT32_REL,
    what: str = "result",
) -> None:
    """Assert ``got`` equals ``want`` to ``rel`` of ``want``'s largest finite magnitude.

    Shapes must match, NaN and ±inf must sit at the same places, and the finite
    entries may differ by at most ``rel * max |want|``.

    Args:
        got, want: tensors of the same shape (any float dtype, any device).
        rel: allowed error relative to the scale of ``want``.
        what: names the quantity in the failure message.
    """
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    g = got.detach().to(torch.float64).cpu()
    w = want.detach().to(torch.float64).cpu()
    assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: NaN at different places"
    assert torch.equal(torch.isinf(g), torch.isinf(w)), f"{what}: inf at different places"
    assert torch.equal(g[torch.isinf(g)], w[torch.isinf(w)]), f"{what}: inf of different signs"
    err = scaled_error(g, w)
    assert err <= rel, f"{what}: error {err:.3g} of its scale > allowed {rel:.3g}"
