"""What the context-parallel tests' spawned gloo ranks share: a free port for the group's
rendezvous, starting the ranks and waiting for them (with every rank's stack when they
do not finish), the way a rank leaves once its work is done, and reading its report."""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def _load_repro() -> Any:
    """``scripts/gloo_exit_repro.py`` as a module: it stays runnable with torch alone (a
    repro for upstream), and the tests count a group's threads the same way."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "gloo_exit_repro.py"
    spec = importlib.util.spec_from_file_location("gloo_exit_repro", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


group_threads = _load_repro().group_threads

THREADS_LEFT = "threads left after destroy_process_group"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, worker: Callable[..., None], out_dir: str, *args: Any) -> None:
    """A spawned rank: on SIGUSR1, dump every thread's Python stack to
    ``out_dir/stack{rank}.txt`` (faulthandler, which needs no GIL: it works in a
    deadlock), then run ``worker(rank, *args)``."""
    with open(Path(out_dir, f"stack{rank}.txt"), "w", encoding="utf-8") as stacks:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        try:
            worker(rank, *args)
        finally:
            faulthandler.unregister(signal.SIGUSR1)  # before its file closes


def run_ranks(
    worker: Callable[..., None], world: int, args: tuple[Any, ...], out_dir: str, deadline_s: float
) -> None:
    """Spawn ``world`` processes running ``worker(rank, *args)`` and wait for them.

    Past ``deadline_s`` seconds, every rank still running dumps its threads' stacks, is
    killed, and a TimeoutError carries the stacks: a hang says where it hangs. A rank
    that fails raises torch's ProcessRaisedException or ProcessExitedException.
    """
    ctx = mp.start_processes(
        _rank_main, args=(worker, out_dir, *args), nprocs=world, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the {world}-process group did not finish in {deadline_s:g} s\n"
                    + _stacks(ctx.processes, out_dir)
                )
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()


def _stacks(processes: list[Any], out_dir: str) -> str:
    """Each running rank's threads' stacks, asked for with SIGUSR1 (see :func:`_rank_main`)."""
    running = [(rank, proc) for rank, proc in enumerate(processes) if proc.is_alive()]
    for _, proc in running:
        os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(2)
    parts = []
    for rank, _ in running:
        path = Path(out_dir, f"stack{rank}.txt")
        parts.append(f"rank {rank} still running:\n{path.read_text() if path.exists() else '?'}")
    return "\n".join(parts)


def report_and_leave(path: Path, report: dict[str, Any]) -> None:
    """Tear the group down, then write ``report`` to ``path`` as JSON, with the group's
    threads still running (``group_threads``) under :data:`THREADS_LEFT`.

    The rank then returns and its process exits as a user's script does: no barrier
    and no ``os._exit``. Once ``destroy_process_group`` has returned, nothing may keep
    the group alive: a group kept (by a request still posted, or by anything holding
    the group object) keeps its threads running into the interpreter's teardown, where
    they now and then aborted the process. :func:`read_report` fails on any left.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    report[THREADS_LEFT] = group_threads()
    path.write_text(json.dumps(report))


def read_report(path: Path, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s report written by :func:`report_and_leave`; an AssertionError
    when the rank's group outlived ``destroy_process_group``."""
    report: dict[str, Any] = json.loads(path.read_text())
    left = report.pop(THREADS_LEFT)
    assert left == [], f"rank {rank}: the process group's threads outlived it: {left}"
    return report
