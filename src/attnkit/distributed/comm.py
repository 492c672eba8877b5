"""The collectives context parallelism uses, in the forms it needs.

- :func:`exchange_metadata`: one small ``all_gather`` of int64 vectors, so every
  rank sees every rank's shapes and flags before any real communication.
- :class:`AllToAll` / :func:`all_to_all`: ``all_to_all_single`` on a flat tensor with
  per-rank split sizes, differentiable (its backward is the inverse exchange).
- :func:`p2p`: non-blocking point-to-point sends and receives posted together
  (``batch_isend_irecv``), returning the requests to wait on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["P2P", "AllToAll", "all_to_all", "exchange_metadata", "metadata_device", "p2p"]

P2P = tuple[str, torch.Tensor, int, int]
"""("send" | "recv", tensor, peer rank in the group, tag)."""


def metadata_device(group: dist.ProcessGroup | None, like: object) -> torch.device:
    """Where a collective on ``group`` wants its tensors: ``like``'s device when it is a
    tensor, else the current CUDA device for NCCL and the CPU otherwise."""
    if isinstance(like, torch.Tensor):
        return like.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def exchange_metadata(
    values: Sequence[int], group: dist.ProcessGroup | None, device: torch.device
) -> list[list[int]]:
    """Every rank's ``values`` (the same length on every rank), in rank order."""
    mine = torch.tensor(list(values), dtype=torch.long, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return [t.tolist() for t in gathered]


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of a 1-D tensor: ``in_splits[d]`` values go to rank d and
    ``out_splits[s]`` values come from rank s. Backward runs the inverse exchange."""

    @staticmethod
    def forward(
        ctx: Any,
        flat: torch.Tensor,
        in_splits: list[int],
        out_splits: list[int],
        group: dist.ProcessGroup | None,
    ) -> torch.Tensor:
        ctx.splits = (in_splits, out_splits)
        ctx.group = group
        received = flat.new_empty(sum(out_splits))  # (sum(out_splits),)
        dist.all_to_all_single(received, flat.contiguous(), out_splits, in_splits, group=group)
        return received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        in_splits, out_splits = ctx.splits
        back = grad.new_empty(sum(in_splits))  # (sum(in_splits),)
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(
    flat: torch.Tensor,
    in_splits: list[int],
    out_splits: list[int],
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """Differentiable :class:`AllToAll` of a 1-D tensor."""
    out: torch.Tensor = AllToAll.apply(flat, in_splits, out_splits, group)
    return out


def p2p(ops: Sequence[P2P], group: dist.ProcessGroup | None) -> list[Any]:
    """Post every send and receive of ``ops`` at once; returns the requests to ``wait()``.

    Peers are ranks within ``group``; tags keep messages between the same two ranks
    apart (gloo matches by tag, NCCL by order).
    """
    if not ops:
        return []
    p2p_ops = []
    for kind, tensor, peer, tag in ops:
        fn = dist.isend if kind == "send" else dist.irecv
        global_peer = peer if group is None else dist.get_global_rank(group, peer)
        p2p_ops.append(dist.P2POp(fn, tensor, global_peer, group, tag))
    return list(dist.batch_isend_irecv(p2p_ops))


def wait_all(requests: Sequence[Any]) -> None:
    """Wait for every request of :func:`p2p`."""
    for req in requests:
        req.wait()
