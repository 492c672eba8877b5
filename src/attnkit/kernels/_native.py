"""attnkit's native CPU kernels: one C file, built on first use, loaded with ctypes.

The source is the package file ``native.c``: the fused additive-score loop
(:mod:`attnkit.kernels.additive`), a vectorized ``exp`` of logits rows
(:mod:`attnkit.kernels.softmax`), the viewer's per-row top-k (:mod:`attnkit.kernels.rows`)
and a one-pass check of a kernel's output rows (:mod:`attnkit.kernels.finite`). It
includes no torch headers, so a build takes about a second with the system C compiler
(``$CC``, else ``cc``/``gcc``/``clang``). On x86-64 with AVX2+FMA the inner loops are
vectorized by hand (the additive score's also with AVX-512 where the CPU has it);
elsewhere portable scalar loops are compiled. Nothing prebuilt ships with the package.

When it is built: at the first call that needs it (:func:`library`), or explicitly
(:func:`build`); never by :func:`status`, which only reports.

Where, and what is loaded (a library is native code run in this process):

- builds go to a per-user private folder, ``$ATTNKIT_CACHE_DIR`` or
  ``$XDG_CACHE_HOME/attnkit/kernels`` or ``~/.cache/attnkit/kernels``, created with
  mode 0700; never a shared folder under a world-writable temp dir;
- a library is loaded only when the folder and the file belong to the current user
  and neither is writable by group or others, and only when it answers with
  attnkit's tag (``ak_abi_tag``); anything else is refused, with the reason in
  :func:`status`, and callers use their pure-torch fallbacks;
- a build writes a temporary file and renames it into place atomically (concurrent
  builders agree); temporary files older than an hour (a killed build) are removed;
- the compiler's total wait is bounded (``ATTNKIT_BUILD_TIMEOUT`` seconds, default
  60), after which the compiler and everything it started are stopped and the
  fallbacks are used.

The file name holds a hash of the source, the flags, the compiler and the CPU, so a
change of any of them builds anew. ``ATTNKIT_NO_COMPILE=1`` disables the build (for
tests of the fallbacks).

Math: ``exp(x) = 2^n · e^r`` with ``|r| <= ln2/2`` and e^r by its degree-7 Taylor
polynomial (relative error about 1e-7, float32 rounding); ``exp`` of -inf (or
anything below -87) is exactly 0, of +inf (or anything above ln(FLT_MAX)) +inf, and of
NaN NaN, as in torch. ``tanh(x) = sign(x) · t`` with ``u = expm1(2|x|)``
(``2^n (e^r - 1) + (2^n - 1)``, e^r - 1 = r q(r) with q a near-minimax fit of degree 5,
relative error 2.3e-8), |x| clamped to 10, where float32 tanh is exactly ±1, and
``t = u / (u + 2)`` up to |x| = atanh(1/2), ``1 - 2 / (u + 2)`` above: a relative error
of a few roundings near 0 (``1 - 2/(exp(2x) + 1)`` had an absolute one, 6e-5 relative at
x = 1e-3) and within 0.65 ulps from |x| = 1.5 (``u / (u + 2)`` rounded there at 1.5
ulps): additive logits carry these at a large scale, where one ulp of a term moves the
softmax of near-tied keys.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import torch

__all__ = [
    "ABI_TAG",
    "available",
    "build",
    "cache_dir",
    "library",
    "planned_paths",
    "status",
]

ABI_TAG = 20261129
"""What ``ak_abi_tag()`` of attnkit's library returns."""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_status: str | None = None
_STALE_SECONDS = 3600


def source() -> str:
    """The C source shipped with the package."""
    return resources.files("attnkit.kernels").joinpath("native.c").read_text(encoding="utf-8")


def cache_dir() -> Path:
    """The per-user folder builds go to (not created here): ``$ATTNKIT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/attnkit/kernels``, else ``~/.cache/attnkit/kernels``.

    Raises:
        RuntimeError: none of them can be resolved (no home folder). There is no shared
            fallback: a predictable folder under the temp dir could be planted by others.
    """
    explicit = os.environ.get("ATTNKIT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError) as exc:
            raise RuntimeError(
                f"no per-user cache folder ({exc}); set ATTNKIT_CACHE_DIR or XDG_CACHE_HOME"
            ) from None
    return Path(base) / "attnkit" / "kernels"


def _compiler() -> str | None:
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _cpu_identity() -> str:
    """torch's CPU capability and the processor's model name, e.g. 'AVX2|AMD EPYC ...'."""
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # pragma: no cover - very old torch
        capability = "unknown"
    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{capability}|{model}"


def _flag_sets() -> list[list[str]]:
    base = ["-O3", "-shared", "-fPIC", "-fno-math-errno"]
    sets = []
    if platform.machine().lower() in ("x86_64", "amd64"):
        sets.append([*base, "-march=native", "-fopenmp"])
        if _cpu_identity().split("|")[0] in ("AVX2", "AVX512"):  # never emit what the CPU lacks
            sets.append([*base, "-mavx2", "-mfma", "-fopenmp"])
    sets.append([*base, "-fopenmp"])
    sets.append(base)
    return sets


def _timeout() -> float:
    """Seconds the compiler may take in all: ``$ATTNKIT_BUILD_TIMEOUT`` (at least 1), else 60."""
    try:
        seconds = float(os.environ.get("ATTNKIT_BUILD_TIMEOUT", "60"))
    except ValueError:
        return 60.0
    return max(1.0, seconds) if math.isfinite(seconds) else 60.0


def _private_dir(path: Path) -> str | None:
    """Create ``path`` (mode 0700) if needed; the reason it is unsafe to use, or None."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as exc:
        return f"cannot create the kernel cache {path} ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode) or path.is_symlink():
        return f"the kernel cache {path} is not a real folder"
    return _not_private(st, f"the kernel cache {path}")


def _safe_file(path: Path) -> str | None:
    """The reason not to load ``path``, or None when it is ours and private."""
    try:
        st = path.lstat()
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    return _not_private(st, str(path))


def _not_private(st: os.stat_result, what: str) -> str | None:
    """Why ``what`` (of status ``st``) is not private to this user, or None."""
    if st.st_uid != os.getuid():
        return f"{what} belongs to another user"
    if st.st_mode & 0o022:
        return f"{what} is writable by group or others"
    return None


def _remove_stale(folder: Path) -> None:
    """Delete temporary files a killed build left behind (older than an hour)."""
    now = time.time()
    for p in folder.glob("*.tmp*"):
        try:
            if now - p.lstat().st_mtime > _STALE_SECONDS and p.lstat().st_uid == os.getuid():
                p.unlink()
        except OSError:
            continue


def _load(path: Path) -> tuple[ctypes.CDLL | None, str]:
    """Load ``path`` if it is safe and is attnkit's library."""
    unsafe = _safe_file(path)
    if unsafe is not None:
        return None, f"pure torch: refused to load the kernel ({unsafe})"
    try:
        lib = ctypes.CDLL(str(path))
        tag = lib.ak_abi_tag
    except (OSError, AttributeError) as exc:
        return None, f"pure torch: {path} is not attnkit's kernel library ({exc})"
    tag.restype = ctypes.c_int
    if tag() != ABI_TAG:
        return None, f"pure torch: {path} is another version of the kernel library"
    try:
        _declare(lib)
    except AttributeError as exc:
        return None, f"pure torch: {path} lacks an entry point of the kernel library ({exc})"
    return lib, ""


def _try_build() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("ATTNKIT_NO_COMPILE"):
        return None, "pure torch: compilation disabled by ATTNKIT_NO_COMPILE"
    if not hasattr(os, "getuid"):  # the private cache checks need a POSIX system
        return None, "pure torch: the C kernel is built on POSIX systems only"
    cc = _compiler()
    if cc is None:
        return None, "pure torch: no C compiler found ($CC, cc, gcc, clang)"
    built, why = build_first("the C kernel", cc, _flag_sets(), source(), _lib_path, ".c", ["-lm"])
    if built is None:
        return None, f"pure torch: {why}"
    lib, why = _load(built[0])
    if lib is None:
        return None, why
    simd = ("scalar", "AVX2+FMA", "AVX2+FMA, AVX-512")[lib.ak_simd_level()]
    return lib, f"compiled C kernel ({simd}, {' '.join(built[1][4:]) or 'no extra flags'})"


def build_first(
    what: str,
    compiler: str,
    flag_sets: list[list[str]],
    code: str,
    lib_path: Callable[[Path, str, list[str], str], Path],
    suffix: str,
    link: list[str],
) -> tuple[tuple[Path, list[str]] | None, str]:
    """The first library built from ``code`` (a file ending in ``suffix``) with one of
    ``flag_sets`` in turn, in the private cache: (its path, its flags), taken as it is
    where a build already lies at ``lib_path(folder, compiler, flags, code)``; or None
    and why (no private cache, every build of ``what`` failed, the compiler's time ran
    out). Shared by the C loops here and the C++ ops (:mod:`attnkit.kernels._native_ops`)."""
    try:
        folder = cache_dir()
    except RuntimeError as exc:
        return None, str(exc)
    unsafe = _private_dir(folder)
    if unsafe is not None:
        return None, unsafe
    _remove_stale(folder)
    deadline = time.monotonic() + _timeout()
    errors: list[str] = []
    for flags in flag_sets:
        path = lib_path(folder, compiler, flags, code)
        if not path.exists():
            left = deadline - time.monotonic()
            if left <= 0:
                errors.append(f"the compiler took longer than {_timeout():.0f} s in all")
                break
            err = _compile([compiler, *flags], code, folder, path, left, suffix, link)
            if err is not None:
                errors.append(err)
                continue
        return (path, flags), ""
    last = errors[-1] if errors else "unknown error"
    return None, f"building {what} failed ({last})"


def _lib_path(folder: Path, cc: str, flags: list[str], code: str) -> Path:
    """Where the library built from ``code`` with ``cc`` and ``flags`` lives. The CPU is
    part of the key: -march=native code must not be reused on another CPU."""
    key = code + " ".join(flags) + cc + _cpu_identity()
    return folder / f"attnkit_kernels_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def planned_paths() -> list[Path]:
    """The library paths a build would try, in order (nothing is built or loaded)."""
    cc = _compiler()
    if cc is None:
        return []
    try:
        folder = cache_dir()
    except RuntimeError:
        return []
    code = source()
    return [_lib_path(folder, cc, flags, code) for flags in _flag_sets()]


def _compile(
    command: list[str],
    code: str,
    folder: Path,
    lib_path: Path,
    timeout: float,
    suffix: str = ".c",
    link: list[str] | None = None,
) -> str | None:
    """Build ``lib_path`` with ``command`` (the compiler and its flags) from ``code``,
    through temporary files renamed into place (the source ending in ``suffix``,
    ``link`` after it); the error, or None."""
    with tempfile.NamedTemporaryFile(
        "w", dir=folder, suffix=".tmp" + suffix, delete=False, encoding="utf-8"
    ) as src_file:
        src_file.write(code)
    src = Path(src_file.name)
    fd, tmp_name = tempfile.mkstemp(dir=folder, suffix=".tmp.so")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        returncode, stderr = _run_bounded(
            [*command, str(src), "-o", str(tmp), *(link or [])], timeout
        )
        if returncode is None:
            return f"the compiler took longer than {timeout:.0f} s"
        if returncode != 0:
            return (stderr.strip().splitlines() or ["failed"])[-1]
        os.chmod(tmp, 0o700)
        os.replace(tmp, lib_path)  # atomic: concurrent builders agree
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


def _run_bounded(command: list[str], timeout: float) -> tuple[int | None, str]:
    """Run ``command`` for at most ``timeout`` seconds: (exit status, stderr), or (None, "")
    when it took longer. The compiler runs in its own process group, so on timeout its
    helpers (preprocessor, assembler, linker) are stopped with it, not left running."""
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this call created, nothing else
        except ProcessLookupError:
            pass
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        return None, ""


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ak_additive_logits.argtypes = [p, p, p, p, i64, i64, i64, i64, c_int]
    lib.ak_additive_logits.restype = None
    lib.ak_additive_grads.argtypes = [p, p, p, p, p, p, p, i64, i64, i64, i64, c_int]
    lib.ak_additive_grads.restype = None
    lib.ak_exp_rows.argtypes = [p, p, p, i64, i64, c_int]
    lib.ak_exp_rows.restype = None
    lib.ak_exp_rows_entropy.argtypes = [p, p, p, p, p, i64, i64, c_int]
    lib.ak_exp_rows_entropy.restype = None
    lib.ak_row_topk.argtypes = [p, i64, i64, i64, i64, p, p, p, p, c_int]
    lib.ak_row_topk.restype = None
    lib.ak_rows_settled.argtypes = [p, i64, i64, c_int, ctypes.c_uint32]
    lib.ak_rows_settled.restype = c_int
    lib.ak_simd_level.argtypes = []
    lib.ak_simd_level.restype = c_int


def build() -> str:
    """Build (or load) the kernel library now; returns :func:`status`."""
    library()
    assert _status is not None
    return _status


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first use; None when unavailable."""
    global _lib, _status
    if _status is None:
        with _lock:
            if _status is None:
                _lib, _status = _try_build()
    return _lib


def status() -> str:
    """How the native loops run here, without building anything: the compiled kernel,
    why the pure-torch fallback is used, or that the build happens on first use."""
    if _status is None:
        if os.environ.get("ATTNKIT_NO_COMPILE"):
            return "pure torch: compilation disabled by ATTNKIT_NO_COMPILE"
        if _compiler() is None:
            return "pure torch: no C compiler found ($CC, cc, gcc, clang)"
        return "compiled C kernel, not built yet: builds on first use"
    return _status


def available(dtype: torch.dtype, device: torch.device) -> bool:
    """True when the compiled kernel can run tensors of this dtype on this device
    (builds it on first use)."""
    return dtype == torch.float32 and device.type == "cpu" and library() is not None


def _reset_for_tests() -> None:
    """Forget the loaded library and its status (tests of the build and load rules)."""
    global _lib, _status
    with _lock:
        _lib, _status = None, None
