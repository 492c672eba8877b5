"""The one lowering of masks: a mask of a call becomes a :class:`BlockPlan`.

Every mask kind lowers itself (:meth:`attnkit.masks.Mask.lower`) into atoms
(:mod:`.atoms`: bands, per-batch key and query ranges, per-query key ranges, kept
keys, document ids, dense keep and bias tensors) as a disjunction of conjunctions.
:func:`build_plan` folds each conjunction into a :class:`~.clause.Clause` and the
whole into a :class:`BlockPlan`, the one description the backends read: the chunked
tiles, the unpadded and varlen paths, the Triton kernel arguments and the
context-parallel block schedule. Nothing here asks a mask for its type.

Plans are cached (:func:`build_plan`): per mask object for masks holding tensors
(keyed by the mask's structure and its tensors' versions, and kept only while the mask
still holds the very tensors it was built from, so an in-place change or an attribute
set anew is seen; never for tensors that need a gradient or inference tensors, which
have no version), by value for tensor-free masks (causal, window), like
FlexAttention's ``create_block_mask`` meant to be built once per model step. Building
reads nothing on the host.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .atoms import DNF
from .clause import Clause
from .plan import EMPTY, FULL, PARTIAL, BlockPlan, stable_hash
from .ragged import RaggedSeq

if TYPE_CHECKING:
    from ..masks import Mask

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "BlockPlan",
    "Clause",
    "RaggedSeq",
    "build_plan",
    "clear_cache",
    "stable_hash",
]

_BY_VALUE: dict[tuple[object, ...], BlockPlan] = {}
# Per mask object: key -> (weak references to the tensors the plan was built from, plan).
_Built = tuple[tuple["weakref.ref[torch.Tensor]", ...], BlockPlan]
_BY_OBJECT: weakref.WeakKeyDictionary[Any, dict[tuple[object, ...], _Built]] = (
    weakref.WeakKeyDictionary()
)
_MAX = 256


def clear_cache() -> None:
    """Forget every cached plan."""
    _BY_VALUE.clear()
    _BY_OBJECT.clear()


def build_plan(
    mask: Mask | None,
    L: int,
    S: int,
    batch_shape: Sequence[int],
    device: torch.device | str,
    *,
    dtype: torch.dtype = torch.float32,
    block_q: int = 128,
    block_k: int = 128,
    q_start: int = 0,
    k_start: int = 0,
    total_L: int | None = None,
    total_S: int | None = None,
) -> BlockPlan:
    """The :class:`BlockPlan` of ``mask`` for a call of (batch_shape, L, S).

    Args:
        mask: an attnkit mask (already validated for these sizes) or None.
        L, S: queries and keys of this call (of this block, with offsets).
        batch_shape: the call's leading dims.
        device: where the plan's tensors go (the inputs' device).
        dtype: dtype of the logits (biases and band tiles are in it).
        block_q, block_k: tile sizes.
        q_start, k_start, total_L, total_S: plan the block of queries
            [q_start, q_start + L) and keys [k_start, k_start + S) of a longer problem
            of total_L queries and total_S keys (default: this call is the whole).
    """
    batch = tuple(int(d) for d in batch_shape)
    dev = torch.device(device)
    if mask is not None and (total_L is not None or total_S is not None or q_start or k_start):
        mask = mask.shard(
            q_start,
            k_start,
            L,
            S,
            total_L if total_L is not None else q_start + L,
            total_S if total_S is not None else k_start + S,
        )
    tensors = mask.tensors() if mask is not None else ()
    # A plan of a mask holding tensors is keyed by their version counters, so an
    # in-place change is seen. An inference tensor (made under torch.inference_mode())
    # has no version counter, and may still be changed in place inside inference mode:
    # no key read from it would see that change (its data pointer stays; its values
    # would have to be read, a host sync per call). So masks holding one are never
    # cached: their plan is built on each call, like that of a mask whose tensors need
    # a gradient. Tensor-free masks (causal, window) stay cached by value.
    cacheable = not torch.compiler.is_compiling() and not any(
        t.requires_grad or t.is_inference() for t in tensors
    )
    if not cacheable:
        return _build(mask, L, S, batch, dev, dtype).with_blocks(block_q, block_k)
    key: tuple[object, ...] = (L, S, batch, dev, dtype)
    if mask is None or not tensors:
        key = (None if mask is None else mask.signature(L, S), *key)
        plan = _BY_VALUE.get(key)
        if plan is None:
            if len(_BY_VALUE) >= _MAX:
                _BY_VALUE.clear()
            plan = _BY_VALUE[key] = _build(mask, L, S, batch, dev, dtype)
        return plan.with_blocks(block_q, block_k)
    # The mask's own fields may be set anew (``mask.padding = other``, ``window.left =
    # 0``): its signature holds the static ones, and the entry holds its tensors by
    # weak reference and is used only while the mask still holds those very tensors.
    key = (mask.signature(L, S), tuple(t._version for t in tensors), *key)
    store = _BY_OBJECT.setdefault(mask, {})
    built = store.get(key)
    if built is not None and all(ref() is t for ref, t in zip(built[0], tensors, strict=True)):
        return built[1].with_blocks(block_q, block_k)
    if len(store) >= _MAX:
        store.clear()
    plan = _build(mask, L, S, batch, dev, dtype)
    store[key] = (tuple(weakref.ref(t) for t in tensors), plan)
    return plan.with_blocks(block_q, block_k)


def _merge(
    counted: list[tuple[torch.Tensor, int]], t: torch.Tensor, n: int, how: Callable[[int, int], int]
) -> None:
    """Count ``t`` ``n`` times into ``counted`` (identity by ``is``: torch < 2.13 cannot
    compile id() of a tensor made in the graph), ``how`` joining an existing count."""
    at = next((i for i, (s, _) in enumerate(counted) if s is t), None)
    if at is None:
        counted.append((t, n))
    else:
        counted[at] = (t, how(counted[at][1], n))


def _build(
    mask: Mask | None,
    L: int,
    S: int,
    batch: tuple[int, ...],
    device: torch.device,
    dtype: torch.dtype,
) -> BlockPlan:
    dnf: DNF = [[]] if mask is None else mask.lower(L, S, device)
    clauses: list[Clause] = []
    counted: list[tuple[torch.Tensor, int]] = []  # each bias, and how often a clause adds it
    for atoms in dnf:
        clause = Clause()
        for atom in atoms:
            atom.add_to(clause)
        # The same bias sits in every clause of bias & (a | b): it is added once. A clause
        # that adds one tensor twice (bias(t) & bias(t)) adds it twice.
        here: list[tuple[torch.Tensor, int]] = []
        for t in clause.biases:
            _merge(here, t, 1, operator.add)
        for t, n in here:
            _merge(counted, t, n, max)
        clause.biases = []
        clauses.append(clause)
    biases = [t.to(device=device, dtype=dtype) for t, n in counted for _ in range(n)]
    B0 = batch[0] if batch else 1
    N = math.prod(batch)
    return BlockPlan(
        L=L,
        S=S,
        batch_shape=batch,
        B0=B0,
        R=N // B0 if B0 else 0,
        clauses=clauses,
        biases=biases,
        dtype=dtype,
    )
