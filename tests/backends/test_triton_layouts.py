"""The triton backend (under Triton's interpreter) on the calls of the head-layout and
far-key regressions that it takes: 3-D grouped-query inputs with the Gaussian score, a
per-batch mask and a NaN query; infinitely far Gaussian keys (weight 0 whatever their
values hold, no gradient with a non-finite query elsewhere). Calls with score modifiers
or a tensor scale it declines, saying why."""

from __future__ import annotations

from interpreted_triton import interpreted_triton  # first: sets TRITON_INTERPRET=1

# isort: split

from collections.abc import Iterator

import numpy as np
import pytest
import torch

import attnkit
from attnkit import BackendNotSupportedError, masks, mods

from far_key_cases import (
    MASKS,
    check_far_keys_get_no_gradient,
    check_far_keys_get_weight_zero,
    far_key_call,
    runs,
)
from reference import oracle
from tolerance import assert_close_to_scale


@pytest.fixture(scope="module", autouse=True)
def triton_registered() -> Iterator[None]:
    """The backend under the interpreter for this module only (tests/interpreted_triton.py)."""
    with interpreted_triton():
        yield


@pytest.mark.parametrize(
    "mask_name",
    [m if n == 0 else pytest.param(m, marks=pytest.mark.slow) for n, m in enumerate(MASKS)],
)
def test_far_keys_get_weight_zero_and_no_gradient(mask_name: str) -> None:
    call = far_key_call(mask_name, float("nan"), dtype=torch.float32)
    assert runs(call, "triton")
    check_far_keys_get_weight_zero(call, "triton")
    poisoned = far_key_call(mask_name, float("inf"), float("inf"), dtype=torch.float32)
    check_far_keys_get_no_gradient(poisoned, "triton")


def test_three_d_grouped_query_gaussian_with_a_nan_query() -> None:
    g = torch.Generator().manual_seed(4)
    q = torch.randn(4, 5, 8, generator=g)
    k, v = (torch.randn(2, 5, 8, generator=g) for _ in range(2))
    q[1, 2, 3] = float("nan")
    lens = torch.tensor([3, 4, 5, 2])
    want = oracle(q.nan_to_num(0.0).double().numpy(), k.double().numpy(), v.double().numpy(),
                  score=("gaussian", 1.0), mask=("valid_lens", lens.numpy(), False))[0]  # fmt: skip
    want[1, 2] = np.nan  # the row that uses the NaN
    got = attnkit.attention(q, k, v, score="gaussian", mask=masks.valid_lens(lens),
                            backend="triton")  # fmt: skip
    assert_close_to_scale(got, torch.from_numpy(want), what="output")


def test_modifiers_and_tensor_scales_are_declined_with_a_reason() -> None:
    q = torch.randn(3, 4, 4)
    for kw in ({"mods": mods.alibi(1)}, {"scale": torch.ones(3)}):
        ex = attnkit.explain(q, q, q, backend="triton", **kw)
        assert ex.reasons["triton"], kw
        with pytest.raises(BackendNotSupportedError, match="triton"):
            attnkit.attention(q, q, q, backend="triton", **kw)
