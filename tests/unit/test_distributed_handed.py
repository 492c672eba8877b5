"""attnkit.distributed.comm.handed: a collective's tensors stay referenced until the
backend has let go of them (torch below GLOO_RELEASES_GIL_FLOOR, where gloo's
destroy_process_group can otherwise hang), on one process, with the backend's late
reference played by an autograd graph that saves the tensor."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from attnkit import _torch_features as features
from attnkit.distributed import comm


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``handed`` active whatever the installed torch, as if the group ran gloo."""
    monkeypatch.setattr(comm, "_HOLD_HANDED", True)
    monkeypatch.setattr(comm, "_gloo_runs", lambda group, device: True)
    comm._STILL_HANDED.clear()
    yield
    comm._STILL_HANDED.clear()


def _late_reference(t: torch.Tensor) -> torch.Tensor:
    """A tensor whose graph holds a reference to ``t``'s TensorImpl (as gloo's worker
    thread holds a collective's tensors a moment after the caller's wait returns)."""
    return torch.ones(t.shape, requires_grad=True) * t


def test_a_tensor_still_held_after_the_block_is_kept_until_let_go(hold: None) -> None:
    t = torch.ones(3)
    with comm.handed(None, t):
        late = _late_reference(t)
    assert [kept for kept, _ in comm._STILL_HANDED] == [t]
    del late  # the backend lets go
    with comm.handed(None, torch.zeros(2)):
        pass
    assert comm._STILL_HANDED == []


def test_the_block_waits_for_a_reference_dropped_soon_after(
    hold: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(comm, "HANDED_WAIT_S", 30.0)
    t = torch.ones(3)
    graphs = []
    drop = threading.Timer(0.05, graphs.clear)
    with comm.handed(None, t):
        graphs.append(_late_reference(t))
        drop.start()
    drop.join()
    assert t._use_count() == 1  # type: ignore[attr-defined]
    assert comm._STILL_HANDED == []


def test_only_gloo_below_the_floor_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert comm._HOLD_HANDED == (features.INSTALLED.release < features.GLOO_RELEASES_GIL_FLOOR)
    backends = {"cpu": "gloo", "cuda": "nccl"}
    monkeypatch.setattr(comm.dist, "get_backend", lambda group: "cpu:gloo, cuda:nccl")
    for kind, name in backends.items():
        assert comm._gloo_runs(None, torch.device(kind)) == (name == "gloo")
    monkeypatch.setattr(comm.dist, "get_backend", lambda group: "nccl")
    assert not comm._gloo_runs(None, torch.device("cpu"))
    monkeypatch.setattr(comm.dist, "get_backend", lambda group: "gloo")
    assert comm._gloo_runs(None, torch.device("cpu"))
    monkeypatch.setattr(comm, "_HOLD_HANDED", False)
    t = torch.ones(3)
    with comm.handed(None, t):
        late = _late_reference(t)
    assert comm._STILL_HANDED == []
    del late


def test_unshard_names_its_exchange_when_a_rank_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """unshard's all_gathers go through comm: a lost peer is a ContextParallelError that
    names the exchange and the ranks, not the backend's bare error."""
    from attnkit import distributed as cp
    from attnkit.distributed import layout

    def lost(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(layout.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(layout.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(comm.dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(comm.dist, "all_gather", lost)
    monkeypatch.setattr(comm, "_HOLD_HANDED", False)
    with pytest.raises(cp.ContextParallelError) as caught:
        cp.unshard(torch.zeros(1, 3, 2))
    said = str(caught.value)
    assert "rank 0 lost rank 1 during the shard shapes of unshard" in said
    assert "Connection reset by peer" in said
