"""Host side of the kernels: 4-D views, shared keyword arguments, grids and launches.

:class:`KernelCall` holds one call's operands as (B, H, X, D) strided views (see
:mod:`.layout`), the mask's kernel arguments (see :mod:`.maskargs`) and the
shapes; its methods launch the forward, weights and backward kernels. Kernel
modules are imported here, on first use, so that ``TRITON_INTERPRET`` is read when
the kernels are built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ... import masks as _masks
from .layout import bh_shape, bh_view, kv_lead
from .maskargs import mask_arguments
from .runtime import interpreting, next_pow2, tiles_for

__all__ = ["KernelCall"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class KernelCall:
    """One attention call in kernel form.

    Operands (rows flattened to (B, H) by :func:`.layout.bh_view`, not copied):
    qa (B, H, L, E), ka (B, Hk, S, E), v (B, Hk, S, Ev), kb (B, Hk, 1, S) or None
    (pre-scaled key bias), w (hidden,) or None (the Additive score's w_v, with
    ``E`` its hidden size). ``scale`` multiplies the dot or Additive logits.
    """

    qa: torch.Tensor
    ka: torch.Tensor
    v: torch.Tensor
    kb: torch.Tensor | None
    w: torch.Tensor | None
    scale: float
    batch_shape: tuple[int, ...]
    groups: int
    L: int
    S: int
    mask_args: dict[str, Any] = field(default_factory=dict)
    vbad: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        qa: torch.Tensor,
        ka: torch.Tensor,
        v: torch.Tensor,
        kb: torch.Tensor | None,
        w: torch.Tensor | None,
        *,
        scale: float,
        mask: _masks.Mask | None,
        batch_shape: tuple[int, ...],
        groups: int,
        vbad: torch.Tensor | None = None,
    ) -> KernelCall:
        """Views of qa (*Bq, L, E), ka (*Bk, S, E), v (*Bk, S, Ev), kb (*Bk, 1, S), and
        vbad (*Bk, S, 1) float32 (1 where a value row was not finite and was zeroed) or
        None (every value finite)."""
        lead_kv = kv_lead(batch_shape, groups)
        L, S = qa.shape[-2], ka.shape[-2]
        q4 = bh_view(qa, batch_shape)  # (B, H, L, E)
        return cls(
            qa=q4,
            ka=bh_view(ka, lead_kv),  # (B, Hk, S, E)
            v=bh_view(v, lead_kv),  # (B, Hk, S, Ev)
            kb=bh_view(kb, lead_kv) if kb is not None else None,  # (B, Hk, 1, S)
            w=w.contiguous() if w is not None else None,
            scale=float(scale),
            batch_shape=batch_shape,
            groups=groups,
            L=L,
            S=S,
            mask_args=mask_arguments(mask, L, S, batch_shape, qa.device, q4),
            vbad=bh_view(vbad, lead_kv) if vbad is not None else None,  # (B, Hk, S, 1)
        )

    # ------------------------------------------------------------------ shared

    @property
    def BH(self) -> tuple[int, int]:
        return bh_shape(self.batch_shape)

    @property
    def additive(self) -> bool:
        return self.w is not None

    @property
    def E(self) -> int:
        return int(self.qa.shape[-1])

    @property
    def Ev(self) -> int:
        return int(self.v.shape[-1])

    def _precision(self) -> str:
        # float32 operands: full-precision products (no TF32), like torch's own matmul
        return "ieee" if self.qa.dtype == torch.float32 else "tf32"

    def _common(self, kernel: str) -> tuple[dict[str, Any], Any]:
        H = self.BH[1]
        q, k = self.qa, self.ka
        kb = self.kb if self.kb is not None else q
        tiles = tiles_for(
            kernel,
            max(self.E, self.Ev),
            additive=self.additive,
            hidden=self.E,
            wide=q.dtype == torch.float32,
        )
        args: dict[str, Any] = {
            "Q": q,
            "K": k,
            "KB": kb,
            "W": self.w if self.w is not None else q,
            "s_q_b": q.stride(0),
            "s_q_h": q.stride(1),
            "s_q_l": q.stride(2),
            "s_q_e": q.stride(3),
            "s_k_b": k.stride(0),
            "s_k_h": k.stride(1),
            "s_k_s": k.stride(2),
            "s_k_e": k.stride(3),
            "s_kb_b": kb.stride(0) if self.kb is not None else 0,
            "s_kb_h": kb.stride(1) if self.kb is not None else 0,
            "s_kb_s": kb.stride(3) if self.kb is not None else 0,
            "H": H,
            "L": self.L,
            "S": self.S,
            "E": self.E,
            "GROUPS": self.groups,
            "scale": self.scale,
            "ADDITIVE": self.additive,
            "HAS_KB": self.kb is not None,
            "PRECISION": self._precision(),
            "UPCAST": interpreting() and q.dtype == torch.bfloat16,
            "E_P2": next_pow2(self.E),
            "BLOCK_M": tiles.block_m,
            "BLOCK_N": tiles.block_n,
            "BLOCK_H": tiles.block_h,
            "num_warps": tiles.num_warps,
            "num_stages": tiles.num_stages,
            **self.mask_args,
        }
        return args, tiles

    def _value_args(self) -> dict[str, Any]:
        v = self.v
        return {
            "V": v,
            "s_v_b": v.stride(0),
            "s_v_h": v.stride(1),
            "s_v_s": v.stride(2),
            "s_v_e": v.stride(3),
            "EV": self.Ev,
            "EV_P2": next_pow2(self.Ev),
        }

    # ------------------------------------------------------------------ kernels

    def forward(self, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Output (B, H, L, Ev) in ``out_dtype`` and lse (B, H, L) float32 (natural log)."""
        from .forward import attention_forward_kernel

        B, H = self.BH
        args, tiles = self._common("forward")
        dev = self.qa.device
        out = torch.empty(B, H, self.L, self.Ev, dtype=out_dtype, device=dev)
        lse = torch.empty(B, H, self.L, dtype=torch.float32, device=dev)
        args.update(self._value_args())
        vb = self.vbad if self.vbad is not None else lse
        args.update(
            OUT=out,
            LSE=lse,
            VBAD=vb,
            s_vb_b=vb.stride(0) if self.vbad is not None else 0,
            s_vb_h=vb.stride(1) if self.vbad is not None else 0,
            s_vb_s=vb.stride(2) if self.vbad is not None else 0,
            HAS_VBAD=self.vbad is not None,
        )
        for axis, st in zip(("b", "h", "l", "e"), out.stride(), strict=True):
            args[f"s_o_{axis}"] = st
        grid = (_cdiv(self.L, tiles.block_m), B * H)
        attention_forward_kernel[grid](**args)
        return out, lse

    def weights(self, lse: torch.Tensor, *, mean: bool) -> torch.Tensor:
        """Exact weights exp(s - lse): (B, H, L, S) float32, or with ``mean`` the average
        over H, (B, L, S), accumulated per tile inside the kernel."""
        from .weights import attention_weights_kernel

        B, H = self.BH
        args, tiles = self._common("weights")
        shape = (B, self.L, self.S) if mean else (B, H, self.L, self.S)
        out = torch.empty(shape, dtype=torch.float32, device=self.qa.device)
        args.update(LSE=lse.contiguous(), OUT=out, MEAN=mean)
        grid = (_cdiv(self.L, tiles.block_m), _cdiv(self.S, tiles.block_n), B if mean else B * H)
        attention_weights_kernel[grid](**args)
        return out

    def backward(
        self,
        d_out: torch.Tensor,
        lse: torch.Tensor,
        delta: torch.Tensor,
        d_weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per-query-head float32 gradients: dqa (B, H, L, E), dka (B, H, S, E),
        dv (B, H, S, Ev), dkb (B, H, 1, S) or None, dw (hidden,) or None.

        d_out (B, H, L, Ev); lse, delta (B, H, L) float32; d_weights (B, H, L, S) or None.
        """
        from .backward import attention_backward_dkdv_kernel, attention_backward_dq_kernel

        B, H = self.BH
        L, S, E, Ev = self.L, self.S, self.E, self.Ev
        dev = self.qa.device
        args, tiles = self._common("backward")
        args.update(self._value_args())
        dw_out = d_weights if d_weights is not None else self.qa
        args.update(
            DO=d_out,
            LSE=lse.contiguous(),
            DELTA=delta.contiguous(),
            DW_OUT=dw_out,
            HAS_DW=d_weights is not None,
        )
        for axis, st in zip(("b", "h", "l", "e"), d_out.stride(), strict=True):
            args[f"s_do_{axis}"] = st
        dw_strides = d_weights.stride() if d_weights is not None else (0, 0, 0, 0)
        for axis, st in zip(("b", "h", "l", "s"), dw_strides, strict=True):
            args[f"s_dw_{axis}"] = st
        f32 = torch.float32
        additive = self.additive
        dq = (torch.zeros if additive else torch.empty)(B, H, L, E, dtype=f32, device=dev)
        dk = (torch.zeros if additive else torch.empty)(B, H, S, E, dtype=f32, device=dev)
        dv = torch.empty(B, H, S, Ev, dtype=f32, device=dev)
        dkb = torch.empty(B, H, 1, S, dtype=f32, device=dev) if self.kb is not None else None
        n_blocks = _cdiv(S, tiles.block_n)
        dwv = torch.zeros(B * H, n_blocks, E, dtype=f32, device=dev) if additive else None
        attention_backward_dkdv_kernel[(n_blocks, B * H)](
            DK=dk,
            DV=dv,
            DKB=dkb if dkb is not None else dv,
            DWV=dwv if dwv is not None else dv,
            **args,
        )
        attention_backward_dq_kernel[(_cdiv(L, tiles.block_m), B * H)](DQ=dq, **args)
        dw = dwv.sum(dim=(0, 1)) if dwv is not None else None  # (hidden,)
        return dq, dk, dv, dkb, dw
