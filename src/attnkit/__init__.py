"""attnkit: attention for PyTorch that is exact, fast and visible.

>>> import torch, attnkit
>>> from attnkit import masks
>>> q = k = v = torch.randn(2, 4, 16, 32)                # (B, H, L, E)
>>> out = attnkit.attention(q, k, v, mask=masks.causal())
>>> out.shape
torch.Size([2, 4, 16, 32])
"""

from . import masks, nn, scores, viz
from .backends.dispatch import (
    BackendNotSupportedError,
    Explanation,
    available_backends,
    get_backend,
    register_backend,
    unregister_backend,
    use_backend,
)
from .functional import attention, attention_backward, explain

__version__ = "0.1.0"

__all__ = [
    "BackendNotSupportedError",
    "Explanation",
    "__version__",
    "attention",
    "attention_backward",
    "available_backends",
    "explain",
    "get_backend",
    "masks",
    "nn",
    "register_backend",
    "scores",
    "unregister_backend",
    "use_backend",
    "viz",
]
