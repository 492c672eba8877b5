"""The native kernels' build cache: private per-user folder, nothing foreign loaded,
atomic builds, stale-file cleanup, a bounded compiler wait, and status() never builds."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnkit.kernels import _native, additive, softmax

from tolerance import assert_close_to_scale


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache folder of this test and no library loaded; the real state comes back."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(folder))
    monkeypatch.delenv("ATTNKIT_NO_COMPILE", raising=False)
    _native._reset_for_tests()
    yield folder
    monkeypatch.undo()
    _native._reset_for_tests()


def _compiler_or_skip() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


def _exp_rows_still_correct() -> None:
    """The fallback answers (no AttributeError, no foreign code): exp(s - max) by rows."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 11, generator=g)
    ref = torch.exp(s - s.amax(-1, keepdim=True))
    got = s.clone()
    sums = softmax.exp_rows_(got, s.amax(-1), want_sum=True)
    assert sums is not None
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    torch.testing.assert_close(sums, ref.sum(-1), rtol=0, atol=0)


# ------------------------------------------------------------------ where builds go


def test_the_default_cache_is_per_user_and_never_in_the_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ATTNKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _native.cache_dir() == tmp_path / "xdg" / "attnkit" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _native.cache_dir() == tmp_path / "home" / ".cache" / "attnkit" / "kernels"


def test_without_a_home_folder_nothing_is_built_in_a_shared_place(
    fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    shared = tmp_path / "shared-temp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.delenv("ATTNKIT_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert _native.library() is None
    assert "ATTNKIT_CACHE_DIR" in _native.status()
    assert list(shared.iterdir()) == []
    assert _native.planned_paths() == []


def test_status_never_builds(fresh_cache: Path) -> None:
    assert "first use" in _native.status()
    assert not fresh_cache.exists()
    assert "first use" in additive.status()
    assert additive.status() == _native.status() and not fresh_cache.exists()


def test_status_without_a_compiler_says_so_without_building(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(fresh_cache.parent / "empty-bin"))
    assert "no C compiler" in _native.status()
    assert not fresh_cache.exists()


def test_builds_into_a_private_folder_and_loads(fresh_cache: Path) -> None:
    _compiler_or_skip()
    assert _native.build().startswith("compiled C kernel")
    assert stat.S_IMODE(fresh_cache.stat().st_mode) == 0o700
    libs = list(fresh_cache.glob("attnkit_kernels_*.so"))
    assert len(libs) == 1 and not list(fresh_cache.glob("*.tmp*"))
    assert libs[0].stat().st_mode & 0o022 == 0


def test_a_build_is_renamed_into_place_from_a_temporary_name(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _compiler_or_skip()
    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        renames.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    _native.build()
    assert len(renames) == 1
    src, dst = renames[0]
    assert src.parent == dst.parent == fresh_cache  # same folder: the rename is atomic
    assert ".tmp" in src.name and dst.name.startswith("attnkit_kernels_")


def test_the_abi_tag_of_the_source_is_the_one_the_loader_expects() -> None:
    tags = re.findall(r"ak_abi_tag\(void\)\s*\{\s*return\s+(\d+);", _native.source())
    assert tags == [str(_native.ABI_TAG)]


# ------------------------------------------------------------------ what is refused


def test_a_world_writable_cache_folder_is_refused(fresh_cache: Path) -> None:
    fresh_cache.mkdir(parents=True)
    fresh_cache.chmod(0o777)
    assert _native.library() is None
    assert "writable by group or others" in _native.status()
    _exp_rows_still_correct()


def test_a_cache_folder_of_another_user_is_refused(fresh_cache: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making a folder of another user needs root")
    fresh_cache.mkdir(parents=True, mode=0o700)
    os.chown(fresh_cache, 65534, 65534)
    assert _native.library() is None
    assert "belongs to another user" in _native.status()


def _plant(folder: Path, body: str) -> Path:
    """A library compiled from ``body`` at the exact path attnkit's first build would use."""
    cc = _compiler_or_skip()
    _native._reset_for_tests()
    target = _native.planned_paths()[0]  # computed, nothing built or loaded
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    src = folder.parent / "planted.c"
    src.write_text(body)
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(target)], check=True)
    target.chmod(0o700)
    _native._reset_for_tests()
    return target


def _constructor_leaving(marker: Path) -> str:
    """C code that creates ``marker`` as soon as the library is loaded."""
    return (
        "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n"
        f'  FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
    )


def test_a_planted_library_in_a_world_writable_folder_is_never_loaded(
    fresh_cache: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "foreign-code-ran"
    tag = f"int ak_abi_tag(void) {{ return {_native.ABI_TAG}; }}\n"  # even with our tag
    _plant(fresh_cache, _constructor_leaving(marker) + tag)
    fresh_cache.chmod(0o777)
    assert _native.library() is None
    assert "writable by group or others" in _native.status()
    assert not marker.exists()
    _exp_rows_still_correct()


def test_a_library_of_another_user_is_never_loaded(fresh_cache: Path, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("planting a file of another user needs root")
    marker = tmp_path / "foreign-code-ran"
    planted = _plant(fresh_cache, _constructor_leaving(marker))
    os.chown(planted, 65534, 65534)
    assert _native.library() is None
    assert "belongs to another user" in _native.status()
    assert not marker.exists()


def test_a_group_writable_library_is_never_loaded(fresh_cache: Path, tmp_path: Path) -> None:
    marker = tmp_path / "foreign-code-ran"
    planted = _plant(fresh_cache, _constructor_leaving(marker))
    planted.chmod(0o777)
    assert _native.library() is None
    assert "writable by group or others" in _native.status()
    assert not marker.exists()


def test_a_symlink_at_the_library_path_is_never_followed(fresh_cache: Path, tmp_path: Path) -> None:
    marker = tmp_path / "foreign-code-ran"
    planted = _plant(fresh_cache, _constructor_leaving(marker))
    elsewhere = tmp_path / "elsewhere.so"
    planted.rename(elsewhere)
    planted.symlink_to(elsewhere)
    assert _native.library() is None
    assert "not a regular file" in _native.status()
    assert not marker.exists()


@pytest.mark.parametrize(
    "body, reason",
    [
        ("int unrelated(void) { return 0; }\n", "not attnkit's"),
        ("int ak_abi_tag(void) { return 1; }\n", "another version"),
        (f"int ak_abi_tag(void) {{ return {_native.ABI_TAG}; }}\n", "lacks an entry point"),
    ],
    ids=["no-tag", "wrong-tag", "missing-symbols"],
)
def test_a_file_that_is_not_our_library_falls_back_to_torch(
    fresh_cache: Path, body: str, reason: str
) -> None:
    _plant(fresh_cache, body)
    assert _native.library() is None
    assert _native.status().startswith("pure torch") and reason in _native.status()
    _exp_rows_still_correct()
    g = torch.Generator().manual_seed(1)
    qh, kh, w = torch.randn(1, 3, 5, generator=g), torch.randn(1, 4, 5, generator=g), torch.ones(5)
    torch.testing.assert_close(
        additive.logits(qh, kh, w), additive.logits_torch(qh, kh, w), rtol=0, atol=0
    )


# ------------------------------------------------------------------ faults during a build


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X")


def test_a_hanging_compiler_is_bounded_and_stopped_with_its_helpers(
    fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc to see the compiler's helper")
    pid_file = tmp_path / "helper.pid"
    slow = tmp_path / "slow-cc"
    slow.write_text(f"#!/bin/sh\nsleep 30 &\necho $! > {pid_file}\nwait\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))
    monkeypatch.setenv("ATTNKIT_BUILD_TIMEOUT", "1")
    t0 = time.monotonic()
    assert _native.library() is None
    assert time.monotonic() - t0 < 10
    assert "longer than" in _native.status()
    helper = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 5
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(helper), "the compiler's helper process was left running"
    finally:
        if _alive(helper):
            os.kill(helper, 9)  # the helper this test started


def test_an_unparsable_timeout_uses_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for text in ("soon", "nan", "inf", "-5"):
        monkeypatch.setenv("ATTNKIT_BUILD_TIMEOUT", text)
        seconds = _native._timeout()
        assert 1.0 <= seconds <= 60.0, (text, seconds)


def test_leftovers_of_a_killed_build_are_removed(fresh_cache: Path) -> None:
    _compiler_or_skip()
    fresh_cache.mkdir(parents=True, mode=0o700)
    stale = fresh_cache / "tmpabc.tmp.so"
    stale.write_bytes(b"half a library")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    recent = fresh_cache / "tmpdef.tmp.c"  # another build may be writing it right now
    recent.write_text("int x;")
    _native.build()
    assert not stale.exists() and recent.exists()


def test_no_compile_uses_the_torch_fallbacks_and_builds_nothing(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNKIT_NO_COMPILE", "1")
    assert "ATTNKIT_NO_COMPILE" in _native.status()
    assert not additive.available(torch.float32, torch.device("cpu"))
    assert _native.library() is None
    assert "ATTNKIT_NO_COMPILE" in _native.status() and not fresh_cache.exists()
    _exp_rows_still_correct()
    g = torch.Generator().manual_seed(2)
    qh, kh = torch.randn(2, 3, 7, generator=g), torch.randn(2, 5, 7, generator=g)
    w, up = torch.randn(7, generator=g), torch.randn(2, 3, 5, generator=g)
    exact = additive.logits_torch(qh.double(), kh.double(), w.double())
    assert_close_to_scale(additive.logits(qh, kh, w).double(), exact)
    grads = zip(additive.grads(qh, kh, w, up), additive.grads_torch(qh, kh, w, up), strict=True)
    for got, ref in grads:
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
