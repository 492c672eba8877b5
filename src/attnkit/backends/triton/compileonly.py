"""Compiling the kernels for a GPU that is not there, and reading what ptxas reports.

:func:`compile_only` makes every kernel launch of the backend (see
:func:`.launch.launch`) a compile-only warmup for one target: Triton's compiler gets
``GPUTarget("cuda", arch, 32)`` through a stand-in active driver, the tile table is
read for that architecture, and nothing runs. Each compiled kernel is then given to
the newest ``ptxas`` shipped in the triton wheel (``ptxas -v``: registers, spill
stores and loads); the plain ``ptxas`` can be older than the PTX Triton writes for
the newest targets. ptxas reports are cached next to Triton's own cache, keyed by
the PTX, the target and the ptxas version, so a rerun costs little.

Needs Triton 3.x with its NVIDIA backend and ``ptxas``; no GPU, no CUDA driver.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .launch import LAUNCH_HOOK
from .runtime import TARGET_ARCH

__all__ = ["CompiledKernel", "compile_only", "newest_ptxas", "ptxas_report"]

_PTXAS_FLAGS = ("-v", "--regAllocOptLevel=2")  # Triton builds its cubins with these


@dataclass
class CompiledKernel:
    """One kernel specialization compiled for one target."""

    name: str
    shared: int
    registers: int = -1
    spill_stores: int = 0
    spill_loads: int = 0
    ptxas: str = ""
    """The ptxas version that reported (before :func:`ptxas_report`: the PTX itself)."""
    mma: int = 0
    """Tensor-core instructions (``mma``/``wgmma``) in the PTX: 0 means every product
    runs on CUDA cores (FMA)."""

    @property
    def spills(self) -> int:
        """Bytes of spill stores plus spill loads."""
        return self.spill_stores + self.spill_loads


class _StandInDriver:
    """An active driver for Triton's JIT that names a target and never launches."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.arch = arch
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> str:
        return f"compile-only-sm_{self.arch}"  # a key of the JIT's per-device caches

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def is_active(self) -> bool:
        return True


@dataclass
class _Sink:
    arch: int
    kernels: dict[str, CompiledKernel] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def __call__(self, kernel: Any, grid: tuple[int, ...], args: dict[str, Any]) -> None:
        compiled = kernel.warmup(grid=grid, **args)
        key = str(compiled.hash) if hasattr(compiled, "hash") else str(id(compiled))
        self.order.append(key)
        if key not in self.kernels:
            self.kernels[key] = CompiledKernel(
                name=kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel),
                shared=int(compiled.metadata.shared),
                ptxas=compiled.asm["ptx"],  # replaced by ptxas_report's version
            )


@contextlib.contextmanager
def compile_only(arch: int) -> Iterator[_Sink]:
    """Within the block, kernel launches compile for sm_``arch`` and are recorded."""
    from triton.runtime.driver import driver

    sink = _Sink(arch)
    saved = dict(driver.__dict__)
    driver.set_active(_StandInDriver(arch))
    arch_token = TARGET_ARCH.set(arch)
    hook_token = LAUNCH_HOOK.set(sink)
    try:
        yield sink
    finally:
        LAUNCH_HOOK.reset(hook_token)
        TARGET_ARCH.reset(arch_token)
        driver.__dict__.clear()
        driver.__dict__.update(saved)


def _version(ptxas: Path) -> tuple[int, ...]:
    try:
        out = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout
    except OSError:
        return ()
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def newest_ptxas() -> tuple[Path, str] | None:
    """(path, version) of the newest ``ptxas*`` in the triton wheel, or None."""
    import triton

    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    found = [(v, p) for p in bin_dir.glob("ptxas*") if (v := _version(p))]
    if not found:
        return None
    version, path = max(found)
    return path, ".".join(map(str, version))


def _sm(arch: int) -> str:
    return f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"  # Triton's naming


def _cache_dir() -> Path:
    root = os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    return Path(root) / "attnkit-ptxas"


def ptxas_report(kernel: CompiledKernel, arch: int, ptxas: tuple[Path, str]) -> None:
    """Fill registers and spills of ``kernel`` (whose ``ptxas`` field holds its PTX) from
    ``ptxas -v`` for sm_``arch``, cached."""
    path, version = ptxas
    ptx = kernel.ptxas
    key = hashlib.sha256(f"{version}|{_sm(arch)}|{_PTXAS_FLAGS}|".encode() + ptx.encode())
    cached = _cache_dir() / f"{key.hexdigest()}.json"
    report: dict[str, Any] | None = None
    if cached.is_file():
        with contextlib.suppress(ValueError, OSError):
            report = json.loads(cached.read_text())
    if report is None:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "kernel.ptx"
            src.write_text(ptx)
            cmd = [str(path), *_PTXAS_FLAGS, f"--gpu-name={_sm(arch)}", str(src), "-o"]
            proc = subprocess.run(
                [*cmd, str(Path(tmp) / "k.cubin")], capture_output=True, text=True
            )
        log = proc.stderr + proc.stdout
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas {version} failed for {_sm(arch)}: {log[-2000:]}")
        report = {"log": log}
        with contextlib.suppress(OSError):
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(report))
    log = str(report["log"])
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    kernel.registers = int(regs.group(1)) if regs else -1
    kernel.spill_stores = int(spills.group(1)) if spills else 0
    kernel.spill_loads = int(spills.group(2)) if spills else 0
    kernel.mma = len(re.findall(r"\b(?:wgmma|mma)\.", ptx))
    kernel.ptxas = version
