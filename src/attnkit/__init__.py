"""attnkit: attention for PyTorch that is exact, fast and visible.

>>> import torch, attnkit
>>> from attnkit import masks
>>> q = k = v = torch.randn(2, 4, 16, 32)                # (B, H, L, E)
>>> out = attnkit.attention(q, k, v, mask=masks.causal())
>>> out.shape
torch.Size([2, 4, 16, 32])
"""

from typing import TYPE_CHECKING, Any

from . import masks, mods, nn, scores
from ._torch_features import FeatureUnavailableError
from .backends.dispatch import (
    BackendNotSupportedError,
    Explanation,
    available_backends,
    get_backend,
    register_backend,
    unregister_backend,
    use_backend,
)
from .functional import attention, attention_backward, explain, masked_softmax

__version__ = "0.1.0"
"""The version of attnkit, a string (``"0.1.0"``): the ``version`` of the project's
``pyproject.toml``, and what ``attnkit --version`` prints."""


if TYPE_CHECKING:  # (for type checkers: attnkit.viz is the module, typed; at run time
    from . import viz as viz  # it is imported on first use, below)


def __getattr__(name: str) -> Any:
    """``attnkit.viz`` is imported on first use (it is not needed to compute attention)."""
    if name == "viz":
        import importlib

        return importlib.import_module(".viz", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BackendNotSupportedError",
    "Explanation",
    "FeatureUnavailableError",
    "__version__",
    "attention",
    "attention_backward",
    "available_backends",
    "explain",
    "get_backend",
    "masked_softmax",
    "masks",
    "mods",
    "nn",
    "register_backend",
    "scores",
    "unregister_backend",
    "use_backend",
    "viz",
]

from ._namespace import public_dir as _public_dir  # noqa: E402

__dir__ = _public_dir(__all__)
