"""Declaring attnkit's kernels as torch ops.

Each native CPU entry point is an op in the ``attnkit`` namespace with a fake (meta)
implementation, so ``torch.compile`` traces it as one node and meta or fake tensors
get correct shapes without running it. They are declared with :func:`define_op`: a
schema on a ``torch.library.Library`` and a kernel for it, not
``torch.library.custom_op``. The dispatcher then reaches the kernel directly:

- about 9 µs less per call than ``custom_op``'s Python wrapper (``exp_rows_`` on an
  8 × 64 tile, 1 thread: 10.4 µs against 19.5; a chunked call makes one per tile);
- the first call does not import ``torch._dynamo`` (``custom_op`` wraps each kernel in
  ``torch._dynamo.disable``, which imports it on first use). That import costs a
  second or more, and when a process group already exists it also imports
  ``torch.distributed.nn.functional``, whose functions keep that group as a default
  argument: the group, its gloo threads and its store then outlive
  ``destroy_process_group`` and run into the interpreter's teardown.

The Triton ops (:mod:`attnkit.backends.triton.ops`) keep ``custom_op``/``triton_op``,
which carry their autograd. torch infers those ops' schemas from their functions'
signatures, and before torch 2.5 that inference reads the annotations as they stand:
strings under ``from __future__ import annotations``, and builtin generics such as
``list[int]``, are refused. So they are registered through :func:`schema_ready`, which
gives a function a signature of resolved ``typing`` objects that every torch from 2.4
on reads.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["define_op", "schema_ready"]

LIBRARY = torch.library.Library("attnkit", "FRAGMENT")
"""The ``attnkit`` op namespace, as one fragment every op of the package is declared on."""


def _typing_form(annotation: Any) -> Any:
    """``list[X]`` -> ``typing.List[X]``, ``X | None`` -> ``typing.Optional[X]``, recursively;
    ``tuple[...]`` keeps its origin (torch reads it for several returns)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is None or not args:
        return annotation
    inner = tuple(_typing_form(a) for a in args)
    # Built at run time from objects, so held as Any (they are values here, not types).
    list_form: Any = typing.List  # noqa: UP006 - torch < 2.5 knows only typing.List
    union_form: Any = typing.Union  # torch < 2.5 keys typing.Optional, not X | None
    tuple_form: Any = tuple
    if origin is list:
        return list_form[inner[0]]
    if origin in (typing.Union, types.UnionType):
        return union_form[inner]
    if origin is tuple:
        return tuple_form[inner]
    return annotation


def schema_ready(fn: Any) -> Any:
    """``fn`` with a ``__signature__`` whose annotations are resolved ``typing`` objects.

    The function itself is unchanged (it is returned, not wrapped); only what
    ``inspect.signature`` reports changes, which is what torch's schema inference reads.
    """
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    params = [
        p.replace(annotation=_typing_form(hints[p.name])) if p.name in hints else p
        for p in sig.parameters.values()
    ]
    ret = _typing_form(hints["return"]) if "return" in hints else sig.return_annotation
    fn.__signature__ = sig.replace(parameters=params, return_annotation=ret)
    return fn


def define_op(
    schema: str,
    kernel: Callable[..., Any],
    fake: Callable[..., Any],
    dispatch_key: str = "CompositeExplicitAutograd",
) -> Any:
    """Declare ``attnkit::<schema>``, run by ``kernel`` (on every device, or only where
    ``dispatch_key`` says, e.g. ``"CPU"``), with ``fake`` as its shape function; returns
    the op (``torch.ops.attnkit.<name>.default``).

    ``schema`` is torch's schema language, e.g. ``"exp_rows_(Tensor(a!) s, Tensor
    shift) -> Tensor"`` (``(a!)``: an argument the kernel writes). The op has no
    autograd formula: its callers run it inside their own ``autograd.Function``s or
    without gradients.
    """
    name = schema.split("(", 1)[0]
    LIBRARY.define(schema)
    LIBRARY.impl(name, kernel, dispatch_key)
    torch.library.register_fake(f"attnkit::{name}", lib=LIBRARY)(fake)
    return getattr(torch.ops.attnkit, name).default
