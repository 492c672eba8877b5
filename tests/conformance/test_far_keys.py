"""Infinitely far Gaussian keys on every CPU backend (see ``tests/far_key_cases.py``):
weight 0 whatever their values hold, and no gradient, a query elsewhere holding an inf
or a NaN. (Regressions: on sdpa under a mask, a far key whose value held a NaN or an
inf made every row that keeps it NaN; with an inf query elsewhere, the far key's
gradient was NaN on the reference backend, and on sdpa with the lse in the loss.)"""

from __future__ import annotations

import pytest

from attnkit import BackendNotSupportedError

from cases import CPU_BACKENDS
from far_key_cases import (
    MASKS,
    check_far_keys_get_no_gradient,
    check_far_keys_get_weight_zero,
    far_key_call,
    runs,
)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("value_poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("mask_name", MASKS)
def test_a_far_key_gets_weight_zero_whatever_its_value(mask_name: str, value_poison: float,
                                                       backend: str) -> None:  # fmt: skip
    call = far_key_call(mask_name, value_poison)
    if not runs(call, backend):
        pytest.skip(f"{backend} does not take this call")
    check_far_keys_get_weight_zero(call, backend)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("query_poison", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("mask_name", MASKS)
def test_a_far_key_gets_no_gradient(mask_name: str, query_poison: float, backend: str) -> None:
    call = far_key_call(mask_name, float("nan"), query_poison)
    if not runs(call, backend):
        with pytest.raises(BackendNotSupportedError):
            check_far_keys_get_no_gradient(call, backend)
        return
    check_far_keys_get_no_gradient(call, backend)
