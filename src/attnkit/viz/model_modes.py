"""How the viewer runs a model it is handed: in eval mode with the caller's modes given
back, and with autograd on for the attribution methods whatever the caller's grad mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["evaluating", "gradients_on"]


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Within the block the model runs in eval mode (no dropout); each module's own
    ``training`` flag is restored after, even on error."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextmanager
def gradients_on() -> Iterator[None]:
    """Within the block autograd records, even inside a caller's ``torch.no_grad()`` or
    ``torch.inference_mode()``: the gradient methods differentiate the model."""
    with torch.inference_mode(False), torch.enable_grad():
        yield
