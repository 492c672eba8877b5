"""The checks of ``attention_backward()``'s own arguments: the global (out, lse), their
gradients and the parameters to differentiate.

The call's query, key, value, score, mask and scale are checked by
:func:`attnkit._inputs.validate_inputs`, as for ``attention()``. What is checked here,
before any compute, is what ``attention(..., return_lse=True)`` would have returned
for the same call and what autograd would pass back:

- ``out`` (*batch, L, Ev) in the query's dtype, ``lse`` (*batch, L) in the compute
  dtype (float32 for half inputs, else the query's), both on the query's device;
- ``grad_out`` like ``out``; ``grad_lse`` like ``lse`` or None;
- ``params``: a sequence of tensors.

Values follow the non-finite policy of ``attention()``: a NaN (a row that used a NaN)
propagates and ``-inf`` in the lse marks a row with no key. An lse of ``+inf`` comes
from no attention and is refused where values can be read for free (CPU tensors,
outside ``torch.compile``); on an accelerator nothing is read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._args import shape_text as _shape
from ._host import readable
from ._inputs import AttentionInputs
from ._strided import check_strided

__all__ = ["check_backward_tensors"]


def _tensor(
    name: str,
    t: object,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    layout: str,
    inputs: AttentionInputs,
    why: str,
) -> torch.Tensor:
    """``t`` when it is a tensor of ``shape`` and ``dtype`` on the query's device."""
    want = f"a {dtype} tensor of shape {layout} = {_shape(shape)}"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected {want}, got {type(t).__name__}")
    check_strided("", name, t)
    if t.device != inputs.device:
        raise ValueError(
            f"{name}: is on {t.device} but the query is on {inputs.device}; expected "
            f"{want} on {inputs.device}"
        )
    if tuple(t.shape) != shape:
        raise ValueError(
            f"{name}: expected shape {layout} = {_shape(shape)}, got {_shape(t.shape)}"
        )
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} ({why}), got {t.dtype}")
    return t


def check_backward_tensors(
    inputs: AttentionInputs,
    out: object,
    lse: object,
    grad_out: object,
    grad_lse: object,
    params: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """(out, lse, grad_out, grad_lse, params) of a validated call, or the error naming
    the argument, what it received and what was expected (see the module docstring)."""
    out_shape = (*inputs.batch_shape, inputs.L, inputs.Ev)
    lse_shape = (*inputs.batch_shape, inputs.L)
    same = "the query's dtype, as attention() returns its output"
    wide = (
        "the compute dtype: float32 for half inputs, else the query's, as attention() "
        "returns its lse"
    )
    o = _tensor("out", out, out_shape, inputs.dtype, "(..., L, Ev)", inputs, same)
    s = _tensor("lse", lse, lse_shape, inputs.compute_dtype, "(..., L)", inputs, wide)
    go = _tensor("grad_out", grad_out, out_shape, inputs.dtype, "(..., L, Ev) like out", inputs,
                 "like out")  # fmt: skip
    gs = None
    if grad_lse is not None:
        gs = _tensor("grad_lse", grad_lse, lse_shape, inputs.compute_dtype,
                     "(..., L) like lse", inputs, "like lse")  # fmt: skip
    if readable(s) and bool(torch.isposinf(s).any()):
        raise ValueError(
            "lse: holds +inf, which no attention gives; expected finite values, -inf for a "
            "row with no key, or NaN for a row that used a NaN"
        )
    if isinstance(params, (str, bytes, torch.Tensor)) or not isinstance(params, Sequence):
        raise TypeError(
            f"params: expected a sequence of tensors (the score's parameters to "
            f"differentiate), got {type(params).__name__}"
        )
    for n, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"params: item {n} is {type(p).__name__}, expected a torch.Tensor")
        if not p.requires_grad:
            raise ValueError(
                f"params: item {n} (shape {_shape(p.shape)}) does not require grad; expected "
                "the score's parameters to differentiate (requires_grad=True)"
            )
    return o, s, go, gs, list(params)
