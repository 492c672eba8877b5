"""The show suite's ``--explain`` case: ``attnkit show --explain`` against forward + backward.

On the show suite's model (GPT-2 small's shape with random weights, peaked heads; quick
mode: 2 × 2, 64 wide; :func:`attnkit.bench.show.build_model`) and a text of N tokens,
each repeat runs, in fresh processes and interleaved:

- ``attnkit show --explain`` (attention × gradient, the default method) on the text;
- ``attnkit show`` on the same text, without ``--explain``;
- the model's forward plus backward on the same N tokens (transformers' ``"sdpa"``
  attention, the causal LM's top logit at the last position backpropagated to the
  weights; warmed up on a short input first, then timed once).

The figure is (show --explain − show) ÷ (forward + backward), the median over repeats:
what ``--explain`` adds to a page (loading the model with its head, one forward and one
backward on attnkit's attention, every layer's weights recomputed in the backward,
Chefer's products, the page's larger data) against one plain training step's worth of
model compute.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .runner import CaseResult
from .show import _forward_child, _timed, build_model, text_of

__all__ = ["EXPLAIN_CASES", "ExplainCase", "forward_backward_seconds", "run_explain_case"]


@dataclass(frozen=True)
class ExplainCase:
    """The ``--explain`` case of the show suite.

    Attributes:
        name, suite: as for every case.
        tokens: the text's tokens; repeats: interleaved repeats (full mode).
        goal: the most (show --explain − show) / (forward + backward) allowed.
    """

    name: str
    tokens: int
    repeats: int
    goal: float = 3.0
    suite: str = "show"

    @property
    def target(self) -> str:
        return f"(show --explain − show) ≤ {self.goal:g}× (forward + backward)"


EXPLAIN_CASES = (ExplainCase("show_explain_2k", 2000, repeats=3),)


def forward_backward_seconds(directory: str, text_file: str, tokens: int) -> float:
    """The causal LM's plain sdpa forward and backward (of the top logit at the last position)
    on the file's first ``tokens`` tokens, warmed up on a short input first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                 attn_implementation="sdpa").eval()  # fmt: skip
    ids = tok(Path(text_file).read_text(encoding="utf-8"))["input_ids"][:tokens]
    x = torch.tensor([ids])  # (1, N)

    def step(inputs: torch.Tensor) -> None:
        logits = model(inputs).logits  # (1, n, V)
        logits[0, -1].max().backward()
        model.zero_grad(set_to_none=True)

    step(x[:, :64])  # warm-up: thread pools, first-call costs
    start = time.perf_counter()
    step(x)
    return time.perf_counter() - start


def _exact_text(model: Path, tokens: int) -> str:
    """A text of exactly ``tokens`` tokens under the model's tokenizer, so that the page (cut at
    ``--max-length``) and the attribution (which reads the whole text) see the same input."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    ids = tok(text_of(tokens + 64))["input_ids"][:tokens]
    return str(tok.decode(ids))


def run_explain_case(case: ExplainCase, *, quick: bool) -> CaseResult:
    """Measure the case; never raises (an error is reported in the result)."""
    layers, heads, width, tokens = (2, 2, 64, 64) if quick else (12, 12, 768, case.tokens)
    res = CaseResult(name=case.name, target=case.target,
                     baseline_name='transformers "sdpa" forward + backward',
                     shape=f"GPT-2 {layers} layers × {heads} heads, {width} wide, N={tokens}",
                     goal=1 / case.goal)  # fmt: skip
    repeats = 1 if quick else case.repeats
    try:
        with tempfile.TemporaryDirectory(prefix="attnkit-explain-bench-") as tmp:
            root = Path(tmp)
            model = root / "gpt2"
            build_model(model, layers, heads, width, max(1024, tokens + 8))
            text = root / "text.txt"
            text.write_text(_exact_text(model, tokens), encoding="utf-8")
            show = [sys.executable, "-m", "attnkit", "show", "--model", str(model), "--no-png",
                    "--quiet", "--out", str(root / "attention.html"), "--text-file", str(text),
                    "--max-length", str(tokens)]  # fmt: skip
            child = [sys.executable, "-m", "attnkit.bench._forward_child", str(model), str(text),
                     str(tokens), "backward"]  # fmt: skip
            explains, plains, steps, ratios = [], [], [], []
            for i in range(repeats):
                order = ("plain", "explain", "step") if i % 2 == 0 else ("step", "explain", "plain")
                got: dict[str, float] = {}
                for what in order:
                    if what == "step":
                        got[what] = _forward_child(child)
                    else:
                        got[what] = _timed([*show, "--explain"] if what == "explain" else show)[0]
                explains.append(got["explain"])
                plains.append(got["plain"])
                steps.append(got["step"])
                ratios.append((got["explain"] - got["plain"]) / got["step"])
            ratio = statistics.median(ratios)
            res.attnkit_s = statistics.median(e - p for e, p in zip(explains, plains, strict=True))
            res.baseline_s = statistics.median(steps)
            res.speedup = 1 / ratio if ratio > 0 else None
            res.ratios = [round(1 / r, 4) for r in ratios if r > 0]
            res.pairs = len(ratios)
            res.figures = {
                "explain_show_s": round(statistics.median(explains), 3),
                "plain_show_s": round(statistics.median(plains), 3),
                "forward_backward_s": round(res.baseline_s, 3),
                "explain_ratio": round(ratio, 3),
            }
            if not quick:
                res.met = ratio <= case.goal
    except Exception as exc:  # report and go on with the other cases
        res.error = f"{type(exc).__name__}: {exc}"
    return res
