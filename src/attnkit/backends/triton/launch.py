"""Host side of the kernels, run inside the torch ops: arguments, grids and launches.

:class:`Operands` holds one call in kernel form (4-D strided views, the packed mask);
:func:`run_forward`, :func:`run_weights` and :func:`run_backward` launch the kernels
through :func:`launch`, the one place a kernel is launched. Kernel modules are
imported on first use, so that ``TRITON_INTERPRET`` is read when they are built.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

import torch

from .._common import clean_rows
from . import bits as _b
from .runtime import arch_of, interpreting, next_pow2, tiles_for

__all__ = ["LAUNCH_HOOK", "Operands", "launch", "run_backward", "run_forward", "run_weights"]

LaunchHook = Callable[[Any, tuple[int, ...], dict[str, Any]], None]
LAUNCH_HOOK: ContextVar[LaunchHook | None] = ContextVar("attnkit_triton_launch", default=None)
"""When set, :func:`launch` hands (kernel, grid, arguments) to it instead of launching
(the compile-only check of :mod:`.targets` compiles them for a GPU target)."""

WRAP_KERNELS: list[bool] = [False]
"""True when the ops are ``torch.library.triton_op``s: launches go through
``torch.library.wrap_triton`` so that tracing sees the kernels."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch(kernel: Any, grid: tuple[int, ...], args: dict[str, Any]) -> None:
    """Launch ``kernel`` on ``grid`` with keyword ``args`` (or hand it to the hook)."""
    hook = LAUNCH_HOOK.get()
    if hook is not None:
        hook(kernel, grid, args)
        return
    if WRAP_KERNELS[0]:
        kernel = torch.library.wrap_triton(kernel)
    if interpreting():  # Triton's interpreter patches module state while a kernel runs
        with _INTERPRETER_LOCK:
            kernel[grid](**args)
        return
    kernel[grid](**args)


_INTERPRETER_LOCK = threading.Lock()
"""One interpreted launch at a time: the interpreter is not thread-safe (launches on a
GPU are)."""


@dataclass
class Operands:
    """One call in kernel form.

    q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev): strided, unit stride on the last
    dim; kb (B, Hk, S) float32 (pre-scaled key bias) or None; w (hidden,) or None (the
    Additive score's w_v, q/k then hold the projections and E is the hidden size);
    vbad (B, Hk, S) float32 or None (1: that value row was not finite and was zeroed);
    records/keep/bias/ints: the packed mask (see :mod:`.maskargs`); scale multiplies
    the dot or Additive logits.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor | None
    kb: torch.Tensor | None
    w: torch.Tensor | None
    vbad: torch.Tensor | None
    records: torch.Tensor
    keep: torch.Tensor | None
    bias: torch.Tensor | None
    ints: list[int]
    scale: float

    @property
    def B(self) -> int:
        return int(self.q.shape[0])

    @property
    def H(self) -> int:
        return int(self.q.shape[1])

    @property
    def Hk(self) -> int:
        return int(self.k.shape[1])

    @property
    def L(self) -> int:
        return int(self.q.shape[2])

    @property
    def S(self) -> int:
        return int(self.k.shape[2])

    @property
    def E(self) -> int:
        return int(self.q.shape[3])

    @property
    def Ev(self) -> int:
        return int(self.v.shape[3]) if self.v is not None else self.E

    def _ops(self) -> int:
        ops = 0
        if self.w is not None:
            ops |= _b.ADDITIVE
        if self.kb is not None:
            ops |= _b.HAS_KB
        if self.vbad is not None:
            ops |= _b.HAS_VBAD
        if self.q.dtype == torch.float32:
            ops |= _b.IEEE
        if interpreting() and self.q.dtype == torch.bfloat16:
            ops |= _b.EMULATE_BF16
        return ops

    def args(self, kernel: str, *, values: bool = True) -> tuple[dict[str, Any], Any]:
        """Keyword arguments every kernel shares, and its tiles."""
        q, k = self.q, self.k
        R, MB, LO0, HI0, LO1, HI1 = self.ints
        dummy = self.records
        tiles = tiles_for(
            kernel,
            max(self.E, self.Ev),
            arch=arch_of(q.device),
            additive=self.w is not None,
            hidden=self.E,
            wide=q.dtype == torch.float32,
        )
        args: dict[str, Any] = {
            "Q": q,
            "K": k,
            "KB": self.kb if self.kb is not None else dummy,
            "W": self.w if self.w is not None else dummy,
            "MASK": self.records,
            "KEEP": self.keep if self.keep is not None else dummy,
            "BIAS": self.bias if self.bias is not None else dummy,
            "s_q_b": q.stride(0),
            "s_q_h": q.stride(1),
            "s_q_l": q.stride(2),
            "s_k_b": k.stride(0),
            "s_k_h": k.stride(1),
            "s_k_s": k.stride(2),
            "H": self.H,
            "L": self.L,
            "S": self.S,
            "E": self.E,
            "GROUPS": self.H // self.Hk,
            "R": R,
            "scale": float(self.scale),
            "LO0": LO0,
            "HI0": HI0,
            "LO1": LO1,
            "HI1": HI1,
            "OPS": self._ops(),
            "MB": MB,
            "E_P2": next_pow2(self.E),
            "BLOCK_M": tiles.block_m,
            "BLOCK_N": tiles.block_n,
            "BLOCK_H": tiles.block_h,
            "num_warps": tiles.num_warps,
            "num_stages": tiles.num_stages,
        }
        if values:
            v = self.v if self.v is not None else q
            args.update(
                V=v,
                s_v_b=v.stride(0),
                s_v_h=v.stride(1),
                s_v_s=v.stride(2),
                EV=self.Ev,
                EV_P2=next_pow2(self.Ev),
            )
        return args, tiles


def run_forward(op: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (B, H, L, Ev) in v's dtype and lse (B, H, L) float32 (natural log)."""
    from .forward import attention_forward_kernel

    assert op.v is not None
    B, H, L = op.B, op.H, op.L
    args, tiles = op.args("forward")
    out = torch.empty(B, H, L, op.Ev, dtype=op.v.dtype, device=op.q.device)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=op.q.device)
    args.update(VBAD=op.vbad if op.vbad is not None else op.records, OUT=out, LSE=lse)
    launch(attention_forward_kernel, (_cdiv(L, tiles.block_m), B * H), args)
    return out, lse


def run_weights(op: Operands, lse: torch.Tensor, *, mean: bool) -> torch.Tensor:
    """Exact weights exp(s - lse): (B, H, L, S) float32, or with ``mean`` the average
    over H, (B, L, S), accumulated per tile inside the kernel."""
    from .weights import attention_weights_kernel

    B, H, L, S = op.B, op.H, op.L, op.S
    args, tiles = op.args("weights", values=False)
    if mean:
        args["OPS"] |= _b.MEAN
    shape = (B, L, S) if mean else (B, H, L, S)
    out = torch.empty(shape, dtype=torch.float32, device=op.q.device)
    args.update(LSE=lse.contiguous(), OUT=out)
    grid = (_cdiv(S, tiles.block_n), _cdiv(L, tiles.block_m), B if mean else B * H)
    launch(attention_weights_kernel, grid, args)
    return out


def _finite_backward(
    op: Operands,
    out: torch.Tensor | None,
    lse: torch.Tensor,
    d_out: torch.Tensor | None,
    d_lse: torch.Tensor | None,
    d_weights: torch.Tensor | None,
    weights: torch.Tensor | None,
) -> tuple[Any, ...]:
    """The backward's inputs under the non-finite policy, with tensor operations only.

    A row whose lse is NaN (its scores use a non-finite query or key) or whose output
    is not finite (it uses a non-finite value) passes no gradient: its output, the
    gradients of its output and lse, and its weights become 0 and its lse +inf, so every
    P of the row is 0 and no ``0 * NaN`` of the row reaches a key it does not use.
    Non-finite rows of q and k are zeroed, so a pair that is masked out multiplies no
    NaN or inf. What such a row itself receives is within the poison's reach, where the
    policy makes no promise (the reference backend gives NaN, this one 0).
    """
    bad = torch.isnan(lse)  # (B, H, L)
    if out is not None:
        bad = bad | ~torch.isfinite(out).all(dim=-1)
    zero = torch.zeros((), dtype=torch.float32, device=lse.device)

    def rows_zeroed(t: torch.Tensor | None) -> torch.Tensor | None:  # (B, H, L, ...) or None
        if t is None:
            return None
        flags = bad.reshape(*bad.shape, *([1] * (t.ndim - 3)))  # (B, H, L, 1...)
        return torch.where(flags, zero.to(t.dtype), t)

    op = replace(op, q=clean_rows(op.q)[0], k=clean_rows(op.k)[0])  # non-finite rows zeroed
    lse = torch.where(bad, float("inf"), lse)
    return (
        op, rows_zeroed(out), lse, rows_zeroed(d_out), rows_zeroed(d_lse),
        rows_zeroed(d_weights), rows_zeroed(weights),
    )  # fmt: skip


def run_backward(
    op: Operands,
    out: torch.Tensor | None,
    lse: torch.Tensor,
    d_out: torch.Tensor | None,
    d_lse: torch.Tensor | None,
    d_weights: torch.Tensor | None,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of q, k, v, kb and w from (out, lse) and the gradients of the output
    (B, H, L, Ev), of the lse (B, H, L) and of the weights (B, H, L, S), each optional
    (``weights``, the forward's, go with ``d_weights``).

    Returns dq (B, H, L, E), dk (B, Hk, S, E), dv (B, Hk, S, Ev) in the operands'
    dtypes (dv float32 zeros without v), dkb (B, Hk, S) float32 or None, dw (hidden,) or
    None."""
    from .backward import attention_backward_dkdv_kernel, attention_backward_dq_kernel

    op, out, lse, d_out, d_lse, d_weights, weights = _finite_backward(
        op, out, lse, d_out, d_lse, d_weights, weights
    )
    B, H, Hk, L, S, E, Ev = op.B, op.H, op.Hk, op.L, op.S, op.E, op.Ev
    dev, f32 = op.q.device, torch.float32
    args, tiles = op.args("dkdv")
    dq_args, dq_tiles = op.args("dq")
    ops_bits = args["OPS"]
    delta = torch.zeros(B, H, L, dtype=f32, device=dev)
    if d_out is not None and out is not None:
        delta = (d_out.float() * out.float()).sum(dim=-1)  # (B, H, L)
        ops_bits |= _b.HAS_DO
    if d_lse is not None:
        delta = delta - d_lse.float()
    if d_weights is not None:
        ops_bits |= _b.HAS_DW
        if weights is not None:
            delta = delta + (d_weights.float() * weights.float()).sum(dim=-1)
    shared = {
        "OPS": ops_bits,
        "DO": d_out.contiguous() if d_out is not None else op.records,
        "LSE": lse.contiguous(),
        "DELTA": delta.contiguous(),
        "DWG": d_weights.contiguous() if d_weights is not None else op.records,
    }
    additive = op.w is not None
    new = torch.zeros if additive else torch.empty
    dq = new(B, H, L, E, dtype=f32, device=dev)
    dk = new(B, H, S, E, dtype=f32, device=dev)
    dv = torch.empty(B, H, S, Ev, dtype=f32, device=dev)
    dkb = torch.empty(B, H, S, dtype=f32, device=dev) if op.kb is not None else None
    n_blocks = _cdiv(S, tiles.block_n)
    dwv = torch.zeros(B * H, n_blocks, E, dtype=f32, device=dev) if additive else None
    launch(
        attention_backward_dkdv_kernel,
        (n_blocks, B * H),
        {**args, **shared, "DK": dk, "DV": dv, "DKB": dkb if dkb is not None else dv,
         "DWV": dwv if dwv is not None else dv},
    )  # fmt: skip
    grid = (_cdiv(L, dq_tiles.block_m), B * H)
    launch(attention_backward_dq_kernel, grid, {**dq_args, **shared, "DQ": dq})
    groups = H // Hk

    def per_kv_head(g: torch.Tensor) -> torch.Tensor:  # (B, H, ...) -> (B, Hk, ...)
        return g.reshape(B, Hk, groups, *g.shape[2:]).sum(dim=2) if groups > 1 else g

    return (
        dq.to(op.q.dtype),
        per_kv_head(dk).to(op.k.dtype),
        per_kv_head(dv).to(op.v.dtype if op.v is not None else f32),
        per_kv_head(dkb) if dkb is not None else None,
        dwv.sum(dim=(0, 1)).to(op.w.dtype) if dwv is not None and op.w is not None else None,
    )
