"""The triton kernels as torch ops, and the packed mask's fields, under the interpreter.

- ``torch.compile(fullgraph=True)`` of a model whose attention runs on triton: no
  graph break, the reference's values and gradients, no recompilation over shapes it
  has seen (inductor on the CPU, the kernels as opaque ops).
- The backward op from (out, lse, d_out, d_lse) alone gives autograd's gradients.
- Mask fields the mask classes do not reach yet (key/query/row ranges with a lower
  bound, document ids, two OR-ed clauses), through :func:`pack_mask` and the ops,
  against dense masks built here; FULL, PARTIAL and EMPTY tiles all taken.
"""

from __future__ import annotations

from interpreted_triton import interpreted_triton  # first: sets TRITON_INTERPRET=1

# isort: split

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
import torch._dynamo.utils

import attnkit
from attnkit import masks
from attnkit.backends.triton.kmask import record, tile_state
from attnkit.backends.triton.maskargs import MaskSpec, pack_mask
from attnkit.blockplan import Clause
from attnkit.blockplan.atoms import Document

from tolerance import assert_close_to_scale

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _states_kernel(MASK, OUT, L, S, LO0, HI0, LO1, HI1, MB: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr):  # fmt: skip
    """Every tile's :func:`tile_state` into OUT (B0, cdiv(L, BM), cdiv(S, BN))."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    b0 = tl.program_id(2)
    rec = record(MASK, MB, b0, L, S)
    state = tile_state(rec, MB, pid_m * BM, pid_n * BN, L, S, LO0, HI0, LO1, HI1, BM, BN)
    tl.store(OUT + (b0 * tl.num_programs(0) + pid_m) * tl.num_programs(1) + pid_n, state)


@pytest.fixture(scope="module", autouse=True)
def triton_registered() -> Iterator[None]:
    """The backend under the interpreter for this module only (tests/interpreted_triton.py)."""
    with interpreted_triton():
        yield


def _ops():
    from attnkit.backends.triton import ops

    return ops


@pytest.mark.parametrize(
    "compiler", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_compiles_fullgraph_without_graph_breaks_or_recompiles(compiler: str) -> None:
    """The op is one node of one graph, under dynamo and AOTAutograd by default, and
    through inductor's code generation too under ``slow``."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[0, -2:] = True
    mask = masks.causal("bottom_right") & masks.key_padding(pad)

    def model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnkit.attention(q, k, v, mask=mask, backend="triton").square().sum()

    graphs_seen: list[str] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs_seen.append(str(gm.code))
        if compiler == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("aot_eager")(gm, example_inputs)

    compiled = torch.compile(model, fullgraph=True, backend=recording)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2, 2, 9, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, 9, 8, generator=gen, requires_grad=True)
    for step, L in enumerate((5, 7, 5)):  # two shapes compiled, then one of them again
        if step == 2:
            graphs = counters["stats"]["unique_graphs"]
        q = torch.randn(2, 2, L, 8, generator=gen, requires_grad=True)
        got = compiled(q, k, v)
        got_grads = torch.autograd.grad(got, [q, k, v])
        out = attnkit.attention(q, k, v, mask=mask, backend="reference").square().sum()
        want_grads = torch.autograd.grad(out, [q, k, v])
        assert_close_to_scale(got, out)
        for g, w in zip(got_grads, want_grads, strict=True):
            assert_close_to_scale(g, w)
    assert counters["stats"]["unique_graphs"] == graphs  # shapes seen: no recompile
    assert not counters["graph_break"]
    assert graphs_seen and all("attnkit.triton_attention" in code for code in graphs_seen)


def _operands(q, k, v, spec, L, S):
    """Kernel operands of a (B, H, L, E) call with a MaskSpec, as the backend builds them."""
    packed = pack_mask(spec, L, S, tuple(q.shape[:2]), q.device)
    return (q, k, v, None, None, None), (packed.records, packed.keep, packed.bias, packed.ints)


def test_backward_op_from_out_and_lse_alone() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 7, 8, generator=gen, requires_grad=True)
    k = torch.randn(2, 1, 11, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, 1, 11, 5, generator=gen, requires_grad=True)
    spec = MaskSpec([Clause(hi=2, key_hi=torch.tensor([6, 11]))])
    (q4, k4, v4, kb, w, vbad), margs = _operands(q, k, v, spec, 7, 11)
    ops = _ops()
    out, lse, _ = ops.attention_forward(q4, k4, v4, kb, w, vbad, *margs, 0.5, False)
    d_out = torch.randn(out.shape, generator=gen)
    d_lse = torch.randn(lse.shape, generator=gen)
    want = torch.autograd.grad((out * d_out).sum() + (lse * d_lse).sum(), [q, k, v])
    got = ops.attention_backward(
        q.detach(), k.detach(), v.detach(), None, None, *margs, 0.5,
        out.detach(), lse.detach(), d_out, d_lse, None, None,
    )  # fmt: skip
    for g, w_ in zip(got[:3], want, strict=True):
        assert_close_to_scale(g, w_)


def _dense(spec: MaskSpec, B: int, L: int, S: int) -> torch.Tensor:
    """(B, L, S) bool of a spec, written out pair by pair."""
    i = torch.arange(L).view(1, L, 1)
    j = torch.arange(S).view(1, 1, S)
    out = torch.zeros(B, L, S, dtype=torch.bool)
    for c in spec.clauses:
        keep = torch.ones(B, L, S, dtype=torch.bool)
        if c.lo is not None:
            keep &= j >= i + c.lo
        if c.hi is not None:
            keep &= j <= i + c.hi
        if c.key_lo is not None:
            keep &= j >= c.key_lo.view(-1, 1, 1)
        if c.key_hi is not None:
            keep &= j < c.key_hi.view(-1, 1, 1)
        if c.query_lo is not None:
            keep &= i >= c.query_lo.view(-1, 1, 1)
        if c.query_hi is not None:
            keep &= i < c.query_hi.view(-1, 1, 1)
        if c.row_lo is not None:
            keep &= j >= c.row_lo.view(-1, L, 1)
        if c.row_hi is not None:
            keep &= j < c.row_hi.view(-1, L, 1)
        if c.key_keep is not None:
            keep &= c.key_keep.view(-1, 1, S)
        for d in c.docs:
            q_ids, k_ids = d.q_ids.view(-1, L, 1), d.k_ids.view(-1, 1, S)
            same = (q_ids == k_ids) & (q_ids >= 0)
            keep &= same if d.equal else ~same
        for t in c.dense_keep:
            keep &= t.view(-1, L, S)
        out |= keep
    return out


def _specs(B: int, L: int, S: int) -> dict[str, MaskSpec]:
    docs_q = torch.tensor([[0] * 20 + [1] * 14 + [2] * 6, [0] * 33 + [-1] * 7])  # (B, L)
    docs_k = torch.tensor([[0] * 20 + [1] * 14 + [2] * 6, [0] * 33 + [-1] * 7])  # (B, S)
    return {
        "ranges": MaskSpec(
            [
                Clause(
                    key_lo=torch.tensor([3, 17]),
                    key_hi=torch.tensor([30, 40]),
                    query_lo=torch.tensor([0, 5]),
                    row_lo=torch.arange(L).repeat(B, 1) // 2,
                )
            ]
        ),
        "documents": MaskSpec([Clause(lo=None, hi=0, docs=[Document(docs_q, docs_k, True)])]),
        "not_documents": MaskSpec([Clause(docs=[Document(docs_q, docs_k, False)])]),
        "window_or_global": MaskSpec(  # Longformer-like: a band, or the first 4 keys
            [Clause(lo=-3, hi=3), Clause(key_hi=torch.tensor([4, 4]))]
        ),
        "documents_or_keep": MaskSpec(
            [
                Clause(docs=[Document(docs_q, docs_k, True)]),
                Clause(
                    dense_keep=[
                        torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(3)) < 0.1
                    ]
                ),
            ]
        ),
        "nothing": MaskSpec([]),
    }


@pytest.mark.parametrize(
    "name",
    [
        n
        if n in ("documents_or_keep", "window_or_global")
        else pytest.param(n, marks=pytest.mark.slow)
        for n in sorted(_specs(2, 40, 40))
    ],
)
def test_mask_fields_and_or_clauses_match_dense_masks(name: str) -> None:
    B, H, L, S, E = 2, 1, 40, 40, 8  # 16 x 16 tiles: FULL, PARTIAL and EMPTY ones
    spec = _specs(B, L, S)[name]
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, L, E, generator=gen, requires_grad=True)
    k = torch.randn(B, H, S, E, generator=gen, requires_grad=True)
    v = torch.randn(B, H, S, E, generator=gen, requires_grad=True)
    (q4, k4, v4, kb, w, vbad), margs = _operands(q, k, v, spec, L, S)
    out, lse, weights = _ops().attention_forward(q4, k4, v4, kb, w, vbad, *margs, 0.5, True)
    keep = _dense(spec, B, L, S).unsqueeze(1)  # (B, 1, L, S)
    ref_out, ref_w, ref_lse = attnkit.attention(
        *(t.double() for t in (q, k, v)),
        mask=masks.keep(keep),
        scale=0.5,
        return_weights=True,
        return_lse=True,
        backend="reference",
    )
    assert_close_to_scale(out.double(), ref_out)
    assert_close_to_scale(weights.double(), ref_w)
    assert_close_to_scale(lse.double(), ref_lse)
    loss_w = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad((out * loss_w).sum() + weights.sum(), [q, k, v])
    want = torch.autograd.grad((ref_out * loss_w).sum() + ref_w.sum(), [q, k, v])
    for g, w_ in zip(got, want, strict=True):
        assert_close_to_scale(g.double(), w_.double())


def test_tile_states_are_sound_and_not_trivial() -> None:
    """Every tile's state against the dense mask: FULL only where every pair is kept (and
    the tile is inside (L, S)), EMPTY only where none is; for each spec some tiles are
    FULL or EMPTY, so the kernels do skip work."""
    B, L, S, T = 2, 40, 40, 16
    n_m, n_n = -(-L // T), -(-S // T)
    specs = _specs(B, L, S)
    specs["causal"] = MaskSpec([Clause(hi=0)])
    for name, spec in specs.items():
        packed = pack_mask(spec, L, S, (B, 1), torch.device("cpu"))
        _, MB, *bands = packed.ints
        out = torch.full((B, n_m, n_n), -1, dtype=torch.int32)
        _states_kernel[(n_m, n_n, B)](packed.records, out, L, S, *bands, MB, T, T)
        keep = _dense(spec, B, L, S)
        for b in range(B):
            for i in range(n_m):
                for j in range(n_n):
                    tile = keep[b, i * T : (i + 1) * T, j * T : (j + 1) * T]
                    state = int(out[b, i, j])
                    inside = (i + 1) * T <= L and (j + 1) * T <= S
                    assert state in (0, 1, 2), (name, state)
                    if state == 2:
                        assert inside and tile.all(), (name, b, i, j)
                    if state == 0:
                        assert not tile.any(), (name, b, i, j)
        if name in ("causal", "documents"):
            assert (out == 2).any(), f"{name}: no FULL tile"
        if name in ("causal", "documents", "window_or_global", "nothing"):
            assert (out == 0).any(), f"{name}: no EMPTY tile"
