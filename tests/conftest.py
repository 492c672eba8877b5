"""Shared test setup: the oracle on the path, and the device x backend matrix.

- ``tests/`` goes on ``sys.path`` so every folder can ``import reference`` (the
  float64 NumPy oracle) and ``import cases``.
- Without a CUDA device, Triton kernels run on CPU tensors through Triton's
  interpreter: ``TRITON_INTERPRET=1`` is set here, before anything imports triton.
- A test that takes a ``backend`` argument runs once per registered backend that
  runs on each available device; with a ``device`` argument too, it gets the
  device. So a new backend or a new device is tested by registering it: on a
  machine with CUDA the conformance suite runs there as well.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attnkit.backends import dispatch

DEVICES: tuple[str, ...] = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
"""Devices the suite runs on: the CPU always, CUDA when torch sees a GPU."""

# Backends the CPU matrix leaves to their own test files: triton on the CPU runs in
# Triton's interpreter, far too slow for the full matrix (tests/backends/test_triton.py
# covers it at small shapes).
_SLOW_ON = {("cpu", "triton")}


def device_backends() -> list[tuple[str, str]]:
    """(device, backend) pairs: every backend registered for every available device."""
    pairs = []
    for device in DEVICES:
        for name in dispatch.backends_for(device):
            if (device, name) in _SLOW_ON:
                continue
            backend = dispatch._REGISTRY[name]
            if backend.is_available() is None:
                pairs.append((device, name))
    return pairs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    if any(
        m.name == "parametrize" and "backend" in m.args[0]
        for m in metafunc.definition.iter_markers()
    ):
        return  # the test names its backends itself
    pairs = device_backends()
    if "device" in metafunc.fixturenames:
        metafunc.parametrize(("device", "backend"), pairs, ids=[f"{d}-{b}" for d, b in pairs])
    else:
        names = [b for d, b in pairs if d == "cpu"]
        metafunc.parametrize("backend", names)


@pytest.fixture
def device() -> str:
    """The CPU, for tests that take a device but no backend (parametrized otherwise)."""
    return "cpu"
