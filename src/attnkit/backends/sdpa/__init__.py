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

Files: ``backend.py`` (the Backend: reasons, masks it would materialize, the dense
and unpadded paths), ``run.py`` (one SDPA call: 4-D views, head sizes, the lse op),
``lse.py`` (the lse kernel and exact weights recomputed from it); unpadding of
variable lengths is shared with other backends in :mod:`attnkit.backends.varlen`.
"""

from __future__ import annotations

from .backend import SDPABackend
from .lse import has_lse_kernel

__all__ = ["SDPABackend", "has_lse_kernel"]
