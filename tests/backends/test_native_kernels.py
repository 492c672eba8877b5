"""The native CPU kernels: torch ops with fake implementations, and a safe build cache."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnkit.kernels import _native, additive, softmax


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty private cache and no library loaded; the real state comes back after."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(folder))
    monkeypatch.delenv("ATTNKIT_NO_COMPILE", raising=False)
    _native._reset_for_tests()
    yield folder
    monkeypatch.undo()
    _native._reset_for_tests()


# ------------------------------------------------------------------ the ops


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 5, 33)])
def test_exp_rows_matches_float64_with_blocked_and_nan_entries(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    s = torch.randn(*shape, generator=g) * 5
    s[..., 0] = float("-inf")
    if shape[-1] > 2:
        s.view(-1, shape[-1])[0, 2] = float("nan")
    shift = s.nan_to_num(nan=0.0).amax(-1).clamp(min=0)
    ref = torch.exp((s - shift.unsqueeze(-1)).double())  # the float32 argument, exp in float64
    got = s.clone()
    sums = softmax.exp_rows_(got, shift, want_sum=True)
    assert sums is not None
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=0, equal_nan=True)
    torch.testing.assert_close(sums.double(), ref.sum(-1), rtol=1e-6, atol=0, equal_nan=True)
    assert (got[..., 0] == 0).all()


@pytest.mark.parametrize("R, M, N, H", [(1, 1, 1, 1), (2, 3, 17, 9), (1, 5, 4, 33)])
def test_additive_ops_match_the_torch_version(R: int, M: int, N: int, H: int) -> None:
    g = torch.Generator().manual_seed(1)
    qh, kh = torch.randn(R, M, H, generator=g), torch.randn(R, N, H, generator=g)
    w, up = torch.randn(H, generator=g), torch.randn(R, M, N, generator=g)
    torch.testing.assert_close(
        additive.logits(qh, kh, w), additive.logits_torch(qh.double(), kh.double(), w.double()).float(),
        rtol=1e-5, atol=1e-5,
    )  # fmt: skip
    for got, ref in zip(
        additive.grads(qh, kh, w, up), additive.grads_torch(qh, kh, w, up), strict=True
    ):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_ops_run_on_meta_tensors_without_computing() -> None:
    qh, kh = torch.empty(2, 3, 8, device="meta"), torch.empty(2, 5, 8, device="meta")
    w, up = torch.empty(8, device="meta"), torch.empty(2, 3, 5, device="meta")
    assert additive.logits_op(qh, kh, w).shape == (2, 3, 5)
    dq, dk, dw = additive.grads_op(qh, kh, w, up)
    assert (dq.shape, dk.shape, dw.shape) == (qh.shape, kh.shape, w.shape)
    s = torch.empty(4, 6, device="meta")
    assert softmax.exp_rows_op(s, torch.empty(4, device="meta")).shape == (4,)


def test_ops_compile_fullgraph() -> None:
    torch._dynamo.reset()

    def f(qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        s = additive.logits(qh, kh, w)  # (R, M, N)
        sums = softmax.exp_rows_(s, s.amax(-1), want_sum=True)
        assert sums is not None
        return s / sums.unsqueeze(-1)

    g = torch.Generator().manual_seed(2)
    qh, kh, w = (
        torch.randn(2, 3, 8, generator=g),
        torch.randn(2, 5, 8, generator=g),
        torch.randn(8, generator=g),
    )
    ref = torch.softmax(additive.logits_torch(qh, kh, w), dim=-1)
    torch.testing.assert_close(
        torch.compile(f, fullgraph=True, backend="aot_eager")(qh, kh, w), ref
    )


# ------------------------------------------------------------------ the build cache


def test_status_never_builds(fresh_cache: Path) -> None:
    assert "first use" in _native.status()
    assert not fresh_cache.exists()


def test_builds_into_a_private_folder_and_loads(fresh_cache: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    assert _native.build().startswith("compiled C kernel")
    assert stat.S_IMODE(fresh_cache.stat().st_mode) == 0o700
    libs = list(fresh_cache.glob("attnkit_kernels_*.so"))
    assert len(libs) == 1 and not list(fresh_cache.glob("*.tmp*"))


def test_a_world_writable_cache_folder_is_refused(fresh_cache: Path) -> None:
    fresh_cache.mkdir(parents=True)
    fresh_cache.chmod(0o777)
    assert _native.library() is None
    assert "writable by group or others" in _native.status()


def _plant_foreign_library(folder: Path, marker: Path) -> Path:
    """A library at the exact path attnkit would load, whose constructor leaves a marker."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    _native._reset_for_tests()
    genuine = _native.planned_paths()[0]  # where the first build would go, not loaded
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    src = folder / "foreign.c"
    src.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n"
        f'  FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
        "int ak_abi_tag(void) { return 1; }\n"
    )
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(genuine)], check=True)
    src.unlink()
    _native._reset_for_tests()
    return genuine


def test_a_library_of_another_user_is_never_loaded(fresh_cache: Path, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("planting a file of another user needs root")
    marker = tmp_path / "foreign-code-ran"
    planted = _plant_foreign_library(fresh_cache, marker)
    os.chown(planted, 65534, 65534)
    assert _native.library() is None
    assert "belongs to another user" in _native.status()
    assert not marker.exists()


def test_a_group_writable_library_is_never_loaded(fresh_cache: Path, tmp_path: Path) -> None:
    marker = tmp_path / "foreign-code-ran"
    planted = _plant_foreign_library(fresh_cache, marker)
    planted.chmod(0o777)
    assert _native.library() is None
    assert "writable by group or others" in _native.status()
    assert not marker.exists()


def test_a_file_that_is_not_our_library_falls_back_to_torch(
    fresh_cache: Path, tmp_path: Path
) -> None:
    _plant_foreign_library(fresh_cache, tmp_path / "marker")
    assert _native.library() is None
    assert "another version" in _native.status() or "not attnkit's" in _native.status()
    s = torch.randn(2, 3)
    ref = torch.exp(s - s.amax(-1, keepdim=True))
    got = s.clone()
    softmax.exp_rows_(got, s.amax(-1), want_sum=False)  # the fallback, no AttributeError
    torch.testing.assert_close(got, ref)


def test_a_hanging_compiler_is_bounded(
    fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = tmp_path / "slow-cc"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))
    monkeypatch.setenv("ATTNKIT_BUILD_TIMEOUT", "1")
    t0 = time.monotonic()
    assert _native.library() is None
    assert time.monotonic() - t0 < 10
    assert "longer than" in _native.status()


def test_leftovers_of_a_killed_build_are_removed(fresh_cache: Path) -> None:
    fresh_cache.mkdir(parents=True, mode=0o700)
    stale = fresh_cache / "abc.tmp.so"
    stale.write_bytes(b"half a library")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    _native.build()
    assert not stale.exists()
