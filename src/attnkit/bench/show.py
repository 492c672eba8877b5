"""The show suite (``attnkit bench --suite show``, CPU): ``attnkit show`` against the forward.

The model is a GPT-2 of GPT-2 small's shape (12 layers × 12 heads, 768 wide; quick
mode: 2 × 2, 64 wide) with random weights, its query and key weights scaled up so
heads are peaked like a trained model's, and a byte-level BPE tokenizer trained on
a few words: both built here from a config, nothing downloaded.

Each case runs, in fresh processes and interleaved, repeat after repeat:

- ``attnkit show`` on a text of N tokens (``--quiet --no-png``);
- the same command on one sentence: its start-up (imports, loading the model,
  writing a page);
- the model's plain forward on the same N tokens (transformers' ``"sdpa"``
  attention, no weights; warmed up on a short input first, then timed once).

The figure is (show − start-up) ÷ forward, the median over repeats; the target
is at most 2×. The page's size and the long run's peak resident memory
(``ru_maxrss`` of that child) are reported beside it, with the page budgets at
2,000 tokens (≤ 20 MiB, ≤ 3 GiB).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runner import CaseResult

__all__ = ["SHOW_CASES", "ShowCase", "build_model", "run_show_case", "text_of"]

WORDS = ("the cat sat on a mat because it was tired and then it slept all day long while "
         "a dog ran past the house near the river").split()  # fmt: skip
SENTENCE = "The cat sat on the mat because it was tired."


@dataclass(frozen=True)
class ShowCase:
    """One length of the show suite.

    Attributes:
        name, suite, target: as for every case.
        tokens: the long text's tokens; repeats: interleaved repeats (full mode).
        goal: the most (show - start-up) / forward allowed.
        page_mib, peak_gib: the page budgets (None: not judged).
    """

    name: str
    tokens: int
    repeats: int
    goal: float = 2.0
    page_mib: float | None = None
    peak_gib: float | None = None
    suite: str = "show"

    @property
    def target(self) -> str:
        budgets = ""
        if self.page_mib is not None and self.peak_gib is not None:
            budgets = f"; page ≤ {self.page_mib:g} MiB, peak ≤ {self.peak_gib:g} GiB"
        return f"(show − start-up) ≤ {self.goal:g}× forward{budgets}"


SHOW_CASES = (
    ShowCase("show_2k", 2000, repeats=3, page_mib=20, peak_gib=3),
    ShowCase("show_8k", 8000, repeats=1),
)


def text_of(tokens: int) -> str:
    """Random words from a fixed list: about one token per word under the suite's tokenizer."""
    rng = random.Random(0)
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


def build_model(directory: Path, layers: int, heads: int, width: int, positions: int) -> None:
    """A random GPT-2 with peaked heads and a byte-level BPE tokenizer, saved to ``directory``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    torch.manual_seed(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=width, n_layer=layers, n_head=heads,
                     n_positions=positions, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    blocks: Any = model.transformer.h
    with torch.no_grad():
        for block in blocks:
            block.attn.c_attn.weight[:, : 2 * width] *= 6  # peaked heads
    model.save_pretrained(directory)


def _timed(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak resident GiB) of a child process; RuntimeError when it fails."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak memory
        took = time.perf_counter() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            tail = (err.read().strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{' '.join(cmd[2:4])} exited {code}: {tail}")
    return took, usage.ru_maxrss / 1024 / 1024  # KiB -> GiB


def forward_seconds(directory: str, text_file: str, tokens: int) -> float:
    """The plain sdpa forward's time on the file's first ``tokens`` tokens (warmed up)."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModel.from_pretrained(directory, local_files_only=True,
                                      attn_implementation="sdpa").eval()  # fmt: skip
    ids = tok(Path(text_file).read_text(encoding="utf-8"))["input_ids"][:tokens]
    x = torch.tensor([ids])  # (1, N)
    with torch.no_grad():
        model(x[:, :64])  # warm-up: thread pools, first-call costs
        start = time.perf_counter()
        model(x)
        return time.perf_counter() - start


def run_show_case(case: ShowCase, *, quick: bool) -> CaseResult:
    """Measure one case; never raises (an error is reported in the result)."""
    layers, heads, width, tokens = (2, 2, 64, 64) if quick else (12, 12, 768, case.tokens)
    res = CaseResult(name=case.name, target=case.target, baseline_name='transformers "sdpa"',
                     shape=f"GPT-2 {layers} layers × {heads} heads, {width} wide, N={tokens}",
                     goal=1 / case.goal)  # fmt: skip
    repeats = 1 if quick else case.repeats
    try:
        with tempfile.TemporaryDirectory(prefix="attnkit-show-bench-") as tmp:
            root = Path(tmp)
            model = root / "gpt2"
            build_model(model, layers, heads, width, max(1024, tokens + 8))
            text = root / "text.txt"
            text.write_text(text_of(tokens), encoding="utf-8")
            page = root / "attention.html"
            show = [sys.executable, "-m", "attnkit", "show", "--model", str(model), "--no-png",
                    "--quiet", "--out", str(page)]  # fmt: skip
            long_cmd = [*show, "--text-file", str(text), "--max-length", str(tokens)]
            short_cmd = [*show, SENTENCE]
            fwd_cmd = [sys.executable, "-m", "attnkit.bench._forward_child", str(model),
                       str(text), str(tokens)]  # fmt: skip
            shows, starts, fwds, peaks, ratios = [], [], [], [], []
            size = 0.0
            for i in range(repeats):
                order = ("short", "long", "fwd") if i % 2 == 0 else ("fwd", "long", "short")
                got: dict[str, float] = {}
                for what in order:
                    if what == "fwd":
                        got[what] = _forward_child(fwd_cmd)
                    else:
                        took, peak = _timed(long_cmd if what == "long" else short_cmd)
                        got[what] = took
                        if what == "long":
                            peaks.append(peak)
                            size = page.stat().st_size / 1024 / 1024
                shows.append(got["long"])
                starts.append(got["short"])
                fwds.append(got["fwd"])
                ratios.append((got["long"] - got["short"]) / got["fwd"])
            _fill(res, case, shows, starts, fwds, ratios, size, max(peaks), quick)
    except Exception as exc:  # report and go on with the other cases
        res.error = f"{type(exc).__name__}: {exc}"
    return res


def _forward_child(cmd: list[str]) -> float:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the forward's child failed: {tail}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["forward_s"])


def _fill(res: CaseResult, case: ShowCase, shows: list[float], starts: list[float],
          fwds: list[float], ratios: list[float], page_mib: float, peak_gib: float,
          quick: bool) -> None:  # fmt: skip
    ratio = statistics.median(ratios)
    extra = statistics.median(s - t for s, t in zip(shows, starts, strict=True))
    # (a show no slower than its start-up, as a --quick run's short text can be: its
    # time is within the start-up's noise, not a negative duration)
    res.attnkit_s = extra if extra > 0 else None
    res.baseline_s = statistics.median(fwds)
    res.speedup = 1 / ratio if ratio > 0 else None
    res.ratios = [round(1 / r, 4) for r in ratios if r > 0]
    res.pairs = len(ratios)
    res.figures = {
        "show_s": round(statistics.median(shows), 3),
        "startup_s": round(statistics.median(starts), 3),
        "forward_s": round(res.baseline_s, 3),
        "page_mib": round(page_mib, 2),
        "peak_gib": round(peak_gib, 3),
    }
    if ratio > 0:
        res.figures["ratio"] = round(ratio, 3)
    if quick:
        return
    res.met = ratio <= case.goal
    if case.page_mib is not None and case.peak_gib is not None:
        res.mem_met = page_mib <= case.page_mib and peak_gib <= case.peak_gib
