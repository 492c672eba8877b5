"""The vectorised reduction against plain oracles: top-k, block overviews, statistics,
rollout, the neuron view's window and the file of captured weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks, mods
from attnkit.viz.blocks import LongStore, overview_block, top_keys
from attnkit.viz.export import load_weights, save_weights
from attnkit.viz.neuron import NeuronStore
from attnkit.viz.options import NeuronWindow, WindowError
from attnkit.viz.reduce import Budget, SetReducer
from attnkit.viz.rollout import attention_rollout, rollout_of_means
from attnkit.viz.stats import LOCAL, StatsAccumulator

from tolerance import (
    BYTE_STEP,
    FLOAT32_CHAIN_REL,
    FLOAT32_ULPS_REL,
    SIGNED_BYTE_STEP,
    WEIGHTS_SCALE,
    assert_close_elementwise,
    assert_close_to_scale,
    half_step_rel,
)


def _weights(heads: int, rows: int, keys: int, seed: int, sharp: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(heads, rows, keys, generator=g) * sharp, -1)


@pytest.mark.parametrize("keys", [3, 16, 129, 257, 1001, 2049, 8003])
@pytest.mark.parametrize("k", [1, 5, 16])
def test_pruned_top_k_is_exact(keys: int, k: int) -> None:
    w = _weights(2, 9, keys, keys + k)
    w[:, :, keys // 2] = 0.0  # exact zeros and a fully zero row: ties
    w[1, 3] = 0.0
    vals, idx = top_keys(w, k)
    padded = F.pad(w, (0, max(0, k - keys)))
    want = torch.topk(padded, k, dim=-1).values
    assert torch.equal(vals, want)  # the same weights, largest first
    assert torch.equal(torch.gather(padded, 2, idx), vals)  # at the keys it names
    assert int(idx.max()) < max(keys, k) and bool((idx.sort(-1).values.diff(dim=-1) > 0).all())


def test_overview_blocks_are_exact_for_any_row_blocks() -> None:
    Q = K = 203
    b = overview_block(Q, K, 12)
    assert b % 8 == 0 and -(-Q // b) <= 12
    store = LongStore(1, 2, Q, K, b, 4)
    w = _weights(2, Q, K, 0)
    for a, e in ((0, 37), (37, 38), (38, 203)):  # blocks not aligned to the overview's rows
        store.add(0, slice(0, 2), a, w[:, a:e].contiguous())
    got = store.finish()
    pad = torch.zeros(2, -(-Q // b) * b, -(-K // b) * b)
    pad[:, :Q, :K] = w
    blocks = pad.view(2, -(-Q // b), b, -(-K // b), b)
    torch.testing.assert_close(got["pooled_max"][0], blocks.amax((2, 4)), rtol=0, atol=0)
    cells = torch.ones_like(pad)
    cells[:, Q:], cells[:, :, K:] = 0, 0
    count = cells.view_as(blocks).sum((2, 4))
    assert_close_to_scale(got["pooled_mean"][0], blocks.sum((2, 4)) / count, rel=FLOAT32_ULPS_REL)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_long_page_refuses_one_non_finite_weight(bad: float) -> None:
    """One NaN (or inf) weight in a row of a long page is refused, as on a dense page,
    though neither the block maxima nor the top-k choose a NaN: the block sums hold it."""
    from attnkit.viz.reduce import NonFiniteAttention

    Q = K = 300
    reducer = SetReducer("self-attention", 1, 2, Q, K, budget=Budget(dense_cells=1000))
    assert reducer.long
    w = _weights(2, Q, K, 1)
    w[1, 5, 17] = bad  # inside a block, neither its first key nor a row's best
    reducer.add(0, 0, w)
    with pytest.raises(NonFiniteAttention, match="hold NaN or infinity"):
        reducer.finish()


def _stats_oracle(w: np.ndarray) -> dict[str, np.ndarray]:
    """Per head, row by row in float64: the statistics' definitions written out."""
    H, Q, K = w.shape
    out = {k: np.zeros(H) for k in ("entropy", "distance", "first", "prev", "self", "local")}
    for h in range(H):
        ent, dist, first, prev, own, local, rows, later = [], [], [], [], [], [], 0, 0
        for i in range(Q):
            p = w[h, i].astype(np.float64)
            if p.sum() <= 0:
                continue
            rows += 1
            nz = p[p > 0]
            ent.append(-(nz * np.log(nz)).sum())
            dist.append((p * np.abs(i - np.arange(K))).sum())
            local.append(p[max(0, i - LOCAL) : i + LOCAL + 1].sum())
            if i > 0:
                later += 1
                first.append(p[0])
                prev.append(p[i - 1])
                own.append(p[i])
        out["entropy"][h] = sum(ent) / rows
        out["distance"][h] = sum(dist) / rows
        out["local"][h] = sum(local) / rows
        out["first"][h], out["prev"][h] = sum(first) / later, sum(prev) / later
        out["self"][h] = sum(own) / later
    return out


def test_statistics_equal_their_definitions_row_by_row() -> None:
    Q = 61
    s = torch.randn(3, Q, Q) * 3
    s = s.masked_fill(torch.ones(Q, Q, dtype=torch.bool).triu(1), float("-inf"))
    w = torch.softmax(s, -1)
    w[1, 5] = 0.0  # a fully masked row is left out
    acc = StatsAccumulator(1, 3, positional=True)
    for a, e in ((0, 20), (20, 21), (21, Q)):
        acc.add(0, w[:, a:e, : e + 2].contiguous(), torch.arange(a, e))  # keys up to the row
    got = acc.finish()
    want = _stats_oracle(w.numpy())
    for name, value in want.items():
        assert_close_to_scale(got[name][0], value, scale=WEIGHTS_SCALE, what=name)


@pytest.mark.parametrize("causal", [False, True])
def test_rollout_in_float32_equals_the_float64_definition(causal: bool) -> None:
    L = 300
    s = torch.randn(4, L, L)
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    means = torch.softmax(s, -1)
    want = attention_rollout(means.unsqueeze(1))
    got = rollout_of_means(means.clone())
    assert_close_to_scale(got, want, rel=FLOAT32_CHAIN_REL)


def test_neuron_view_keeps_every_layer_and_a_window_of_queries() -> None:
    Q = K = 50
    d, heads = 4, 2
    store = NeuronStore([0, 1, 2], heads, None, None, Q, K, budget=3 * heads * d * 30,
                        window=None)  # fmt: skip
    q = torch.randn(3, heads, Q, d)
    k = torch.randn(3, heads, K, d)
    for li in range(3):
        for a in (0, 25):  # rows in two blocks
            store.add(li, slice(0, heads), slice(0, heads), a, q[li, :, a : a + 25], k[li],
                      {"terms": "dot", "scale": 0.5})  # fmt: skip
    top = torch.randint(0, K, (3, heads, Q, 3))
    out = store.finish(top)
    assert out is not None and out["layers"] == [0, 1, 2]
    start, stop = out["query_start"], out["query_stop"]
    assert (start, stop) == (35, 50)  # the last queries: half of what the budget pays for
    np.testing.assert_array_equal(out["q"], q[:, :, start:stop].numpy())  # (float32: exact)
    keys = out["key_index"]
    assert set(range(start, stop)) <= set(keys) and len(keys) <= 30
    np.testing.assert_array_equal(out["k"], k[:, :, keys].numpy())


def test_neuron_window_errors_are_one_clear_line() -> None:
    tokens = ["the", " cat", " sat"]
    assert NeuronWindow.parse("1:3").resolve(tokens, 3) == (1, 3)
    assert NeuronWindow.parse("-2:").resolve(tokens, 3) == (1, 3)
    assert NeuronWindow(near="CAT").resolve(tokens, 3) == (0, 3)
    with pytest.raises(WindowError, match=r"2:9 is outside the text's 3 tokens"):
        NeuronWindow.parse("2:9").resolve(tokens, 3)
    with pytest.raises(WindowError, match="holds no token"):
        NeuronWindow.parse("2:1").resolve(tokens, 3)
    with pytest.raises(WindowError, match="expected START:END"):
        NeuronWindow.parse("five")
    with pytest.raises(WindowError, match="no token of the text is or holds 'dog'"):
        NeuronWindow(near="dog").resolve(tokens, 3)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".NPZ", ".SafeTensors"])
@pytest.mark.parametrize("long", [False, True], ids=["dense", "long"])
def test_saved_weights_round_trip(tmp_path, suffix: str, long: bool) -> None:  # type: ignore[no-untyped-def]
    L = 40
    budget = Budget(dense_cells=10 if long else 1 << 20, overview=8, top_k=4)
    r = SetReducer("self-attention", 2, 3, L, L, budget=budget)
    for layer in range(2):
        r.add(layer, 0, _weights(3, L, L, layer))
    s = r.finish()
    s.tokens = [f" t{i}" for i in range(L)]
    path = save_weights([s], tmp_path / f"w{suffix}", meta={"model": "tiny"})
    assert path == tmp_path / f"w{suffix}" and [p.name for p in tmp_path.iterdir()] == [path.name]
    arrays, meta = load_weights(path)
    assert meta["holds"] == ("long" if long else "dense") and meta["meta"] == {"model": "tiny"}
    (info,) = meta["sets"]
    assert info["key"] == "self" and info["tokens"] == s.tokens and info["shape"] == [2, 3, L, L]
    want = s.arrays()
    assert set(arrays) == {f"self.{name}" for name in want}
    for name, value in want.items():
        np.testing.assert_array_equal(arrays[f"self.{name}"], value)
    if long:
        assert info["block"] == s.block and info["top_k"] == 4 and "self.weights" not in arrays
    else:
        assert float(arrays["self.weights"].sum()) == pytest.approx(2 * 3 * L, rel=FLOAT32_ULPS_REL)
    with pytest.raises(ValueError, match=r"ending in \.safetensors or \.npz"):
        save_weights([s], tmp_path / "w.csv")


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_saved_weights_of_two_sides_are_named_by_side(tmp_path, suffix: str) -> None:  # type: ignore[no-untyped-def]
    sides = {}
    for side, L in (("a", 5), ("b", 7)):
        r = SetReducer("self-attention", 1, 2, L, L)
        r.add(0, 0, _weights(2, L, L, L))
        sides[side] = r.finish()
    path = save_weights(sides, tmp_path / f"w{suffix}", meta={"compared": "text"},
                        side_meta={"a": {"text": "one"}, "b": {"text": "two"}})  # fmt: skip
    arrays, meta = load_weights(path)
    for side, s in sides.items():
        for name, value in s.arrays().items():
            np.testing.assert_array_equal(arrays[f"{side}/self.{name}"], value)
    assert len(arrays) == sum(len(s.arrays()) for s in sides.values())
    assert [(d["key"], d["side"]) for d in meta["sets"]] == [("a/self", "a"), ("b/self", "b")]
    assert meta["sides"] == [{"key": "a", "text": "one"}, {"key": "b", "text": "two"}]
    with pytest.raises(ValueError, match="a side's key must be a short name"):
        save_weights({"a/b": sides["a"]}, tmp_path / f"x{suffix}")
    with pytest.raises(ValueError, match="side_meta: only with sides"):
        save_weights(sides["a"], tmp_path / f"x{suffix}", side_meta={"a": {}})


_CASES = {
    "causal": (12, 12, lambda: masks.causal(), lambda H: None),
    "cache, bottom-right": (
        5,
        17,
        lambda: masks.causal("bottom_right"),
        lambda H: mods.alibi(H, causal=True, align="bottom_right"),
    ),
    "window, alibi": (15, 15, lambda: masks.window(3, 0), lambda H: mods.alibi(H)),
    "padding, T5 bias": (
        11,
        13,
        lambda: masks.key_padding(torch.arange(13)[None] < 9),  # (B, S): 9 keys
        lambda H: mods.relative_position_bias(torch.randn(8, H), 8, 16),
    ),
    "none, softcap and sinks": (
        9,
        9,
        lambda: None,
        lambda H: [mods.softcap(2.0), mods.sinks(torch.randn(H))],
    ),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_row_blocks_are_the_call_cut_in_rows(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit._inputs import validate_inputs
    from attnkit.viz import stream

    L, S, mask, mod = _CASES[case]
    H, E = 4, 8
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, n, E, generator=g) * 2 for n in (L, S, S))
    inputs = validate_inputs(q, k, v, mask=mask(), mods=mod(H))
    _, want = attnkit.attention(q, k, v, mask=inputs.mask, mods=list(inputs.mods) or None,
                                return_weights=True)  # fmt: skip
    monkeypatch.setattr(stream, "BLOCK_CELLS", H * S * 3)  # about 3 rows a block
    got = torch.zeros(H, L, S)
    starts = []
    for a, w in stream.row_blocks(inputs, q, k):
        starts.append(a)
        got[:, a : a + w.shape[1], : w.shape[2]] = w  # keys past the block's last: 0
    assert len(starts) >= 2 and starts == sorted(starts)
    assert_close_to_scale(got, want[0], rel=FLOAT32_ULPS_REL)


_DIRECT = {
    "causal, grouped heads": (2, 1, 10, 10, lambda: masks.causal(), None),
    "bias per batch": (4, 2, 9, 11, lambda: masks.bias(torch.randn(2, 1, 9, 11)), 0.3),
    "keep per head": (4, 2, 9, 9, lambda: masks.keep(torch.rand(2, 4, 9, 9) > 0.4), None),
    "padding and causal": (4, 2, 10, 10, lambda: masks.valid_lens([7, 10]) & masks.causal(), None),
}


@pytest.mark.parametrize("case", list(_DIRECT))
def test_one_pass_weights_equal_the_call_s(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain dot-product call's blocks come from one product of q and k (row max, exp,
    row sums): batch element 0's weights, as attention() gives them."""
    from attnkit._inputs import validate_inputs
    from attnkit.viz import stream

    H, B, L, S, mask, scale = _DIRECT[case]
    Hk, E = 2, 8
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, H, L, E, generator=g) * 2
    k, v = (torch.randn(B, Hk, S, E, generator=g) * 2 for _ in range(2))
    inputs = validate_inputs(q, k, v, mask=mask(), scale=scale)
    _, want = attnkit.attention(q, k, v, mask=inputs.mask, scale=scale, return_weights=True)
    plan = stream._call_plan(inputs, q, L, S)
    assert stream._direct_operands(inputs, q, k, plan) is not None
    monkeypatch.setattr(stream, "BLOCK_CELLS", H * S * 3)  # about 3 rows a block
    got = torch.zeros(H, L, S)
    starts = []
    for a, w in stream.row_blocks(inputs, q, k):
        starts.append(a)
        got[:, a : a + w.shape[1], : w.shape[2]] = w  # keys past the block's last: 0
    assert len(starts) >= 2
    assert_close_to_scale(got, want[0], rel=FLOAT32_ULPS_REL)


def test_entropies_read_off_the_logits_equal_the_weights_own() -> None:
    """A one-pass block's row entropies (log Z - sum(p x) / Z) and counts of weights above
    0, read off its logits in the exp's pass, give the statistics that -sum w log w and
    the count of its weights give; a row that keeps no key counts 0."""
    from attnkit._inputs import validate_inputs
    from attnkit.viz import stream
    from attnkit.viz.stats import StatsAccumulator

    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 3, 40, 8, generator=g) * 3 for _ in range(3))
    inputs = validate_inputs(q, k, v, mask=masks.valid_lens([30], queries=True) & masks.causal())
    plain, given = StatsAccumulator(1, 3, True), StatsAccumulator(1, 3, True)
    for a, w, figures in stream._blocks(inputs, q, k, entropy=True):
        assert figures is not None
        ent, n_keys = figures
        assert ent.shape == n_keys.shape == w.shape[:2]
        assert torch.equal(n_keys, (w > 0).sum(-1).to(n_keys.dtype))
        rows = torch.arange(a, a + w.shape[1])
        plain.add(0, w, rows)
        given.add(0, w, rows, entropy=ent, keys=n_keys)
    for name, want in plain.sums.items():
        assert_close_to_scale(torch.from_numpy(given.sums[name]), torch.from_numpy(want),
                              rel=FLOAT32_ULPS_REL)  # fmt: skip


def test_one_pass_weights_leave_non_finite_inputs_to_the_call() -> None:
    from attnkit._inputs import validate_inputs
    from attnkit.viz import stream

    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    q[0, 1, 2, 0] = float("nan")
    inputs = validate_inputs(q, k, v, mask=masks.causal())
    assert stream._direct_operands(inputs, q, k, stream._call_plan(inputs, q, 6, 6)) is None


def test_the_recorder_keeps_the_faster_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit.viz.stream import ThreadChoice

    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    for slow, fast in ((4, 1), (1, 4)):
        choice = ThreadChoice()
        picked = []
        for _ in range(8):
            threads = choice.pick()
            picked.append(threads)
            choice.measured(threads, 5.0 if threads == slow else 1.0, 100)
        assert picked[: 1 + ThreadChoice.TRIALS] == [1, 4, 1, 4, 1]  # warm-up, then trials
        assert picked[1 + ThreadChoice.TRIALS :] == [fast] * 3 and choice.best() == fast


def test_neuron_bytes_round_trip_within_half_a_step() -> None:
    """q and k travel as one signed byte per value against each (layer, head, dimension)'s
    largest |value|: decoded, every value is within half a step of it."""
    from attnkit.viz.payload import quantize_signed

    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 10, 4, generator=g) * torch.tensor([0.01, 1.0, 30.0, 0.0])
    raw, scales = quantize_signed(x.numpy())
    codes = np.frombuffer(raw, dtype=np.int8).reshape(2, 3, 10, 4).astype(np.float32)
    s = np.asarray(scales, dtype=np.float32).reshape(2, 3, 1, 4)
    back = codes * s
    largest = np.abs(x.numpy()).max(axis=2, keepdims=True)  # (2, 3, 1, 4): each scale's set
    assert np.all(np.abs(back - x.numpy()) <= largest * half_step_rel(SIGNED_BYTE_STEP))
    assert np.all(np.abs(codes) <= 127) and np.all(back[..., 3] == 0)  # a zero dimension
    peak = np.abs(x.numpy()).max(axis=2, keepdims=True)
    assert_close_elementwise(np.abs(back).max(axis=2, keepdims=True), peak, rel=FLOAT32_ULPS_REL)


@pytest.mark.parametrize(("K", "width"), [(70, 2), (70_000, 4)])
def test_top_k_payload_decodes_to_each_row_s_keys_and_weights(K: int, width: int) -> None:
    """A long page's top-k travels sorted by key, as gaps (uint16, or uint32 past 65,535
    keys) and one byte per weight: decoded as the page decodes it (inflate, a running sum
    of the gaps, byte × the head's scale), every row holds the same keys as the store's
    best-first rows, each with its weight within half a step."""
    import base64
    import zlib

    from attnkit.viz.payload import grid_payload

    g = torch.Generator().manual_seed(K)
    L, H, Q, k = 2, 3, 2200, 5  # both arrays past COMPRESS_ABOVE: deflated side by side
    ascending = torch.randint(1, K // k, (L, H, Q, k), generator=g).cumsum(-1) - 1  # < K
    shuffle = torch.rand(L, H, Q, k, generator=g).argsort(-1)
    index = ascending.gather(-1, shuffle).int()  # (L, H, Q, k): distinct keys per row, any order
    weight = torch.rand(L, H, Q, k, generator=g).sort(-1, descending=True).values
    pooled = np.zeros((L, H, 1, 1), np.float32)
    got = grid_payload(None, block=K, pooled_max=pooled, pooled_mean=pooled,
                       topk_index=index.numpy(), topk_weight=weight.numpy(), K=K)["topk"]  # fmt: skip

    def raw(part: dict) -> bytes:
        data = base64.b64decode(part["data"])
        return zlib.decompress(data) if part["encoding"] == "deflate" else data

    assert got["k"] == k and got["indexBytes"] == width
    assert got["index"]["encoding"] == got["weight"]["encoding"] == "deflate"
    gaps = np.frombuffer(raw(got["index"]), dtype="<u2" if width == 2 else "<u4")
    keys = np.cumsum(gaps.reshape(L, H, Q, k).astype(np.int64), axis=-1)  # (L, H, Q, k)
    codes = np.frombuffer(raw(got["weight"]), dtype=np.uint8).reshape(L, H, Q, k)
    scales = np.asarray(got["weight"]["scales"], np.float32).reshape(L, H, 1, 1)
    by_key, order = index.long().sort(-1)
    assert np.array_equal(keys, by_key.numpy())
    want = torch.gather(weight, -1, order).numpy()
    assert np.all(np.abs(codes * scales / 255.0 - want) <= scales * half_step_rel(BYTE_STEP))


@pytest.mark.parametrize(
    ("r", "S", "row0"),
    [(5, 9, 4), (7, 7, 0), (6, 30, 10), (5, 12, 7), (3, 2, 0), (4, 3, 6), (40, 2000, 1900)],
)
def test_head_distance_equals_float64_math(r: int, S: int, row0: int) -> None:
    """The mean distance's row sums, from each row's moments plus the keys after it
    (causal blocks, keys past the block, fewer keys than rows, far rows), equal float64
    ``sum w |i - j|``: keys are counted from the block's first row, so long rows do not
    cancel."""
    from attnkit.viz.stats import StatsAccumulator

    g = torch.Generator().manual_seed(r * 1000 + S)
    w = torch.rand(3, r, S, generator=g) ** 8  # peaked rows
    w /= w.sum(-1, keepdim=True)
    rows = torch.arange(row0, row0 + r)
    acc = StatsAccumulator(1, 3, positional=True)
    acc.add(0, w, rows)
    dist = (rows.unsqueeze(1) - torch.arange(S)).abs().double()  # (r, S)
    want = (w.double() * dist).sum(-1).sum(-1)  # (3,)
    assert_close_to_scale(torch.from_numpy(acc.sums["distance"][0]), want, rel=FLOAT32_ULPS_REL)
