"""What ``dir()`` of a public namespace lists: the names it exports, nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["PUBLIC_NAMESPACES", "public_dir"]

PUBLIC_NAMESPACES: tuple[str, ...] = (
    "attnkit",
    "attnkit.masks",
    "attnkit.scores",
    "attnkit.mods",
    "attnkit.nn",
    "attnkit.viz",
    "attnkit.distributed",
    "attnkit.integrations.transformers",
    "attnkit.functional",
)
"""The user-facing namespaces: each lists only its ``__all__`` in ``dir()`` and has a
reference page generated from its docstrings (the tests read this one list)."""


def public_dir(names: Iterable[str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` that lists ``names`` (a module's ``__all__``), sorted.

    Args:
        names: the module's exported names.

    Returns:
        a function of no arguments returning those names, sorted, as ``dir(module)``
        calls it (``module.__dir__ = public_dir(__all__)``): the imports a module
        uses (``torch``, ``math``, ...) are not listed.
    """
    listed = sorted(set(names))

    def __dir__() -> list[str]:
        return list(listed)

    return __dir__
