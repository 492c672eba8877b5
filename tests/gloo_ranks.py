"""What the context-parallel tests' spawned gloo ranks share: a free port for the group's
rendezvous, the way a rank leaves once its work is done, and reading its report."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path
from typing import Any

import torch.distributed as dist


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
