"""The ATen graphs a compiled function runs, for tests that read which ops it holds."""

from __future__ import annotations

from collections.abc import Callable

import torch


def aten_graph_code(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> str:
    """The code of the forward graphs AOT autograd hands to the compiler when ``fn`` is
    compiled whole (``fullgraph=True``) and called on ``inputs``: the ops the compiled
    call runs. A call that dynamo keeps whole (attnkit's traced route runner) shows there
    as the ops it runs. Resets dynamo before tracing."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    codes: list[str] = []

    def keep(gm: torch.fx.GraphModule, _: object) -> torch.fx.GraphModule:
        codes.append(gm.code)
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=keep), fullgraph=True)(*inputs)
    return "".join(codes)
