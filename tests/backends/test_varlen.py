"""The shared variable-length unpadding: kept lengths, key indices, groups, and the
padded layout given to torch's variable-length kernel on CUDA."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import _host, masks
from attnkit._inputs import validate_inputs
from attnkit.backends import varlen
from attnkit.blockplan import RaggedSeq

from tolerance import FLOAT32_CALL_REL, assert_close_to_scale


def _inputs(mask: masks.Mask, B: int = 3, L: int = 6, S: int = 8):  # type: ignore[no-untyped-def]
    q = torch.randn(B, 2, L, 4)
    k = torch.randn(B, 2, S, 4)
    return validate_inputs(q, k, k, mask=mask)


def test_lengths_combine_valid_lens_and_key_padding_without_a_loop_over_keys() -> None:
    pad = torch.tensor(
        [
            [False] * 8,  # every key
            [False, True, False, False, True, True, True, True],  # keys 0, 2, 3: not a prefix
            [False, False, False, True, True, True, True, True],  # a prefix of 3
        ]
    )
    mask = masks.valid_lens(torch.tensor([5, 8, 2]), queries=True) & masks.key_padding(pad)
    inputs = _inputs(mask, L=8)
    assert varlen.can_unpad(inputs)
    layout = inputs.block_plan().ragged()
    assert layout is not None
    seqs, causal = layout
    assert [sq.q_len for sq in seqs] == [5, 8, 2]
    assert [sq.k_len for sq in seqs] == [5, 3, 2]
    assert seqs[0].key_idx is None and seqs[2].key_idx is None
    assert seqs[1].key_idx is not None and seqs[1].key_idx.tolist() == [0, 2, 3]
    assert not causal


def test_a_packed_batch_of_documents_is_a_ragged_batch_of_its_documents() -> None:
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [5, 5, 5, 5, 5, 5, 5, 5]])
    inputs = _inputs(masks.document(ids) & masks.causal(), B=2, L=8)
    layout = inputs.block_plan().ragged()
    assert layout is not None
    seqs, causal = layout
    assert causal
    assert [(sq.b, sq.q0, sq.q_len, sq.k0, sq.k_len) for sq in seqs] == [
        (0, 0, 3, 0, 3),
        (0, 3, 2, 3, 2),
        (0, 5, 1, 5, 1),
        (1, 0, 8, 0, 8),
    ]


def test_no_unpadding_when_lengths_would_be_read_from_a_device() -> None:
    inputs = _inputs(masks.valid_lens(torch.tensor([5, 8, 2])))
    assert varlen.can_unpad(inputs)
    with _host.device_semantics():
        assert not varlen.can_unpad(inputs)


@pytest.mark.parametrize(
    "mask",
    [
        masks.valid_lens(torch.randint(0, 9, (3, 6))),  # per-query lengths
        masks.causal("bottom_right") & masks.valid_lens(torch.tensor([1, 2, 3])),
        masks.window(2, 0) & masks.valid_lens(torch.tensor([1, 2, 3])),
        masks.causal(),
    ],
)
def test_masks_that_cannot_be_unpadded(mask: masks.Mask) -> None:
    assert not varlen.can_unpad(_inputs(mask))


def test_take_keys_pads_the_kept_rows() -> None:
    t = torch.arange(12.0).view(1, 6, 2)
    out = varlen.take_keys(t, RaggedSeq(0, 0, 1, 0, 2, torch.tensor([1, 4])), 3)
    assert out.tolist() == [[[2.0, 3.0], [8.0, 9.0], [0.0, 0.0]]]
    assert varlen.take_keys(t, RaggedSeq(0, 0, 1, 0, 2), 2).tolist() == [[[0.0, 1.0], [2.0, 3.0]]]
    assert varlen.take_keys(t, RaggedSeq(0, 0, 1, 5, 1), 2).tolist() == [[[10.0, 11.0], [0.0, 0.0]]]


def test_padded_sequences_layout() -> None:
    cu_q, cu_k = varlen.padded_sequences(torch.tensor([2, 0, 5]), L=4, S=5, queries=True)
    assert cu_q.tolist() == [0, 2, 4, 4, 8, 12, 12]
    assert cu_k.tolist() == [0, 2, 5, 5, 10, 15, 15]
    cu_q, _ = varlen.padded_sequences(torch.tensor([2, 0]), L=3, S=5, queries=False)
    assert cu_q.tolist() == [0, 3, 3, 6, 6]


def _packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Packed-sequence attention written out, sequence by sequence (torch's semantics)."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
    for n in range(cu_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_q[n]), int(cu_q[n + 1]), int(cu_k[n]), int(cu_k[n + 1])
        assert q1 - q0 <= max_q and k1 - k0 <= max_k
        if q1 == q0 or k1 == k0:
            continue
        qs, ks, vs = q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1)
        if enable_gqa:
            ks = ks.repeat_interleave(qs.shape[0] // ks.shape[0], 0)
            vs = vs.repeat_interleave(qs.shape[0] // vs.shape[0], 0)
        logits = qs @ ks.transpose(-2, -1) * scale
        if window_size == (-1, 0):
            logits = logits.masked_fill(
                ~torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(k1 - k0 - (q1 - q0)), -1e30
            )
        out[q0:q1] = (logits.softmax(-1) @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("queries,causal", [(False, False), (True, False), (True, True)])
def test_torch_varlen_layout_matches_reference(
    queries: bool, causal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(varlen, "VARLEN_ATTN", _packed_attention)
    monkeypatch.setattr(varlen, "VARLEN_OPTIONS", frozenset({"scale", "window_size", "enable_gqa"}))
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 6, 8, generator=g)
    k, v = (torch.randn(3, 2, 6, 8, generator=g) for _ in range(2))
    lens = torch.tensor([6, 0, 3])
    got = varlen.torch_varlen_attention(q, k, v, lens, queries=queries, causal=causal, scale=0.3)
    mask = masks.valid_lens(lens, queries=queries)
    mask = mask & masks.causal() if causal else mask
    want = attnkit.attention(q, k, v, mask=mask, scale=0.3, backend="reference")
    assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL)


def test_torch_varlen_passes_only_the_options_its_torch_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.11's ``varlen_attn`` has ``window_size`` but no ``enable_gqa``: a call with
    one head count per side passes neither (no causal mask), so it runs there."""

    def older(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size=(-1, -1)):  # type: ignore[no-untyped-def]
        return _packed_attention(
            q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size
        )

    monkeypatch.setattr(varlen, "VARLEN_ATTN", older)
    monkeypatch.setattr(varlen, "VARLEN_OPTIONS", frozenset({"scale", "window_size"}))
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    lens = torch.tensor([5, 2])
    for causal in (False, True):
        got = varlen.torch_varlen_attention(q, k, v, lens, queries=True, causal=causal, scale=0.4)
        mask = masks.valid_lens(lens, queries=True)
        mask = mask & masks.causal() if causal else mask
        want = attnkit.attention(q, k, v, mask=mask, scale=0.4, backend="reference")
        assert_close_to_scale(got, want, rel=FLOAT32_CALL_REL)


def test_torch_varlen_route_needs_cuda() -> None:
    inputs = _inputs(masks.valid_lens(torch.tensor([2, 3, 4])))
    assert not varlen.torch_varlen_route(inputs)  # a CPU call keeps the unpadded path


def _as_cuda(inputs):  # type: ignore[no-untyped-def]
    """``inputs`` reporting a CUDA device (its plan built on the CPU): the route's
    decision alone, without a GPU."""
    import dataclasses

    from attnkit._inputs import AttentionInputs

    @dataclasses.dataclass(slots=True)
    class OnCuda(AttentionInputs):
        @property
        def device(self) -> torch.device:  # type: ignore[override]
            return torch.device("cuda")

    plan = inputs.block_plan()
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs) if f.init}
    moved = OnCuda(**fields)
    moved._plan = plan
    return moved


def test_torch_varlen_route_leaves_modifiers_head_scales_and_broadcasts_to_sdpa(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA route computes plain softmax(scale·q·k) over one batch: ALiBi (0.13 off),
    a per-head scale (0.53 off) were dropped there, and a key batch of 1 failed to
    reshape. Those calls now take sdpa's other paths."""
    monkeypatch.setattr(varlen, "torch_varlen", lambda: lambda *a, **k: None)
    monkeypatch.setattr(varlen, "VARLEN_OPTIONS", frozenset({"window_size", "enable_gqa"}))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 16, generator=g).bfloat16()
    k1 = torch.randn(1, 4, 6, 16, generator=g).bfloat16()
    mask = masks.valid_lens(torch.tensor([4, 6]), queries=True) & masks.causal()
    kw = {"mask": mask, "check_finite": False}
    assert varlen.torch_varlen_route(_as_cuda(validate_inputs(q, q, q, **kw)))
    for call in (
        validate_inputs(q, q, q, mods=attnkit.mods.alibi(4, causal=True), **kw),
        validate_inputs(q, q, q, scale=torch.tensor([0.05, 0.5, 2.0, 4.0]), **kw),
        validate_inputs(q, k1, k1, **kw),
        # the kernel cleans no non-finite value (a masked NaN value reached the rows
        # before it): the policy's calls take the other paths
        validate_inputs(q, q, q, mask=mask),
    ):
        assert not varlen.torch_varlen_route(_as_cuda(call))
