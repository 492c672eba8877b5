"""Non-finite inputs: fixed masks with known structure, poisoned positions and the policy
check shared by the conformance suite and the backends' own tests.

The policy: a NaN (or inf) in a position that is used propagates to the rows that use
it; a position masked out never contributes, whatever it holds (see
``conformance/test_nonfinite.py`` for the full statement).
"""

from __future__ import annotations

import math

import numpy as np
import torch

import attnkit
from attnkit import masks

from cases import make_mask, make_score, mask_to
from reference import oracle_mask
from tolerance import FLOAT32_ULPS_REL, assert_close_to_scale

B, H, HK, L, S, E, EV = 2, 2, 1, 6, 7, 4, 3  # GQA: both query heads share one kv head
POISON_QUERY_ROWS = (1, 3, 4)
POISON_KEYS = (5, 6)


def fixed_masks() -> dict[str, tuple[masks.Mask | None, np.ndarray]]:
    """Masks with known structure and their keep arrays broadcastable to (B, H, L, S)."""
    keep = torch.rand(L, S, generator=torch.Generator().manual_seed(3)) < 0.6
    keep[:, 5] = False  # key 5: removed for every query
    keep[3] = False  # query 3: no key at all
    keep[0, 6] = keep[4, 6] = True  # key 6: used by some rows
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, [5, 6]] = True  # batch 0: the poisoned keys are padding
    pad[1, :4] = True  # batch 1: the poisoned keys are used
    causal_keep = np.tril(np.ones((L, S), dtype=bool))  # key 5: row 5 only; key 6: none
    br = S - L
    causal_br = np.tril(np.ones((L, S), dtype=bool), k=br)
    lens_keep = np.zeros((B, 1, L, S), dtype=bool)
    lens_keep[0, :, :, :4] = True  # lens [4, 0]: batch 1 fully masked
    q_lens_keep = np.zeros((B, 1, L, S), dtype=bool)
    q_lens_keep[0, :, :4, :4] = True
    q_lens_keep[1, :, :2, :2] = True
    pad_keep = (~pad.numpy()).reshape(B, 1, 1, S)
    neg_inf_bias = torch.zeros(L, S).masked_fill(~keep, -math.inf)  # the keep mask as a bias
    return {
        "none": (None, np.ones((L, S), dtype=bool)),
        "keep": (masks.keep(keep), keep.numpy()),
        "neg_inf_bias": (masks.bias(neg_inf_bias), keep.numpy()),
        "valid_lens": (masks.valid_lens([4, 0]), lens_keep),
        "valid_lens_queries": (masks.valid_lens([4, 2], queries=True), q_lens_keep),
        "key_padding": (masks.key_padding(pad), pad_keep),
        "causal": (masks.causal(), causal_keep),
        "causal_and_padding": (
            masks.causal("bottom_right") & masks.key_padding(pad),
            causal_br & pad_keep,
        ),
    }


FIXED_MASKS = tuple(fixed_masks())


def poison_inputs(score_name: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    Ek = E + 2 if score_name in ("bilinear", "additive") else E
    q = torch.randn(B, H, L, E, generator=gen)
    k = torch.randn(B, HK, S, Ek, generator=gen)
    v = torch.randn(B, HK, S, EV, generator=gen)
    return q, k, v


def usable(
    score: attnkit.scores.Score, mask: object, backend: str, *qkv: torch.Tensor
) -> tuple[bool, bool, bool]:
    """(runs, can return weights, can return lse) for this backend."""
    kw = {"score": score, "mask": mask, "backend": backend}
    runs = not attnkit.explain(*qkv, **kw).reasons[backend]
    w = not attnkit.explain(*qkv, return_weights=True, **kw).reasons[backend]
    lse = not attnkit.explain(*qkv, return_lse=True, **kw).reasons[backend]
    return runs, w, lse


def poisoned_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score: attnkit.scores.Score,
    mask: object,
    backend: str,
    want_w: bool,
    want_lse: bool,
) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        res = attnkit.attention(
            q,
            k,
            v,
            score=score,
            mask=mask,
            return_weights=want_w,
            return_lse=want_lse,
            backend=backend,
        )
    res = res if isinstance(res, tuple) else (res,)
    names = ["out"] + (["weights"] if want_w else []) + (["lse"] if want_lse else [])
    return {n: r.cpu() for n, r in zip(names, res, strict=True)}


def check_poisoned(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score: attnkit.scores.Score,
    mask: object,
    keep: np.ndarray,
    where: str,
    poison: float,
    positions: np.ndarray,
    backend: str,
    device: str,
) -> bool:
    """Poison ``positions`` of ``where`` and hold the call to the policy; False when the
    backend does not run this call (its refusal is checked in the oracle tests).

    ``positions``: bool (B, H, L) for "query", (B, Hk, S) for "key" / "value";
    ``keep``: the mask's keep array, broadcastable to (B, H, L, S). The inputs are
    poisoned on the CPU; every tensor of the call (inputs, score, mask) then lives on
    ``device``, and ``usable`` asks about the two calls that run there, poisoned and
    zeroed (the score is moved in place, as ``nn.Module.to`` does).
    """
    Bn, Hq, Ln = q.shape[:3]
    Hk, Sn = k.shape[1], k.shape[2]
    keep_full = np.broadcast_to(keep, (Bn, Hq, Ln, Sn))
    pos_t = torch.from_numpy(np.ascontiguousarray(positions))
    inputs = {"query": q, "key": k, "value": v}
    poisoned = {n: t.clone() for n, t in inputs.items()}
    zeroed = {n: t.clone() for n, t in inputs.items()}
    zeroed[where][pos_t] = 0.0
    if where == "value":
        poisoned[where][pos_t] = poison  # the whole value row
    else:
        poisoned[where][..., 0][pos_t] = poison  # one component: the score sees it
    if where == "query":
        used = positions & keep_full.any(-1)  # (B, H, L)
    else:
        group = np.repeat(positions, Hq // Hk, axis=1)[:, :, None, :]  # (B, H, 1, S)
        used = (keep_full & group).any(-1)  # (B, H, L)
    score = score.to(device)
    moved_mask = mask_to(mask, device)
    poisoned_dev = [t.to(device) for t in poisoned.values()]
    zeroed_dev = [t.to(device) for t in zeroed.values()]
    # Both calls run, and return weights and lse, only where explain says so of each.
    caps = [usable(score, moved_mask, backend, *t) for t in (poisoned_dev, zeroed_dev)]
    runs, want_w, want_lse = (all(c) for c in zip(*caps, strict=True))
    if not runs:
        return False
    got = poisoned_call(*poisoned_dev, score, moved_mask, backend, want_w, want_lse)
    want = poisoned_call(*zeroed_dev, score, moved_mask, backend, want_w, want_lse)
    clean = torch.from_numpy(~used)
    what = f"{backend}, {where} poisoned with {poison}"
    for name, g in got.items():
        w = want[name]
        # Values do not enter the weights or the lse: those ignore a poisoned value.
        rows = torch.ones_like(clean) if where == "value" and name != "out" else clean
        assert_close_to_scale(g[rows], w[rows], rel=FLOAT32_ULPS_REL, what=f"{what}, {name}")
    dirty = torch.from_numpy(used)
    if not dirty.any():
        return True
    if np.isnan(poison):
        assert got["out"][dirty].isnan().all(), f"{what}: a row that uses it is not all NaN"
        if "lse" in got and where != "value":
            assert got["lse"][dirty].isnan().all(), f"{what}: lse of a row using it is not NaN"
    elif where == "value":
        assert not got["out"][dirty].isfinite().any(), f"{what}: a row that uses it is finite"
    return True


def query_positions() -> np.ndarray:
    pos = np.zeros((B, H, L), dtype=bool)
    pos[:, :, list(POISON_QUERY_ROWS)] = True
    return pos


def key_positions() -> np.ndarray:
    pos = np.zeros((B, HK, S), dtype=bool)
    pos[:, :, list(POISON_KEYS)] = True
    return pos


def random_poison_case(
    score_name: str,
    mask_name: str,
    where: str,
    shape: tuple[int, int, int, int, int],
    gen: torch.Generator,
    value_width: int = EV,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object, object, np.ndarray, np.ndarray]:
    """One random call to poison: (q, k, v, score, mask, keep, positions).

    ``shape`` is (B, Hq, Hk, L, S) (head size E, value size ``value_width``: EV, or E for
    a call torch's fused kernel takes as it is); ``keep`` (L, S) or
    broadcastable to (B, Hq, L, S) is the pairs the mask keeps (a -inf bias removes a
    pair like a keep mask), ``positions`` a random 30 % of the rows of ``where``
    ("query": (B, Hq, L), else (B, Hk, S)) to poison.
    """
    Bn, Hq, Hk, Ln, Sn = shape
    Ek = E + 2 if score_name in ("bilinear", "additive") else E
    q = torch.randn(Bn, Hq, Ln, E, generator=gen)
    k = torch.randn(Bn, Hk, Sn, Ek, generator=gen)
    v = torch.randn(Bn, Hk, Sn, value_width, generator=gen)
    score, _ = make_score(score_name, E, Ek, gen, torch.float32)
    mask, spec = make_mask(mask_name, Bn, Hq, Ln, Sn, gen, torch.float32)
    keep, bias = oracle_mask(spec, Ln, Sn, 2)
    keep = np.ones((Ln, Sn), dtype=bool) if keep is None else keep
    if bias is not None:
        keep = keep & (bias > -np.inf)
    rows = (Bn, Hq, Ln) if where == "query" else (Bn, Hk, Sn)
    positions = (torch.rand(rows, generator=gen) < 0.3).numpy()
    return q, k, v, score, mask, keep, positions
