"""Do two gloo ranks exit cleanly after their last transfer? Run it many times and count.

    python scripts/gloo_exit_repro.py --mode plain --runs 200 --load 2
    python scripts/gloo_exit_repro.py --mode attnkit --runs 200 --load 2

Each run starts two processes (``--rank 0`` / ``--rank 1``) that meet through a
TCPStore on 127.0.0.1, form a gloo group on the CPU and then:

- ``plain``: pass a tensor around a ring with ``dist.isend``/``dist.irecv`` (each
  request waited), a few steps;
- ``attnkit``: one context-parallel attention call (the ring, causal mask) forward and
  backward;
- ``plain-leftover``: as ``plain``, and rank 0 also posts an ``irecv`` that nothing
  matches and keeps its request (as an exception's traceback keeps the requests of
  the frames it passed through);
- ``attnkit-error``: one context-parallel forward in which rank 0's first block
  raises; rank 0 keeps the error (as a script that logs it and goes on);
- ``plain-pinned``: ``plain``, then the process's first ``import torch._dynamo`` (as a
  first ``torch.compile`` or ``custom_op`` call does), after the group exists: it
  imports ``torch.distributed.nn.functional``, whose functions keep ``group.WORLD`` as
  a default argument, so the group outlives ``destroy_process_group`` (torch alone);
- ``attnkit-compile``: ``attnkit``, then the same late import, with
  ``attnkit.distributed`` imported before the group (as a script imports it): the
  defaults were bound while no group existed, and nothing is kept;
- ``plain-collective``: a few ``all_reduce`` and ``all_gather`` calls on tensors dropped
  as soon as each call returns. On torch below 2.8 (measured: 2.6.0 and 2.7.1, not
  2.8.0) ``destroy_process_group()`` then now and then hangs for ever: it holds the GIL
  while it joins gloo's worker threads, and a worker thread dropping the last
  reference to such a tensor waits for the GIL (torch alone; ``--deadline 30`` counts
  the hangs as "killed at the deadline");

then ``dist.destroy_process_group()`` and a normal return from the script: no
barrier, no ``os._exit``, as a user's script ends. After ``destroy_process_group``
no thread of the group (gloo's, the TCPStore server's) should be left; ``--strict``
makes a rank that still has one (Linux: ``/proc/self/task``) exit with code 3. A
request still held keeps gloo's connection thread (``gloo_tcp_loop``) running past
``destroy_process_group``, into the interpreter's teardown: ``plain-leftover --strict`` and ``plain-pinned --strict`` show
it with torch alone.

``--load K`` keeps K busy Python processes beside the runs (gloo's teardown races
show under CPU contention). The parent counts each rank's exit: code 0, another code, or a signal (-6 is SIGABRT,
"terminate called without an active exception"), prints the tally, and exits 1 when
any rank did not exit with 0.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

WORLD = 2
MODES = (
    "plain",
    "attnkit",
    "plain-leftover",
    "attnkit-error",
    "plain-pinned",
    "attnkit-compile",
    "plain-collective",
)


def _plain(rank: int) -> None:
    """A few ring steps of plain torch point-to-point transfers, every request waited."""
    x = torch.full((4096,), float(rank))
    for _ in range(4):
        got = torch.empty_like(x)
        send = dist.isend(x, (rank + 1) % WORLD)
        recv = dist.irecv(got, (rank - 1) % WORLD)
        assert send is not None and recv is not None  # None only off the group
        send.wait()
        recv.wait()
        x = got + 1


def _plain_collective(rank: int) -> None:
    """A few collectives whose tensors the caller drops as soon as each call returns."""
    for _ in range(4):
        total = torch.full((64,), float(rank))
        dist.all_reduce(total)
        gathered = [torch.empty(3) for _ in range(WORLD)]
        dist.all_gather(gathered, torch.ones(3))
        del total, gathered


def _attnkit(rank: int) -> None:
    """One context-parallel ring attention call, forward and backward."""
    from attnkit import distributed as cp
    from attnkit import masks

    torch.manual_seed(0)
    full = [torch.randn(2, 4, 64, 16, dtype=torch.float64) for _ in range(3)]
    q, k, v = (cp.shard(t, rank=rank, world_size=WORLD).requires_grad_() for t in full)
    out = cp.context_parallel_attention(q, k, v, mask=masks.causal(), strategy="ring")
    out.sum().backward()


def _plain_leftover(rank: int) -> list[Any]:
    """``plain``, and a receive nothing matches, its request kept by the caller."""
    kept = [dist.irecv(torch.empty(8), (rank - 1) % WORLD, tag=99)] if rank == 0 else []
    _plain(rank)
    return kept


def _plain_pinned(rank: int) -> None:
    """``plain``, then the first ``import torch._dynamo`` of the process, after the group
    exists: it imports ``torch.distributed.nn.functional``, whose functions take
    ``group=group.WORLD`` as a default, evaluated then: the default group is kept
    alive by them, past ``destroy_process_group``, into the interpreter's teardown."""
    _plain(rank)
    _plain_pinned_import()


def _plain_pinned_import() -> None:
    """The process's first ``import torch._dynamo``, as a user's first compile does."""
    importlib.import_module("torch._dynamo")


def _attnkit_error(rank: int) -> list[Any]:
    """A context-parallel forward whose first block raises on rank 0; the error, kept."""
    from attnkit import distributed as cp
    from attnkit.distributed import ring

    def fail(*args: Any) -> Any:
        raise RuntimeError("a failure of rank 0's own")

    if rank == 0:
        ring._block_call = fail  # type: ignore[assignment]
    torch.manual_seed(0)
    x = cp.shard(torch.randn(2, 4, 64, 16, dtype=torch.float64), rank=rank, world_size=WORLD)
    try:
        cp.context_parallel_attention(x, x, x, strategy="ring")
    except RuntimeError as exc:
        return [exc]
    return []


def group_threads() -> list[str]:
    """The names of this process's threads that belong to a process group: gloo's
    (``gloo_tcp_loop``, ``pt_gloo_runloop``) and the TCPStore server's
    (``pt_tcpstore_uv``). Linux only (``/proc/self/task``); elsewhere []."""
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if "gloo" in name or "tcpstore" in name:
            names.append(name)
    return sorted(names)


def _warm_up() -> None:
    """Import what an attnkit call imports on first use (autograd imports sympy), once in
    the parent of the forked ranks: the imports, not the exit, would take a run's time."""
    import torch.fx.experimental.symbolic_shapes  # sympy: seconds of imports

    import attnkit
    import attnkit.distributed

    q = torch.randn(1, 1, 4, 2, dtype=torch.float64, requires_grad=True)
    attnkit.attention(q, q, q, mask=attnkit.masks.causal()).sum().backward()


def _rank(rank: int, port: int, mode: str, strict: bool) -> None:
    """One rank of one run: join the group, work, leave as a user's script does."""
    torch.set_num_threads(1)
    # The store is the group's alone (no name keeps it): destroying the group ends it,
    # and with it rank 0's TCPStore server thread.
    dist.init_process_group(
        "gloo",
        store=dist.TCPStore("127.0.0.1", port, WORLD, is_master=rank == 0,
                            timeout=datetime.timedelta(seconds=60)),
        rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    kept: list[Any] = []
    if mode == "plain":
        _plain(rank)
    elif mode == "attnkit":
        _attnkit(rank)
    elif mode == "plain-leftover":
        kept = _plain_leftover(rank)
    elif mode == "plain-pinned":
        _plain_pinned(rank)
    elif mode == "attnkit-compile":
        _attnkit(rank)
        _plain_pinned_import()
    elif mode == "plain-collective":
        _plain_collective(rank)
    else:
        kept = _attnkit_error(rank)
    dist.destroy_process_group()
    left = group_threads()
    if strict and left:
        sys.stderr.write(f"rank {rank}: group threads after destroy_process_group: {left}\n")
        sys.exit(3)
    del kept


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exit_name(code: int | None) -> str:
    if code is None:
        return "killed at the deadline"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def _fork_rank(rank: int, port: int, mode: str, strict: bool) -> int:
    """Fork a child that runs one rank and then exits as a script does (``sys.exit``: the
    interpreter's whole teardown runs). Forking from a process that has imported torch
    but started no thread saves the import's seconds per run."""
    pid = os.fork()
    if pid == 0:
        sys.stdout.flush()
        _rank(rank, port, mode, strict)
        sys.exit(0)  # unwinds through frames without handlers: a normal exit
    return pid


def _poll(pid: int) -> int | None:
    """The exit of a child that is done (negative: the signal), or None while it runs."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        return None
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class Run:
    """Both ranks of one run, started as forked children or as new interpreters."""

    def __init__(self, mode: str, fork: bool, strict: bool, timeout_s: float = 240.0) -> None:
        port = _free_port()
        self.deadline = time.monotonic() + timeout_s
        self.codes: list[int | None] = [None] * WORLD
        self.pids: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        if fork:
            self.pids = [_fork_rank(r, port, mode, strict) for r in range(WORLD)]
        else:
            args = [sys.executable, __file__, "--mode", mode, "--port", str(port)]
            args += ["--strict", "--rank"] if strict else ["--rank"]
            self.procs = [
                subprocess.Popen([*args, str(r)], stdout=subprocess.DEVNULL) for r in range(WORLD)
            ]

    def done(self) -> bool:
        """Whether both ranks have exited; past the deadline, kill them (code None)."""
        for i in range(WORLD):
            if self.codes[i] is None:
                self.codes[i] = self.procs[i].poll() if self.procs else _poll(self.pids[i])
        if all(c is not None for c in self.codes):
            return True
        if time.monotonic() < self.deadline:
            return False
        for i in range(WORLD):
            if self.codes[i] is None:
                if self.procs:
                    self.procs[i].kill()
                    self.procs[i].wait()
                else:
                    os.kill(self.pids[i], signal.SIGKILL)
                    os.waitpid(self.pids[i], 0)
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default="plain")
    parser.add_argument("--strict", action="store_true", help="exit 3 if a gloo thread is left")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    parser.add_argument(
        "--deadline", type=float, default=240.0, help="seconds a run may take before it is killed"
    )
    parser.add_argument(
        "--spawn", action="store_true", help="start each rank as a new interpreter (slow)"
    )
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        _rank(args.rank, args.port, args.mode, args.strict)
        return 0
    busy = f"import time\nend = time.time() + {args.max_seconds}\nwhile time.time() < end: pass"
    load = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(args.load)]
    if not args.spawn and args.mode == "attnkit-compile":
        import attnkit.distributed  # noqa: F401  (imported before the group, as a script does)
    elif not args.spawn and args.mode.startswith("attnkit"):
        _warm_up()
    me = os.getpid()
    tally: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + args.max_seconds
    started = runs = 0
    active: list[Run] = []
    try:
        while runs < args.runs:
            while len(active) < args.jobs and started < args.runs and time.monotonic() < deadline:
                active.append(Run(args.mode, not args.spawn, args.strict, timeout_s=args.deadline))
                started += 1
            if not active:
                break
            time.sleep(0.05)
            for run in [r for r in active if r.done()]:
                active.remove(run)
                for code in run.codes:
                    tally[_exit_name(code)] += 1
                runs += 1
                if runs % 10 == 0:
                    print(f"{args.mode}: {runs} runs: {dict(tally)}", flush=True)
    finally:
        for p in load if os.getpid() == me else ():  # a forked rank leaves them alone
            p.kill()
            p.wait()
    print(f"{args.mode}: {runs} runs, {runs * WORLD} rank exits: {dict(tally)}", flush=True)
    return 0 if set(tally) <= {"exit 0"} else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
