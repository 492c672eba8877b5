"""Tensor layouts attnkit takes: dense, strided, not nested.

Every tensor argument (query, key, value, masks, ``attention_backward``'s out, lse
and gradients, a layer's inputs and masks) is checked here first, before its shape or
dtype is read: a nested, sparse or MKL-DNN tensor would otherwise fail deep inside
torch ("NestedTensorImpl doesn't support sizes", "expand is unsupported for Sparse
tensors"). :func:`layout_problem` says what the tensor is and how to make it one
attnkit takes; :func:`check_strided` raises it as a ``TypeError``.
"""

from __future__ import annotations

import torch

__all__ = ["check_strided", "is_plain_strided", "layout_problem"]

_SPARSE = {
    torch.sparse_coo: "sparse COO",
    torch.sparse_csr: "sparse CSR",
    torch.sparse_csc: "sparse CSC",
    torch.sparse_bsr: "sparse BSR",
    torch.sparse_bsc: "sparse BSC",
}


def is_plain_strided(t: torch.Tensor) -> bool:
    """True for a dense strided tensor that is not nested (what attnkit computes with)."""
    return t.layout is torch.strided and not t.is_nested


def layout_problem(
    name: str, t: torch.Tensor, *, nested_hint: str = "", var: str | None = None
) -> str | None:
    """None for a plain strided tensor, else a sentence naming ``name``, the layout
    received and the conversion that gives a tensor attnkit takes.

    ``nested_hint``: what to do with the padding after padding a nested tensor
    (the masks that say which positions are real); a default sentence otherwise.
    ``var``: how the conversion names the tensor (default ``name``).
    """
    if is_plain_strided(t):
        return None
    var = name if var is None else var
    if t.is_nested:
        jagged = t.layout is torch.jagged
        kind = "nested (jagged)" if jagged else "nested (strided)"
        lengths = f"{var}.offsets().diff()" if jagged else f"[u.shape[0] for u in {var}.unbind()]"
        hint = nested_hint or (
            f"and give the lengths ({lengths}) as a mask, e.g. masks.valid_lens(lengths) "
            "for padded keys"
        )
        return (
            f"{name} is a {kind} tensor; attnkit takes dense strided tensors: pad it with "
            f"torch.nested.to_padded_tensor({var}, 0.0) {hint}"
        )
    if t.layout in _SPARSE:
        return (
            f"{name} is a {_SPARSE[t.layout]} tensor (layout {t.layout}); attnkit takes dense "
            f"strided tensors: pass {var}.to_dense()"
        )
    if t.layout is torch._mkldnn:  # type: ignore[attr-defined]
        return (
            f"{name} is an MKL-DNN tensor (layout torch._mkldnn); attnkit takes dense strided "
            f"tensors: pass {var}.to_dense()"
        )
    return f"{name} has layout {t.layout}; attnkit takes dense strided tensors (torch.strided)"


def check_strided(
    where: str, name: str, t: torch.Tensor, *, nested_hint: str = "", var: str | None = None
) -> None:
    """Raise ``TypeError("{where}: ...")`` unless ``t`` is a plain strided tensor."""
    problem = layout_problem(name, t, nested_hint=nested_hint, var=var)
    if problem is not None:
        raise TypeError(f"{where}: {problem}" if where else problem)
