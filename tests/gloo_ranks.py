"""What the context-parallel tests' spawned gloo ranks share: a free port for the group's
rendezvous, and the way a rank leaves once its report is written."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import torch.distributed as dist


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report_and_leave(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` as JSON and tear the group down.

    The rank then returns and its process exits as a user's script does: no barrier
    first and no ``os._exit`` after, so the tests also check that context parallelism
    leaves nothing posted in gloo that would abort the interpreter's teardown.
    """
    path.write_text(json.dumps(report))
    if dist.is_initialized():
        dist.destroy_process_group()
