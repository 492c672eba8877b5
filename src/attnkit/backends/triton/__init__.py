"""The Triton backend: fused FlashAttention-2-style kernels, forward and backward.

Every call runs as a few fused kernels, registered as torch ops (:mod:`.ops`):

- :mod:`.forward`: online softmax per query block over the key blocks the mask
  leaves (ranges and tile states computed in the kernel, no host read), output in
  the input dtype, lse in float32;
- :mod:`.backward`: dK/dV per key block and dQ per query block, probabilities
  recomputed from the lse; memory stays O((L + S)·E) per row;
- :mod:`.weights`: exact weights ``exp(s - lse)`` tile by tile, per head or
  averaged over heads inside the kernel.

All three compute their logits with one tile function (:mod:`.logits`: score, key
bias, dense bias, scale, mask) and read the mask from one packed description
(:mod:`.maskargs` on the host, :mod:`.kmask` in the kernels, bit layout in
:mod:`.bits`): bands, key/query/row ranges, key keep, document ids, a dense keep
and bias, up to two OR-ed clauses. Tiles the mask keeps whole skip the mask test;
empty tiles inside a block's range are skipped.

Scores: dot, scaled dot and every other dot-reducible score through its dot form
(Bilinear as (qW)·k, Gaussian as q·k plus a per-key bias, its per-query constant
added to lse), and the Additive score fused (``w_v · tanh(qa + ka)`` over the
hidden dim in registers; ``qa``/``ka`` projected by torch so W_q/W_k get their
gradients through autograd). Grouped-query attention reads key/value head
h // groups (no copy); leading dims of any rank are viewed as (B, H) rows with
strides. Fully masked rows give output 0, lse -inf and zero gradients. Head dims
that are not powers of two are padded inside the kernels by masked loads. Not
supported: dropout, float64, double backward.

Runs on CUDA with Triton 3.x from its torch floor on (:mod:`attnkit._torch_features`),
tile sizes per architecture (:mod:`.runtime`, checked for sm_75 to sm_90 by
:mod:`.targets` without a GPU), and, under ``TRITON_INTERPRET=1``, on CPU tensors
through Triton's interpreter (for tests). Importing this package does not import
Triton; :meth:`TritonBackend.is_available` says when it is missing or torch is older
than its floor.
"""

from __future__ import annotations

from .backend import MAX_HEAD_DIM, TritonBackend

__all__ = ["MAX_HEAD_DIM", "TritonBackend"]
