"""The SDPA backend class: what it runs, and a call mapped onto SDPA calls (dense or unpadded)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from ..._autocast import backward_without_autocast
from ..._host import readable
from ..._inputs import AttentionInputs
from ...blockplan import RaggedSeq
from ...mods import ALiBi
from .. import varlen
from .._common import all_finite, dense_mask, graph_link
from ..autograd import differentiable_lse_forward
from ..base import Backend, PlainRunner, TracedCall
from ..operands import alibi_folds, dot_form_grads_at_risk, lower_score
from ..records import AttentionResult, BackwardCall, InputGrads
from . import plan
from .backward import BACKWARD_OP, sdpa_backward
from .lse import has_lse_kernel, logits_of_call, lse_of_logits, weights_from_lse
from .run import HAS_GQA, call, direct, direct_runner, reads_whole_keys, traced_direct

__all__ = ["SDPABackend"]


class SDPABackend(Backend):
    """torch's fused scaled-dot-product attention for dot-reducible scores.

    Args:
        tiles: the backend whose recomputation gives the gradients of a Gaussian call
            beyond :data:`DOT_FORM_GRAD_TERMS` (the package registers chunked's; no
            backend module imports another). None: those calls keep the fused backward.
    """

    name: ClassVar[str] = "sdpa"
    device_types: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda"})
    fused: ClassVar[bool] = True
    any_score: ClassVar[bool] = False
    mod_kinds: ClassVar[frozenset[str]] = frozenset({"alibi"})
    supports_head_scale: ClassVar[bool] = True

    def __init__(self, tiles: Backend | None = None) -> None:
        self.tiles = tiles

    def not_supported_reasons(self, inputs: AttentionInputs) -> list[str]:
        reasons = super().not_supported_reasons(inputs)
        if (inputs.return_lse or inputs.return_weights) and not has_lse_kernel(
            inputs.device, inputs.dtype
        ):
            reasons.append(
                f"no kernel returning the log-sum-exp on {inputs.device.type} for "
                f"{inputs.dtype} (weights/lse)"
            )
        if inputs.return_lse and inputs.needs_grad:
            if BACKWARD_OP is None or inputs.device.type != "cpu":
                reasons.append(
                    "the fused kernel's lse is not differentiable here (return_lse with grad; "
                    "its backward from the lse is torch's CPU flash backward)"
                )
            elif inputs.dropout_p > 0:
                reasons.append("dropout with a differentiable lse (the backward would replay it)")
            elif torch.compiler.is_compiling():
                reasons.append(
                    "under torch.compile, a differentiable lse (its backward calls "
                    "torch.autograd.grad, which dynamo does not trace)"
                )
        if inputs.return_lse and inputs.mask_needs_grad and not _lse_through_weights(inputs):
            reasons.append(
                "an lse with a bias mask that requires grad (the fused kernel's lse carries "
                "no gradient to the bias)"
            )
        softcap = any(m.kind == "softcap" for m in inputs.mods)  # (a reason of its own)
        for m in inputs.mods:
            if isinstance(m, ALiBi) and not softcap and not alibi_folds(inputs, m):
                reasons.append(
                    "symmetric ALiBi is not a dot product unless the call's whole mask is a "
                    "causal band that keeps no key after its query (chunked computes it per "
                    "tile)"
                )
            elif isinstance(m, ALiBi) and inputs.groups > 1:
                reasons.append("ALiBi with grouped-query heads (its key bias is per query head)")
        return reasons

    def materialized_masks(self, inputs: AttentionInputs) -> list[str]:
        """Mask parts SDPA would build as a dense (L, S) tensor (see :mod:`.plan`)."""
        return plan.materialized_masks(inputs)

    def float32_upcasts(self, inputs: AttentionInputs) -> list[str]:
        """On an accelerator, half inputs with a score other than (scaled) dot run in
        float32 here (see :func:`.plan.half_needs_float32`): the Gaussian and Bilinear
        dot forms measured 4x slower than the triton kernels in bfloat16 on an H200."""
        if inputs.device.type == "cpu" or inputs.dtype == inputs.compute_dtype:
            return []
        if type(inputs.score) in plan.DIRECT_SCORES:
            return []
        return [f"score {inputs.score.name!r} in {inputs.dtype} would run upcast to float32"]

    def backward(self, call: BackwardCall) -> InputGrads:
        """torch's fused backward from (out, lse) where it can run (see :mod:`.backward`)."""
        return sdpa_backward(call)

    def plain_runner(self, inputs: AttentionInputs) -> PlainRunner | None:
        """Direct calls (see :func:`.plan.is_direct`) repeat as one :func:`.run.direct`."""
        if not plan.is_direct(inputs):
            return None
        readable_no_grad = readable(inputs.query) and not inputs.needs_grad
        return direct_runner(
            **_direct_options(inputs),
            head_dim=inputs.E,
            readable_no_grad=readable_no_grad,
            whole_keys=reads_whole_keys(inputs.query, inputs.key),
        )

    def traced_call(self, inputs: AttentionInputs) -> TracedCall | None:
        """Direct calls (see :func:`.plan.is_direct`) without gradient on the CPU, traced:
        torch's SDPA op, or with the non-finite policy the checked op (see
        :func:`.run.traced_direct`)."""
        if not plan.is_direct(inputs) or inputs.needs_grad:
            return None
        return traced_direct(inputs.query, inputs.key, inputs.value, **_direct_options(inputs))

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        if self.tiles is not None and _tile_gradients(inputs, self.tiles):
            return self._forward_tile_gradients(inputs, self.tiles)
        if inputs.return_lse and inputs.needs_grad and not _lse_through_weights(inputs):
            # the kernels' lse has no autograd
            return differentiable_lse_forward(self, inputs, self.forward_unrounded)
        res = self.forward_unrounded(inputs)
        if res.output.dtype == inputs.dtype:
            return res
        return AttentionResult(res.output.to(inputs.dtype), res.weights, res.lse)

    def _forward_tile_gradients(self, inputs: AttentionInputs, tiles: Backend) -> AttentionResult:
        """The fused kernel's output (and lse), their gradients those of the chunked
        tiles' recomputation of the call (see :func:`_tile_gradients`): the same numbers
        as the call without gradients, differentiable (twice, through the tiles)."""
        with torch.no_grad():
            res = self.forward(inputs)
        recomputed = tiles.forward(inputs)
        out = _KernelValue.apply(res.output, recomputed.output.to(res.output.dtype))
        lse = None
        if res.lse is not None and recomputed.lse is not None:
            lse = _KernelValue.apply(res.lse, recomputed.lse.to(res.lse.dtype))  # (*batch, L)
        return AttentionResult(output=out, lse=lse)

    def forward_unrounded(self, inputs: AttentionInputs) -> AttentionResult:
        """:meth:`forward` with the output in the dtype the kernel computed it in: the
        compute dtype (float32) where half inputs run upcast, else the inputs' own. A
        backward from (out, lse) takes ``rowsum(d_out * out)`` from it, so a call whose
        forward ran in float32 is not differentiated from its output rounded to half."""
        if plan.is_direct(inputs):
            return AttentionResult(output=_direct(inputs))
        if varlen.torch_varlen_route(inputs):
            return AttentionResult(output=_torch_varlen(inputs))
        # half inputs in float32: a score's dot form (Gaussian's key term, Bilinear's qW)
        # and additive biases (-1e9) are not rounded to half, so the error stays that of
        # plain same-dtype math; (scaled) dot scores keep the half kernel, with or without
        # weights (its lse is float32 either way)
        upcast = inputs.dtype != inputs.compute_dtype and plan.half_needs_float32(inputs)
        ops = lower_score(
            inputs, row_constant=inputs.return_lse, upcast=upcast, fold_alibi=True
        ).dot_products_only(self.name)
        q, k, key_bias, excluded = ops.q, ops.k, ops.key_bias, ops.excluded
        v, layout = inputs.value, inputs.layout
        if key_bias is not None and (inputs.mask is not None or key_bias.requires_grad):
            # q'·k' + b == [q', 1]·[k', b]: one more feature instead of an (L, S) bias mask.
            # Alone, the bias is a (..., 1, S) mask the fused kernels broadcast; one that
            # needs a gradient sends torch's CPU kernel to its math path, and the CUDA
            # kernel to an (L, S) gradient of it: both build the matrix.
            q, k = ops.with_key_bias_feature()
            key_bias = None
            if layout.has_query_heads(k, 2):  # the bias was per query head: so are the keys
                v = layout.query_heads(v, 2)  # (..., H, S, Ev)
                excluded = None if excluded is None else layout.query_heads(excluded, 1)
        if varlen.can_unpad(inputs):
            out, weights, lse = self._forward_unpadded(inputs, q, k, v, excluded)  # bias in k
        else:
            out, weights, lse = self._forward_dense(inputs, q, k, v, key_bias, excluded)
        if lse is not None and inputs.return_lse:
            lse = ops.finish_lse(lse.to(inputs.compute_dtype))
        return AttentionResult(
            output=out,
            weights=weights if inputs.return_weights else None,
            lse=lse if inputs.return_lse else None,
        )

    # ------------------------------------------------------------------ dense

    def _forward_dense(
        self,
        inputs: AttentionInputs,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_bias: torch.Tensor | None,
        excluded: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        v = v.to(q.dtype)
        batch, L, S, layout = inputs.batch_shape, inputs.L, inputs.S, inputs.layout
        want_lse = inputs.return_lse or inputs.return_weights

        attn_mask: torch.Tensor | None = None
        is_causal = lower_right = False
        alive: torch.Tensor | None = None  # (*batch, L, 1) rows with at least one key
        mask = inputs.mask
        shift = plan.causal_shift(inputs) if key_bias is None else None
        if shift is not None:
            route = plan.causal_route(inputs, shift)
            is_causal, lower_right = route == "symbolic", route == "lower_right"
            if route in ("none", "lower_right"):
                mask = None  # every query sees every key, or the kernel takes the bias
        if key_bias is not None and mask is None:
            # one row per key, (..., 1, S): the fused kernel broadcasts it over the queries
            attn_mask = layout.query_heads(key_bias, 2) * inputs.scale  # (..., Hq, 1, S)
        elif (mask is not None and not is_causal) or key_bias is not None:
            dm = dense_mask(inputs)
            if not dm.biases and key_bias is None:
                keep = dm.keep
                assert keep is not None
                if keep.ndim < 2:  # a (S,) row: SDPA and the lse op need (..., L or 1, S)
                    keep = keep.unsqueeze(-2)  # (1, S)
                alive = keep.any(dim=-1, keepdim=True)  # (..., L or 1, 1)
                attn_mask = keep | ~alive  # dead rows attend everywhere, zeroed below
            else:
                bias = torch.zeros((), dtype=q.dtype, device=q.device)
                if key_bias is not None:
                    bias = bias + layout.query_heads(key_bias, 2) * inputs.scale  # (..., 1, S)
                mask_bias = dm.bias_in(q.dtype)
                if mask_bias is not None:
                    bias = bias + mask_bias
                if dm.keep is not None:
                    bias = bias.masked_fill(~dm.keep, float("-inf"))
                if bias.ndim < 2:
                    bias = bias.reshape((1,) * (2 - bias.ndim) + tuple(bias.shape))  # (1, S|1)
                # no copy over the queries: a key bias stays (..., 1, S)
                bias = bias.expand(*bias.shape[:-1], S)  # (..., L or 1, S)
                alive = (bias > float("-inf")).any(dim=-1, keepdim=True)  # (..., L or 1, 1)
                attn_mask = bias.masked_fill(~alive, 0.0)  # dead rows: zeroed below

        gqa = inputs.groups > 1 and HAS_GQA
        if inputs.groups > 1 and not HAS_GQA:
            k, v = layout.query_heads(k, 2), layout.query_heads(v, 2)  # (..., Hq, S, D)
            excluded = None if excluded is None else layout.query_heads(excluded, 1)
        # SDPA's fused kernels need equal leading dims: broadcast views, no copies.
        q = q.expand(*batch, L, q.shape[-1])  # (*batch, L, E')
        kv_batch = (*batch[:-1], k.shape[-3]) if batch and gqa else batch
        k = k.expand(*kv_batch, S, k.shape[-1])  # (*kv_batch, S, E')
        v = v.expand(*kv_batch, S, v.shape[-1])  # (*kv_batch, S, Ev)
        out, lse = call(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=is_causal,
            dropout_p=inputs.dropout_p,
            scale=inputs.scale,
            gqa=gqa,
            want_lse=want_lse,
            excluded=excluded,
            lower_right=lower_right,
            assume_finite=not inputs.check_finite,
        )  # (*batch, L, Ev), (*batch, L)
        zero = torch.zeros((), dtype=out.dtype, device=out.device)
        if alive is not None:  # no host sync: stays torch.compile friendly
            out = torch.where(alive, out, zero)
            if lse is not None:
                lse = torch.where(alive.squeeze(-1), lse, float("-inf"))
        weights = None
        if inputs.return_weights:
            assert lse is not None
            out, weights, lse = _with_weights(
                inputs,
                out,
                lse,
                q,
                k,
                v,
                attn_mask=attn_mask,
                is_causal=is_causal,
                gqa=gqa,
                alive=alive,
            )  # (*batch, L, Ev), (*batch, L, S), (*batch, L)
        return out, weights, lse

    # ------------------------------------------------------------------ unpadded

    def _forward_unpadded(
        self,
        inputs: AttentionInputs,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        excluded: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """SDPA on each batch element's kept queries and keys, similar lengths grouped.

        This path always has a mask, so a score's key bias already rides in q and k
        as one extra feature (see :meth:`forward`).

        Batch elements are sorted by length and grouped (see :func:`attnkit.backends.varlen.group_lengths`)
        so a few SDPA calls cover the batch with little padding left inside a group.
        """
        batch, L, S = inputs.batch_shape, inputs.L, inputs.S
        cd = inputs.compute_dtype
        dev = q.device
        want_lse = inputs.return_lse or inputs.return_weights
        # With one leading dim, the batch dim that is sliced per element is the head dim
        # itself: each query head needs its key head materialized at its own index.
        gqa = inputs.groups > 1 and HAS_GQA and len(batch) > 1
        v = v.to(q.dtype)
        if inputs.groups > 1 and not gqa:
            hl = inputs.layout  # (the name layout is the ragged layout's, below)
            k, v = hl.query_heads(k, 2), hl.query_heads(v, 2)  # (..., Hq, S, D)
            excluded = None if excluded is None else hl.query_heads(excluded, 1)
        kv_batch = (*batch[:-1], k.shape[-3]) if gqa else batch
        q = q.expand(*batch, L, q.shape[-1])  # (B, ..., L, E')
        k = k.expand(*kv_batch, S, k.shape[-1])  # (B, ..., S, E')
        v = v.expand(*kv_batch, S, v.shape[-1])  # (B, ..., S, Ev)
        far = None
        if excluded is not None:
            far = excluded.unsqueeze(-1).expand(*kv_batch, S, 1)  # (B, ..., S, 1)
        layout = inputs.block_plan().ragged()
        assert layout is not None
        seqs, causal = layout
        q_len = [sq.q_len for sq in seqs]
        k_len = [sq.k_len for sq in seqs]
        out_full = torch.zeros(*batch, L, v.shape[-1], dtype=q.dtype, device=dev)
        lse_full = (
            torch.full((*batch, L), float("-inf"), dtype=cd, device=dev) if want_lse else None
        )
        w_full = torch.zeros(*batch, L, S, dtype=cd, device=dev) if inputs.return_weights else None
        live = [n for n, sq in enumerate(seqs) if sq.q_len > 0 and sq.k_len > 0]
        head_work = inputs.E * max(1, math.prod(batch[1:]))
        for members in varlen.group_lengths(live, q_len, k_len, head_work):
            group = [seqs[n] for n in members]
            qm = max(sq.q_len for sq in group)
            km = max(sq.k_len for sq in group)
            q_g = torch.stack([varlen.take_queries(q[sq.b], sq, qm) for sq in group])
            # (G, ..., qm, E')
            k_g = torch.stack([varlen.take_keys(k[sq.b], sq, km) for sq in group])
            # (G, ..., km, E')
            v_g = torch.stack([varlen.take_keys(v[sq.b], sq, km) for sq in group])
            # (G, ..., km, Ev)
            far_g = None
            if far is not None:
                far_g = torch.stack([varlen.take_keys(far[sq.b], sq, km) for sq in group]).squeeze(
                    -1
                )  # (G, ..., km)
            lens_g = torch.tensor([sq.k_len for sq in group], device=dev)  # (G,)
            keep: torch.Tensor | None = None
            if any(sq.k_len < km for sq in group):
                keep = torch.arange(km, device=dev) < lens_g[:, None]  # (G, km)
                keep = keep.view(len(group), *([1] * (q_g.ndim - 2)), km)  # (G, 1.., 1, km)
            if causal and keep is not None:
                tri = torch.ones(qm, km, dtype=torch.bool, device=dev).tril()  # (qm, km)
                keep = keep & tri
            attn_mask: torch.Tensor | None = keep
            out_g, lse_g = call(
                q_g,
                k_g,
                v_g,
                attn_mask=attn_mask,
                is_causal=causal and attn_mask is None,
                dropout_p=inputs.dropout_p,
                scale=inputs.scale,
                gqa=gqa,
                want_lse=want_lse,
                excluded=far_g,
                assume_finite=not inputs.check_finite,
            )  # (G, ..., qm, Ev), (G, ..., qm)
            w_g: torch.Tensor | None = None
            if w_full is not None and lse_g is not None:
                out_g, w_g, lse_g = _with_weights(
                    inputs,
                    out_g,
                    lse_g,
                    q_g,
                    k_g,
                    v_g,
                    attn_mask=attn_mask,
                    is_causal=causal and attn_mask is None,
                    gqa=gqa,
                )  # (G, ..., qm, Ev), (G, ..., qm, km), (G, ..., qm)
            for n, sq in enumerate(group):
                _put_rows(out_full[sq.b], sq, out_g[n, ..., : sq.q_len, :].to(out_full.dtype))
                if lse_full is not None and lse_g is not None:
                    rows_lse = lse_g[n, ..., : sq.q_len].to(cd).unsqueeze(-1)  # (..., ql, 1)
                    _put_rows(lse_full[sq.b].unsqueeze(-1), sq, rows_lse)
                if w_full is not None and w_g is not None:
                    wb = w_g[n, ..., : sq.q_len, : sq.k_len]  # (..., ql, kl)
                    if sq.key_idx is None:
                        cols = torch.zeros(*wb.shape[:-1], S, dtype=wb.dtype, device=dev)
                        cols[..., sq.k0 : sq.k0 + sq.k_len] = wb  # (..., ql, S)
                    else:
                        cols = wb.new_zeros(*wb.shape[:-1], S).index_copy(-1, sq.key_idx, wb)
                    _put_rows(w_full[sq.b], sq, cols)
        if not live and torch.is_grad_enabled():
            # Every element is fully masked: keep the graph connected so backward gives
            # zero gradients (the policy for masked rows), not "does not require grad".
            link = graph_link(q, k, v)  # a 0-d zero, whatever q, k, v hold
            out_full = out_full + link.to(out_full.dtype)
            if w_full is not None:
                w_full = w_full + link.to(w_full.dtype)
        return out_full, w_full, lse_full


def _with_weights(
    inputs: AttentionInputs,
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    gqa: bool,
    alive: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A call's output, weights and lse once its weights are asked for.

    out (..., L, Ev) and lse (..., L) from the fused kernel; q, k, v and the rest as
    :func:`.lse.weights_of_call` takes them (v with its own heads when ``gqa``). The
    weights (..., L, S) are the softmax of the recomputed logits, normalized by their
    own row sums.

    When gradients flow through the logits or v (no dropout), the output becomes
    ``weights @ v`` and the lse (when returned) :func:`.lse.lse_of_logits`: their
    gradients then join the weights' in one softmax backward over those weights
    (``p * (dP - sum_j p dP)``, as plain math does). The fused backward instead forms
    ``exp(s - lse) * (dP - rowsum(dO * O))``, whose rounding is about eps times the
    logits' size in every probability and eps times ``|dO| |v|`` in the row term, both
    multiplied by the scale on the way to q and k: at logits of 1e5 a query whose row is
    one-hot (exact gradient 0) got gradients of 5% of the largest. Rows whose lse is NaN
    (they use a non-finite input) keep the kernel's output, so a NaN reaches no other
    row's gradient. Without gradients the kernel's output and lse are kept as they are.
    """
    logits = logits_of_call(
        inputs, q, k, attn_mask=attn_mask, is_causal=is_causal, gqa=gqa, alive=alive
    )  # (..., L, S)
    grad = torch.is_grad_enabled() and inputs.dropout_p == 0
    grad = grad and (logits.requires_grad or v.requires_grad)
    if grad and logits.requires_grad and inputs.return_lse:
        own = lse_of_logits(logits, lse.to(logits.dtype))  # (before an in-place softmax)
        # the kernel's value (asking for the weights changes no returned number), the
        # gradient of the recomputed logits' lse
        lse = _KernelValue.apply(lse.detach(), own.to(lse.dtype))  # (..., L)
        weights = weights_from_lse(logits, own.to(inputs.compute_dtype))  # (..., L, S)
    else:
        weights = weights_from_lse(logits, lse.to(inputs.compute_dtype))  # (..., L, S)
    if not grad:
        return out, weights, lse
    vf = inputs.layout.query_heads(v, 2) if gqa else v  # (..., Hq, S, Ev)
    kernel_rows = torch.isnan(lse).unsqueeze(-1)  # (..., L, 1)
    w = weights.masked_fill(kernel_rows, 0.0)  # (..., L, S)
    # values known finite without a device sync (or promised finite) are used as they
    # are; else a blocked weight of 0 times a non-finite value would be NaN: the values
    # are zeroed there and the rows whose kernel output is not finite (they use such a
    # value) keep the kernel's output and backward
    if inputs.check_finite and not (readable(v) and all_finite(v.detach())):
        vf = vf.masked_fill(~torch.isfinite(vf), 0.0)
        kernel_rows = kernel_rows | ~torch.isfinite(out).all(dim=-1, keepdim=True)
    mixed = torch.matmul(w, vf.to(w.dtype)).to(out.dtype)  # (..., L, Ev)
    # the kernel's output as the value (the same bits as a call without the weights),
    # the gradient of weights @ v
    mixed = _KernelValue.apply(out.detach(), mixed)  # (..., L, Ev)
    return torch.where(kernel_rows, out, mixed), weights, lse


class _KernelValue(torch.autograd.Function):
    """``value`` forward, its gradient passed to ``through`` (a recomputation of the same
    quantity, within rounding): the fused kernel's numbers with the gradient of the
    recomputed softmax. The backward is the identity, so higher derivatives flow
    through ``through`` as well."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, through: torch.Tensor) -> torch.Tensor:
        return value.clone()

    @staticmethod
    @backward_without_autocast
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, grad


def _tile_gradients(inputs: AttentionInputs, tiles: Backend) -> bool:
    """True when the call's gradients come from the chunked tiles, not the fused
    backward: a Gaussian whose dot form has terms beyond :data:`DOT_FORM_GRAD_TERMS`
    (the fused backward's row term, rounded at ``eps * |dO| |v|``, would reach q, k and σ
    multiplied by them), with a gradient of the logits' operands, no dropout and no
    weights (whose own path already differentiates the softmax of the recomputed logits,
    see :func:`_with_weights`), on a call the tiles run. Measured on the host with the
    Gaussian's form (:func:`attnkit.backends.operands.gaussian_form`): elsewhere 0."""
    if inputs.return_weights or inputs.dropout_p > 0 or not dot_form_grads_at_risk(inputs):
        return False
    return not tiles.not_supported_reasons(inputs)


def _lse_through_weights(inputs: AttentionInputs) -> bool:
    """True when a differentiable lse comes from the recomputed logits of the weights
    (see :func:`_with_weights`), not from the fused backward."""
    return inputs.return_weights and inputs.dropout_p == 0 and torch.is_grad_enabled()


def _put_rows(full: torch.Tensor, sq: RaggedSeq, rows: torch.Tensor) -> None:
    """Write a sequence's rows (..., q_len, D) into its batch element's ``full``
    (..., L, D) in place: at its contiguous run, or at its query indices."""
    if sq.query_idx is None:
        full[..., sq.q0 : sq.q0 + sq.q_len, :] = rows
    else:
        full.index_copy_(-2, sq.query_idx.to(full.device), rows)


def _direct(inputs: AttentionInputs) -> torch.Tensor:
    """The call handed to torch's SDPA unchanged (see :func:`.plan.is_direct`):
    out (B, H, L, Ev)."""
    return direct(inputs.query, inputs.key, inputs.value, **_direct_options(inputs))


def _direct_options(inputs: AttentionInputs) -> dict[str, Any]:
    """The keyword arguments of :func:`.run.direct` for a direct call."""
    shift = plan.causal_shift(inputs)
    route = plan.causal_route(inputs, shift) if shift is not None else "none"
    return {
        "is_causal": route == "symbolic",
        "lower_right": route == "lower_right",
        "dropout_p": inputs.dropout_p,
        "scale": inputs.scale,
        "gqa": inputs.groups > 1,
        "assume_finite": not inputs.check_finite,
    }


def _torch_varlen(inputs: AttentionInputs) -> torch.Tensor:
    """A ragged call on torch's variable-length kernel (see :func:`varlen.torch_varlen_route`)."""
    lens = varlen.varlen_lengths(inputs)
    c = inputs.block_plan().single
    assert lens is not None and c is not None
    return varlen.torch_varlen_attention(
        inputs.query,
        inputs.key,
        inputs.value,
        lens,
        queries=c.query_hi is not None,
        causal=c.has_band,
        scale=inputs.scale,
    )
