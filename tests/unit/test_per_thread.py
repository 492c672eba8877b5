"""The per-thread call settings (``attnkit._per_thread``): ``use_backend()``'s choice and
``device_semantics()``' strict host reads, two fields of one record.

Each field belongs to its own context manager and its own thread: setting one leaves the
other as it was, another thread sees neither, and a compiled call is traced again when
either changes (both are read in its trace).
"""

from __future__ import annotations

import threading

import pytest
import torch

import attnkit
from attnkit import _host, masks
from attnkit.backends import dispatch

from tolerance import FLOAT32_CALL_REL, assert_close_to_scale


def test_each_setting_is_left_as_it_was_by_the_other() -> None:
    assert dispatch.forced_backends() is None and not _host.strict()
    with attnkit.use_backend("reference"):
        with _host.device_semantics():
            assert dispatch.forced_backends() == ("reference",) and _host.strict()
        assert dispatch.forced_backends() == ("reference",) and not _host.strict()
        with _host.device_semantics():
            with attnkit.use_backend("chunked"):
                assert dispatch.forced_backends() == ("chunked",) and _host.strict()
            assert dispatch.forced_backends() == ("reference",) and _host.strict()
    assert dispatch.forced_backends() is None and not _host.strict()


def test_another_thread_sees_neither_setting() -> None:
    """Thread A holds both settings while thread B reads its own (the defaults), then
    sets its own strict flag, which A does not see."""
    a_inside, b_done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def thread_a() -> None:
        with attnkit.use_backend("reference"), _host.device_semantics():
            a_inside.set()
            b_done.wait(5)
            seen["a"] = (dispatch.forced_backends(), _host.strict())

    def thread_b() -> None:
        a_inside.wait(5)
        seen["b"] = (dispatch.forced_backends(), _host.strict())
        with _host.device_semantics():
            seen["b_inside"] = (dispatch.forced_backends(), _host.strict())
        b_done.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {
        "a": (("reference",), True),
        "b": (None, False),
        "b_inside": (None, True),
    }


@pytest.mark.torch_feature("compile")
def test_compile_recompiles_when_the_strict_setting_changes() -> None:
    """A compiled causal call traced outside ``device_semantics()`` is traced again inside
    it (where it may read nothing on the host), and the first graph serves again after."""
    torch._dynamo.reset()
    calls: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        calls.append(1)
        return gm

    mask = masks.causal()

    def f(q: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, q, q, mask=mask)

    g = torch.compile(f, backend=counting_backend, fullgraph=True)
    q = torch.randn(1, 2, 8, 4)
    ref = attnkit.attention(q, q, q, mask=mask, backend="reference")
    assert_close_to_scale(g(q), ref, rel=FLOAT32_CALL_REL)
    with _host.device_semantics():
        assert_close_to_scale(g(q), ref, rel=FLOAT32_CALL_REL)
    assert_close_to_scale(g(q), ref, rel=FLOAT32_CALL_REL)
    assert len(calls) == 2  # once per setting; the third call reuses the first graph
