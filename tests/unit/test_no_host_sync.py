"""No host-device synchronization on the call path, for any mask kind.

On the CPU, reading a tensor costs nothing, so the CPU paths may read lengths. Under
``_host.device_semantics()`` every tensor counts as an accelerator's, and the call
must then take its sync-free path: this test runs every mask kind that way under a
dispatch mode that fails on ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``,
``int(t)``) and on data-dependent shapes (``nonzero``), with ``Tensor.tolist`` refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
from attnkit import _host, masks

from tolerance import assert_close_to_scale

_SYNCING = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten._unique2.default,
}


class _NoSync(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _SYNCING:
            raise AssertionError(f"host sync on the call path: {func}")
        return func(*args, **(kwargs or {}))


@contextmanager
def _no_sync(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(self: torch.Tensor, *a: object) -> object:
        raise AssertionError("host sync on the call path: Tensor.tolist")

    monkeypatch.setattr(torch.Tensor, "tolist", refuse)
    with _host.device_semantics(), _NoSync():
        yield
    monkeypatch.undo()


B, H, L, S, E = 2, 2, 9, 12, 8


def _cases() -> dict[str, masks.Mask | None]:
    g = torch.Generator().manual_seed(0)
    pad = torch.rand(B, S, generator=g) < 0.3
    return {
        "none": None,
        "causal": masks.causal(),
        "causal_br": masks.causal("bottom_right"),
        "window": masks.window(3, 1),
        "valid_lens": masks.valid_lens(torch.tensor([4, 12])),
        "valid_lens_queries": masks.valid_lens(torch.tensor([4, 9]), queries=True),
        "valid_lens_rows": masks.valid_lens(torch.randint(0, S + 1, (B, L), generator=g)),
        "key_padding": masks.key_padding(pad),
        "keep": masks.keep(torch.rand(B, 1, L, S, generator=g) < 0.8),
        "bias": masks.bias(torch.randn(L, S, generator=g)),
        "tf": masks.tf((torch.rand(L, S, generator=g) < 0.2).float()),
        "causal_and_padding": masks.causal() & masks.key_padding(pad),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
@pytest.mark.parametrize("want", ["output", "weights", "grad"])
def test_every_mask_kind_runs_without_a_host_sync(
    name: str, want: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mask = _cases()[name]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, n, E, generator=g) for n in (L, S, S))
    ref = attnkit.attention(q, k, v, mask=mask, return_weights=True, backend="reference")
    if want == "grad":
        q.requires_grad_(True)
    with _no_sync(monkeypatch):
        got = attnkit.attention(q, k, v, mask=mask, return_weights=want == "weights")
        if want == "grad":
            got.sum().backward()
    out = got[0] if want == "weights" else got
    assert_close_to_scale(out.detach(), ref[0])
    if want == "weights":
        assert_close_to_scale(got[1], ref[1])
    if want == "grad":
        assert q.grad is not None and torch.isfinite(q.grad).all()
