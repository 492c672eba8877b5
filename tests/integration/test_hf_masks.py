"""The "attnkit" mask function against the pairs transformers' mask functions keep.

Every pattern transformers composes (causal, sliding windows, chunks, block ids,
padding, and/or, at any cache offset) must become attnkit masks that keep exactly
the pairs the mask function keeps, without a dense tensor; a pattern it does not
recognise stays exact as a dense mask. The expected pairs come from evaluating the
public mask function at the call's positions (the way the mask interface defines
them), never from transformers' own mask builders, whose signatures change between
releases. Both call forms are exercised on every release: ``q_length``/``q_offset``
(transformers >= 5.4.0) and ``cache_position`` (5.0.0 to 5.3.0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import transformers
import transformers.masking_utils as mu

from attnkit import masks
from attnkit.integrations.transformers import FEATURES, SymbolicMask, attnkit_mask

B = 2
N = 12  # positions the patterns' tensors cover

LEFT = torch.tensor([0, 3])
BLOCKS = torch.tensor([[-1, -1, 0, 0, 0, -1, 1, 1, -1, -1, -1, -1]] * B)


def _padding(n: int) -> torch.Tensor:
    pad = torch.ones(B, n, dtype=torch.bool)
    pad[1, :3] = False  # left padding of the second row
    return pad


def _factory(name: str, first: str) -> Callable[..., Any]:
    """A public factory of transformers.masking_utils, or a skip naming the release that
    introduced it."""
    fn = getattr(mu, name, None)
    if fn is None:
        pytest.skip(f"masking_utils.{name} exists from transformers {first} on "
                    f"(installed: {transformers.__version__})")  # fmt: skip
    return fn


def _pattern(name: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """(mask function, the hints transformers passes with it)."""
    if name == "causal":
        return mu.causal_mask_function, {}
    if name == "bidirectional":
        return mu.bidirectional_mask_function, {}
    if name == "sliding":
        return mu.sliding_window_causal_mask_function(3), {"local_size": 3}
    if name == "sliding_bidirectional":
        make = _factory("sliding_window_bidirectional_mask_function", "5.1.0")
        return make(2), {"local_size": 2}
    if name == "chunked":
        return mu.chunked_causal_mask_function(4, LEFT), {"local_size": 4}
    if name == "blockwise":
        overlay = _factory("blockwise_overlay", "5.9.0")
        return mu.or_masks(mu.causal_mask_function, overlay(BLOCKS)), {}
    if name == "padding_fn":
        pad = mu.padding_mask_function(_padding(N))
        return mu.and_masks(mu.causal_mask_function, pad), {}
    raise AssertionError(name)


PATTERNS = ["causal", "bidirectional", "sliding", "sliding_bidirectional", "chunked",
            "blockwise", "padding_fn"]  # fmt: skip


def _positions(L: int, S: int, q0: int, k0: int) -> tuple[torch.Tensor, ...]:
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    q = (torch.arange(L) + q0).view(1, 1, L, 1)
    kv = (torch.arange(S) + k0).view(1, 1, 1, S)
    return b, h, q, kv


def _expected(fn, L, S, q0, k0, padding=None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """(B, 1, L, S): the mask function at the call's global positions, and the padding
    (positions past its end are padding, as for a static cache)."""
    keep = torch.as_tensor(fn(*_positions(L, S, q0, k0))).expand(B, 1, L, S)
    if padding is not None:
        pad = torch.nn.functional.pad(padding, (0, max(0, k0 + S - padding.shape[1])))
        keep = keep & pad[:, k0 : k0 + S].view(B, 1, 1, S)
    return keep


def _got(sym: SymbolicMask, L: int, S: int) -> torch.Tensor:
    if sym.mask is None:
        return torch.ones(B, 1, L, S, dtype=torch.bool)
    return sym.mask.to_dense(L, S, (B, 1))


def _dense_kinds(m: masks.Mask | None) -> set[str]:
    return set() if m is None else set(m.kinds()) & {"keep", "bias"}


def _call(form: str, L: int, S: int, q0: Any, k0: Any, **kw: Any) -> SymbolicMask:
    """attnkit_mask called the way a release calls it."""
    if form == "cache_position":
        return attnkit_mask(batch_size=B, cache_position=torch.arange(L) + q0, kv_length=S,
                            kv_offset=k0, **kw)  # fmt: skip
    return attnkit_mask(batch_size=B, q_length=L, kv_length=S, q_offset=q0, kv_offset=k0, **kw)


# (L, S, q_offset, kv_offset): a prefill, a chunked prefill and a decode step against a
# cache, and a sliding cache that dropped its oldest keys.
SIZES = [(12, 12, 0, 0), (5, 12, 7, 0), (1, 12, 11, 0), (1, 4, 11, 8), (3, 6, 9, 6)]


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "L{}S{}q{}k{}".format(*s))
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("form", ["offsets", "cache_position"])
def test_patterns_keep_what_transformers_keeps(name: str, sizes: tuple, padded: bool,
                                               form: str) -> None:  # fmt: skip
    L, S, q0, k0 = sizes
    fn, hints = _pattern(name)
    padding = _padding(q0 + L) if padded else None  # shorter than k0 + S: a static cache
    sym = _call(form, L, S, q0, k0, mask_function=fn, attention_mask=padding, **hints)
    assert sym.symbolic and not _dense_kinds(sym.mask), sym
    assert torch.equal(_got(sym, L, S), _expected(fn, L, S, q0, k0, padding))


@pytest.mark.parametrize("form", ["offsets", "cache_position"])
def test_an_unknown_pattern_is_evaluated_exactly_and_said_so(form: str) -> None:
    def every_other(b, h, q, kv):  # type: ignore[no-untyped-def]
        return (kv % 2 == 0) | (kv == q)

    def causal_but_one(b, h, q, kv):  # type: ignore[no-untyped-def]
        return (kv <= q) & ~((q == 7) & (kv == 3))  # causal on every probe but one pair

    for fn in (mu.and_masks(mu.causal_mask_function, every_other), causal_but_one):
        for L, S, q0, k0 in ((12, 12, 0, 0), (5, 12, 7, 0)):
            sym = _call(form, L, S, q0, k0, mask_function=fn, attention_mask=_padding(N))
            assert not sym.symbolic and sym.mask.kinds() == {"keep"}
            assert torch.equal(_got(sym, L, S), _expected(fn, L, S, q0, k0, _padding(N)))


def test_positions_and_shape_travel_with_the_mask() -> None:
    sym = attnkit_mask(B, 1, 9, torch.tensor(8), 0)  # a static cache keeps q_offset in a tensor
    assert (sym.q_offset, sym.kv_offset, sym.shape, sym.ndim) == (8, 0, (B, 1, 1, 9), 4)
    assert sym.contiguous() is sym
    assert attnkit_mask(B, 1, 9, 8, 0, attention_mask=sym) is sym  # prepared ahead: as it is
    assert sym.mask is None and sym.for_call(1, 5) is None  # one new token sees its whole cache
    causal = attnkit_mask(B, 4, 9, 5, 0)
    assert torch.equal(
        causal.for_call(4, 7).to_dense(4, 7), causal.mask.to_dense(4, 9)[:, :7]
    )  # fewer keys than the mask covers: the first ones
    with pytest.raises(ValueError, match="built for 4 queries and 9 keys"):
        causal.for_call(3, 9)
    with pytest.raises(TypeError, match="either q_length or cache_position"):
        attnkit_mask(B, kv_length=9)


@pytest.mark.parametrize("name", ["causal", "sliding", "padding_fn"])
def test_a_mask_for_a_compiled_forward_keeps_its_structure_as_decoding_moves(name: str) -> None:
    """transformers allows no skipping for a compiled static-cache forward: the mask then
    has the same structure at every step, its positions tensors copied when it is made."""
    fn, hints = _pattern(name)
    S = N  # a static cache of N slots, the prompt 5 tokens long, one new token per step
    signatures = set()
    for pos in range(5, S):
        counter = torch.tensor(pos)  # the cache's own length counter
        padding = _padding(pos + 1)  # the 2-D mask grows by one per step
        sym = attnkit_mask(B, 1, S, counter, 0, mask_function=fn, attention_mask=padding,
                           allow_is_causal_skip=False, **hints)  # fmt: skip
        counter.add_(1)  # the cache moves on during the forward: the mask keeps its copy
        assert isinstance(sym.q_offset, torch.Tensor) and sym.mask is not None
        assert torch.equal(_got(sym, 1, S), _expected(fn, 1, S, pos, 0, padding))
        signatures.add(sym.mask.signature(1, S))
    assert len(signatures) == 1, signatures


@pytest.mark.torch_feature("compile")
def test_under_torch_compile_the_causal_function_stays_symbolic_and_others_dense() -> None:
    """Inside a compiled forward nothing is read on the host: transformers' causal
    function is known by identity, any other pattern is evaluated densely (as sdpa's)."""
    seen: list[SymbolicMask] = []
    fn = mu.sliding_window_causal_mask_function(3)

    def build(q0: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        for f in (mu.causal_mask_function, fn):
            form = (
                {"cache_position": q0.view(1) + torch.arange(1)}
                if (FEATURES.mask_positions == "cache_position")
                else {"q_length": 1, "q_offset": q0}
            )
            seen.append(attnkit_mask(batch_size=B, kv_length=N, kv_offset=0, mask_function=f,
                                     attention_mask=padding, local_size=3, **form))  # fmt: skip
        return padding.sum()

    torch.compile(build, fullgraph=True, backend="eager")(torch.tensor(8), _padding(9))
    causal, sliding = seen
    assert not _dense_kinds(causal.mask) and sliding.mask.kinds() == {"keep"}
