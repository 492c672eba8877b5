"""The models suite (``attnkit bench --suite models``, CPU): attnkit in today's models.

Two groups of cases, each against its peer on the same inputs:

- a Llama-shaped stack (``LlamaModel``: 4 layers, hidden 512, 8 query heads and 2
  key/value heads of 64, 2,048 tokens, one sequence, eval, no grad) run with
  ``attn_implementation="attnkit"`` against the same weights on transformers'
  ``"sdpa"`` (``llama_2k``, target: at least 0.95x its speed) and ``"eager"``
  (``llama_2k_eager``), and with ``output_attentions=True`` against eager, the
  only implementation of transformers that returns weights (``llama_2k_weights``,
  target: at least 2x its speed);
- each score modifier at 4,096 tokens (B=1, H=8, E=64, float32, forward) against
  its materialized formula, the (H, L, S) logits written out as a model file
  does: ``softcap_4k`` (Gemma 2's ``c * tanh(s / c)``), ``alibi_4k`` (symmetric,
  ``-slope * |i - j|``), ``alibi_causal_4k`` (BLOOM's per-key bias under a causal
  mask), ``t5_bias_4k`` (T5's bucketed table) and ``sinks_4k`` (gpt-oss's extra
  softmax column). Targets: softcap and symmetric ALiBi at least 3x the formula's
  speed at no more than 1/10 of its peak memory.

The model cases need transformers (attnkit's ``transformers`` extra); without
it they report the error and the other cases still run. Peak memory is measured
by :mod:`attnkit.bench.runner` (each side once in a child process).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

import attnkit
from attnkit import masks, mods

from .cases import BenchCase, Sides, max_abs_diff

__all__ = ["MODEL_CASES", "materialized_modifier"]


# --------------------------------------------------------------------------- the Llama stack


def _llama(quick: bool, baseline: str) -> tuple[Any, Any, torch.Tensor, str]:
    """(attnkit model, baseline model, input ids (1, N), shape text): same weights."""
    try:
        import transformers

        import attnkit.integrations.transformers  # noqa: F401  (registers "attnkit")
    except ImportError as exc:
        raise RuntimeError(
            'the models suite needs transformers: pip install "transformers>=5"'
        ) from exc
    transformers.logging.set_verbosity_error()
    layers, hidden, heads, kv_heads, N = (2, 32, 4, 2, 32) if quick else (4, 512, 8, 2, 2048)
    cfg = transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=2 * hidden, vocab_size=1000,
        max_position_embeddings=N,
    )  # fmt: skip
    torch.manual_seed(21)
    theirs = transformers.AutoModel.from_config(cfg, attn_implementation=baseline).eval()
    ours = copy.deepcopy(theirs)
    ours.set_attn_implementation("attnkit")
    ids = torch.randint(0, cfg.vocab_size, (1, N), generator=torch.Generator().manual_seed(21))
    shape = (
        f"LlamaModel {layers} layers, hidden {hidden}, heads {heads}/{kv_heads} of "
        f"{hidden // heads}, N={N}, eval"
    )
    return ours, theirs, ids, shape


def _llama_case(baseline: str, weights: bool) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        ours, theirs, ids, shape = _llama(quick, baseline)

        def run(model: Any) -> Callable[[], Any]:
            def forward() -> Any:
                with torch.no_grad():
                    return model(ids, output_attentions=weights)

            return forward

        def check() -> float:
            a, b = run(ours)(), run(theirs)()
            diffs = [max_abs_diff(a.last_hidden_state, b.last_hidden_state)]
            if weights:
                diffs += [
                    max_abs_diff(x, y) for x, y in zip(a.attentions, b.attentions, strict=True)
                ]
            return max(diffs)

        return Sides(
            attnkit=run(ours),
            baseline=run(theirs),
            baseline_name=f'transformers "{baseline}"',
            shape=shape + (", output_attentions" if weights else ""),
            check=check,
        )

    return build


# --------------------------------------------------------------------------- score modifiers


def _t5_bias(table: torch.Tensor, L: int, S: int, buckets: int, distance: int) -> torch.Tensor:
    rel = torch.arange(S).view(1, S) - torch.arange(L).view(L, 1)  # (L, S): key - query
    idx = mods.t5_buckets(rel, buckets, distance, bidirectional=True)  # (L, S)
    return table[idx].permute(2, 0, 1)  # (H, L, S)


def materialized_modifier(
    kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, param: torch.Tensor | float
) -> torch.Tensor:
    """A score modifier written out as model files do: the (B, H, L, S) logits, the
    modifier's bias or function on them, softmax, times v.

    q (B, H, L, E), k and v (B, H, S, E); ``param``: the cap (softcap), the (H,)
    slopes (alibi, alibi_causal), the (buckets, H) table (t5_bias) or the (H,) sink
    logits (sinks). Returns (B, H, L, E).
    """
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q @ k.transpose(-1, -2)) * E**-0.5  # (B, H, L, S)
    i = torch.arange(L).view(L, 1)  # (L, 1)
    j = torch.arange(S).view(1, S)  # (1, S)
    if kind == "softcap":
        assert isinstance(param, float)
        s = torch.tanh(s / param) * param
    elif kind == "alibi":
        assert isinstance(param, torch.Tensor)
        s = s - param.view(-1, 1, 1) * (i - j).abs()  # (H, L, S) bias
    elif kind == "alibi_causal":
        assert isinstance(param, torch.Tensor)
        s = s + param.view(-1, 1, 1) * j  # (H, 1, S): BLOOM's per-key form
        s = s.masked_fill(j > i, float("-inf"))
    elif kind == "t5_bias":
        assert isinstance(param, torch.Tensor)
        s = s + _t5_bias(param, L, S, param.shape[0], 128)
    elif kind == "sinks":
        assert isinstance(param, torch.Tensor)
        sink = param.view(1, -1, 1, 1).expand(s.shape[0], -1, L, 1)  # (B, H, L, 1)
        w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, L, S)
        return w @ v
    return torch.softmax(s, dim=-1) @ v


def _modifier(kind: str) -> tuple[mods.Mod, masks.Mask | None, torch.Tensor | float]:
    H = 8
    if kind == "softcap":
        return mods.softcap(5.0), None, 5.0
    if kind in ("alibi", "alibi_causal"):
        slopes = mods.alibi_slopes(H)
        causal = kind == "alibi_causal"
        return mods.alibi(slopes, causal=causal), masks.causal() if causal else None, slopes
    if kind == "t5_bias":
        table = torch.randn(32, H, generator=torch.Generator().manual_seed(22))  # (buckets, H)
        return mods.relative_position_bias(table, 32, 128, bidirectional=True), None, table
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(23))  # (H,)
    return mods.sinks(sinks), None, sinks


def _modifier_case(kind: str) -> Callable[[bool], Sides]:
    def build(quick: bool) -> Sides:
        B, H, N, E = (1, 8, 64, 16) if quick else (1, 8, 4096, 64)
        g = torch.Generator().manual_seed(24)
        q, k, v = (torch.randn(B, H, N, E, generator=g) for _ in range(3))  # (B, H, N, E)
        mod, mask, param = _modifier(kind)

        def ours() -> torch.Tensor:
            with torch.no_grad():
                return attnkit.attention(q, k, v, mask=mask, mods=mod)

        def theirs() -> torch.Tensor:
            with torch.no_grad():
                return materialized_modifier(kind, q, k, v, param)

        return Sides.compared(
            ours,
            theirs,
            "materialized formula",
            f"B={B} H={H} L=S={N} E={E}, {kind}",
            backend=lambda: attnkit.explain(q, k, v, mask=mask, mods=mod).chosen,
        )

    return build


MODEL_CASES: tuple[BenchCase, ...] = (
    BenchCase("llama_2k", "models", "≥ 0.95× sdpa", 0.95, _llama_case("sdpa", False)),
    BenchCase("llama_2k_eager", "models", "-", None, _llama_case("eager", False)),
    BenchCase("llama_2k_weights", "models", "≥ 2× eager, weights", 2.0, _llama_case("eager", True)),
    BenchCase(
        "softcap_4k", "models", "≥ 3×, ≤ 1/10 memory", 3.0, _modifier_case("softcap"), mem_goal=0.1
    ),
    BenchCase(
        "alibi_4k", "models", "≥ 3×, ≤ 1/10 memory", 3.0, _modifier_case("alibi"), mem_goal=0.1
    ),
    BenchCase("alibi_causal_4k", "models", "-", None, _modifier_case("alibi_causal")),
    BenchCase("t5_bias_4k", "models", "-", None, _modifier_case("t5_bias")),
    BenchCase("sinks_4k", "models", "-", None, _modifier_case("sinks")),
)
"""The CPU cases of ``--suite models`` (its own suite, not part of ``all``)."""
