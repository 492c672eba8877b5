"""attnkit's compiled torch ops: one C++ file, built on first use, loaded into torch.

The source is the package file ``native_ops.cpp``. It declares ops of the ``attnkit``
namespace whose kernels are C++ (today ``attnkit::sdpa_settled``, the checked SDPA call of
a compiled graph): the dispatcher reaches them without Python, which a graph node called
per step otherwise pays (about 4 µs a call on a 2-core AMD EPYC, with the Python read
of the output). Unlike the C loops of
:mod:`attnkit.kernels._native`, the file includes torch's headers and links to torch's
libraries, so it is built against the installed torch: a build takes about 5 seconds with
the system C++ compiler (``$CXX``, else ``c++``/``g++``/``clang++``).

When it is built: by :func:`loaded`, which the sdpa backend asks while ``torch.compile``
traces a call (once per process; never at import, never by an eager call), or explicitly
(:func:`build`).

Where, and what is loaded: the same per-user private folder and the same rules as
:mod:`attnkit.kernels._native` (created 0700, loaded only when the folder and the file
belong to the current user and are not writable by others, built through a temporary
file renamed into place, the compiler's wait bounded by ``ATTNKIT_BUILD_TIMEOUT``). The
file name holds a hash of the source, the flags, the compiler, the CPU and the torch
build, so a change of any of them builds anew. ``ATTNKIT_NO_COMPILE=1`` disables the
build. When there is no library, callers use their Python ops, which give the same
numbers.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import threading
from importlib import resources
from pathlib import Path

import torch

from . import _native

__all__ = ["build", "loaded", "status"]

_lock = threading.Lock()
_loaded: bool | None = None
_status: str | None = None

OPS = ("sdpa_settled",)
"""The ops the library declares (each ``torch.ops.attnkit.<name>``)."""


def source() -> str:
    """The C++ source shipped with the package."""
    return resources.files("attnkit.kernels").joinpath("native_ops.cpp").read_text(encoding="utf-8")


def _compiler() -> str | None:
    for cand in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _torch_dir() -> Path:
    return Path(torch.__file__).resolve().parent


def _flag_sets() -> list[list[str]]:
    """Compiler flags, tried in order: the CPU's own instructions first (the output
    check's loop is vectorized), then portable code; C++20, then C++17 (older torch
    headers, older compilers)."""
    root = _torch_dir()
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    base = [
        "-O3",
        "-shared",
        "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-I" + str(root / "include"),
        "-I" + str(root / "include" / "torch" / "csrc" / "api" / "include"),
    ]
    native = ["-march=native"] if platform.machine().lower() in ("x86_64", "amd64") else []
    sets = [[*base, *native, "-std=c++20"]] if native else []
    sets.append([*base, "-std=c++20"])
    sets.append([*base, "-std=c++17"])
    return sets


def _link_flags() -> list[str]:
    lib = str(_torch_dir() / "lib")
    return ["-L" + lib, "-lc10", "-ltorch_cpu", "-Wl,-rpath," + lib]


def _lib_path(folder: Path, cxx: str, flags: list[str], code: str) -> Path:
    """Where the library built from ``code`` with ``cxx`` and ``flags`` lives: the CPU and
    the torch build are part of the key (the library is built against its headers)."""
    key = "\n".join(
        (code, " ".join(flags), cxx, _native._cpu_identity(), torch.__version__, str(_torch_dir()))
    )
    return folder / f"attnkit_ops_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def _load(path: Path) -> tuple[bool, str]:
    unsafe = _native._safe_file(path)
    if unsafe is not None:
        return False, f"Python ops: refused to load the compiled ops ({unsafe})"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return False, f"Python ops: {path} could not be loaded ({exc})"
    missing = [name for name in OPS if not hasattr(torch.ops.attnkit, name)]
    if missing:
        return False, f"Python ops: {path} lacks {', '.join(missing)}"
    return True, "compiled C++ ops"


def _try_build() -> tuple[bool, str]:
    if os.environ.get("ATTNKIT_NO_COMPILE"):
        return False, "Python ops: compilation disabled by ATTNKIT_NO_COMPILE"
    if all(hasattr(torch.ops.attnkit, name) for name in OPS):
        return True, "compiled C++ ops (loaded before)"
    if not hasattr(os, "getuid"):  # the private cache checks need a POSIX system
        return False, "Python ops: the compiled ops are built on POSIX systems only"
    cxx = _compiler()
    if cxx is None:
        return False, "Python ops: no C++ compiler found ($CXX, c++, g++, clang++)"
    if not (_torch_dir() / "include" / "torch" / "library.h").exists():
        return False, "Python ops: this torch has no C++ headers"
    built, why = _native.build_first(
        "the compiled ops", cxx, _flag_sets(), source(), _lib_path, ".cpp", _link_flags()
    )
    if built is None:
        return False, f"Python ops: {why}"
    return _load(built[0])


def loaded() -> bool:
    """True when the compiled ops are loaded into torch (``torch.ops.attnkit.<name>``),
    building them on first use; False when they cannot be (see :func:`status`)."""
    global _loaded, _status
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded, _status = _try_build()
    return _loaded


def build() -> str:
    """Build (or load) the compiled ops now; returns :func:`status`."""
    loaded()
    assert _status is not None
    return _status


def status() -> str:
    """How the compiled-graph ops run here, without building anything."""
    if _status is None:
        if os.environ.get("ATTNKIT_NO_COMPILE"):
            return "Python ops: compilation disabled by ATTNKIT_NO_COMPILE"
        if _compiler() is None:
            return "Python ops: no C++ compiler found ($CXX, c++, g++, clang++)"
        return "compiled C++ ops, not built yet: built when torch.compile first traces a call"
    return _status
