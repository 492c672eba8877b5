"""Input × gradient and integrated gradients: attnkit against captum and inseq, same model, same tokens.

    python scripts/attribution_peers.py --json peers.json
    python scripts/attribution_peers.py --json peers.json --long 2000 --long-steps 2 --inseq-long
    python scripts/attribution_peers.py --json inseq.json --tools attnkit,inseq --inseq-long

Nothing is downloaded: both models are random GPT-2s built here from a config with a
fixed seed, and the tokenizer is a word-level one over the show suite's words
(:data:`attnkit.bench.show.WORDS`), so the show suite's text of N words
(:func:`attnkit.bench.show.text_of`) is exactly N tokens:

- ``tiny``: 2 layers × 2 heads, 16 wide, 0.3 initial spread, in float64, so that the
  differences between the tools are the methods' and not float32 rounding;
- ``gpt2-small``: GPT-2 small's shape (12 layers × 12 heads, 768 wide, GPT-2's
  50,257-token vocabulary, unused entries past the words), in float32, for the times.

The explained scalar is the same for every tool: the logit, at the last position, of
the word the model ranks first there (a word, not a special token). Each tool
attributes it to the output of the input embedding layer (``wte``; GPT-2 adds the
positions after it) and sums over the hidden dimension:

- attnkit: :func:`attnkit.viz.explain` (``method="input_x_gradient"`` or
  ``"integrated_gradients"``, Gauss–Legendre, ``steps`` points), the whole call timed
  (tokenizing, the model switched to attnkit's attention, the head importance that comes
  with every gradient method, and for integrated gradients the main pass and y at zero);
- captum: ``InputXGradient`` / ``IntegratedGradients`` (``method="gausslegendre"``,
  the same ``n_steps``, baseline zero, ``internal_batch_size`` the points attnkit puts
  in one forward) on ``e -> model(inputs_embeds=e).logits[:, -1, word]``, the model on
  its own attention (transformers' ``"sdpa"``); the ``attribute`` call timed;
- inseq (where it is installed): ``inseq.load_model(model, method, tokenizer=...)`` and
  ``attribute(text, text + " " + word, attributed_fn="logit")`` (one generation step,
  the same logit; ``n_steps`` and ``internal_batch_size`` as captum's); the ``attribute``
  call timed; the raw per-dimension attributions summed over the hidden dimension.
  inseq's integrated gradients start from the embedding of the tokenizer's UNK token,
  so that token's row of ``wte`` is zeroed here: its baseline is zero as the others'.
  inseq keeps its attributions in float32 (its step outputs are cast), so on the float64
  model its scores differ from the others' at float32's rounding (about 1e-7).

Reported per row: the wall time (after a warm-up call of the same tool and method on
8 tokens, the median of up to ``--repeats`` calls, fewer where the calls so far took
over ``--budget`` seconds: one call at 2,000 tokens), the max relative difference of
the per-token scores from attnkit's (``max |s − s_attnkit| / max |s_attnkit|``), and for
integrated gradients the completeness gap ``|Σ s − (y(x) − y(0))| / |y(x) − y(0)|``.
A markdown table is printed and the whole record written as JSON.

At 2,000 tokens a forward and backward of GPT-2 small takes tens of seconds on two
cores, so integrated gradients there use ``--long-steps`` points (default 2: one
batched forward and backward); the time grows about linearly with the points.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

SPECIALS = ("[PAD]", "[UNK]", "[EOS]")  # ids 0, 1, 2; [UNK]'s embedding row is zeroed
UNK = 1
GPT2_VOCAB = 50257
WARM = 8  # tokens of the warm-up call


@dataclass
class Row:
    """One tool on one model, length and method."""

    model: str
    tokens: int
    method: str
    tool: str
    steps: int | None = None
    seconds: float | None = None
    times: list[float] = field(default_factory=list)
    max_rel_diff: float | None = None  # against attnkit's scores
    completeness_gap: float | None = None  # |Σ s − (y(x) − y(0))| / |y(x) − y(0)|
    note: str = ""


def tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer: the specials, the show suite's words, then unused entries up to
    ``vocab_size``."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnkit.bench.show import WORDS

    words = list(dict.fromkeys(WORDS))
    names = [*SPECIALS, *words]
    names += [f"[unused{i}]" for i in range(vocab_size - len(names))]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(names)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]",
        bos_token="[EOS]",
    )  # fmt: skip


def build(name: str, positions: int) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) of ``name`` ("tiny" or "gpt2-small"), random weights from seed 0."""
    import transformers

    transformers.logging.set_verbosity_error()
    if name == "tiny":
        vocab, dtype = 64, torch.float64
        shape: dict[str, Any] = {"n_layer": 2, "n_head": 2, "n_embd": 16, "initializer_range": 0.3}
    else:
        vocab, dtype = GPT2_VOCAB, torch.float32
        shape = {"n_layer": 12, "n_head": 12, "n_embd": 768}
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=positions, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=2, eos_token_id=2,
                                  pad_token_id=0, **shape)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).to(dtype).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[UNK] = 0  # inseq's baseline token: zero embeddings
    return model, tokenizer(vocab)


@dataclass
class Case:
    """A model on a text: the ids, the explained word and the objective every tool shares."""

    name: str
    model: torch.nn.Module
    tok: Any
    text: str
    ids: torch.Tensor  # (1, L)
    word: str
    index: int
    embeds: torch.Tensor  # (1, L, D)

    def objective(self, e: torch.Tensor) -> torch.Tensor:
        """(k, L, D) embeddings -> (k,) the word's logit at the last position."""
        return self.model(inputs_embeds=e).logits[:, -1, self.index]

    @property
    def gap(self) -> float:
        """y(x) − y(0)."""
        with torch.no_grad():
            return float(
                self.objective(self.embeds) - self.objective(torch.zeros_like(self.embeds))
            )


def case(name: str, model: torch.nn.Module, tok: Any, n: int) -> Case:
    """The show suite's text of ``n`` words (``n`` tokens) and the model's top word after it."""
    from attnkit.bench.show import WORDS, text_of

    text = text_of(n)
    ids = torch.tensor([tok(text)["input_ids"]])  # (1, n)
    assert ids.shape[1] == n, ids.shape
    with torch.no_grad():
        net: Any = model
        embeds = net.get_input_embeddings()(ids)  # (1, n, D)
        logits = model(inputs_embeds=embeds).logits[0, -1]  # (V,)
    words = len(SPECIALS) + len(dict.fromkeys(WORDS))  # ids of the words: [3, words)
    index = int(logits[len(SPECIALS) : words].argmax()) + len(SPECIALS)
    word = tok.convert_ids_to_tokens(index)
    return Case(name, model, tok, text, ids, word, index, embeds)


def chunk_of(n: int, steps: int) -> int:
    """The integration points attnkit puts in one forward at ``n`` tokens."""
    from attnkit.viz.attribution_passes import IG_BATCH_TOKENS

    return max(1, min(steps, IG_BATCH_TOKENS // max(n, 1)))


def attnkit_tool(c: Case, method: str, steps: int) -> Callable[[], torch.Tensor]:
    from attnkit import viz

    def run() -> torch.Tensor:
        a = viz.explain(c.model, c.tok, c.text, target=c.word, method=method, steps=steps,
                        max_length=c.ids.shape[1])  # fmt: skip
        assert a.target.index == c.index and len(a.tokens) == c.ids.shape[1]
        return a.scores.detach()

    return run


def captum_tool(c: Case, method: str, steps: int) -> Callable[[], torch.Tensor]:
    from captum.attr import InputXGradient, IntegratedGradients

    if method == "input_x_gradient":

        def run() -> torch.Tensor:
            x = c.embeds.clone().requires_grad_(True)  # (1, L, D)
            return InputXGradient(c.objective).attribute(x)[0].sum(-1).detach()  # (L,)
    else:

        def run() -> torch.Tensor:
            ig = IntegratedGradients(c.objective)
            got = ig.attribute(c.embeds, baselines=torch.zeros_like(c.embeds), n_steps=steps,
                               method="gausslegendre",
                               internal_batch_size=chunk_of(c.ids.shape[1], steps))  # fmt: skip
            return got[0].sum(-1).detach()  # (L,)

    return run


def inseq_tool(c: Case, method: str, steps: int) -> Callable[[], torch.Tensor]:
    import inseq

    am = inseq.load_model(c.model, method, tokenizer=c.tok)
    extra = {} if method == "input_x_gradient" else {
        "n_steps": steps, "internal_batch_size": chunk_of(c.ids.shape[1], steps)}  # fmt: skip
    n = c.ids.shape[1]

    def run() -> torch.Tensor:
        out = am.attribute(c.text, c.text + " " + c.word, attributed_fn="logit",
                           show_progress=False, **extra)  # fmt: skip
        seq = out.sequence_attributions[0]
        got = seq.target_attributions  # (n + 1, 1, D): the prefix, then the generated word
        assert got is not None and got.shape[0] == n + 1, None if got is None else got.shape
        return got[:n, 0].sum(-1).to(c.embeds.dtype)  # (n,)

    return run


def timed(fn: Callable[[], torch.Tensor], warm: Callable[[], Any], repeats: int,
          budget: float) -> tuple[torch.Tensor, list[float]]:  # fmt: skip
    """(the last result, each repeat's seconds) after one warm-up call: up to ``repeats``
    calls, no new one once ``budget`` seconds have gone in timed calls."""
    warm()
    times: list[float] = []
    got = None
    while len(times) < repeats and sum(times) < budget:
        start = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - start)
    assert got is not None
    return got, times


def inseq_reason() -> str | None:
    """None where inseq imports, else why not."""
    try:
        import inseq  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def measure(c: Case, steps: int, tools: list[str], warm: Case, args: Any, rows: list[Row],
            skip: str | None) -> None:  # fmt: skip
    """Every tool and method on the case, each warmed up first on ``warm`` (a few tokens on
    the same model, two integration points)."""
    n = c.ids.shape[1]
    gap = c.gap
    makers = {"attnkit": attnkit_tool, "captum": captum_tool, "inseq": inseq_tool}
    for method in ("input_x_gradient", "integrated_gradients"):
        ig = method == "integrated_gradients"
        ref: torch.Tensor | None = None
        for tool in tools:
            row = Row(c.name, n, method, tool, steps if ig else None)
            rows.append(row)
            if tool == "inseq" and skip is not None:
                row.note = f"does not run: {skip}"
                continue
            try:
                fn = makers[tool](c, method, steps)
                first = makers[tool](warm, method, min(steps, 2))
                got, row.times = timed(fn, first, args.repeats, args.budget)
            except Exception as exc:  # a peer that fails is reported, not faked
                row.note = f"does not run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                print(f"  {tool} {method}: {row.note}", file=sys.stderr, flush=True)
                continue
            row.seconds = statistics.median(row.times)
            if tool == "attnkit":
                ref = got
            elif ref is not None:
                row.max_rel_diff = float((got - ref).abs().max() / ref.abs().max())
            if ig:
                row.completeness_gap = abs(float(got.sum()) - gap) / abs(gap)
            print(f"  {c.name} N={n} {method} {tool}: {row.seconds:.3f} s", file=sys.stderr,
                  flush=True)  # fmt: skip


def table(rows: list[Row]) -> str:
    head = ("| model | tokens | method | tool | seconds | max rel. diff. vs attnkit "
            "| IG completeness gap | note |")  # fmt: skip
    head = head.replace("| seconds |", "| seconds (calls) |")
    lines = [head, "|---|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        method = r.method + (f" ({r.steps} pts)" if r.steps else "")
        sec = f"{r.seconds:.3f} ({len(r.times)})" if r.seconds is not None else "—"
        diff = f"{r.max_rel_diff:.1e}" if r.max_rel_diff is not None else "—"
        comp = f"{r.completeness_gap:.1e}" if r.completeness_gap is not None else "—"
        lines.append(f"| {r.model} | {r.tokens} | {method} | {r.tool} | {sec} | {diff} | {comp} "
                     f"| {r.note} |")  # fmt: skip
    return "\n".join(lines)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "transformers", "captum", "inseq", "attnkit"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True, help="where to write the record")
    p.add_argument("--short", type=int, default=64, help="tokens of the short text (64)")
    p.add_argument("--long", type=int, default=2000, help="tokens of the long text; 0: skip")
    p.add_argument("--steps", type=int, default=32, help="IG points at the short length (32)")
    p.add_argument("--long-steps", type=int, default=2, help="IG points at the long length (2)")
    p.add_argument("--repeats", type=int, default=3, help="most timed calls of a row (3)")
    p.add_argument(
        "--budget",
        type=float,
        default=20.0,
        help="no new timed call of a row after this many seconds of them (20)",
    )
    p.add_argument("--inseq-long", action="store_true", help="time inseq at the long length too")
    p.add_argument(
        "--tools",
        default="attnkit,captum,inseq",
        help="comma-separated; attnkit first (the others are compared with it)",
    )
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from attnkit.bench.runner import machine_info

    skip = inseq_reason()
    tools = args.tools.split(",")
    if tools[0] != "attnkit" or not set(tools) <= {"attnkit", "captum", "inseq"}:
        p.error(f"--tools: attnkit, then any of captum and inseq; got {args.tools!r}")
    rows: list[Row] = []
    start = time.perf_counter()
    load = [round(x, 2) for x in os.getloadavg()]
    tiny, tiny_tok = build("tiny", args.short + 8)
    warm = case("tiny", tiny, tiny_tok, WARM)
    measure(case("tiny", tiny, tiny_tok, args.short), args.steps, tools, warm, args, rows, skip)
    small, small_tok = build("gpt2-small", max(1024, args.short, args.long) + 8)
    warm = case("gpt2-small", small, small_tok, WARM)
    short = case("gpt2-small", small, small_tok, args.short)
    measure(short, args.steps, tools, warm, args, rows, skip)
    if args.long:
        long_tools = [t for t in tools if t != "inseq" or args.inseq_long]
        long = case("gpt2-small", small, small_tok, args.long)
        measure(long, args.long_steps, long_tools, warm, args, rows, skip)
    machine = machine_info()
    end = [round(x, 2) for x in os.getloadavg()]
    found = versions()
    record: dict[str, Any] = {
        "command": " ".join(["python", "scripts/attribution_peers.py", *sys.argv[1:]]),
        "machine": {k: machine[k] for k in ("cpu", "cores", "threads", "date_utc")},
        "versions": found,
        "inseq": "runs" if skip is None else f"does not run: {skip}",
        "wall_s": round(time.perf_counter() - start, 1),
        "load_average_1_5_15_min": {"start": load, "end": end},
        "rows": [asdict(r) for r in rows],
    }
    args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{machine['cpu']}, {args.threads} threads; " + ", ".join(
        f"{k} {v}" for k, v in found.items() if v))  # fmt: skip
    print(table(rows))
    print(
        "\nattnkit: the whole explain() call (tokenizing, its main pass with head importance, "
        "for integrated gradients also y at zero); captum, inseq: the attribute() call. "
        f"Load average (1, 5, 15 min) at the start {load}, at the end {end}."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
