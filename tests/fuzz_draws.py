"""Random valid attention calls for the conformance fuzz (tests/fuzz_calls.py), each with
its float64 oracle spec, rebuilt in any dtype from one draw.

A :class:`Draw` holds a call's structure (layout, heads, sizes, score, scale, modifiers,
mask, flags) and its values as float64 masters. :meth:`Draw.build` makes the call in a
dtype: every float (inputs, score and modifier parameters, a tensor scale, a bias mask)
is the master rounded to that dtype, and the oracle spec holds the same rounded values
in float64, so a replay of the call in float64 (:meth:`Draw.build` with
``replay_of=``) runs on exactly the values the oracle saw.

The axes are drawn together:

- layouts: 2-D ``(L, E)``, 3-D ``(H, L, E)`` (or d2l's ``(B, L, E)``) and 4-D
  ``(B, H, L, E)``, with grouped-query heads on dim -3 and a key batch of 1 broadcast;
- scores: dot, scaled_dot, bilinear, additive, gaussian (its sigma learnable or not);
- scale: the score's default, a float, or a per-head tensor (H,) or (1,);
- modifiers: ALiBi (both forms, any alignment and offsets), T5's relative position bias
  (one way or both, any buckets), softcap and sinks, up to three, two of a kind too;
- masks: keep, block, bias, tf, valid_lens (per batch, per query, queries too),
  key_padding, causal and window (any alignment and offsets), document ids (runs or
  spread: interleaved, padding inside a document; self or cross), prefix LM, and
  ``&``, ``|``, ``~`` of two of them;
- weights, lse, gradients (inputs and every learnable parameter), the accelerator
  paths (``device_semantics``), and dtypes float32, bfloat16, float16 and float64;
- extremes (:func:`_draw_extremes`, drawn from their own stream so the other axes of a
  case do not move): the Gaussian's sigma (1e-3 .. 1e3) and the input scale of its
  query and key (1e-3 .. 1e4), and large logits (|logit| 1e3 .. 1e6) with the weights
  returned. ``focus`` draws every case on one of them.

Every mask's oracle spec is a dense keep (and bias) array computed here from the
definitions, independently of attnkit's lowering.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnkit import masks, mods, scores

SCORES = ("dot", "scaled_dot", "bilinear", "additive", "gaussian")
MOD_KINDS = ("alibi", "relpos", "softcap", "sinks")
MASK_KINDS = (
    "none", "keep", "block", "bias", "tf", "valid_lens", "valid_lens_rows", "valid_lens_queries",
    "key_padding", "causal", "window", "document", "document_spread", "prefix_lm", "and", "or",
    "not",
)  # fmt: skip
SIMPLE_MASKS = MASK_KINDS[1:14]  # every kind but none and the combinations
PER_BATCH = ("valid_lens", "valid_lens_rows", "valid_lens_queries", "key_padding", "prefix_lm")
"""Kinds that need a batch dim (2-D inputs have none)."""
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass
class Built:
    """A call in one dtype: attention's arguments, its leaves for gradients and the oracle."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict[str, Any]
    params: list[torch.Tensor]
    oracle_kw: dict[str, Any]


@dataclass
class Draw:
    """One random call (see the module docstring); ``features`` name its axes."""

    seed: int
    dtype: torch.dtype
    layout: int
    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    Ev: int
    score_name: str
    features: dict[str, Any] = field(default_factory=dict)
    masters: dict[str, Any] = field(default_factory=dict)
    want_w: bool = False
    want_lse: bool = False
    grad: bool = False
    strict: bool = False

    @property
    def batch_shape(self) -> tuple[int, ...]:
        qb, kb = list(self.q_shape[:-2]), list(self.k_shape[:-2])
        if qb and kb and kb[-1] not in (1, qb[-1]):
            kb[-1] = qb[-1]
        return tuple(int(d) for d in np.broadcast_shapes(tuple(qb), tuple(kb)))

    @property
    def heads(self) -> int:
        return self.batch_shape[-1] if self.batch_shape else 1

    def label(self) -> str:
        f = self.features
        return (
            f"{self.layout}-D q{self.q_shape} k{self.k_shape} Ev{self.Ev} {str(self.dtype)[6:]} "
            f"{self.score_name} scale={f['scale']} mods={f['mods']} mask={f['mask']}"
            f" w{self.want_w:d} lse{self.want_lse:d} grad{self.grad:d}"
            + (" device_semantics" if self.strict else "")
            + (f" extreme={f['extreme']}" if "extreme" in f else "")
        )

    # ------------------------------------------------------------------ building

    def build(self, dtype: torch.dtype | None = None) -> Built:
        """The call in ``dtype`` (default: the draw's); floats rounded to the draw's dtype
        first, so a float64 build replays the values of the draw's own."""
        run = dtype or self.dtype
        m = self.masters

        def val(t: torch.Tensor) -> torch.Tensor:  # rounded to the draw's dtype, held in run
            return t.detach().to(self.dtype).to(run).clone()  # (never the master itself)

        def spec(t: torch.Tensor) -> np.ndarray:
            return t.detach().to(self.dtype).double().numpy()

        q, k, v = val(m["q"]), val(m["k"]), val(m["v"])
        params: list[torch.Tensor] = []
        score, score_spec = self._score(run, val, spec, params)
        kwargs: dict[str, Any] = {"score": score}
        oracle_kw: dict[str, Any] = {"score": score_spec}
        if "scale_tensor" in m:
            hs = val(m["scale_tensor"]).requires_grad_(self.grad and m["scale_learnable"])
            if hs.requires_grad:
                params.append(hs)
            kwargs["scale"], oracle_kw["scale"] = hs, spec(m["scale_tensor"])
        elif "scale" in m:
            kwargs["scale"] = oracle_kw["scale"] = m["scale"]
        elif score_spec[0] == "scaled_dot":
            oracle_kw["scale"] = None
        L, S = self.q_shape[-2], self.k_shape[-2]
        mod_objs, mod_specs = [], []
        for desc in m["mods"]:
            obj, sp = _build_mod(desc, L, S, val, spec, self.grad, params)
            mod_objs.append(obj)
            mod_specs.append(sp)
        if mod_objs:
            kwargs["mods"] = mod_objs
            oracle_kw["mods"] = mod_specs
        mask, keep, bias = resolve_mask(m["mask"], self.batch_shape, L, S, self.dtype, run)
        kwargs["mask"] = mask
        parts = [("keep", keep)] if keep is not None else []
        parts += [("bias", bias)] if bias is not None else []
        oracle_kw["mask"] = ("and", *parts) if parts else None
        return Built(q, k, v, kwargs, params, oracle_kw)

    def _score(self, run: torch.dtype, val: Any, spec: Any, params: list[torch.Tensor]) -> Any:
        m, name = self.masters, self.score_name
        if name in ("dot", "scaled_dot"):
            return name, (name,)
        if name == "gaussian":
            sigma = float(m["sigma"].to(self.dtype))
            if not m["sigma_learnable"]:
                return scores.Gaussian(sigma), ("gaussian", sigma)
            s = scores.Gaussian(sigma, learnable=True).to(run)
            if self.grad:
                params.append(s.sigma)
            else:
                s.sigma.requires_grad_(False)
            return s, ("gaussian", float(s.sigma.detach().double()))
        E, Ek = self.q_shape[-1], self.k_shape[-1]
        if name == "bilinear":
            s = scores.Bilinear(E, Ek, dtype=run)
            with torch.no_grad():
                s.weight.copy_(val(m["W"]))
            s.weight.requires_grad_(self.grad)
            params += [s.weight] if self.grad else []
            return s, ("bilinear", spec(m["W"]))
        s = scores.Additive(E, Ek, m["hidden"], dtype=run)
        with torch.no_grad():
            for lin, key in ((s.W_q, "Wq"), (s.W_k, "Wk"), (s.w_v, "wv")):
                lin.weight.copy_(val(m[key]))
                lin.weight.requires_grad_(self.grad)
                params += [lin.weight] if self.grad else []
        return s, ("additive", spec(m["Wq"]), spec(m["Wk"]), spec(m["wv"])[0])


# ---------------------------------------------------------------------- drawing


FOCUS = ("gaussian_extremes", "large_logits")
"""The extremes a campaign may draw on every case (``focus=``)."""


def draw(
    seed: int, index: int, *, layouts: tuple[int, ...] = (2, 3, 4), focus: str | None = None
) -> Draw:
    """Call ``index`` of the campaign with ``seed`` (structure and values); with ``focus``
    (one of :data:`FOCUS`) every case is drawn on that extreme."""
    rng = random.Random(seed * 1_000_003 + index)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    dtype = rng.choices(DTYPES, weights=[70, 10, 10, 10])[0]
    layout = rng.choice(layouts)
    L, S = rng.randint(1, 12), rng.randint(1, 12)
    if rng.random() < 0.3:
        S = L  # self-attention sizes: document ids shared by queries and keys
    score_name = rng.choice(SCORES)
    if focus == "gaussian_extremes":
        score_name = "gaussian"
    E = rng.randint(1, 6)
    Ek = rng.randint(1, 6) if score_name in ("bilinear", "additive") else E
    Ev = rng.randint(1, 5)
    Hk, g = rng.randint(1, 3), rng.choice([1, 1, 2, 3])
    B = rng.randint(1, 3)
    if layout == 2:
        q_shape, k_shape = (L, E), (S, Ek)
    elif layout == 3:
        q_shape, k_shape = (Hk * g, L, E), (Hk, S, Ek)
    else:
        kb = 1 if rng.random() < 0.15 else B
        q_shape, k_shape = (B, Hk * g, L, E), (kb, Hk, S, Ek)
    d = Draw(rng.randrange(2**31), dtype, layout, q_shape, k_shape, Ev, score_name)
    m = d.masters
    m["q"] = torch.randn(q_shape, generator=gen, dtype=torch.float64)
    m["k"] = torch.randn(k_shape, generator=gen, dtype=torch.float64)
    m["v"] = torch.randn(*k_shape[:-1], Ev, generator=gen, dtype=torch.float64)
    fill(d, rng, gen, with_mods=True)
    d.want_w, d.want_lse = rng.random() < 0.3, rng.random() < 0.4
    d.grad, d.strict = rng.random() < 0.35, rng.random() < 0.15
    if focus is not None:
        _draw_extremes(d, random.Random(seed * 7_000_003 + index), focus)
    return d


def _draw_extremes(d: Draw, rng: random.Random, focus: str) -> None:
    """The extreme ``focus``, from its own stream ``rng``: "gaussian_extremes" an extreme
    sigma (1e-3 .. 1e3), input scale (1e-3 .. 1e4, 1e2 for half inputs) or both (the
    inputs scaled, sigma within a decade or two of their scale: a float64 replay keeps
    logits far above 1e8 no better than 1e-8); "large_logits" (float32 and float64
    cases) the scale brought to 1e3 .. 1e6, the weights returned.

    Extremes run off the accelerator paths: there no host read may decide between the
    Gaussian's dot form and its differences, and the dot-product kernels keep the
    dot form, which cancels at these extremes (a known limit of those paths)."""
    m = d.masters
    wide = d.dtype in (torch.float32, torch.float64)
    if focus == "gaussian_extremes":
        kind = rng.choice(("sigma", "input", "both"))
        factor = 1.0
        if kind != "sigma":  # half inputs: randn times 1e4 would overflow float16
            factor = 10 ** rng.uniform(-3, 4 if wide else 2)
            m["q"], m["k"] = m["q"] * factor, m["k"] * factor
        if kind == "sigma":
            m["sigma"] = torch.tensor(10 ** rng.uniform(-3, 3), dtype=torch.float64)
        elif kind == "both":
            m["sigma"] = torch.tensor(factor * 10 ** rng.uniform(-2, 1), dtype=torch.float64)
        d.features["extreme"] = kind
        d.strict = False
    elif focus == "large_logits" and wide:
        m.pop("scale_tensor", None)
        m["scale"] = 10 ** rng.uniform(3, 6)
        d.features["scale"] = "large"
        d.features["extreme"] = "large_logits"
        d.want_w = True


def fill(d: Draw, rng: random.Random, gen: torch.Generator, *, with_mods: bool) -> None:
    """Draw a call's score, scale, modifiers (or none) and mask for its shapes."""
    _draw_score(d, rng, gen)
    _draw_scale(d, rng, gen)
    if with_mods:
        _draw_mods(d, rng, gen)
    else:
        d.masters["mods"] = []
        d.features["mods"] = "none"
    _draw_mask(d, rng, gen)


def _draw_score(d: Draw, rng: random.Random, gen: torch.Generator) -> None:
    m, E, Ek = d.masters, d.q_shape[-1], d.k_shape[-1]
    if d.score_name == "gaussian":
        m["sigma"] = torch.tensor(rng.uniform(0.7, 3.0), dtype=torch.float64)
        m["sigma_learnable"] = rng.random() < 0.5
    elif d.score_name == "bilinear":
        m["W"] = torch.randn(E, Ek, generator=gen, dtype=torch.float64) / math.sqrt(E)
    elif d.score_name == "additive":
        m["hidden"] = h = rng.randint(1, 6)
        m["Wq"] = torch.randn(h, E, generator=gen, dtype=torch.float64)
        m["Wk"] = torch.randn(h, Ek, generator=gen, dtype=torch.float64)
        m["wv"] = torch.randn(1, h, generator=gen, dtype=torch.float64)


def _draw_scale(d: Draw, rng: random.Random, gen: torch.Generator) -> None:
    m, r = d.masters, rng.random()
    if r < 0.25:
        n = 1 if rng.random() < 0.3 else d.heads
        m["scale_tensor"] = torch.rand(n, generator=gen, dtype=torch.float64) * 1.8 + 0.2
        m["scale_learnable"] = rng.random() < 0.5
        d.features["scale"] = f"tensor({n},)"
    elif r < 0.5:
        m["scale"] = rng.uniform(0.1, 2.0)
        d.features["scale"] = "float"
    else:
        d.features["scale"] = "default"


def _draw_mods(d: Draw, rng: random.Random, gen: torch.Generator) -> None:
    kinds: list[str] = []
    n = rng.choices([0, 1, 2, 3], weights=[40, 35, 18, 7])[0]
    for _ in range(n):
        if kinds and rng.random() < 0.3 and kinds[-1] != "sinks":
            kinds.append(kinds[-1])  # two of a kind
        else:
            kinds.append(rng.choice([k for k in MOD_KINDS if k != "sinks" or "sinks" not in kinds]))
    H = d.heads
    descs = []
    for kind in kinds:
        per_head = 1 if rng.random() < 0.2 else H
        align = rng.choice(["top_left", "bottom_right"])
        r = rng.random()
        offs = (0, 0) if r < 0.5 else (rng.randint(-50, 50), rng.randint(-50, 50))
        if r > 0.92:  # long-context positions (a KV cache of a million tokens)
            offs = (rng.randint(-(10**6), 10**6), rng.randint(-(10**6), 10**6))
        if kind == "alibi":
            slopes = (
                mods.alibi_slopes(per_head).double()
                if rng.random() < 0.5
                else torch.rand(per_head, generator=gen, dtype=torch.float64) * 0.5
            )
            descs.append({"kind": kind, "slopes": slopes, "causal": rng.random() < 0.5,
                          "align": align, "offsets": offs, "learn": rng.random() < 0.5})  # fmt: skip
        elif kind == "relpos":
            bidir = rng.random() < 0.6
            nb = rng.randint(4 if bidir else 2, 16)
            exact = (nb // 2 if bidir else nb) // 2
            maxd = rng.randint(exact + 1, exact + 40)
            table = torch.randn(nb, per_head, generator=gen, dtype=torch.float64)
            descs.append({"kind": kind, "table": table, "nb": nb, "maxd": maxd, "bidir": bidir,
                          "align": align, "offsets": offs, "learn": rng.random() < 0.5})  # fmt: skip
        elif kind == "softcap":
            descs.append({"kind": kind, "cap": rng.choice([0.5, 2.0, 5.0, 30.0])})
        else:
            logits = torch.randn(per_head, generator=gen, dtype=torch.float64)
            descs.append({"kind": kind, "logits": logits, "learn": rng.random() < 0.5})
    d.masters["mods"] = descs
    d.features["mods"] = "+".join(kinds) or "none"


def _build_mod(desc: dict[str, Any], L: int, S: int, val: Any, spec: Any, grad: bool,
               params: list[torch.Tensor]) -> tuple[mods.Mod, tuple[Any, ...]]:  # fmt: skip
    """A modifier and its oracle spec (reference.py's positions: query row i at q0 + i,
    key column j at k0 + j)."""
    kind = desc["kind"]
    if kind == "softcap":
        return mods.softcap(desc["cap"]), ("softcap", desc["cap"])
    learn = grad and desc.get("learn", False)
    if kind == "sinks":
        t = val(desc["logits"]).requires_grad_(learn)
        params += [t] if learn else []
        return mods.sinks(t), ("sinks", spec(desc["logits"]))
    q_off, k_off = desc["offsets"]
    kw = {"align": desc["align"], "q_offset": q_off, "k_offset": k_off}
    q0 = (S - L if desc["align"] == "bottom_right" else 0) + q_off
    if kind == "alibi":
        t = val(desc["slopes"]).requires_grad_(learn)
        params += [t] if learn else []
        spec_a = ("alibi", spec(desc["slopes"]), desc["causal"], q0, k_off)
        return mods.alibi(t, causal=desc["causal"], **kw), spec_a
    t = val(desc["table"]).requires_grad_(learn)
    params += [t] if learn else []
    m = mods.relative_position_bias(t, desc["nb"], desc["maxd"], desc["bidir"], **kw)
    return m, ("relpos", spec(desc["table"]), desc["nb"], desc["maxd"], desc["bidir"], q0, k_off)


# ---------------------------------------------------------------------- masks


def _draw_mask(d: Draw, rng: random.Random, gen: torch.Generator) -> None:
    kinds = [k for k in MASK_KINDS if d.batch_shape or (k not in PER_BATCH)]
    kind = rng.choice(kinds)
    desc = _mask_desc(kind, d, rng, gen)
    d.masters["mask"] = desc
    d.features["mask"] = _mask_name(desc)


def _mask_name(desc: dict[str, Any]) -> str:
    if desc["kind"] in ("and", "or"):
        return f"({_mask_name(desc['a'])} {'&' if desc['kind'] == 'and' else '|'} " \
               f"{_mask_name(desc['b'])})"  # fmt: skip
    if desc["kind"] == "not":
        return f"~{_mask_name(desc['a'])}"
    return desc.get("name", desc["kind"])


def _sub_shape(d: Draw, rng: random.Random) -> tuple[int, ...]:
    """A shape broadcastable to (*batch, L, S): some batch dims kept, others 1 or dropped."""
    batch = list(d.batch_shape)
    drop = rng.randint(0, len(batch))
    kept = [n if rng.random() < 0.6 else 1 for n in batch[drop:]]
    L, S = d.q_shape[-2], d.k_shape[-2]
    return (*kept, L if rng.random() < 0.85 else 1, S)


def _mask_desc(kind: str, d: Draw, rng: random.Random, gen: torch.Generator) -> dict[str, Any]:
    L, S = d.q_shape[-2], d.k_shape[-2]
    B = d.batch_shape[0] if d.batch_shape else 1
    if kind in ("and", "or", "not"):  # of two simple kinds (a bias under & only)
        simple = [k for k in SIMPLE_MASKS if d.batch_shape or k not in PER_BATCH]
        pick = simple if kind == "and" else [k for k in simple if k != "bias"]
        a = _mask_desc(rng.choice(pick), d, rng, gen)
        if kind == "not":
            return {"kind": "not", "a": a}
        return {"kind": kind, "a": a, "b": _mask_desc(rng.choice(pick), d, rng, gen)}
    desc: dict[str, Any] = {"kind": kind}
    if kind in ("keep", "block", "tf"):
        desc["t"] = torch.rand(_sub_shape(d, rng), generator=gen) < 0.7
    elif kind == "bias":
        shape = _sub_shape(d, rng)
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
        desc["t"] = t.masked_fill(torch.rand(shape, generator=gen) < 0.2, -math.inf)
    elif kind == "valid_lens":
        desc["lens"] = torch.randint(0, S + 1, (B,), generator=gen)
    elif kind == "valid_lens_rows":
        desc["lens"] = torch.randint(0, S + 1, (B, L), generator=gen)
    elif kind == "valid_lens_queries":
        desc["lens"] = torch.randint(0, min(L, S) + 1, (B,), generator=gen)
    elif kind == "key_padding":
        desc["pad"] = torch.rand(B, S, generator=gen) < 0.3
    elif kind in ("causal", "window"):
        desc["align"] = rng.choice(["top_left", "bottom_right"])
        desc["offsets"] = (0, 0) if rng.random() < 0.6 else (rng.randint(-9, 9), rng.randint(-9, 9))
        desc["left"] = None if kind == "causal" else rng.choice([None, 0, 1, 3])
        desc["right"] = 0 if kind == "causal" else rng.choice([None, 0, 1, 2])
        if desc["left"] is None and desc["right"] is None:
            desc["right"] = 1
    elif kind in ("document", "document_spread"):
        per_batch = bool(d.batch_shape) and rng.random() < 0.7
        rows = B if per_batch else 1
        spread = kind == "document_spread"
        q_ids = _ids(rows, L, spread, gen)
        same = L == S and rng.random() < 0.8  # self-attention: one ids tensor
        k_ids = q_ids if same else _ids(rows, S, spread, gen)
        if not per_batch:  # (N,) ids, for every batch element
            q_ids = q_ids[0]
            k_ids = q_ids if same else k_ids[0]
        if rng.random() < 0.1:  # ids of any size: 2**40 apart, beyond int32

            def widen(t: torch.Tensor) -> torch.Tensor:
                return torch.where(t >= 0, t * 2**40 + 2**31, t)

            q_ids = widen(q_ids)
            k_ids = q_ids if same else widen(k_ids)
        desc.update(q_ids=q_ids, k_ids=k_ids, same=same)
    elif kind == "prefix_lm":
        desc["prefix"] = (
            torch.randint(0, S + 1, (B,), generator=gen) if rng.random() < 0.6
            else rng.randint(0, S)
        )  # fmt: skip
        desc["align"] = rng.choice(["top_left", "bottom_right"])
        desc["offsets"] = (0, 0) if rng.random() < 0.7 else (rng.randint(-5, 5), rng.randint(-5, 5))
    return desc


def _ids(rows: int, n: int, spread: bool, gen: torch.Generator) -> torch.Tensor:
    """(rows, n) document ids: sorted runs with a padding tail, or spread (any order,
    padding inside documents)."""
    if spread:
        ids = torch.randint(-1, 3, (rows, n), generator=gen)
        ids[:, 0::3] = 1
        return ids
    ids = torch.randint(0, 3, (rows, n), generator=gen).sort(dim=1).values
    pad = torch.rand(rows, n, generator=gen).sort(dim=1).values > 0.85
    return ids.masked_fill(pad, -1)


def resolve_mask(
    desc: dict[str, Any], batch: tuple[int, ...], L: int, S: int, dtype: torch.dtype,
    run: torch.dtype,
) -> tuple[Any, np.ndarray | None, np.ndarray | None]:  # fmt: skip
    """(attnkit mask, keep, bias) of a mask description for a call of (*batch, L, S):
    keep bool and bias float64 arrays broadcastable to (*batch, L, S), or None."""
    nb = len(batch)

    def per_batch(keep_bls: np.ndarray) -> np.ndarray:  # (B, L, S) -> (B, 1.., L, S)
        return keep_bls.reshape(keep_bls.shape[0], *([1] * (nb - 1)), L, S)

    kind = desc["kind"]
    if kind == "none":
        return None, None, None
    if kind in ("and", "or"):
        ma, ka, ba = resolve_mask(desc["a"], batch, L, S, dtype, run)
        mb, kb, bb = resolve_mask(desc["b"], batch, L, S, dtype, run)
        ones = np.ones((L, S), dtype=bool)
        ka = ones if ka is None else ka
        kb = ones if kb is None else kb
        if kind == "and":
            bias = ba if bb is None else bb if ba is None else ba + bb
            return ma & mb, ka & kb, bias
        return ma | mb, ka | kb, None
    if kind == "not":
        ma, ka, _ = resolve_mask(desc["a"], batch, L, S, dtype, run)
        return ~ma, ~(np.ones((L, S), dtype=bool) if ka is None else ka), None
    if kind == "keep":
        return masks.keep(desc["t"]), desc["t"].numpy(), None
    if kind == "block":
        return masks.block(~desc["t"]), desc["t"].numpy(), None
    if kind == "tf":
        t = (~desc["t"]).to(run)  # 1 = masked
        return masks.tf(t), desc["t"].numpy(), None
    if kind == "bias":
        t = desc["t"].to(dtype).to(run)
        return masks.bias(t), None, desc["t"].to(dtype).double().numpy()
    j, i = np.arange(S), np.arange(L)
    if kind.startswith("valid_lens"):
        lens = desc["lens"]
        ln = lens.numpy()
        queries = kind == "valid_lens_queries"
        if lens.ndim == 2:
            keep = j[None, None, :] < ln[:, :, None]  # (B, L, S)
        else:
            keep = np.broadcast_to(j[None, None, :] < ln[:, None, None], (len(ln), L, S)).copy()
            if queries:
                keep &= i[None, :, None] < ln[:, None, None]
        return masks.valid_lens(lens, queries=queries), per_batch(keep), None
    if kind == "key_padding":
        pad = desc["pad"]
        keep = np.broadcast_to(~pad.numpy()[:, None, :], (pad.shape[0], L, S))
        return masks.key_padding(pad), per_batch(keep), None
    if kind in ("causal", "window"):
        q_off, k_off = desc["offsets"]
        kw = {"q_offset": q_off, "k_offset": k_off}
        if kind == "causal":
            mask = masks.causal(desc["align"], **kw)
        else:
            mask = masks.window(desc["left"], desc["right"], desc["align"], **kw)
        return mask, _band(L, S, desc["align"], q_off, k_off, desc["left"], desc["right"]), None
    if kind in ("document", "document_spread"):
        q_ids, k_ids = desc["q_ids"], desc["k_ids"]
        mask = masks.document(q_ids) if desc["same"] else masks.document(q_ids, key_ids=k_ids)
        qn, kn = q_ids.numpy(), k_ids.numpy()
        keep = (qn[..., :, None] == kn[..., None, :]) & (qn[..., :, None] >= 0)
        return mask, (keep if keep.ndim == 2 else per_batch(keep)), None
    assert kind == "prefix_lm"
    q_off, k_off = desc["offsets"]
    prefix = desc["prefix"]
    mask = masks.prefix_lm(prefix, desc["align"], q_offset=q_off, k_offset=k_off)
    causal = _band(L, S, desc["align"], q_off, k_off, None, 0)  # (L, S)
    at = j + int(k_off)  # (S,) the keys' global positions, which the prefix counts
    if isinstance(prefix, int):
        return mask, causal | (at[None, :] < prefix), None
    keep = causal[None] | (at[None, None, :] < prefix.numpy()[:, None, None])  # (B, L, S)
    return mask, per_batch(keep), None


def _band(L: int, S: int, align: str, q_off: int, k_off: int, left: int | None,
          right: int | None) -> np.ndarray:  # fmt: skip
    """(L, S) keep of a window at global positions: query at p_i = base + q_off + i keeps
    the key at p_j = k_off + j when -left <= p_j - p_i <= right."""
    base = S - L if align == "bottom_right" else 0
    rel = (k_off + np.arange(S))[None, :] - (base + q_off + np.arange(L))[:, None]  # (L, S)
    keep = np.ones((L, S), dtype=bool)
    if left is not None:
        keep &= rel >= -left
    if right is not None:
        keep &= rel <= right
    return keep
