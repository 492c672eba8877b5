"""``attnkit show --image PICTURE --model DIR``: a vision transformer's attention on a picture.

The picture is the source: its tokens are the model's non-patch tokens
(``[CLS]``, ``[DIST]``, registers) and its patches, laid out on the picture the
model saw. The page opens on the image view (each head's attention from
``[CLS]`` or a clicked patch as a heatmap, and the rollout); the head, matrix,
model, statistics and neuron views work as for text.

Every check runs before a model is built, and each failure is one line with
exit status 2: Pillow missing (``pip install "attnkit[image]"``), a file that is
not a picture, a text given as well (a vision transformer reads the picture
alone), a text-only option, no ``--model``, a model that is not a supported
vision transformer (the message lists the families), or a checkpoint without
``preprocessor_config.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .show_args import UsageError, check_writable, count, parse_selection, picture_format, resolve
from .show_report import focus_lines, open_page, page_views, save_picture

__all__ = ["add_arguments", "run"]

# Options that only mean something for a text, with what they are about.
_TEXT_ONLY = (
    ("text_file", "--text-file", None),
    ("pair", "--pair", None),
    ("max_length", "--max-length", None),
    ("generate", "--generate", 0),
    ("seed", "--seed", None),
    ("compare", "--compare", None),
    ("compare_model", "--compare-model", None),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--image``."""
    parser.add_argument(
        "--image",
        metavar="PATH",
        help="a picture (PNG, JPEG, ...) for a vision transformer given by --model (ViT, DeiT, "
        "DINOv2, ...): its attention from [CLS] or any patch, drawn over the picture; needs "
        "Pillow (pip install 'attnkit[image]')",
    )


def _check_options(args: argparse.Namespace) -> None:
    """--image against the text options (arithmetic only)."""
    if args.text is not None:
        raise UsageError(
            "--image and TEXT: a vision transformer reads the picture alone; leave the text out"
        )
    for attr, flag, unset in _TEXT_ONLY:
        if getattr(args, attr, unset) not in (unset, None):
            raise UsageError(f"--image and {flag}: {flag} is for a text; leave it out")
    if args.model is None:
        raise UsageError(
            "--image needs --model DIR: a local vision transformer checkpoint (the default model "
            "reads text)"
        )
    if not 1 <= args.top_k <= 256:
        raise UsageError(f"--top-k: expected 1 to 256 keys per row, got {args.top_k}")


def _open_picture(path_text: str) -> Any:
    from ..viz.image import open_image

    if not path_text.strip():
        raise UsageError("--image: expected a file name, got an empty one")
    try:
        return open_image(path_text)
    except ImportError:
        raise UsageError(
            "--image needs Pillow, which is not installed: pip install 'attnkit[image]'"
        ) from None
    except ValueError as exc:
        raise UsageError(f"--image: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    _check_options(args)
    layer_sel = parse_selection(args.layers, "--layers")
    head_sel = parse_selection(args.heads, "--heads")
    out_html = check_writable(args.out, "--out")
    out_pic = None if args.no_png else check_writable(args.png, "--png")
    pic_format = picture_format(out_pic) if out_pic is not None else None
    if out_pic is not None and out_pic.resolve() == out_html.resolve():
        raise UsageError("--png: the picture and the page would be the same file; choose two names")
    picture = _open_picture(args.image)

    from ..models import hf, hf_vision
    from ..viz.reduce import Budget

    try:
        ck = hf_vision.ImageCheckpoint(args.model)
    except hf.CheckpointError as exc:
        raise UsageError(f"--model: {exc}") from None
    layers = sorted(resolve(layer_sel, ck.num_layers, "--layers", "layer"))
    heads = resolve(head_sel, ck.num_heads, "--heads", "head")
    try:
        ck.load()
        run = ck.attend(picture, layers=layers, heads=heads, budget=Budget(top_k=args.top_k))
    except hf.CheckpointError as exc:
        raise UsageError(f"--model: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--image: {exc}") from None
    return _write(args, ck, run, picture, layers, heads, out_html, out_pic, pic_format)


def _write(
    args: argparse.Namespace,
    ck: Any,
    run: Any,
    picture: Any,
    layers: list[int],
    heads: list[int],
    out_html: Path,
    out_pic: Path | None,
    pic_format: str | None,
) -> int:
    """Write the page and the picture of layers × heads, and print the summary."""
    from ..viz import to_html

    s, layout = run.sets[0], run.layout
    size = f"{count(ck.num_layers, 'layer')} × {count(ck.num_heads, 'head')}"
    h, w = layout.picture.shape[:2]
    image_name = Path(args.image).name
    meta = {
        "model": f"{ck.name} ({ck.family.name}, {size})",
        "image": f"{image_name}, {picture.size[0]} × {picture.size[1]} px, seen at {w} × {h}",
        "tokens": f"{len(run.tokens)}: {layout.describe()}",
    }
    try:
        to_html(
            run.sets,
            None,
            out_html,
            title=f"Attention of {ck.name} on {image_name}",
            subtitle=layout.describe(),
            meta=meta,
            notes=[*run.notes, *s.notes],
            scale=args.scale,
            image=layout,
        )
    except OSError as exc:
        raise UsageError(f"--out: cannot write {out_html}: {exc.strerror or exc}") from None
    pic_note = ""
    if out_pic is not None and pic_format is not None:
        try:
            px = save_picture(run.sets, out_pic, pic_format, ck.name, args.scale)
        except OSError as exc:
            raise UsageError(f"--png: cannot write {out_pic}: {exc.strerror or exc}") from None
        grid = f"{count(len(layers), 'layer')} × {count(len(heads), 'head')}"
        pic_note = f"  ({grid}, {px[0]}×{px[1]} px)" if px else f"  ({grid}, SVG)"
    print(
        f"{ck.name}: {ck.family.name}, {size}, {count(len(run.tokens), 'token')}: "
        f"{layout.describe()} on {image_name} (seen at {w} × {h} px)"
    )
    print("most focused head of each layer (lowest mean entropy of a query's attention):")
    for line in focus_lines(s, layers, heads):
        print(line)
    size_kb = out_html.stat().st_size / 1024
    print(
        f"wrote {out_html}  ({size_kb:,.0f} KB; open it in a browser: "
        f"{page_views(run.sets, first=('image',))})"
    )
    if out_pic is not None:
        print(f"wrote {out_pic}{pic_note}")
    if args.open:
        open_page(out_html)
    return 0


def run(args: argparse.Namespace) -> int:
    """``attnkit show --image``; UsageError on bad input (the caller prints it, exit 2)."""
    return _run(args)
