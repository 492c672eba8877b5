"""Where one ``attention()`` call spends its host time, stage by stage.

The overhead suite's causal case reports these beside its timing
(``attnkit bench --suite overhead``). Each stage is timed alone, as the minimum over
samples of many calls in a row, on the case's own inputs:

- the first call of a shape runs the full path: ``validation`` (the arguments checked
  into one call record), ``lowering`` (the mask's BlockPlan, from its cache),
  ``dispatch`` (the backend chosen, from its cache), ``backend`` (the chosen backend's
  forward: the non-finite policy's checks and the kernel) and ``wrap_up`` (the result
  packed for the caller);
- every later call of that shape runs its plan: ``plan_key`` (the call's key built
  and looked up), then the plan's runner: ``kernel`` (torch's op alone) and
  ``finite_check`` (the reads of the output, the queries and the keys that the policy
  needs after the kernel, :func:`attnkit.backends.sdpa.run.kernel_followed_policy`).

The stages of a path need not add up to the whole call exactly: the call's own
argument handling is in no stage, and each stage timed alone runs with warm caches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .. import _plans, attention
from .. import functional as _functional
from ..backends.dispatch import normalize_backend_arg, select_backend
from ..backends.sdpa.run import kernel_followed_policy
from ..masks import Mask

__all__ = ["causal_call_stages"]


def _per_call_us(fn: Callable[[], Any], calls: int, samples: int) -> float:
    best = float("inf")
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def causal_call_stages(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask, *, quick: bool = False
) -> dict[str, float]:
    """Host time per stage (µs) of ``attention(q, k, v, mask=mask)``, a causal call.

    Args:
        q: (B, H, L, E) float queries, host-readable, no gradient.
        k: (B, H, S, E) keys. v: (B, H, S, Ev) values.
        mask: a causal mask (the kernel's own causal flag is timed as ``kernel``).
        quick: fewer calls per sample (a smoke run).

    Returns:
        ``{"stage_<name>_us": µs}`` for each stage of the module docstring, plus
        ``call_us``, the whole call timed the same way.
    """
    calls, samples = (20, 3) if quick else (500, 7)
    with torch.no_grad():
        inputs = _functional.validate_inputs(q, k, v, mask=mask)
        core = _functional._split_common(_functional._split_sinks(inputs)[0])[0]
        backend_arg = normalize_backend_arg(None)
        chosen = select_backend(core, backend_arg)
        result = chosen.forward(core)
        out = result.output  # (B, H, L, Ev)

        def key() -> object:
            planned = _plans.plan_key(q, k, v, "scaled_dot", mask, None, 0.0, None, True)
            assert planned is not None
            return _plans.lookup(planned)

        timed: dict[str, Callable[[], Any]] = {
            "validation": lambda: _functional.validate_inputs(q, k, v, mask=mask),
            "lowering": inputs.block_plan,
            "dispatch": lambda: select_backend(core, backend_arg),
            "backend": lambda: chosen.forward(core),
            "wrap_up": lambda: _functional._pack(inputs, result),
            "plan_key": key,
            "kernel": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "finite_check": lambda: kernel_followed_policy(out, q, k),
        }
        figures = {
            f"stage_{name}_us": _per_call_us(fn, calls, samples) for name, fn in timed.items()
        }
        figures["call_us"] = _per_call_us(lambda: attention(q, k, v, mask=mask), calls, samples)
    return figures
