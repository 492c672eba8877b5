"""The additive score's inner loop, fused: ``sum_h w[h] * tanh(qh[i, h] + kh[j, h])``.

The materialized formula builds a (rows, L, S, hidden) tensor and makes three
passes over it (add, tanh, dot with ``w``). Here each (query, key) pair is one
register-resident loop over the hidden dimension, so nothing larger than a
logits tile is ever written, and tanh runs on 8 lanes at once.

The loop is compiled C (:mod:`attnkit.kernels._native`, built on first use),
vectorized with AVX2+FMA where available. When the kernel cannot be built,
:func:`status` says why and callers use :func:`logits_torch` /
:func:`grads_torch`, which chunk the hidden dimension so their temporaries stay
cache-sized. float32 on CPU only; other dtypes use the torch versions.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _native
from ._ops import define_op

__all__ = [
    "available",
    "grads",
    "grads_op",
    "grads_torch",
    "logits",
    "logits_op",
    "logits_torch",
    "status",
]

# Hidden features handled per step of the pure-torch fallback: keeps its
# (rows, bi, bj, chunk) temporaries near cache size.
TORCH_HIDDEN_CHUNK = 32


def status() -> str:
    """How the fused loop runs here: the compiled kernel, or why the pure-torch fallback."""
    return _native.status()


def available(dtype: torch.dtype, device: torch.device) -> bool:
    """True when the compiled kernel can run tensors of this dtype on this device."""
    return _native.available(dtype, device)


def logits_torch(qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Pure-torch additive logits, hidden dim in chunks.

    Args:
        qh: (R, M, H) projected queries. kh: (R, N, H) projected keys. w: (H,).
    Returns:
        (R, M, N): ``sum_h w[h] * tanh(qh[:, i, h] + kh[:, j, h])``.
    """
    R, M, H = qh.shape
    N = kh.shape[1]
    out = torch.zeros(R, M, N, dtype=qh.dtype, device=qh.device)
    for h0 in range(0, H, TORCH_HIDDEN_CHUNK):
        h1 = min(h0 + TORCH_HIDDEN_CHUNK, H)
        t = torch.tanh(qh[:, :, None, h0:h1] + kh[:, None, :, h0:h1])  # (R, M, N, h)
        out += t @ w[h0:h1]  # (R, M, N)
    return out


def grads_torch(
    qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure-torch gradients of :func:`logits_torch` for upstream gradient ``g`` (R, M, N).

    Pairs with ``g == 0`` (masked out) contribute nothing, whatever ``qh`` and ``kh``
    hold there (a NaN in a masked key stays out of the other gradients), as in the
    compiled loop.

    Returns dqh (R, M, H), dkh (R, N, H), dw (H,).
    """
    H = qh.shape[-1]
    dqh = torch.zeros_like(qh)
    dkh = torch.zeros_like(kh)
    dw = torch.zeros_like(w)
    unused = (g == 0).unsqueeze(-1)  # (R, M, N, 1)
    for h0 in range(0, H, TORCH_HIDDEN_CHUNK):
        h1 = min(h0 + TORCH_HIDDEN_CHUNK, H)
        t = torch.tanh(qh[:, :, None, h0:h1] + kh[:, None, :, h0:h1])  # (R, M, N, h)
        t.masked_fill_(unused, 0.0)
        dw[h0:h1] = torch.einsum("rmn,rmnh->h", g, t)
        d = (1 - t * t) * w[h0:h1]  # (R, M, N, h)
        d *= g[..., None]
        dqh[..., h0:h1] = d.sum(2)
        dkh[..., h0:h1] = d.sum(1)
    return dqh, dkh, dw


def _native_lib(qh: torch.Tensor, kh: torch.Tensor, *rest: torch.Tensor) -> Any:
    """The kernel library when every tensor is float32 on CPU and the shapes agree, else None.

    The kernel reads raw pointers with these sizes, so anything else (mixed dtypes, a
    w of the wrong length) takes the torch path, which checks its operands.
    """
    ts = (qh, kh, *rest)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in ts):
        return None
    if qh.ndim != 3 or kh.ndim != 3 or qh.shape[0] != kh.shape[0] or qh.shape[2] != kh.shape[2]:
        return None
    R, M, H = qh.shape
    if rest[0].shape != (H,):
        return None
    if len(rest) > 1 and rest[1].shape != (R, M, kh.shape[1]):
        return None
    return _native.library()


def logits(qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Fused additive logits (R, M, N) of qh (R, M, H), kh (R, N, H), w (H,); no autograd."""
    return logits_op(qh, kh, w)


def _logits(qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The op behind :func:`logits`: the compiled loop, or the chunked torch version."""
    lib = _native_lib(qh, kh, w)
    if lib is None:
        return logits_torch(qh, kh, w)
    R, M, H = qh.shape
    N = kh.shape[1]
    qc, kc, wc = qh.contiguous(), kh.contiguous(), w.contiguous()
    out = torch.empty(R, M, N, dtype=qh.dtype)
    lib.ak_additive_logits(
        qc.data_ptr(), kc.data_ptr(), wc.data_ptr(), out.data_ptr(),
        R, M, N, H, torch.get_num_threads(),
    )  # fmt: skip
    return out


def grads(
    qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused gradients of :func:`logits`: dqh (R, M, H), dkh (R, N, H), dw (H,)."""
    return grads_op(qh, kh, w, g)


def _grads(
    qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op behind :func:`grads`: the compiled loop, or the chunked torch version."""
    lib = _native_lib(qh, kh, w, g)
    if lib is None:
        return grads_torch(qh, kh, w, g)
    R, M, H = qh.shape
    N = kh.shape[1]
    nt = torch.get_num_threads()
    qc, kc, wc, gc = qh.contiguous(), kh.contiguous(), w.contiguous(), g.contiguous()
    dqh = torch.empty(R, M, H, dtype=qh.dtype)
    dkh_t = torch.zeros(nt, R, N, H, dtype=qh.dtype)  # one accumulator per thread
    dw_t = torch.zeros(nt, H, dtype=qh.dtype)
    lib.ak_additive_grads(
        qc.data_ptr(), kc.data_ptr(), wc.data_ptr(), gc.data_ptr(),
        dqh.data_ptr(), dkh_t.data_ptr(), dw_t.data_ptr(),
        R, M, N, H, nt,
    )  # fmt: skip
    return dqh, dkh_t.sum(0), dw_t.sum(0)


def _logits_fake(qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return qh.new_empty(qh.shape[0], qh.shape[1], kh.shape[1])  # (R, M, N)


def _grads_fake(
    qh: torch.Tensor, kh: torch.Tensor, w: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(qh), torch.empty_like(kh), torch.empty_like(w)


logits_op = define_op(
    "additive_logits(Tensor qh, Tensor kh, Tensor w) -> Tensor", _logits, _logits_fake
)
grads_op = define_op(
    "additive_grads(Tensor qh, Tensor kh, Tensor w, Tensor g) -> (Tensor, Tensor, Tensor)",
    _grads,
    _grads_fake,
)
