"""The public entry points: context-parallel attention, its explanation, and helpers.

Every rank holds its shard of the sequence (:func:`attnkit.distributed.shard`) and
passes the same score and the same mask, both defined on the **full** sequence:
dense mask tensors are full-size (or broadcast), ``valid_lens`` and
``key_padding`` count full positions, causal and window masks are placed at
global positions. The call is a collective: every rank of ``group`` makes it.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .. import masks as _masks
from .._autocast import autocast_dtype
from .._autocast import operands as autocast_operands
from .._inputs import validate_inputs
from ..blockplan import stable_hash
from ..scores import Score, ScoreName
from .agree import normalize_mask
from .all_to_all import all_to_all_attention
from .comm import all_reduce, exchange_rows, metadata_device, require_group
from .errors import ContextParallelError
from .layout import Layout, check_layout, segments
from .plan import (
    STRATEGIES,
    Strategy,
    call_batch_shape,
    check_full_mask,
    choose_strategy,
    plan_blocks,
    prepare,
)
from .ring import ring_attention

__all__ = [
    "ContextParallelExplanation",
    "all_reduce_grads",
    "context_parallel_attention",
    "explain_context_parallel",
]


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    score: ScoreName | Score = "scaled_dot",
    mask: _masks.Mask | torch.Tensor | None = None,
    scale: float | torch.Tensor | None = None,
    layout: Layout = "zigzag",
    strategy: Strategy | None = None,
    return_lse: bool = False,
    backend: str | Sequence[str] | None = None,
) -> Any:
    """Exact attention over a sequence sharded across the ranks of ``group``.

    Args:
        query: (..., L_r, E), this rank's shard of the queries (positions as
            :func:`attnkit.distributed.shard` cuts them for ``layout``).
        key: (..., S_r, Ek), this rank's shard of the keys.
        value: (..., S_r, Ev), this rank's shard of the values.
        group: the process group (None = the default group); at least 2 ranks.
        score: as for :func:`attnkit.attention`; the same on every rank.
        mask: a mask of the FULL (L, S) problem (see the module docstring), the same
            on every rank; a float tensor is an additive bias of full size.
        scale: as for :func:`attnkit.attention`: None, a float, or a per-head tensor
            (H,) the same on every rank (its values are checksummed like a score
            parameter's). A per-head scale that requires grad gets each rank's part of
            its gradient: sum it across the group, like a score parameter's.
        layout: ``"zigzag"`` (balances causal work) or ``"contiguous"``.
        strategy: ``"ring"``, ``"all_to_all"`` (heads must divide by the world size)
            or None to choose (:func:`explain_context_parallel` says which and why).
        return_lse: also return the log-sum-exp (..., L_r) of this rank's rows.
        backend: passed to every :func:`attnkit.attention` call.

    Returns:
        output (..., L_r, Ev) for this rank's queries; with ``return_lse`` the tuple
        ``(output, lse)``. Rows with no key to attend give 0 and lse -inf.
        Differentiable in query, key, value and the score's parameters; a score
        parameter's gradient on each rank is that rank's part: sum it across the
        group (:func:`all_reduce_grads`). Twice differentiable (``create_graph=True``:
        a gradient penalty, a Hessian) on the all-to-all; the ring's backward raises
        ContextParallelError there instead of dropping the second derivatives.

    Raises:
        ContextParallelError, the same on every rank and before any block is sent
        (never a hang), when any rank's arguments are bad or its backend cannot run
        its blocks, when the ranks' arguments differ (shapes, dtype, layout,
        strategy, backend, scale, gradients needed, the score's parameters, the
        mask's structure or values), for a group of one rank, or for a strategy that
        cannot apply; during the call, when a peer is lost or silent past the process
        group's timeout (``error.collective`` names the exchange, ``error.ranks`` the
        peers). See docs/context-parallel.md, "Agreement and faults".
    """
    problem = None
    if not isinstance(return_lse, bool):
        problem = TypeError(f"return_lse: expected True or False, got {return_lse!r}")
    return attend(
        query, key, value, group=group, score=score, mask=mask, scale=scale, layout=layout,
        strategy=strategy, return_lse=return_lse, backend=backend, problem=problem,
    )  # fmt: skip


def attend(
    query: Any,
    key: Any,
    value: Any,
    *,
    group: dist.ProcessGroup | None,
    score: Any,
    mask: Any,
    scale: Any,
    layout: Any,
    strategy: Any,
    return_lse: bool,
    backend: Any,
    problem: Exception | None,
) -> Any:
    """:func:`context_parallel_attention` for callers that found a ``problem`` of their
    own with this rank's call: it is shipped in the agreement, so every rank raises
    (instead of this rank raising alone while the others wait in the agreement).

    Under ``torch.autocast`` the call runs as :func:`attnkit.attention` runs there: its
    inputs and a learned score in autocast's dtype, with autocast off (so the ring's
    backward, run after the autocast block, sees the dtypes its forward saw)."""
    low = autocast_dtype(query)
    if low is not None:
        q, k, v, low_score = autocast_operands(low, query, key, value, score)
        with torch.autocast(query.device.type, enabled=False):
            return attend(
                q, k, v, group=group, score=low_score, mask=mask, scale=scale, layout=layout,
                strategy=strategy, return_lse=return_lse, backend=backend, problem=problem,
            )  # fmt: skip
    plan = prepare(
        query, key, value, group=group, score=score, mask=mask, scale=scale,
        layout=layout, strategy=strategy, backend=backend, problem=problem,
    )  # fmt: skip
    run = all_to_all_attention if plan.strategy == "all_to_all" else ring_attention
    out, lse = run(plan, query, key, value)
    return (out, lse) if return_lse else out


@dataclass(frozen=True)
class ContextParallelExplanation:
    """Which strategy a context-parallel call runs, why, and what the ring would do.

    Returned by :func:`explain_context_parallel`; ``str()`` of it prints a summary, one
    line per strategy. A frozen dataclass: built by attnkit, read by you.

    Attributes:
        chosen: "ring" or "all_to_all".
        why: one line on the choice.
        reasons: for each strategy, why it cannot run (empty = it can).
        world_size, layout, seq_len_q, seq_len_kv: the call's sizes.
        ring_blocks: per rank, how many (query segment, key segment) blocks the ring
            computes (blocks the mask empties are skipped).
        ring_blocks_total: blocks without skipping (the same on every rank).
        ring_hops: per rank, how many ranks its K/V shard travels to (P-1 at most).

    Examples:
        >>> import torch
        >>> from attnkit import distributed as cp, masks
        >>> q = torch.randn(1, 4, 8, 16)                        # one rank's shard
        >>> ex = cp.explain_context_parallel(q, q, q, world_size=4, mask=masks.causal())
        >>> ex.chosen, ex.ring_blocks, ex.ring_blocks_total
        ('all_to_all', [9, 9, 9, 9], 16)
    """

    chosen: str
    why: str
    reasons: dict[str, list[str]]
    world_size: int
    layout: str
    seq_len_q: int
    seq_len_kv: int
    ring_blocks: list[int] = field(default_factory=list)
    ring_blocks_total: int = 0
    ring_hops: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"context parallel over {self.world_size} ranks ({self.layout}): {self.why}"]
        for name in STRATEGIES:
            why_not = self.reasons.get(name, [])
            lines.append(f"  {name}: " + ("can run" if not why_not else "; ".join(why_not)))
        lines.append(
            f"  ring blocks per rank: {self.ring_blocks} of {self.ring_blocks_total}; "
            f"K/V hops per rank: {self.ring_hops}"
        )
        return "\n".join(lines)


def explain_context_parallel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    world_size: int,
    seq_len: int | None = None,
    kv_seq_len: int | None = None,
    mask: _masks.Mask | torch.Tensor | None = None,
    layout: Layout = "zigzag",
    strategy: Strategy | None = None,
    score: ScoreName | Score = "scaled_dot",
) -> ContextParallelExplanation:
    """What :func:`context_parallel_attention` would do, on any process (no collective).

    Args:
        query, key, value: tensors with a rank's shard shapes (only their shapes are read).
        world_size: the number of ranks.
        seq_len, kv_seq_len: full query / key lengths (default: the shard length
            times ``world_size``).
        mask: the full-sequence mask (a float tensor is a bias).
        layout: as for the call, ``"zigzag"`` or ``"contiguous"``.
        strategy: as for the call, ``"ring"``, ``"all_to_all"`` or None (chosen).
        score: as for the call (read for its checks of the feature sizes).

    Returns:
        A :class:`ContextParallelExplanation`: the strategy chosen and why, each
        strategy's reasons, and the ring's blocks and hops per rank.

    Raises:
        TypeError, ValueError: what the call would refuse of these shapes and dtypes
            (:func:`attnkit.attention`'s checks), or a shard length that no rank holds
            of ``seq_len`` / ``kv_seq_len``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size: expected an int >= 2, got {world_size!r}")
    lay = check_layout(layout)
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected 'ring', 'all_to_all' or None, got {strategy!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.ndim < 2:
            raise TypeError(f"{name}: expected a tensor of shape (..., L, E), got {t!r:.60}")
    for name, n in (("seq_len", seq_len), ("kv_seq_len", kv_seq_len)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0):
            raise ValueError(f"{name}: expected None or an int >= 0, got {n!r}")
    # the call's own checks of shapes and dtypes (attention()'s), on stand-ins of no memory
    # (zeros expanded, on the inputs' devices: a score's parameters are checked there)
    stand_ins = (
        torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape) for t in (query, key, value)
    )
    validate_inputs(*stand_ins, score=score)
    mask = normalize_mask(mask)  # (a float tensor is a bias, as for the call)
    n_q = seq_len if seq_len is not None else query.shape[-2] * world_size
    n_kv = kv_seq_len if kv_seq_len is not None else key.shape[-2] * world_size
    q_segs, kv_segs = segments(n_q, world_size, lay), segments(n_kv, world_size, lay)
    for name, t, n, segs in (("query", query, n_q, q_segs), ("key", key, n_kv, kv_segs)):
        held = sorted({sum(length for _, length in rank) for rank in segs})
        if t.shape[-2] not in held:
            raise ValueError(
                f"{name}: {t.shape[-2]} positions is no rank's shard of {n} positions over "
                f"{world_size} ranks ({lay}: {', '.join(map(str, held))}); check "
                f"{'seq_len' if name == 'query' else 'kv_seq_len'}"
            )
    batch_shape = call_batch_shape(query.shape, key.shape)
    check_full_mask(mask, batch_shape, n_q, n_kv,
                    "seq_len, kv_seq_len, or the shard lengths times world_size")  # fmt: skip
    chosen, why, reasons = choose_strategy(
        strategy,
        query.shape,
        key.shape,
        world_size,
        mask,
        (n_q, n_kv, batch_shape),
        query.dtype,
    )
    blocks, last_hop = plan_blocks(mask, q_segs, kv_segs, n_q, n_kv, batch_shape)
    return ContextParallelExplanation(
        chosen=chosen,
        why=why,
        reasons=reasons,
        world_size=world_size,
        layout=lay,
        seq_len_q=n_q,
        seq_len_kv=n_kv,
        ring_blocks=[sum(len(b) for b in row) for row in blocks],
        ring_blocks_total=sum(len(q_segs[0]) * len(s) for s in kv_segs),
        ring_hops=last_hop,
    )


def all_reduce_grads(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Sum every parameter gradient of ``module`` across ``group`` (a collective).

    After a context-parallel backward each rank holds its local part of a score's
    (or a layer's) parameter gradients; this makes them the full gradient on every
    rank. Skip it when DDP/FSDP already reduces over the context-parallel ranks.

    Args:
        module: the module whose parameters that require grad are summed, in place
            (``p.grad``), in the order of ``named_parameters()``; a parameter with no
            gradient on this rank takes part with zeros (and gets a ``grad``).
        group: the process group (default None: the default group). Every rank of it
            must call this with the same module structure.

    Returns:
        None; the gradients are summed in place.

    Raises:
        ContextParallelError: the ranks' parameters that require grad differ (names,
            shapes or dtypes; raised on every rank before any sum), or a communication
            failure, naming the parameter whose all_reduce failed.

    Example::

        out = cp.context_parallel_attention(q, k, v, score=score)
        out.sum().backward()
        cp.all_reduce_grads(score)          # every rank: the full gradient
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    require_group("all_reduce_grads")
    summed = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    # the ranks first agree on which gradients they sum: a list that differs (a parameter
    # frozen on one rank) would add one parameter's gradient to another's
    listed = [(name, tuple(p.shape), str(p.dtype)) for name, p in summed]
    device = summed[0][1].device if summed else metadata_device(group, None)
    row = torch.tensor([stable_hash(listed)], dtype=torch.long, device=device)  # (1,)
    rows = exchange_rows(row, group)
    differ = [r for r, (h,) in enumerate(rows) if h != rows[0][0]]
    if differ:  # (every rank sees every row: each raises the same)
        raise ContextParallelError(
            f"module: rank {differ[0]} sums other parameters than rank 0 (names, shapes, "
            "dtypes or requires_grad differ); every rank must pass the same module with the "
            f"same parameters requiring grad (this rank's: {len(listed)} parameters)"
        )
    for name, p in summed:
        if p.grad is None:  # a rank that computed no block still takes part
            p.grad = torch.zeros_like(p)
        all_reduce(p.grad, group, f"the gradient of parameter {name!r}")
