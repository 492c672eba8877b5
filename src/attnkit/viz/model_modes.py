"""How the viewer runs a model it is handed: in eval mode with the caller's modes given
back, and with autograd on for the attribution methods whatever the caller's grad mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .._autocast import autocast_on

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
    ``torch.inference_mode()``: the gradient methods differentiate the model; and
    autocast is off on every device where the caller had it on, so the attribution is
    computed in the model's own dtype (in bfloat16 the relevance of most tokens of a
    sentence rounded to one value, and their ranking was lost)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        for device_type in _AUTOCAST_DEVICES:
            if autocast_on(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")
"""The device types whose autocast :func:`gradients_on` turns off where it is on."""
