"""The SDPA backend: torch.nn.functional.scaled_dot_product_attention.

Runs every score that reduces exactly to a dot product (dot, scaled dot,
bilinear, Gaussian), in one of two ways:

- **unpadded**: when the mask is only ``valid_lens`` (one length per batch
  element, with or without ``queries=True``), ``key_padding`` and/or a
  top-left ``causal()`` (not with ``key_padding``), each batch element keeps
  only its own queries and keys, and elements of similar lengths are grouped
  into one call (see :func:`attnkit.backends.varlen.group_lengths`), so SDPA sees (almost) no padding
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

It reports the mask parts it would build densely (window masks, shifted causal
masks over many queries, causal combined with other masks; :mod:`.plan`) and
dispatch decides; forced by name it still runs them, densely. Decoding against a
KV cache (bottom-right causal, at most ``plan.DECODE_ROWS`` queries) stays on the
fused kernel: one query needs no mask, a few take a small (L, S) mask on the CPU
and torch's lower-right causal bias on CUDA. Grouped K/V heads use ``enable_gqa``.

Non-finite inputs follow attnkit's policy, with tensor operations only (no host
read): a NaN in a used position propagates to the rows that use it; a masked-out
position never contributes, whatever it holds (:mod:`.poison`). Calls that need a
gradient can be differentiated twice (:mod:`.grad`).

Gradients of a Gaussian whose dot form's terms pass
:data:`attnkit.backends.operands.DOT_FORM_GRAD_TERMS` (inputs hundreds of bandwidths
apart): the fused backward's row term ``rowsum(dO * O)`` rounds at ``eps |dO| |v|``,
which the dot form carries to q, k and σ multiplied by its terms; such a call keeps
the fused kernel's output and takes its gradients from the chunked tiles'
recomputation (``backend.py``).

Weights and lse: the log-sum-exp comes from torch's flash kernels (private ops,
feature-detected: the CPU flash op; on CUDA the flash or efficient op), and
weights are then recomputed exactly in a second pass as
``exp(scale * q k^T + bias - lse)``; no softmax is materialized in the forward.
Returned weights are differentiable (their backward is the softmax backward,
differentiable again); the lse is not, so a call
that needs both the lse and gradients goes to another backend.

Files: ``backend.py`` (the Backend: reasons, the dense and unpadded paths),
``plan.py`` (how a call maps onto SDPA calls, masks it would materialize),
``run.py`` (one SDPA call: 4-D views, head sizes), ``lse.py`` (lse kernels and
exact weights recomputed from the lse), ``poison.py`` (non-finite inputs),
``grad.py`` (double backward); unpadding of variable lengths, and torch's
variable-length kernel on CUDA, are shared in :mod:`attnkit.backends.varlen`.
"""

from __future__ import annotations

from . import plan
from .backend import SDPABackend
from .lse import has_lse_kernel

__all__ = ["SDPABackend", "has_lse_kernel", "plan"]
