"""Measure ``attnkit show`` at length on a tiny random GPT-2 built here (nothing downloaded).

    python scripts/show_bench.py --tokens 2000                       # 12 layers x 12 heads
    python scripts/show_bench.py --tokens 8000 --layers 4 --heads 4
    python scripts/show_bench.py --tokens 2000 --load-only PAGE.html  # browser load time

Builds the model from a config (4,096 or more positions, query and key weights scaled up
so heads are peaked like a trained model's), a byte-level BPE tokenizer trained on a
small text, runs ``attnkit show`` in this process and prints the page size, the wall time
and the peak RSS (ru_maxrss). With Playwright and a system Chromium it also times the
page's load (until the viewer says it is ready). Run it on a quiet machine for times.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the cat sat on a mat because it was tired and then it slept all day long while "
         "a dog ran past the house near the river").split()  # fmt: skip


def build(directory: Path, layers: int, heads: int, positions: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)
    width = 16 * heads
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=width, n_layer=layers, n_head=heads,
                     n_positions=positions, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, : 2 * width] *= 6  # peaked heads
    model.save_pretrained(directory)


def text_of(tokens: int) -> str:
    import random

    rng = random.Random(0)
    return " ".join(rng.choice(WORDS) for _ in range(tokens))  # about one token per word


def load_time(page: Path) -> float | None:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page()
        start = time.perf_counter()
        tab.goto(page.resolve().as_uri())
        tab.wait_for_selector("body[data-ready='1']", timeout=120_000)
        took = time.perf_counter() - start
        browser.close()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--generate", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", help="write the model and page here")
    ap.add_argument("--load-only", metavar="PAGE", help="only time loading this page")
    args = ap.parse_args()
    if args.load_only:
        print(f"load: {load_time(Path(args.load_only)):.2f} s")
        return 0
    root = Path(args.keep or tempfile.mkdtemp(prefix="show-bench-"))
    model_dir = root / "tiny-gpt2"
    build(model_dir, args.layers, args.heads, max(4096, args.tokens + args.generate + 8))
    text = text_of(args.tokens)
    page = root / "attention.html"
    from attnkit.cli import main as cli

    argv = ["show", text, "--model", str(model_dir), "--out", str(page), "--no-png",
            "--max-length", str(args.tokens + args.generate)]  # fmt: skip
    if args.generate:
        argv += ["--generate", str(args.generate)]
    start = time.perf_counter()
    code = cli(argv)
    took = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024  # KiB -> GiB
    size = page.stat().st_size / 1024 / 1024
    print(
        f"show: exit {code}, {took:.1f} s, page {size:.1f} MiB, peak RSS {rss:.2f} GiB",
        file=sys.stderr,
    )
    loaded = load_time(page)
    if loaded is not None:
        print(f"load in headless Chromium: {loaded:.2f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
