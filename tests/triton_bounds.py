"""Bounds-checked interpreted triton kernels, with a GPU target's tile sizes.

Under Triton's interpreter a load or store past the end of a tensor reads or writes
host memory without a fault, where a GPU reports an illegal memory access. Inside
:func:`bounds_checked`, every load and store of an interpreted kernel is checked
against the storages of that launch's tensor arguments: an address that falls outside
all of them, on a lane whose mask is true, raises (the interpreter reports it as an
``InterpreterError`` naming the kernel). :func:`target_tiles` makes the kernels take the
tile sizes of a GPU architecture, so the edges of those tiles are what gets checked.

Import :mod:`interpreted_triton` first (it sets ``TRITON_INTERPRET``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

_interp = pytest.importorskip("triton.runtime.interpreter")


@dataclass
class Accesses:
    """What the checked kernels did: the launches, and the lanes checked."""

    launches: int = 0
    lanes: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)


def _check(seen: Accesses, ptrs: Any, mask: Any, itemsize: int, what: str) -> None:
    on = ptrs.data[mask.data.astype(bool)]  # the lanes that touch memory
    if on.size == 0:
        return
    addr = on.astype(np.uint64)
    inside = np.zeros(addr.shape, dtype=bool)
    for lo, hi in seen.ranges:
        inside |= (addr >= lo) & (addr + itemsize <= hi)
    seen.lanes += int(addr.size)
    if not inside.all():
        bad = [hex(int(a)) for a in addr[~inside][:4]]
        spans = [(hex(lo), hi - lo) for lo, hi in seen.ranges]
        raise IndexError(f"{what} outside every tensor argument: {bad}; arguments {spans}")


@contextmanager
def bounds_checked(short_by: int = 0) -> Iterator[Accesses]:
    """Inside the block, every interpreted load and store is bounds-checked.

    ``short_by``: bytes taken off the end of every tensor argument (a test of the check
    itself: its last elements then count as outside)."""
    seen = Accesses()
    executor, builder = _interp.GridExecutor, _interp.InterpreterBuilder
    init, load, store = (
        executor._init_args_hst,
        builder.create_masked_load,
        builder.create_masked_store,
    )

    def init_checked(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args, kw = init(self, args_dev, kwargs)
        seen.launches += 1
        seen.ranges = []
        for arg in [*args, *kw.values()]:
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                end = storage.data_ptr() + storage.nbytes() - short_by
                seen.ranges.append((storage.data_ptr(), end))
        return args, kw

    def load_checked(self: Any, ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        itemsize = np.dtype(_interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        _check(seen, ptrs, mask, itemsize, "load")
        return load(self, ptrs, mask, other, *rest)

    def store_checked(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        _check(seen, ptrs, mask, value.data.dtype.itemsize, "store")
        return store(self, ptrs, value, mask, *rest)

    executor._init_args_hst = init_checked
    builder.create_masked_load = load_checked
    builder.create_masked_store = store_checked
    try:
        yield seen
    finally:
        executor._init_args_hst = init
        builder.create_masked_load = load
        builder.create_masked_store = store


@contextmanager
def target_tiles(arch: int) -> Iterator[None]:
    """Inside the block, the triton kernels take ``arch``'s tile sizes (e.g. 90 for sm_90)
    instead of the interpreter's 16 x 16."""
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("attnkit.backends.triton") and hasattr(module, "arch_of"):
            patched.append((module, module.arch_of))
            module.arch_of = lambda device, _arch=arch: _arch
    try:
        yield
    finally:
        for module, original in patched:
            module.arch_of = original
