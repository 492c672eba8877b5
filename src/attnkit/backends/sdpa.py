"""The SDPA backend: torch.nn.functional.scaled_dot_product_attention.

Runs every score that reduces exactly to a dot product (dot, scaled dot,
bilinear, Gaussian), in one of two ways:

- **unpadded**: when the mask is only ``valid_lens`` (one length per batch
  element, with or without ``queries=True``), ``key_padding`` and/or a
  top-left ``causal()`` (not with ``key_padding``), each batch element keeps
  only its own queries and keys, and elements of similar lengths are grouped
  into one call (see :func:`_group_lengths`), so SDPA sees (almost) no padding
  and the padded rows and columns cost nothing;
- **dense**: otherwise. A top-left causal mask alone stays symbolic
  (``is_causal=True``, which lets the kernel skip the upper triangle); other
  masks are materialized into SDPA's ``attn_mask``. Fully masked rows get a
  harmless all-keep row for the kernel and their output is then set to 0, so
  neither the output nor the gradients see NaN.

Staying on torch's fused CPU kernel: inputs are viewed as 4-D, unequal query
and value head sizes are zero-padded to one size, and a score's key bias (the
Gaussian's ``-‖k‖²/2σ²``) is a (..., 1, S) row the kernel broadcasts, or,
under a mask, one extra feature (``[q', 1]·[k', b]``); never an (L, S) bias.
Otherwise torch falls back to plain math.

In automatic dispatch it passes over what it would compute densely and
wastefully (window masks, bottom-right causal with L != S, causal combined
with other masks) when the chunked backend, which skips those blocks, can run
the call; forced by name it still runs them, densely.

Weights and lse: the log-sum-exp comes from torch's CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, a private op, used
only when present), and weights are then recomputed exactly in a second pass
as ``exp(scale * q k^T + bias - lse)``; no softmax is materialized in the
forward. Returned weights are differentiable (their backward is the softmax
backward, computed from the weights themselves); the lse is not, so a call
that needs both the lse and gradients goes to another backend.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from .. import masks as _masks
from .._host import readable
from .._inputs import AttentionInputs
from ..kernels.softmax import exp_rows_
from ._common import dense_mask, expand_kv
from ._dotform import dot_form_in_compute_dtype
from .base import AttentionResult, Backend

__all__ = ["SDPABackend", "has_lse_kernel"]

_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


def _lse_op() -> Any:
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):  # pragma: no cover - older or newer torch
        return None


_LSE_OP = _lse_op()


def has_lse_kernel(device: torch.device) -> bool:
    """True when SDPA can also give the log-sum-exp on this device (CPU flash op)."""
    return _LSE_OP is not None and device.type == "cpu"


class _SoftmaxFromLse(torch.autograd.Function):
    """weights = exp(logits - lse) with the softmax backward; lse is treated as given.

    logits (..., L, S) with -inf where blocked; lse (..., L), finite or -inf.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        safe = torch.where(torch.isfinite(lse), lse, torch.zeros((), dtype=lse.dtype))
        weights = logits.contiguous().clone()  # (..., L, S)
        exp_rows_(weights, safe, want_sum=False)
        ctx.save_for_backward(weights)
        return weights

    @staticmethod
    def backward(ctx: Any, d_weights: torch.Tensor) -> tuple[torch.Tensor, None]:
        (weights,) = ctx.saved_tensors
        row = (d_weights * weights).sum(dim=-1, keepdim=True)  # (..., L, 1)
        return weights * (d_weights - row), None


def _weights_from_lse(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Exact weights (..., L, S) from masked logits (..., L, S) and lse (..., L)."""
    lse = lse.to(logits.dtype)  # (..., L)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _SoftmaxFromLse.apply(logits, lse.detach())
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros((), dtype=lse.dtype))
    logits = logits.contiguous()
    exp_rows_(logits, safe, want_sum=False)
    return logits


def _weights_of_call(
    inputs: AttentionInputs,
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    gqa: bool,
    alive: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact weights (..., L, S) of one SDPA call, recomputed from the lse it returned.

    q (..., L, E'), k (..., S, E') as given to the call (k with its own heads when
    ``gqa``), lse (..., L); ``attn_mask``/``is_causal`` exactly as the call had them,
    ``alive`` (..., L, 1) marking rows that keep at least one key.
    """
    cd = inputs.compute_dtype
    kf = expand_kv(k, inputs.groups) if gqa else k  # (..., S, E')
    qs = q.to(cd) * inputs.scale  # (..., L, E'): scaled here, not on (L, S)
    logits = torch.matmul(qs, kf.to(cd).transpose(-2, -1))  # (..., L, S)
    keep: torch.Tensor | None = None
    if is_causal:
        L, S = logits.shape[-2], logits.shape[-1]
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()  # (L, S)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask
    elif attn_mask is not None:
        logits = logits + attn_mask.to(cd)
        keep = attn_mask > float("-inf")
    if alive is not None:
        keep = alive if keep is None else keep & alive
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    return _weights_from_lse(logits, lse.to(cd))


def _to4d(t: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (B', H, N, D) for the 4-D flash op."""
    if t.ndim == 4:
        return t
    if t.ndim < 4:
        return t.reshape(*([1] * (4 - t.ndim)), *t.shape)  # (1.., H, N, D)
    return t.reshape(-1, *t.shape[-3:])  # (B', H, N, D)


def _call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float,
    gqa: bool,
    want_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SDPA on equal leading dims: out (..., L, Ev) and, with ``want_lse``, lse (..., L)."""
    E, Ev = q.shape[-1], v.shape[-1]
    if E != Ev:  # the fused CPU kernels need one head size (else: plain math); zeros are free
        if E > Ev:
            v = F.pad(v, (0, E - Ev))  # (..., S, E)
        else:
            q, k = F.pad(q, (0, Ev - E)), F.pad(k, (0, Ev - E))  # (..., L or S, Ev)
        out, lse = _call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                         scale=scale, gqa=gqa, want_lse=want_lse)  # fmt: skip
        return out[..., :Ev], lse
    mask_grad = attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled()
    if want_lse and (mask_grad or dropout_p > 0):
        # The lse kernel takes no gradient for attn_mask (a Gaussian key bias has one) and
        # no dropout: the output through the public path, the lse (of the logits before
        # dropout, never differentiated) apart.
        out, _ = _call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                       scale=scale, gqa=gqa, want_lse=False)  # fmt: skip
        with torch.no_grad():
            _, lse = _call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=0.0,
                           scale=scale, gqa=gqa, want_lse=True)  # fmt: skip
        return out, lse
    if want_lse and math.prod(q.shape[:-2]) == 0:
        # An empty batch: nothing to compute, and the lse op would divide by zero (SIGFPE).
        out, _ = _call(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                       scale=scale, gqa=gqa, want_lse=False)  # fmt: skip
        return out, q.new_zeros(q.shape[:-1])  # (..., L): no rows
    if want_lse:
        if gqa:
            g = q.shape[-3] // k.shape[-3]
            k, v = expand_kv(k, g), expand_kv(v, g)  # (..., Hq, S, D)
        lead = q.shape[:-2]
        m4 = None
        if attn_mask is not None:
            full = attn_mask.expand(*lead, *attn_mask.shape[-2:])  # (..., L or 1, S)
            m4 = _to4d(full)  # (B', H, L or 1, S)
            if m4.dtype == torch.bool:
                zero = torch.zeros((), dtype=q.dtype, device=q.device)
                m4 = torch.where(m4, zero, float("-inf"))  # (B', H, L or 1, S)
            else:
                m4 = m4.to(q.dtype)
        # The private op trusts its inputs' layout (permuted views give wrong results):
        # hand it contiguous tensors, as the public entry point would.
        q4, k4, v4 = (_to4d(t).contiguous() for t in (q, k, v))  # (B', H, N, D)
        m4 = m4.contiguous() if m4 is not None else None
        out, lse = _LSE_OP(q4, k4, v4, dropout_p, is_causal, attn_mask=m4, scale=scale)
        out = out.reshape(*lead, *out.shape[-2:])  # (..., L, Ev)
        return out, lse.reshape(*lead, lse.shape[-1])  # (..., L)
    kwargs = {"enable_gqa": True} if gqa else {}
    lead = q.shape[:-2]
    if q.ndim != 4:  # torch's fused CPU kernels take 4-D inputs only; others run plain math
        if attn_mask is not None and (q.ndim > 4 or attn_mask.ndim > q.ndim):
            attn_mask = _to4d(attn_mask.expand(*lead, *attn_mask.shape[-2:]))  # (B', H, L, S)
        q, k, v = _to4d(q), _to4d(k), _to4d(v)  # (B', H, N, D)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        **kwargs,
    )  # fmt: skip
    return out.reshape(*lead, *out.shape[-2:]), None  # (..., L, Ev)


def _unpadded_parts(inputs: AttentionInputs) -> bool:
    """True when every mask part lets each batch element run on its own kept keys."""
    parts = inputs.mask_parts
    if not parts or not inputs.batch_shape or torch.compiler.is_compiling():
        return False  # (under torch.compile: the lengths would be data-dependent shapes)
    kinds = [p.kind for p in parts]
    if not any(k in ("valid_lens", "key_padding") for k in kinds):
        return False
    for p in parts:
        if isinstance(p, _masks.ValidLensMask):
            if p.lens.ndim != 1 or not readable(p.lens):
                return False
            if p.query_lens is not None and not torch.equal(p.query_lens, p.lens):
                return False
        elif isinstance(p, _masks.CausalMask):
            if p.offset(inputs.L, inputs.S) != 0 or "key_padding" in kinds:
                return False
        elif not isinstance(p, _masks.KeyPaddingMask) or not readable(p.padding):
            return False
    return True


class SDPABackend(Backend):
    """torch's fused scaled-dot-product attention for dot-reducible scores."""

    name: ClassVar[str] = "sdpa"
    device_types: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda"})
    any_score: ClassVar[bool] = False

    def not_supported_reasons(self, inputs: AttentionInputs) -> list[str]:
        reasons = super().not_supported_reasons(inputs)
        if (inputs.return_lse or inputs.return_weights) and not has_lse_kernel(inputs.device):
            reasons.append("no kernel returning the log-sum-exp on this device (weights/lse)")
        if inputs.return_lse and inputs.needs_grad:
            reasons.append("the fused kernel's lse is not differentiable (return_lse with grad)")
        return reasons

    def materialized_masks(self, inputs: AttentionInputs) -> list[str]:
        """Mask parts SDPA would build as a dense (L, S) tensor."""
        parts = inputs.mask_parts
        if not parts:
            return []
        out: list[str] = []
        L, S = inputs.L, inputs.S
        for p in parts:
            if isinstance(p, _masks.CausalMask):
                if not p.symbolic_causal(L, S):
                    out.append("a shifted (bottom-right, L != S, or offset) causal mask")
                elif len(parts) > 1 and not _unpadded_parts(inputs):
                    out.append("a causal mask combined with another mask")
            elif isinstance(p, _masks.WindowMask):
                out.append("a window mask")
        padded = any(p.kind in ("valid_lens", "key_padding") for p in parts)
        if padded and inputs.device.type != "cpu" and not _unpadded_parts(inputs):
            out.append("padding (unpadding would read lengths on the host)")
        return out

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        if (inputs.return_lse or inputs.return_weights) and inputs.dtype != inputs.compute_dtype:
            # weights and lse are float32 for half inputs: computed from float32 logits
            q, k, key_bias, rc = dot_form_in_compute_dtype(inputs, row_constant=inputs.return_lse)
        else:
            q, k, key_bias = inputs.score.dot_form(inputs.query, inputs.key)
            rc = inputs.score.row_constant(inputs.query, inputs.key) if inputs.return_lse else None
        if key_bias is not None and inputs.mask is not None:
            # q'·k' + b == [q', 1]·[k', b]: one more feature instead of an (L, S) bias mask
            kb = key_bias.transpose(-2, -1)  # (..., S, 1)
            lead = torch.broadcast_shapes(k.shape[:-1], kb.shape[:-1])
            k = torch.cat(
                [k.expand(*lead, k.shape[-1]), kb.expand(*lead, 1)], dim=-1
            )  # (..., S, E'+1)
            q = torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1)  # (..., L, E'+1)
            key_bias = None
        if _unpadded_parts(inputs):
            out, weights, lse = self._forward_unpadded(inputs, q, k)  # key bias folded above
        else:
            out, weights, lse = self._forward_dense(inputs, q, k, key_bias)
        if lse is not None and inputs.return_lse:
            lse = lse.to(inputs.compute_dtype)
            if rc is not None:
                lse = lse + (rc.to(inputs.compute_dtype) * inputs.scale).expand_as(lse)
        return AttentionResult(
            output=out.to(inputs.dtype),
            weights=weights if inputs.return_weights else None,
            lse=lse if inputs.return_lse else None,
        )

    # ------------------------------------------------------------------ dense

    def _forward_dense(
        self,
        inputs: AttentionInputs,
        q: torch.Tensor,
        k: torch.Tensor,
        key_bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        v = inputs.value.to(q.dtype)
        batch, L, S = inputs.batch_shape, inputs.L, inputs.S
        want_lse = inputs.return_lse or inputs.return_weights

        attn_mask: torch.Tensor | None = None
        is_causal = False
        alive: torch.Tensor | None = None  # (*batch, L, 1) rows with at least one key
        mask = inputs.mask
        if key_bias is None and mask is not None and len(mask.parts()) == 1:
            is_causal = mask.symbolic_causal(L, S)
        if key_bias is not None and mask is None:
            # one row per key, (..., 1, S): the fused kernel broadcasts it over the queries
            if inputs.groups > 1 and key_bias.ndim >= 3 and key_bias.shape[-3] != 1:
                key_bias = expand_kv(key_bias, inputs.groups)  # (..., Hq, 1, S)
            attn_mask = key_bias * inputs.scale  # (..., 1, S)
        elif (mask is not None and not is_causal) or key_bias is not None:
            dm = dense_mask(inputs)
            if dm.bias is None and key_bias is None:
                keep = dm.keep
                assert keep is not None
                if keep.ndim < 2:  # a (S,) row: SDPA and the lse op need (..., L or 1, S)
                    keep = keep.unsqueeze(-2)  # (1, S)
                alive = keep.any(dim=-1, keepdim=True)  # (..., L or 1, 1)
                attn_mask = keep | ~alive  # dead rows attend everywhere, zeroed below
            else:
                bias = torch.zeros((), dtype=q.dtype, device=q.device)
                if key_bias is not None:
                    bias = bias + key_bias * inputs.scale  # (..., 1, S)
                if dm.bias is not None:
                    bias = bias + dm.bias.to(q.dtype)
                if dm.keep is not None:
                    bias = bias.masked_fill(~dm.keep, float("-inf"))
                bias = bias.expand(*bias.shape[:-2], L, S) if bias.ndim >= 2 else bias.expand(L, S)
                alive = (bias > float("-inf")).any(dim=-1, keepdim=True)  # (..., L, 1)
                attn_mask = bias.masked_fill(~alive, 0.0)  # dead rows: zeroed below

        gqa = inputs.groups > 1 and _HAS_GQA
        if inputs.groups > 1 and not _HAS_GQA:
            k = expand_kv(k, inputs.groups)  # (..., Hq, S, E)
            v = expand_kv(v, inputs.groups)  # (..., Hq, S, Ev)
        # SDPA's fused kernels need equal leading dims: broadcast views, no copies.
        q = q.expand(*batch, L, q.shape[-1])  # (*batch, L, E')
        kv_batch = (*batch[:-1], k.shape[-3]) if batch and gqa else batch
        k = k.expand(*kv_batch, S, k.shape[-1])  # (*kv_batch, S, E')
        v = v.expand(*kv_batch, S, v.shape[-1])  # (*kv_batch, S, Ev)
        out, lse = _call(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=is_causal,
            dropout_p=inputs.dropout_p,
            scale=inputs.scale,
            gqa=gqa,
            want_lse=want_lse,
        )  # (*batch, L, Ev), (*batch, L)
        zero = torch.zeros((), dtype=out.dtype, device=out.device)
        if alive is not None:  # no host sync: stays torch.compile friendly
            out = torch.where(alive, out, zero)
            if lse is not None:
                lse = torch.where(alive.squeeze(-1), lse, float("-inf"))
        weights = None
        if inputs.return_weights:
            assert lse is not None
            weights = _weights_of_call(
                inputs, q, k, lse, attn_mask=attn_mask, is_causal=is_causal, gqa=gqa, alive=alive
            )  # (*batch, L, S)
        return out, weights, lse

    # ------------------------------------------------------------------ unpadded

    def _forward_unpadded(
        self, inputs: AttentionInputs, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """SDPA on each batch element's kept queries and keys, similar lengths grouped.

        This path always has a mask, so a score's key bias already rides in q and k
        as one extra feature (see :meth:`forward`).

        Batch elements are sorted by length and grouped (see :func:`_group_lengths`)
        so a few SDPA calls cover the batch with little padding left inside a group.
        """
        batch, L, S = inputs.batch_shape, inputs.L, inputs.S
        B = batch[0]
        cd = inputs.compute_dtype
        dev = q.device
        want_lse = inputs.return_lse or inputs.return_weights
        # With one leading dim, the batch dim that is sliced per element is the head dim
        # itself: each query head needs its key head materialized at its own index.
        gqa = inputs.groups > 1 and _HAS_GQA and len(batch) > 1
        v = inputs.value.to(q.dtype)
        if inputs.groups > 1 and not gqa:
            k, v = expand_kv(k, inputs.groups), expand_kv(v, inputs.groups)  # (..., Hq, S, D)
        kv_batch = (*batch[:-1], k.shape[-3]) if gqa else batch
        q = q.expand(*batch, L, q.shape[-1])  # (B, ..., L, E')
        k = k.expand(*kv_batch, S, k.shape[-1])  # (B, ..., S, E')
        v = v.expand(*kv_batch, S, v.shape[-1])  # (B, ..., S, Ev)
        q_len, k_len, key_idx, causal = _unpadded_lengths(inputs, dev)
        out_full = torch.zeros(*batch, L, v.shape[-1], dtype=inputs.dtype, device=dev)
        lse_full = (
            torch.full((*batch, L), float("-inf"), dtype=cd, device=dev) if want_lse else None
        )
        w_full = torch.zeros(*batch, L, S, dtype=cd, device=dev) if inputs.return_weights else None
        live = [b for b in range(B) if q_len[b] > 0 and k_len[b] > 0]
        head_work = inputs.E * max(1, math.prod(batch[1:]))
        for members in _group_lengths(live, q_len, k_len, head_work):
            qm = max(q_len[b] for b in members)
            km = max(k_len[b] for b in members)
            q_g = torch.stack([q[b, ..., :qm, :] for b in members])  # (G, ..., qm, E')
            k_g = torch.stack(
                [_take_keys(k[b], key_idx[b], km) for b in members]
            )  # (G, ..., km, E')
            v_g = torch.stack(
                [_take_keys(v[b], key_idx[b], km) for b in members]
            )  # (G, ..., km, Ev)
            lens_g = torch.tensor([k_len[b] for b in members], device=dev)  # (G,)
            keep: torch.Tensor | None = None
            if any(k_len[b] < km for b in members):
                keep = torch.arange(km, device=dev) < lens_g[:, None]  # (G, km)
                keep = keep.view(len(members), *([1] * (q_g.ndim - 2)), km)  # (G, 1.., 1, km)
            if causal and keep is not None:
                tri = torch.ones(qm, km, dtype=torch.bool, device=dev).tril()  # (qm, km)
                keep = tri if keep is None else keep & tri
            attn_mask: torch.Tensor | None = keep
            out_g, lse_g = _call(
                q_g,
                k_g,
                v_g,
                attn_mask=attn_mask,
                is_causal=causal and attn_mask is None,
                dropout_p=inputs.dropout_p,
                scale=inputs.scale,
                gqa=gqa,
                want_lse=want_lse,
            )  # (G, ..., qm, Ev), (G, ..., qm)
            w_g: torch.Tensor | None = None
            if w_full is not None and lse_g is not None:
                w_g = _weights_of_call(
                    inputs,
                    q_g,
                    k_g,
                    lse_g,
                    attn_mask=attn_mask,
                    is_causal=causal and attn_mask is None,
                    gqa=gqa,
                )  # (G, ..., qm, km)
            for n, b in enumerate(members):
                ql, kl, idx = q_len[b], k_len[b], key_idx[b]
                out_full[b, ..., :ql, :] = out_g[n, ..., :ql, :].to(inputs.dtype)
                if lse_full is not None and lse_g is not None:
                    lse_full[b, ..., :ql] = lse_g[n, ..., :ql].to(cd)
                if w_full is not None and w_g is not None:
                    wb = w_g[n, ..., :ql, :kl]  # (..., ql, kl)
                    if idx is None:
                        w_full[b, ..., :ql, :kl] = wb
                    else:
                        rows = torch.zeros_like(w_full[b, ..., :ql, :])  # (..., ql, S)
                        w_full[b, ..., :ql, :] = rows.index_copy(-1, idx, wb)
        if not live and torch.is_grad_enabled():
            # Every element is fully masked: keep the graph connected so backward gives
            # zero gradients (the policy for masked rows), not "does not require grad".
            link = (q.sum() + k.sum() + v.sum()) * 0  # a 0-d zero
            out_full = out_full + link.to(out_full.dtype)
            if w_full is not None:
                w_full = w_full + link.to(w_full.dtype)
        return out_full, w_full, lse_full


def _unpadded_lengths(
    inputs: AttentionInputs, device: torch.device
) -> tuple[list[int], list[int], list[torch.Tensor | None], bool]:
    """Per batch element: kept queries, kept keys, key indices (None = a prefix), causal."""
    B, L, S = inputs.batch_shape[0], inputs.L, inputs.S
    q_len, k_len = [L] * B, [S] * B
    key_idx: list[torch.Tensor | None] = [None] * B
    causal = False
    kp_keep: torch.Tensor | None = None
    for p in inputs.mask_parts:
        if isinstance(p, _masks.ValidLensMask):
            lens = p.lens.tolist()
            k_len = [min(a, int(b)) for a, b in zip(k_len, lens, strict=True)]
            if p.queries:
                q_len = [min(a, int(b)) for a, b in zip(q_len, lens, strict=True)]
        elif isinstance(p, _masks.KeyPaddingMask):
            keep = ~p.padding.to(device)  # (B, S)
            kp_keep = keep if kp_keep is None else kp_keep & keep
        elif isinstance(p, _masks.CausalMask):
            causal = True
    if kp_keep is not None:
        j = torch.arange(S, device=device)
        for b in range(B):
            kept = kp_keep[b] & (j < k_len[b])  # (S,)
            n_kept = int(kept.sum())
            if n_kept == k_len[b]:
                continue  # the first k_len[b] keys: a prefix, slicing is enough
            idx = kept.nonzero().squeeze(-1)  # (S_b,)
            key_idx[b] = idx
            k_len[b] = n_kept
    return q_len, k_len, key_idx, causal


def _take_keys(t: torch.Tensor, idx: torch.Tensor | None, n: int) -> torch.Tensor:
    """Rows of t (..., S, D) at idx (or the first n), zero-padded to n rows: (..., n, D)."""
    if idx is None:
        return t[..., :n, :]
    rows = t.index_select(-2, idx)  # (..., S_b, D)
    return F.pad(rows, (0, 0, 0, n - rows.shape[-2]))  # (..., n, D)


# Fixed cost of one SDPA call, in multiply-adds (launch, thread barrier): about half a
# millisecond of a small CPU. Groups are merged while padding costs less than this.
_CALL_COST = 2.5e7


def _group_lengths(
    members: list[int], q_len: list[int], k_len: list[int], head_work: int
) -> list[list[int]]:
    """Split batch elements into groups minimizing padded work + a per-call cost.

    Sorted by key length, then an exact O(B²) dynamic program over contiguous runs:
    a group costs ``count * max(q) * max(k) * head_work + _CALL_COST``.
    """
    order = sorted(members, key=lambda b: (k_len[b], q_len[b]))
    n = len(order)
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        qm = km = 0
        for i in range(j, 0, -1):  # group = order[i-1 .. j-1]
            qm = max(qm, q_len[order[i - 1]])
            km = max(km, k_len[order[i - 1]])
            cost = best[i - 1] + (j - i + 1) * qm * km * head_work + _CALL_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]
