"""Backend: what a kernel supports, declared as data, plus one generic reason check.

Every backend declares its capabilities as class attributes. The generic
:meth:`Backend.not_supported_reasons` turns them into human-readable reasons
for a given call; a backend adds its own special reasons by extending it.
The dispatcher runs the first backend, in priority order, with no reasons.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeAlias

import torch

from .._host import in_transform
from .._inputs import AttentionInputs
from ..masks.base import mask_kinds
from ..mods.base import backend_mod_kinds
from .operands import DOT_FORM_LIMIT, gaussian_form
from .records import AttentionResult, BackwardCall, InputGrads

__all__ = ["AttentionResult", "Backend", "PlainRunner", "TracedCall"]

PlainRunner: TypeAlias = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(query, key, value) -> output: a backend's shortcut for a repeated plain call."""

TracedCall: TypeAlias = tuple[str, str, tuple[object, ...], tuple[tuple[str, object], ...]]
"""(namespace, op name, args, keyword items): a backend's plain call under
``torch.compile`` as one op, ``torch.ops.<namespace>.<name>.default(query, key, value,
*args, **{name: value for name, value in keyword items})``; every entry a constant of
the graph."""

ALL_MOD_KINDS = backend_mod_kinds()
"""Every score modifier kind a backend may compute (sinks are joined outside backends),
read off the modifier classes."""

ALL_MASK_KINDS = mask_kinds()
"""Every mask kind (leaf kinds, and "or"/"not" for ``|`` and ``~`` combinations), read off
the mask classes."""


class Backend:
    """Base class: capability attributes and ``not_supported_reasons``.

    Attributes:
        name: the name used by ``backend=`` and ``use_backend``.
        dtypes: input dtypes it computes in.
        device_types: ``torch.device.type`` values it runs on (default: the CPU only;
            a backend claims a device explicitly).
        fused: True when a call runs as one fused kernel (or a few), False when it is
            tiled in Python; dispatch never prefers a Python-tiled backend over a
            fused one on an accelerator.
        any_score: True if it computes any score; else only dot-reducible ones.
        mask_kinds: mask kinds it accepts (leaf kinds of ``&`` combinations).
        supports_weights / supports_lse / supports_dropout / supports_grad: flags.
    """

    name: ClassVar[str] = "base"
    dtypes: ClassVar[frozenset[torch.dtype]] = frozenset(
        {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    )
    device_types: ClassVar[frozenset[str]] = frozenset({"cpu"})
    fused: ClassVar[bool] = True
    any_score: ClassVar[bool] = True
    mask_kinds: ClassVar[frozenset[str]] = ALL_MASK_KINDS
    supports_weights: ClassVar[bool] = True
    supports_lse: ClassVar[bool] = True
    supports_dropout: ClassVar[bool] = True
    supports_grad: ClassVar[bool] = True
    mod_kinds: ClassVar[frozenset[str]] = frozenset()
    """Score modifier kinds it computes (:mod:`attnkit.mods`; sinks are joined outside
    every backend, from its (out, lse))."""
    supports_head_scale: ClassVar[bool] = False
    """True when it takes a per-head scale (``scale=`` a (H,) tensor)."""
    gaussian_differences: ClassVar[bool] = False
    """True when it computes a Gaussian score from the differences ``q - k`` where its dot
    form would cancel (:func:`attnkit.backends.operands.gaussian_form`)."""
    dense_masks: ClassVar[bool] = False
    """True when it builds every mask densely and never reads it lowered
    (:meth:`AttentionInputs.block_plan`): a mask too complex to lower runs there."""
    supports_transforms: ClassVar[bool] = False
    """True when it runs inside torch.func's transforms (``vmap``, ``grad``, ``jvp``):
    plain torch operations only, no autograd Function of its own."""
    averages_heads: ClassVar[bool] = False
    """True when the backend itself returns head-averaged weights for
    ``return_weights="mean"`` (else attention() averages the per-head weights)."""

    def is_available(self) -> str | None:
        """Why this backend cannot run at all on this install (a missing package, no
        compiler), or None when it can. Checked before any per-call reason."""
        return None

    def not_supported_reasons(self, inputs: AttentionInputs) -> list[str]:
        """Every reason this backend cannot run ``inputs``; empty when it can."""
        reasons: list[str] = []
        unavailable = self.is_available()
        if unavailable is not None:
            reasons.append(unavailable)
        if not self.supports_transforms and in_transform():
            reasons.append(
                "inside a torch.func transform (vmap, grad, jvp, ...): its autograd "
                "Functions do not run there; the reference backend's plain torch "
                "operations do"
            )
        if inputs.dtype not in self.dtypes:
            reasons.append(f"dtype {inputs.dtype} is not supported")
        if inputs.device.type not in self.device_types:
            reasons.append(f"device type {inputs.device.type!r} is not supported")
        if not self.any_score and not inputs.score.dot_reducible:
            reasons.append(f"score {inputs.score.name!r} does not reduce to a dot product")
        unsupported = sorted(inputs.mask_kinds - self.mask_kinds)
        if unsupported:
            reasons.append(f"mask kind(s) {', '.join(unsupported)} not supported")
        if inputs.return_weights and not self.supports_weights:
            reasons.append("cannot return attention weights (return_weights=True)")
        if inputs.return_lse and not self.supports_lse:
            reasons.append("cannot return the log-sum-exp (return_lse=True)")
        if inputs.dropout_p > 0 and not self.supports_dropout:
            reasons.append("does not support dropout_p > 0")
        if inputs.needs_grad and not self.supports_grad:
            reasons.append("does not support autograd")
        mods = sorted(inputs.mod_kinds - self.mod_kinds)
        if mods:
            reasons.append(f"score modifier(s) {', '.join(mods)} not supported")
        if inputs.head_scale is not None and not self.supports_head_scale:
            reasons.append("a per-head scale (scale= a tensor) is not supported")
        if not self.gaussian_differences and not reasons:
            form = gaussian_form(inputs)
            if form == "distance":
                reasons.append(
                    "the Gaussian score's dot form q·k/σ² - ‖k‖²/2σ² would cancel: these "
                    "inputs span many bandwidths (its rounding would exceed "
                    f"{DOT_FORM_LIMIT:g}x that of -‖q - k‖²/2σ²); chunked and reference "
                    "form the differences q - k"
                )
            elif form == "unknown" and torch.compiler.is_compiling():
                # (a compiled graph keeps its choice for every later input: one it could
                # not measure may cancel)
                reasons.append(
                    "inside torch.compile the inputs cannot be measured for the Gaussian "
                    "score's dot form q·k/σ² - ‖k‖²/2σ², which cancels on inputs that span "
                    "many bandwidths; chunked and reference form the differences q - k"
                )
        return reasons

    def materialized_masks(self, inputs: AttentionInputs) -> list[str]:
        """The parts of the call's mask this backend would build densely as (L, S) tensors,
        as short reasons ("window mask", ...); empty when every part stays symbolic.

        Dispatch uses them to pass over this backend in favour of one that keeps those
        parts symbolic (see ``backends/dispatch.py``); a backend forced by name runs anyway.
        """
        return []

    def float32_upcasts(self, inputs: AttentionInputs) -> list[str]:
        """Why this backend would run the call's half-precision inputs in float32 on an
        accelerator (a slower kernel on twice the bytes), as short reasons; empty when it
        computes in the inputs' dtype.

        Dispatch uses them to pass over this backend in favour of a fused one that keeps
        half-precision tiles (see ``backends/dispatch.py``).
        """
        return []

    def describe(self, inputs: AttentionInputs) -> str:
        """One line on how this backend computes ``inputs`` (shown by ``explain()``), or ""."""
        return ""

    def forward(self, inputs: AttentionInputs) -> AttentionResult:
        """Compute attention for validated inputs."""
        raise NotImplementedError

    def backward(self, call: BackwardCall) -> InputGrads:
        """Gradients (d query, d key, d value, [d param for each of ``call.params``]) of
        ``call.inputs`` as one part of an attention whose output is ``call.given.out``
        (*batch, L, Ev) with log-sum-exp ``call.given.lse`` (*batch, L): e.g. one key
        block of a context-parallel ring, given the global (out, lse). For a whole call,
        its own (out, lse) (see :class:`.records.BackwardCall`).

        The default is the materialized definition differentiated (:mod:`._backward`,
        O(L·S) memory); a backend with a backward of its own from (out, lse) overrides it.
        """
        from ._backward import materialized_backward

        return materialized_backward(call)

    def plain_runner(self, inputs: AttentionInputs) -> PlainRunner | None:
        """A shortcut for repeated plain calls like ``inputs`` (output only; see
        :mod:`attnkit._plans`): a function of (query, key, value) returning what
        ``forward(...).output`` would for any call with the same shapes, dtypes,
        devices, grad flags, score, mask and flags. None (the default): every call
        goes through :meth:`forward`."""
        return None

    def traced_call(self, inputs: AttentionInputs) -> TracedCall | None:
        """The op a plain call like ``inputs`` (as for :meth:`plain_runner`) is, traced
        by ``torch.compile``: one op of (query, key, value) and constants that gives
        what :meth:`forward` traced would, for every call with the same shapes, dtypes,
        devices, grad flags, score, mask and flags. Asked at trace time, outside the
        trace (see :func:`attnkit._plans.traced_call`), so the graph holds the op and no
        guard on how it was chosen. None (the default): :meth:`forward` is traced."""
        return None

    def __repr__(self) -> str:
        return f"<attnkit backend {self.name!r}>"
