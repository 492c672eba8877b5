"""Measure ``attnkit show`` at length on a random GPT-2 built here (nothing downloaded).

    python scripts/show_bench.py --tokens 2000                       # 12 layers x 12 heads
    python scripts/show_bench.py --tokens 8000 --layers 4 --heads 4 --width 64
    python scripts/show_bench.py --tokens 2000 --load-only PAGE.html  # browser load time

Builds the model the show suite builds (``attnkit bench --suite show``, which times
``show`` against the model's forward): GPT-2 small's shape by default (768 wide), 4,096
or more positions, query and key weights scaled up so heads are peaked like a trained
model's, and a byte-level BPE tokenizer trained on a few words. It runs ``attnkit show``
in this process and prints the page size, the wall time and the peak RSS (ru_maxrss).
With Playwright and a system Chromium it also times the page's load (until the viewer
says it is ready). Run it on a quiet machine for times.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path


def build(directory: Path, layers: int, heads: int, width: int, positions: int) -> None:
    from attnkit.bench.show import build_model

    build_model(directory, layers, heads, width, positions)


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
    ap.add_argument("--width", type=int, default=768, help="model width (GPT-2 small: 768)")
    ap.add_argument("--generate", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", help="write the model and page here")
    ap.add_argument("--load-only", metavar="PAGE", help="only time loading this page")
    args = ap.parse_args()
    if args.load_only:
        print(f"load: {load_time(Path(args.load_only)):.2f} s")
        return 0
    root = Path(args.keep or tempfile.mkdtemp(prefix="show-bench-"))
    model_dir = root / "tiny-gpt2"
    build(model_dir, args.layers, args.heads, args.width,
          max(4096, args.tokens + args.generate + 8))  # fmt: skip
    from attnkit.bench.show import text_of

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
