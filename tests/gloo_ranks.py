"""What the context-parallel tests' spawned gloo ranks share: a free port for the group's
rendezvous, and the way a rank leaves once its report is written."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as dist


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report_and_leave(path: Path, report: dict[str, Any]) -> NoReturn:
    """Write ``report`` to ``path`` as JSON, tear the group down, and leave the process.

    The ranks meet at a barrier first, so that every rank's transfers are done before
    any rank tears down. The process then leaves without the interpreter's teardown:
    gloo's threads sometimes abort the process there ("terminate called without an
    active exception"), after the results are written and the group is gone.
    """
    path.write_text(json.dumps(report))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)
