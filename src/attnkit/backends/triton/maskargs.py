"""A mask as kernel arguments: one band, per-batch lengths, dense tiles.

Every kernel takes the same mask arguments (see :func:`mask_arguments`):

- ``LO``/``HI`` with ``HAS_LO``/``HAS_HI``: the intersection of every causal and
  window part, key j kept for query i iff ``i + LO <= j <= i + HI`` (a side with
  no bound is off). It gives every query block its key range and every key block
  its query range, so blocks outside it are never visited;
- ``KLEN`` (B0,), ``QLEN`` (B0,), ``RLEN`` (B0, L), ``KKEEP`` (B0, S): valid_lens
  for keys / queries / per query, and key_padding's kept keys, for batch element
  ``b0 = row // R`` (rows flattened, R rows per batch element). Lengths also cut
  each block's loop bounds, inside the kernel (no host read);
- ``KEEP`` and ``BIAS``: dense tensors (every keep part and-ed, every bias part
  summed) as 4-D (B, H, L, S) strided views, stride 0 where they broadcast,
  loaded tile by tile.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import masks as _masks
from .layout import bh_view

__all__ = ["mask_arguments"]


def _flag(name: str, t: torch.Tensor | None, dummy: torch.Tensor) -> dict[str, Any]:
    return {name: t if t is not None else dummy, f"HAS_{name}": t is not None}


def mask_arguments(
    mask: _masks.Mask | None,
    L: int,
    S: int,
    batch_shape: tuple[int, ...],
    device: torch.device,
    dummy: torch.Tensor,
) -> dict[str, Any]:
    """Keyword arguments describing ``mask`` to every kernel of this package.

    ``dummy`` stands in for absent tensors (never read: the ``HAS_*`` flag is off).
    """
    parts = mask.parts() if mask is not None else ()
    lo: int | None = None
    hi: int | None = None
    klen: torch.Tensor | None = None
    qlen: torch.Tensor | None = None
    rlen: torch.Tensor | None = None
    kkeep: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    for part in parts:
        if isinstance(part, _masks.WindowMask):  # causal included
            shift = part.offset(L, S)
            if part.left is not None:
                lo = shift - part.left if lo is None else max(lo, shift - part.left)
            if part.right is not None:
                hi = shift + part.right if hi is None else min(hi, shift + part.right)
        elif isinstance(part, _masks.ValidLensMask):
            lens = part.lens.to(device)
            if lens.ndim == 2:
                rlen = lens if rlen is None else torch.minimum(rlen, lens)  # (B0, L)
            else:
                klen = lens if klen is None else torch.minimum(klen, lens)  # (B0,)
            if part.query_lens is not None:
                ql = part.query_lens.to(device)
                qlen = ql if qlen is None else torch.minimum(qlen, ql)  # (B0,)
        elif isinstance(part, _masks.KeyPaddingMask):
            kept = ~part.padding.to(device)  # (B0, S)
            kkeep = kept if kkeep is None else kkeep & kept
        elif isinstance(part, _masks.KeepMask):
            t = part.tensor.to(device)
            keep = t if keep is None else keep & t
        elif isinstance(part, _masks.BiasMask):
            t = part.tensor.to(device)
            bias = t if bias is None else bias + t
        else:
            raise TypeError(f"triton backend: no kernel form for mask {type(part).__name__}")
    B0 = batch_shape[0] if batch_shape else 1
    rows_per_b0 = max(math.prod(batch_shape) // max(B0, 1), 1)
    args: dict[str, Any] = {
        "LO": lo if lo is not None else 0,
        "HI": hi if hi is not None else 0,
        "HAS_LO": lo is not None,
        "HAS_HI": hi is not None,
        "R": rows_per_b0,
    }
    args.update(_flag("KLEN", klen.contiguous() if klen is not None else None, dummy))
    args.update(_flag("QLEN", qlen.contiguous() if qlen is not None else None, dummy))
    args.update(_flag("RLEN", rlen.contiguous() if rlen is not None else None, dummy))
    kk = kkeep.contiguous().view(torch.uint8) if kkeep is not None else None  # (B0, S)
    args.update(_flag("KKEEP", kk, dummy))
    args["s_rlen_b"] = L
    args["s_kkeep_b"] = S
    for name, dense in (("KEEP", keep), ("BIAS", bias)):
        if dense is not None:
            if dense.ndim == 1:
                dense = dense.unsqueeze(0)  # (1, S)
            t4 = bh_view(dense, batch_shape)  # (B, H, L or 1, S or 1)
            t4 = t4.expand(t4.shape[0], t4.shape[1], L, S)  # (B, H, L, S), stride 0 if broadcast
            if t4.dtype == torch.bool:
                t4 = t4.view(torch.uint8)  # same bytes, a loadable element type
            args.update(_flag(name, t4, dummy))
            strides = t4.stride()
        else:
            args.update(_flag(name, None, dummy))
            strides = (0, 0, 0, 0)
        low = name.lower()
        for axis, st in zip(("b", "h", "l", "s"), strides, strict=True):
            args[f"s_{low}_{axis}"] = st
    return args
