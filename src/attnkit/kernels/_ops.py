"""Declaring the native kernels as ``torch.library`` custom ops.

Each entry point is an op in the ``attnkit`` namespace with a fake (meta)
implementation, so ``torch.compile`` traces it as one node and meta or fake tensors
get correct shapes without running it. ``torch.library.custom_op`` exists from
torch 2.4; where it is missing the functions stay plain Python functions.

torch infers an op's schema from its function's signature. Before torch 2.5 that
inference reads the annotations as they stand: strings under ``from __future__ import
annotations``, and builtin generics such as ``list[int]``, are refused. So every op is
registered through :func:`schema_ready`, which gives the function a signature of
resolved ``typing`` objects that every torch from 2.4 on reads.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["custom_op", "register_fake", "schema_ready"]

_HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")


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


def custom_op(name: str, *, mutates_args: Iterable[str] = ()) -> Callable[[Any], Any]:
    """``torch.library.custom_op(name, mutates_args=...)``, or the function unchanged."""

    def wrap(fn: Any) -> Any:
        if not _HAS_CUSTOM_OP:  # pragma: no cover - torch < 2.4
            return fn
        return torch.library.custom_op(name, mutates_args=tuple(mutates_args))(schema_ready(fn))

    return wrap


def register_fake(op: Any) -> Callable[[Any], Any]:
    """``torch.library.register_fake(op)``, or a no-op."""

    def wrap(fn: Any) -> Any:
        if _HAS_CUSTOM_OP and hasattr(op, "register_fake"):
            op.register_fake(fn)
        return fn

    return wrap
