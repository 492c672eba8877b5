"""Memory of the chunked backend grows with L + S, not with L·S.

Peak memory is read in a fresh child process per size (both sizes at once, one
torch thread each): the resident-memory high-water mark after the forward+backward
minus the resident size before it (inputs already built, torch's thread pools warmed
up on a tiny call), so it counts every allocation the call makes, torch's included.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_CHILD = r"""
import json, sys, torch, attnkit
from attnkit.bench.runner import peak_since, reset_peak
backend, n = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
def step(L, H=2, E=64):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, L, E, generator=g, requires_grad=True) for _ in range(3))
    return lambda: attnkit.attention(q, k, v, backend=backend).sum().backward()
step(64)()  # warm up thread pools and first-call caches
run = step(n)
from attnkit.backends.chunked import block_sizes
with block_sizes(128, 256):  # fixed tiles: only the O(L + S) part may grow
    start = reset_peak()
    run()
print(json.dumps({"extra_mib": peak_since(start)}))
"""


def _peak_extra_mib(backend: str, sizes: tuple[int, ...]) -> list[float]:
    """The peak extra MiB of one forward+backward at each size, each in its own process."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, backend, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in sizes
    ]
    peaks = []
    for n, proc in zip(sizes, procs, strict=True):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"the child at {n} failed:\n{err}"
        peaks.append(float(json.loads(out.strip().splitlines()[-1])["extra_mib"]))
    return peaks


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
@pytest.mark.slow
def test_chunked_forward_backward_memory_grows_linearly() -> None:
    small, large = 1024, 4096  # L = S; 4x the length is 16x the L·S matrix
    m_small, m_large = _peak_extra_mib("chunked", (small, large))
    one_matrix_mib = 2 * large * large * 4 / 2**20  # one float32 (H, L, S) matrix: 128 MiB
    # Far below a single L×S matrix, where materialized attention keeps several.
    assert m_large < one_matrix_mib / 4, (m_small, m_large)
    # Linear growth (x4) plus a fixed allowance for the tiles and allocator slack, not x16.
    assert m_large <= 4 * m_small + 16, (m_small, m_large)
