"""The collectives context parallelism uses, in the forms it needs, each guarded.

- :func:`exchange_rows`: one ``all_gather`` of an int64 row per rank, so every
  rank sees every rank's call before any real communication.
- :class:`AllToAll` / :func:`all_to_all`: ``all_to_all_single`` on a flat tensor with
  per-rank split sizes, differentiable (its backward is the inverse exchange).
- :func:`p2p` / :func:`wait_all` / :func:`in_flight`: non-blocking point-to-point
  sends and receives posted together (``batch_isend_irecv``), and the wait for every
  one of them, on error paths too (:func:`settle`): no transfer outlives the call.
- :func:`all_reduce`: a sum across the group; :func:`all_gather`: every rank's tensor.

On torch below :data:`attnkit._torch_features.GLOO_RELEASES_GIL_FLOOR`, every
collective on gloo runs inside :func:`handed`, which keeps its tensors until gloo's
worker thread has let go of them: that torch's ``destroy_process_group()`` can hang for
ever otherwise (see :func:`handed`). Point-to-point transfers need nothing of the kind:
gloo runs them on the calling thread's request, not on a worker thread.

Every exchange is named (``what``), and a failure of the backend (gloo or NCCL: a
peer that died or closed its connection, a timeout) becomes a
:class:`ContextParallelError` that says which exchange failed and which rank it was
waiting on: the peer of a point-to-point transfer, or the other ranks of a
collective (a collective does not say which one is gone).
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import _torch_features as _features
from .errors import ContextParallelError


def _import_group_defaults_first() -> None:
    """Import ``torch.distributed.nn.functional`` while no process group exists.

    Its functions take ``group=group.WORLD`` as a default argument, evaluated when the
    module is first imported, and torch imports it along with ``torch._dynamo`` (a
    first ``torch.compile``, the first call of a ``custom_op`` or of
    ``torch.nn.attention.bias``). Imported after ``init_process_group``, it keeps the
    default group alive past ``destroy_process_group``: the group's gloo threads and
    TCPStore server then run into the interpreter's teardown, where they now and then
    abort the process. Imported here, before any group (a script imports attnkit first),
    the defaults hold None. Where a group already exists nothing is imported: that
    import would keep the group itself.
    """
    if dist.is_available() and not dist.is_initialized():
        import torch.distributed.nn.functional  # noqa: F401


_import_group_defaults_first()

__all__ = [
    "P2P",
    "AllToAll",
    "Pending",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "exchange_rows",
    "guard",
    "handed",
    "in_flight",
    "metadata_device",
    "p2p",
    "require_group",
    "settle",
    "wait_all",
]

P2P = tuple[str, torch.Tensor, int, int]
"""("send" | "recv", tensor, peer rank in the group, tag)."""

_LOST = ("connection reset", "closed by peer", "broken pipe", "connection refused", "eof")
_TIMEOUT = ("timed out", "timeout")


def require_group(where: str) -> None:
    """Raise ValueError, naming ``where``, unless torch.distributed has a process group
    (before any collective, which would raise torch's own message)."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"{where}: torch.distributed is not initialized; call "
            "torch.distributed.init_process_group first (torchrun sets up the environment)"
        )


def metadata_device(group: dist.ProcessGroup | None, like: object) -> torch.device:
    """Where a collective on ``group`` wants its tensors: ``like``'s device when it is a
    tensor, else the current CUDA device for NCCL and the CPU otherwise."""
    if isinstance(like, torch.Tensor):
        return like.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _translate(
    exc: RuntimeError, group: dist.ProcessGroup | None, what: str, peers: Sequence[int]
) -> ContextParallelError:
    """A backend's communication error as a ContextParallelError naming the exchange and
    the ranks it involved."""
    me = dist.get_rank(group)
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    low = said.lower()
    if len(peers) == 1:
        them, it = f"rank {peers[0]}", f"rank {peers[0]}"
    else:
        them, it = f"one of ranks {list(peers)}", "that rank"
    if any(w in low for w in _TIMEOUT):
        what_happened = (
            f"rank {me} waited longer than the process group's timeout for {them} during "
            f"{what}: {it} died, is stuck, or left the call after an error of its own"
        )
    elif any(w in low for w in _LOST):
        what_happened = (
            f"rank {me} lost {them} during {what}: the connection was closed ({it} died or "
            "tore down its process group)"
        )
    else:
        what_happened = f"rank {me}: {what} failed, exchanging with {them}"
    return ContextParallelError(
        f"context_parallel_attention: {what_happened}. The group cannot finish this call; "
        f"destroy it and restart the job (the backend said: {said})",
        ranks=peers,
        collective=what,
    )


def _others(group: dist.ProcessGroup | None) -> list[int]:
    me = dist.get_rank(group)
    return [r for r in range(dist.get_world_size(group)) if r != me]


@contextmanager
def guard(
    group: dist.ProcessGroup | None, what: str, peers: Sequence[int] | None = None
) -> Iterator[None]:
    """Turn a communication failure inside the block into a :class:`ContextParallelError`
    naming ``what`` and ``peers`` (default: every other rank of the group)."""
    try:
        yield
    except ContextParallelError:
        raise
    except RuntimeError as exc:  # gloo/NCCL errors, torch.distributed.DistError included
        # The frames the error passed through keep their locals for as long as the error
        # lives (a script may keep it): among them the backend's requests, which keep
        # gloo's connection thread alive past destroy_process_group. Drop those locals.
        traceback.clear_frames(exc.__traceback__)
        raise _translate(exc, group, what, _others(group) if peers is None else peers) from exc


_HOLD_HANDED = _features.INSTALLED.release < _features.GLOO_RELEASES_GIL_FLOOR
"""Whether this torch's gloo needs :func:`handed` (read once at import)."""

HANDED_WAIT_S = 0.02
"""How long :func:`handed` waits, after its block, for gloo to let go of the tensors, in
seconds; a tensor gloo still holds after that is kept in :data:`_STILL_HANDED`."""

_HANDED_POLL_S = 5e-5
_HANDED_YIELDS = 50
_yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))  # no sched_yield on Windows

_STILL_HANDED: list[tuple[torch.Tensor, int]] = []
"""(tensor, its use count before the collective) for each tensor a collective's block
returned while gloo's worker thread still held it; dropped by a later :func:`handed` once
gloo has let go, or at the interpreter's exit."""


def _gloo_runs(group: dist.ProcessGroup | None, device: torch.device) -> bool:
    """Whether ``group`` runs collectives on ``device``'s tensors with gloo (a group can
    name one backend per device: ``"cpu:gloo,cuda:nccl"``)."""
    name = str(dist.get_backend(group))
    if ":" not in name:
        return name == "gloo"
    for part in name.split(","):
        kind, _, backend = part.partition(":")
        if kind.strip() == device.type:
            return backend.strip() == "gloo"
    return False


def _use_count(t: torch.Tensor) -> int:
    """How many references hold ``t``'s TensorImpl (its Python object's one among them)."""
    return int(t._use_count())  # type: ignore[attr-defined]  # private, in torch >= 2.6


def _still_held(held: list[tuple[torch.Tensor, int]]) -> list[tuple[torch.Tensor, int]]:
    """The entries of ``held`` that something besides their Python object still holds."""
    return [(t, before) for t, before in held if _use_count(t) > before]


@contextmanager
def handed(group: dist.ProcessGroup | None, *tensors: torch.Tensor) -> Iterator[None]:
    """Run the block, which hands ``tensors`` to a collective on ``group``, and keep
    them until the backend has let go of them.

    Below :data:`attnkit._torch_features.GLOO_RELEASES_GIL_FLOOR`, gloo runs a
    collective on a worker thread, which drops its reference to the collective's
    tensors a moment after the caller's wait has returned. When the caller's Python
    object of such a tensor has gone first, that drop needs the GIL; and
    ``destroy_process_group()`` holds the GIL while it joins the worker threads. The
    two wait for each other for ever. Here every tensor stays referenced until its use
    count (``Tensor._use_count``) is back to what it was before the block: gloo's drop
    is then never the last. The wait is bounded by :data:`HANDED_WAIT_S`; what gloo
    still holds after it is kept for a later call to release.

    On a newer torch, and on any backend but gloo, this only runs the block.

    Args:
        group: the process group the collective runs on (None: the default group).
        *tensors: every tensor the block hands to the collective, inputs and outputs.
    """
    if not _HOLD_HANDED or not tensors or not _gloo_runs(group, tensors[0].device):
        yield
        return
    held = [(t, _use_count(t)) for t in tensors]
    try:
        yield
    finally:
        deadline = time.monotonic() + HANDED_WAIT_S
        held = _still_held(held)
        polls = 0
        while held and time.monotonic() < deadline:
            # The worker thread lets go within microseconds unless it waits for a CPU:
            # yield the CPU at first, then sleep.
            if polls < _HANDED_YIELDS:
                _yield_cpu()
            else:
                time.sleep(_HANDED_POLL_S)
            polls += 1
            held = _still_held(held)
        _STILL_HANDED[:] = _still_held(_STILL_HANDED) + held


def all_gather(
    outputs: list[torch.Tensor], t: torch.Tensor, group: dist.ProcessGroup | None, what: str
) -> None:
    """Every rank's ``t`` into ``outputs`` (one tensor of ``t``'s shape per rank, in rank
    order); ``what`` names it in errors."""
    with guard(group, what), handed(group, t, *outputs):
        dist.all_gather(outputs, t, group=group)


def exchange_rows(row: torch.Tensor, group: dist.ProcessGroup | None) -> list[list[int]]:
    """Every rank's ``row`` (1-D int64, the same length on every rank), in rank order,
    read on the host once."""
    gathered = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    all_gather(gathered, row, group, "the argument agreement (an all_gather of every rank's call)")
    rows: list[list[int]] = torch.stack(gathered).tolist()  # (P, width)
    return rows


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of a 1-D tensor: ``in_splits[d]`` values go to rank d and
    ``out_splits[s]`` values come from rank s. Backward runs the inverse exchange, as
    this Function again, so a backward that autograd records (``create_graph=True``)
    can be differentiated too. ``what`` names the exchange in errors."""

    @staticmethod
    def forward(
        ctx: Any,
        flat: torch.Tensor,
        in_splits: list[int],
        out_splits: list[int],
        group: dist.ProcessGroup | None,
        what: str,
    ) -> torch.Tensor:
        ctx.splits = (in_splits, out_splits)
        ctx.group = group
        ctx.what = what
        received = flat.new_empty(sum(out_splits))  # (sum(out_splits),)
        sent = flat.contiguous()
        with guard(group, what), handed(group, received, sent):
            dist.all_to_all_single(received, sent, out_splits, in_splits, group=group)
        return received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        in_splits, out_splits = ctx.splits
        what = ctx.what.replace("the all_to_all of", "the backward all_to_all of", 1)
        back = AllToAll.apply(grad, out_splits, in_splits, ctx.group, what)  # (sum(in_splits),)
        return back, None, None, None, None


def all_to_all(
    flat: torch.Tensor,
    in_splits: list[int],
    out_splits: list[int],
    group: dist.ProcessGroup | None,
    what: str = "a tensor",
) -> torch.Tensor:
    """Differentiable :class:`AllToAll` of a 1-D tensor; ``what`` names it in errors."""
    out: torch.Tensor = AllToAll.apply(
        flat, in_splits, out_splits, group, f"the all_to_all of {what}"
    )
    return out


def all_reduce(t: torch.Tensor, group: dist.ProcessGroup | None, what: str) -> None:
    """Sum ``t`` across the group in place."""
    with guard(group, f"the all_reduce of {what}"), handed(group, t):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)


@dataclass
class Pending:
    """Posted transfers: their requests, and (kind, peer) of each op for error messages."""

    requests: list[Any]
    ops: list[tuple[str, int]]
    group: dist.ProcessGroup | None
    what: str


def _one(kind: str, peer: int, what: str) -> str:
    return f"{what}: {kind} {'to' if kind == 'send' else 'from'} rank {peer}"


def p2p(ops: Sequence[P2P], group: dist.ProcessGroup | None, what: str = "") -> Pending:
    """Post every send and receive of ``ops`` at once; :func:`wait_all` waits for them.

    Peers are ranks within ``group``; tags keep messages between the same two ranks
    apart (gloo matches by tag, NCCL by order). ``what`` names the step in errors.
    """
    pending = Pending([], [(kind, peer) for kind, _, peer, _ in ops], group, what)
    if not ops:
        return pending
    p2p_ops = []
    for kind, tensor, peer, tag in ops:
        fn = dist.isend if kind == "send" else dist.irecv
        global_peer = peer if group is None else dist.get_global_rank(group, peer)
        p2p_ops.append(dist.P2POp(fn, tensor, global_peer, group, tag))
    peers = sorted({peer for _, peer in pending.ops})
    with guard(group, f"{what}: posting transfers", peers):
        pending.requests = list(dist.batch_isend_irecv(p2p_ops))
    return pending


SETTLE_S = 5.0
"""How long each transfer still posted after a failure is waited for, in seconds: a dead
peer's transfers fail at once and a live peer's finish, so only a peer that is alive but
silent makes these waits run out (each adds at most this much to the error's delay)."""


def _wait(req: Any, timeout_s: float | None) -> None:
    if timeout_s is None:
        req.wait()
    else:
        req.wait(timeout=timedelta(seconds=timeout_s))


def wait_all(pending: Pending) -> None:
    """Wait for every transfer of :func:`p2p`; a failure names the op and its peer.

    Every transfer is waited for, even after one has failed (the later waits bounded by
    :data:`SETTLE_S`), so that none is left posted in the backend when this returns or
    raises: a transfer left posted keeps the backend's connection state and the tensor
    alive past the call, to be torn down at some later point (the process's exit among
    them). The first failure is raised.
    """
    requests, pending.requests = pending.requests, []
    one_each = len(requests) == len(pending.ops)  # gloo; NCCL may coalesce
    peers = sorted({peer for _, peer in pending.ops})
    first: ContextParallelError | None = None
    for i in range(len(requests)):
        if one_each:
            kind, peer = pending.ops[i]
            ctx = guard(pending.group, _one(kind, peer, pending.what), [peer])
        else:
            ctx = guard(pending.group, f"{pending.what}: transfers with ranks {peers}", peers)
        try:
            with ctx:
                _wait(requests[i], None if first is None else SETTLE_S)
        except ContextParallelError as exc:
            first = first or exc
    requests.clear()  # an error raised here keeps this frame, and it no request
    if first is not None:
        raise first


def settle(pending: Pending) -> None:
    """Wait for every transfer of ``pending`` still posted, dropping their errors: the
    cleanup of a step that failed for another reason (that error is the one to raise).
    Each wait is bounded by the group's timeout; the peers of a ring step post their
    sides of these transfers before they compute, so the waits end promptly unless a
    peer has died or stopped."""
    try:
        wait_all(pending)
    except ContextParallelError:
        pass


@contextmanager
def in_flight(pending: Pending) -> Iterator[Pending]:
    """Run the block while the transfers of ``pending`` are in flight, then wait for them
    (:func:`wait_all`). When the block raises, the transfers are still waited for
    (:func:`settle`) before its error goes on, so none outlives the call."""
    try:
        yield pending
    except BaseException:
        settle(pending)
        raise
    wait_all(pending)
