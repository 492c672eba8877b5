"""Every mask and modifier constructor refuses a bad argument when it is built, naming
the constructor and the argument: ints out of range (int64 and the position limit),
strings, bools or floats where ints are meant, empty tensors, wrong dtypes. One
checker (attnkit._args) gives one answer to each class of mistake."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import attnkit
import attnkit.nn as ann
from attnkit import masks, mods, scores

TABLE = torch.zeros(32, 4)

REL = torch.arange(-40, 41, 10)  # (9,) relative positions j - i

BAD: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # T5's bucketing divides by the exact buckets of each direction
    ("2 buckets", lambda: mods.relative_position_bias(torch.zeros(2, 4), 2, 8), ValueError,
     "mods.relative_position_bias: num_buckets must be an int >= 4"),
    ("3 buckets", lambda: mods.relative_position_bias(torch.zeros(3, 4), 3, 8), ValueError,
     "num_buckets must be an int >= 4 (half the buckets per direction); got 3"),
    ("1 bucket, one way", lambda: mods.relative_position_bias(torch.zeros(1, 4), 1, 8, False),
     ValueError, "num_buckets must be an int >= 2; got 1"),
    ("buckets a float", lambda: mods.relative_position_bias(TABLE, 32.0, 128), TypeError,
     "num_buckets must be"),
    ("max_distance 2**64", lambda: mods.relative_position_bias(TABLE, 32, 2**64), ValueError,
     "max_distance must be an int >= 2; got 18446744073709551616"),
    ("max_distance a string", lambda: mods.relative_position_bias(TABLE, 32, "128"), TypeError,
     "max_distance must be an int >= 2, got '128'"),
    ("bidirectional a string", lambda: mods.relative_position_bias(TABLE, 32, 128, "no"),
     TypeError, "bidirectional must be True or False, got 'no'"),
    ("table with no heads", lambda: mods.relative_position_bias(torch.zeros(32, 0), 32, 128),
     ValueError, "table must not be empty"),
    ("table of ints", lambda: mods.relative_position_bias(TABLE.long(), 32, 128), TypeError,
     "table must have a floating dtype, got torch.int64"),
    ("table a list", lambda: mods.relative_position_bias([[0.0] * 4] * 32, 32, 128), TypeError,
     "table must be a float tensor of shape (num_buckets, heads), got list"),
    ("table NaN", lambda: mods.relative_position_bias(TABLE + float("nan"), 32, 128),
     ValueError, "table must hold finite values"),
    ("relpos offset", lambda: mods.relative_position_bias(TABLE, 32, 128, k_offset=2**63),
     ValueError, "mods.relative_position_bias: k_offset must be an int"),
    # t5_buckets checks what relative_position_bias checks: 8 and 4 gave buckets of -2**63
    # and -10, 0 and 1 buckets a ZeroDivisionError, a float relative float buckets
    ("buckets max_distance = exact", lambda: mods.t5_buckets(REL, 32, 8, True), ValueError,
     "mods.t5_buckets: max_distance must exceed the exact buckets"),
    ("buckets max_distance < exact", lambda: mods.t5_buckets(REL, 32, 4, True), ValueError,
     "max_distance must exceed the exact buckets"),
    ("no buckets", lambda: mods.t5_buckets(REL, 0, 128, True), ValueError,
     "mods.t5_buckets: num_buckets must be an int >= 4"),
    ("max_distance 0", lambda: mods.t5_buckets(REL, 32, 0, False), ValueError,
     "mods.t5_buckets: max_distance must be an int >= 2"),
    ("float relative", lambda: mods.t5_buckets(REL.float(), 32, 128, True), TypeError,
     "mods.t5_buckets: relative must be an integer tensor (j - i), got torch.float32"),
    ("list relative", lambda: mods.t5_buckets([1, 2], 32, 128, True), TypeError,
     "relative must be an integer tensor (j - i), got list"),
    # combinations and masks built by their class take only masks (an empty AndMask
    # reached an AssertionError in sdpa, AndMask([1, 2]) an AttributeError when used)
    ("AndMask of none", lambda: masks.AndMask([]), ValueError,
     "masks.AndMask: expected at least one mask, got none"),
    ("OrMask of none", lambda: masks.OrMask([]), ValueError, "masks.OrMask: expected at least"),
    ("AndMask of ints", lambda: masks.AndMask([1, 2]), TypeError,
     "masks.AndMask: every part must be an attnkit mask, got 1"),
    ("OrMask of an int", lambda: masks.OrMask([1]), TypeError, "every part must be an attnkit"),
    ("AndMask of a number", lambda: masks.AndMask(3), TypeError,
     "masks.AndMask: expected a list of masks, got 3"),
    ("NotMask of None", lambda: masks.NotMask(None), TypeError,
     "masks.NotMask: expected an attnkit mask, got None"),
    ("KeepMask of ints", lambda: masks.KeepMask(torch.ones(4, 5, dtype=torch.int64)), TypeError,
     "masks.keep: expected a bool tensor (True = may attend), got dtype torch.int64"),
    # parameters' device and dtype, and the Gaussian's flag, at construction (a
    # misspelt device reached torch's own error, an int dtype a weight initializer's)
    ("Bilinear on 'gpu'", lambda: scores.Bilinear(8, 8, device="gpu"), ValueError,
     "scores.Bilinear: device must be a torch.device or a name such as 'cpu'"),
    ("Bilinear of ints", lambda: scores.Bilinear(8, 8, dtype=torch.int64), TypeError,
     "scores.Bilinear: dtype must be a floating-point torch.dtype"),
    ("Additive of ints", lambda: scores.Additive(8, 8, 4, dtype=torch.int64), TypeError,
     "scores.Additive: dtype must be a floating-point torch.dtype"),
    ("Gaussian learnable 'no'", lambda: scores.Gaussian(1.0, learnable="no"), TypeError,
     "Gaussian: learnable must be True or False, got 'no'"),
    ("MHA on 'gpu'", lambda: ann.MultiheadAttention(8, 2, device="gpu"), ValueError,
     "MultiheadAttention: device must be a torch.device"),
    ("SelfAttention on 'gpu'", lambda: ann.SelfAttention(8, 2, device="gpu"), ValueError,
     "SelfAttention: device must be a torch.device"),
    ("KVCache on 'gpu'", lambda: ann.KVCache(1, 1, 4, 8, device="gpu"), ValueError,
     "KVCache: device must be a torch.device"),
    ("Keras MHA on 'gpu'", lambda: ann.MultiHeadAttention(2, 4, device="gpu"), ValueError,
     "MultiHeadAttention: device must be a torch.device"),
    # ALiBi
    ("alibi q_offset 2**63", lambda: mods.alibi(8, q_offset=2**63), ValueError,
     "mods.alibi: q_offset must be an int; got 9223372036854775808, expected a value in "
     "[-2**60, 2**60]"),
    ("alibi k_offset -2**63 - 1", lambda: mods.alibi(8, k_offset=-(2**63) - 1), ValueError,
     "mods.alibi: k_offset must be an int"),
    ("alibi offset a float", lambda: mods.alibi(8, q_offset=1.0), TypeError,
     "mods.alibi: q_offset must be an int, got 1.0"),
    ("alibi '8'", lambda: mods.alibi("8"), TypeError,
     "mods.alibi: slopes must be a number of heads (an int >= 1) or a (H,) float tensor, "
     "got '8'"),
    ("alibi True", lambda: mods.alibi(True), TypeError, "mods.alibi: slopes must be"),
    ("alibi 0 heads", lambda: mods.alibi(0), ValueError, "slopes must be a number of heads"),
    ("alibi 2**40 heads", lambda: mods.alibi(2**40), ValueError, "expected a value in [1, 65536]"),
    ("alibi 8.0", lambda: mods.alibi(8.0), TypeError, "mods.alibi: slopes must be"),
    ("alibi no slopes", lambda: mods.alibi([]), ValueError, "mods.alibi: slopes must not be empty"),
    ("alibi empty", lambda: mods.alibi(torch.zeros(0)), ValueError, "slopes must not be empty"),
    ("alibi strings", lambda: mods.alibi([0.5, "a"]), TypeError,
     "mods.alibi: slopes must be a float tensor of shape (H,)"),
    ("alibi int slopes", lambda: mods.alibi(torch.ones(4, dtype=torch.long)), TypeError,
     "slopes must have a floating dtype, got torch.int64"),
    ("alibi 2-D slopes", lambda: mods.alibi(torch.ones(2, 4)), ValueError,
     "slopes must have shape (H,), got (2, 4)"),
    ("alibi NaN slopes", lambda: mods.alibi(torch.full((4,), float("nan"))), ValueError,
     "slopes must hold finite values"),
    ("alibi causal 1", lambda: mods.alibi(8, causal=1), TypeError,
     "mods.alibi: causal must be True or False, got 1"),
    ("alibi_slopes '4'", lambda: mods.alibi_slopes("4"), TypeError, "mods.alibi_slopes: heads"),
    # softcap and sinks
    ("softcap '3'", lambda: mods.softcap("3"), TypeError, "mods.softcap: cap must be a positive"),
    ("softcap True", lambda: mods.softcap(True), TypeError, "mods.softcap: cap must be"),
    ("softcap 0", lambda: mods.softcap(0.0), ValueError, "mods.softcap: cap must be a positive"),
    ("softcap -inf", lambda: mods.softcap(float("-inf")), ValueError, "cap must be a finite"),
    ("softcap NaN", lambda: mods.softcap(float("nan")), ValueError, "cap must be a finite"),
    ("softcap 3.5e38", lambda: mods.softcap(3.5e38), ValueError,
     "mods.softcap: cap must lie in [1.18e-38, 3.403e+38]"),
    ("softcap 1e300", lambda: mods.softcap(1e300), ValueError, "or be inf (no cap), got 1e+300"),
    ("softcap 1e-40", lambda: mods.softcap(1e-40), ValueError, "mods.softcap: cap must lie in"),
    ("softcap 2**1100", lambda: mods.softcap(2**1100), ValueError, "in the float64 range"),
    ("sinks empty", lambda: mods.sinks(torch.zeros(0)), ValueError,
     "mods.sinks: logits must not be empty"),
    ("sinks ints", lambda: mods.sinks(torch.zeros(4, dtype=torch.long)), TypeError,
     "mods.sinks: logits must have a floating dtype"),
    ("sinks a list", lambda: mods.sinks([0.0] * 4), TypeError,
     "mods.sinks: logits must be a float tensor of shape (H,), one sink per query head, got list"),
    ("sinks NaN", lambda: mods.sinks(torch.full((4,), float("nan"))), ValueError,
     "mods.sinks: logits must hold finite values"),
    # prefix LM
    ("prefix_lm 2**64", lambda: masks.prefix_lm(2**64), ValueError,
     "masks.prefix_lm: prefix must be an int >= 0 or a (B,) integer tensor; got "
     "18446744073709551616"),
    ("prefix_lm -1", lambda: masks.prefix_lm(-1), ValueError, "masks.prefix_lm: prefix"),
    ("prefix_lm '3'", lambda: masks.prefix_lm("3"), TypeError, "masks.prefix_lm: prefix"),
    ("prefix_lm 1.5", lambda: masks.prefix_lm(1.5), TypeError, "got 1.5"),
    ("prefix_lm True", lambda: masks.prefix_lm(True), TypeError, "got True"),
    ("prefix_lm [2**64]", lambda: masks.prefix_lm([2**64, 1]), ValueError,
     "masks.prefix_lm: prefix must hold values that fit in int64"),
    ("prefix_lm floats", lambda: masks.prefix_lm(torch.ones(2)), TypeError,
     "prefix must have an integer dtype"),
    ("prefix_lm 2-D", lambda: masks.prefix_lm([[1]]), ValueError, "prefix must have shape (B,)"),
    ("prefix_lm offset", lambda: masks.prefix_lm(2, q_offset=2**63), ValueError,
     "masks.prefix_lm: q_offset must be an int"),
    # documents
    ("document strings", lambda: masks.document(["a"] * 5), TypeError,
     "masks.document: ids must be an integer tensor or a list of ints of shape (N,) or (B, N)"),
    ("document a string", lambda: masks.document("abc"), TypeError, "got str"),
    ("document 2**64", lambda: masks.document([2**64, 0]), ValueError,
     "masks.document: ids must hold values that fit in int64"),
    ("document floats", lambda: masks.document([0.0, 1.0]), TypeError,
     "ids must have an integer dtype, got torch.float32"),
    ("document bools", lambda: masks.document([True, False]), TypeError, "got torch.bool"),
    ("document 3-D", lambda: masks.document(torch.zeros(1, 2, 3, dtype=torch.long)), ValueError,
     "ids must have shape (N,) or (B, N), got (1, 2, 3)"),
    ("document key_ids", lambda: masks.document([0, 1], key_ids=["a", "b"]), TypeError,
     "masks.document: key_ids must be"),
    ("document lengths", lambda: masks.document(lengths=["a"]), TypeError,
     "masks.document: lengths must be"),
    ("document lengths overflow", lambda: masks.document(lengths=[2**62, 2**62]), ValueError,
     "masks.document: lengths must add up to at most"),
    ("document lengths 2**64", lambda: masks.document(lengths=[2**64]), ValueError,
     "lengths must hold values that fit in int64"),
    # lengths
    ("valid_lens strings", lambda: masks.valid_lens(["a"]), TypeError, "masks.valid_lens: lens"),
    ("valid_lens 2**64", lambda: masks.valid_lens([2**64]), ValueError, "fit in int64"),
    ("valid_lens a scalar", lambda: masks.valid_lens(3), ValueError,
     "lens must have shape (B,) or (B, L), got ()"),
    ("valid_lens queries 1", lambda: masks.valid_lens([1], queries=1), TypeError,
     "masks.valid_lens: queries must be True or False, got 1"),
    # bands
    ("causal q_offset 2**63", lambda: masks.causal(q_offset=2**63), ValueError,
     "masks.causal: q_offset must be an int"),
    ("causal k_offset '1'", lambda: masks.causal(k_offset="1"), TypeError,
     "masks.causal: k_offset must be an int or a 0-d integer tensor, got '1'"),
    ("window 2**63", lambda: masks.window(2**63), ValueError,
     "masks.window: left must be an int >= 0 or None (unbounded); got 9223372036854775808"),
    ("window '2'", lambda: masks.window("2"), TypeError, "masks.window: left must be"),
    ("window right True", lambda: masks.window(1, True), TypeError, "masks.window: right must be"),
    ("window -1", lambda: masks.window(-1), ValueError, "masks.window: left must be"),
    ("window offset 2**64", lambda: masks.window(2, k_offset=2**64), ValueError,
     "masks.window: k_offset must be an int"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "make", "error", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_argument_is_refused_at_construction(
    what: str, make: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        make()


GOOD: list[tuple[str, Callable[[], Any]]] = [
    ("numpy int prefix", lambda: masks.prefix_lm(np.int64(2))),
    ("numpy int window", lambda: masks.window(np.int32(1), 0)),
    ("numpy float cap", lambda: mods.softcap(np.float32(30.0))),
    ("int cap", lambda: mods.softcap(30)),
    ("list slopes", lambda: mods.alibi([0.5, 0.25, 0.125, 0.0625])),
    ("list of int slopes", lambda: mods.alibi([1, 1, 1, 1])),
    ("numpy ids", lambda: masks.document(np.array([0, 0, 1, -1, 1, 1]))),
    ("list ids", lambda: masks.document([[0, 0, 1, -1, 1, 1]] * 2)),
    ("one-way 2 buckets", lambda: mods.relative_position_bias(torch.zeros(2, 4), 2, 8, False)),
    ("4 buckets", lambda: mods.relative_position_bias(torch.zeros(4, 4), 4, 8)),
    ("offsets at the limit", lambda: mods.alibi(4, q_offset=2**60, k_offset=-(2**60))),
]


@pytest.mark.parametrize(("what", "make"), GOOD, ids=[g[0] for g in GOOD])
def test_good_arguments_are_taken_and_the_call_runs(what: str, make: Callable[[], Any]) -> None:
    made = make()
    q = torch.randn(2, 4, 6, 3)
    kw = {"mods": made} if isinstance(made, mods.Mod) else {"mask": made}
    out = attnkit.attention(q, q, q, **kw)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_device_this_torch_lacks_is_named_at_construction() -> None:
    """device="cuda" on a torch without CUDA: torch's AssertionError from inside a weight
    factory before; now a ValueError naming the layer and the device."""
    with pytest.raises(ValueError, match=r"MultiheadAttention: device cuda is not available"):
        ann.MultiheadAttention(8, 2, device="cuda")


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_t5_buckets_of_the_dtypes_extremes_are_the_last_buckets(dtype: torch.dtype) -> None:
    # abs() of the dtype's minimum overflowed: bucket -128 for int8, -2**63 for int64
    info = torch.iinfo(dtype)
    extremes = torch.tensor([info.min, info.max], dtype=dtype)
    far = torch.tensor([-(10**2), 10**2])  # past max_distance: the last bucket each way
    for bidirectional in (True, False):
        got = mods.t5_buckets(extremes, 32, 64, bidirectional)
        assert got.dtype == torch.long
        assert torch.equal(got, mods.t5_buckets(far, 32, 64, bidirectional))


def test_numpy_numbers_are_taken_where_torch_takes_them() -> None:
    # torch.nn.MultiheadAttention(np.int64(8), 2) works; the drop-in said "must be a
    # positive int, got np.int64(8)", as did the scores, SelfAttention and distributed
    from attnkit import distributed, nn, scores

    mha = nn.MultiheadAttention(np.int64(8), np.int64(2), dropout=np.float32(0.25))
    assert type(mha.embed_dim) is int and mha.dropout == 0.25
    assert type(nn.SelfAttention(np.int64(8), 2).hidden_dim) is int
    assert scores.Bilinear(np.int64(4), 4).weight.shape == (4, 4)
    assert scores.ScaledDot(np.float32(0.5)).scale == 0.5
    assert float(scores.Gaussian(np.float32(0.5)).sigma) == 0.5
    assert distributed.shard_lengths(np.int64(10), np.int64(3)) == [3, 3, 4]


@pytest.mark.parametrize("size", [2**63, 2**61])
def test_sizes_past_int64_are_refused_by_name(size: int) -> None:
    # "Overflow when unpacking long long" came from torch, or a world size ran for ever
    from attnkit import distributed, nn

    with pytest.raises(
        ValueError, match=r"MultiheadAttention: embed_dim must be a positive int up"
    ):
        nn.MultiheadAttention(size, 1)
    with pytest.raises(ValueError, match=r"world_size: expected an int from 1 to"):
        distributed.shard_lengths(8, size)
    with pytest.raises(ValueError, match=r"scale: expected a positive finite float"):
        attnkit.attention(
            torch.ones(1, 2, 4), torch.ones(1, 2, 4), torch.ones(1, 2, 4), scale=10**400
        )
