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
    register_backend,
    use_backend,
)
from .functional import attention, explain

__version__ = "0.1.0"

__all__ = [
    "BackendNotSupportedError",
    "Explanation",
    "__version__",
    "attention",
    "available_backends",
    "explain",
    "masks",
    "nn",
    "register_backend",
    "scores",
    "use_backend",
    "viz",
]
