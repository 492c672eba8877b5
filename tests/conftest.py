"""Shared test setup: the oracle on the path, and the device x backend matrix.

- ``tests/`` goes on ``sys.path`` so every folder can ``import reference`` (the
  float64 NumPy oracle) and ``import cases``.
- Without a CUDA device, Triton kernels run on CPU tensors through Triton's
  interpreter: ``TRITON_INTERPRET=1`` is set here, before anything imports triton.
  With one, triton is imported here first, so its kernels run compiled and the
  interpreter-only modules skip themselves (``scripts/gpu_check.sh`` runs the CUDA
  part of the suite and the GPU benchmarks).
- A test that takes ``device`` and ``backend`` runs once per (device, backend) pair:
  every registered backend that runs on each available device ("cpu", plus "cuda"
  when torch sees a GPU; see ``cases.matrix_backends``). A test that takes only
  ``backend`` runs on the CPU backends; one that takes only ``device`` runs on every
  device. So a new backend or a new device is tested by registering it: on a machine
  with CUDA the conformance suite runs there as well.
- ``ATTNKIT_TEST_BUDGET_S``: when set, a run whose tests take longer than that many
  seconds of wall time fails (a hard check that the suite stays fast; unset, nothing
  is timed). Under pytest-xdist the controlling process times the whole run, from
  its start to the last worker's report; the workers time nothing.
- ``@pytest.mark.torch_feature("compile")`` (or ``"triton"``, any key of
  ``attnkit._torch_features.FEATURES``): the test needs a feature with a torch floor of
  its own, and is skipped below it with the feature's one-line reason. The floors live
  in that record only; no test names a torch version.
- ``ATEN_CPU_CAPABILITY``: when set (``default``, ``avx2``, ``avx512``), inductor's
  on-disk cache goes to a folder of that capability, unless ``TORCHINDUCTOR_CACHE_DIR``
  names one. torch's FX graph cache keys leave the capability out: C++ generated for
  AVX-512 in a run without the variable is found again under ``default``, where it
  is compiled without the vector headers and fails (``'at::vec' has not been
  declared``), a failure of torch's cache that says nothing about attnkit.
- Under pytest-xdist each worker gets its share of the cores for torch's intra-op
  threads (cores // workers, at least one), and ``OMP_NUM_THREADS`` says the same to
  the processes a test starts; unless ``OMP_NUM_THREADS`` is set already. Without
  this, every worker starts one thread per core and they oversubscribe the machine:
  on two cores the default run took half as long again.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

if torch.cuda.is_available():
    # On a GPU the kernels run compiled: triton is imported before any test module that
    # asks for the interpreter (tests/interpreted_triton.py), which then skips itself
    # instead of turning every kernel of the process into interpreted ones.
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401
elif "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

_XDIST_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
if _XDIST_WORKERS.isdigit() and "OMP_NUM_THREADS" not in os.environ:
    _affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    _cores = len(_affinity(0)) if _affinity else (os.cpu_count() or 1)
    _threads = max(1, _cores // max(1, int(_XDIST_WORKERS)))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    torch.set_num_threads(_threads)

_CAPABILITY = os.environ.get("ATEN_CPU_CAPABILITY", "").strip()
if _CAPABILITY and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_cpu_{_CAPABILITY}"
    )

from attnkit import _torch_features as torch_features  # noqa: E402

from cases import DEVICES, matrix_backends  # noqa: E402 - after the environment above
from pairwise import mark_all_but_pairs_slow  # noqa: E402


def device_backends() -> list[tuple[str, str]]:
    """(device, backend) pairs: every backend registered for every available device."""
    return [(device, name) for device in DEVICES for name in matrix_backends(device)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``backend`` (with ``device``) over the matrix, ``device`` alone over
    the devices, unless the test names them itself."""
    names = metafunc.fixturenames
    if "backend" not in names and "device" not in names:
        return
    if any(
        m.name == "parametrize" and ("backend" in m.args[0] or "device" in m.args[0])
        for m in metafunc.definition.iter_markers()
    ):
        return  # the test names its backends or devices itself
    pairs = device_backends()
    if "backend" not in names:
        metafunc.parametrize("device", DEVICES)
    elif "device" in names:
        metafunc.parametrize(("device", "backend"), pairs, ids=[f"{d}-{b}" for d, b in pairs])
    else:
        metafunc.parametrize("backend", [b for d, b in pairs if d == "cpu"])


@pytest.hookimpl(tryfirst=True)  # before ``-m 'not slow'`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``pairwise`` keeps an all-pairs set of its combinations in the
    default run; the rest are ``slow`` (see ``pairwise.py``). A test marked
    ``torch_feature(key)`` is skipped when the installed torch is below that feature's
    floor (``attnkit._torch_features``)."""
    mark_all_but_pairs_slow(items)
    for item in items:
        for marker in item.iter_markers("torch_feature"):
            why = torch_features.missing(*marker.args)
            if why is not None:
                item.add_marker(pytest.mark.skip(reason=why))
                break


_BUDGET_ENV = "ATTNKIT_TEST_BUDGET_S"
_budget: dict[str, float] = {}


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    raw = os.environ.get(_BUDGET_ENV)
    if not raw or _is_xdist_worker(session.config):
        return
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:  # also refuses nan
        raise pytest.UsageError(
            f"{_BUDGET_ENV}: expected a positive number of seconds, got {raw!r}"
        )
    _budget.update(seconds=seconds, start=time.perf_counter())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _budget:
        return
    _budget["elapsed"] = time.perf_counter() - _budget["start"]
    if _budget["elapsed"] > _budget["seconds"] and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if "elapsed" not in _budget:
        return
    elapsed, seconds = _budget["elapsed"], _budget["seconds"]
    line = f"test time {elapsed:.1f} s, budget {seconds:g} s ({_BUDGET_ENV})"
    over = elapsed > seconds
    terminalreporter.write_line(f"FAILED: {line}: over budget" if over else line, red=over)


@pytest.fixture
def device() -> str:
    """The CPU, for a test that names its own backends but takes a device too."""
    return "cpu"
