"""``attnkit show --image PICTURE --model DIR``: a vision transformer's attention on a picture.

The picture is the source: its tokens are the model's non-patch tokens
(``[CLS]``, ``[DIST]``, registers) and its patches, laid out on the picture the
model saw. The page opens on the image view (each head's attention from
``[CLS]`` or a clicked patch as a heatmap, and the rollout); the head, matrix,
model, statistics and neuron views work as for text.

Every check runs before a model is built, and each failure is one line with
exit status 2: Pillow missing (``pip install "attnkit[image]"``), a file that is
not a picture, a text given as well (a vision transformer reads the picture
alone), a text-only option (``--pair``, ``--words``, ``--no-special``, the
neuron window, ...), an output that cannot be written, no ``--model``, a model
that is not a supported vision transformer (the message lists the families), or
a checkpoint without ``preprocessor_config.json``. ``--save-weights`` writes the
picture's weights as for a text.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import show_explain
from .outputs import Output, ShowOutputs, check_input, show_outputs, shown_path, write_all
from .show_args import UsageError, count, parse_selection, resolve
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
    ("words", "--words", False),
    ("no_special", "--no-special", False),
    ("neuron_window", "--neuron-window", None),
    ("neuron_token", "--neuron-token", None),
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

    path = check_input(path_text, "--image", directory=False)
    try:
        return open_image(path)
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
    outputs = show_outputs(args)
    model = check_input(args.model, "--model", directory=True)
    picture = _open_picture(args.image)

    from ..models import hf
    from ..viz import image_show
    from ..viz.options import ImageRunOptions
    from ..viz.sources import open_image_source

    try:
        source = open_image_source(str(model))
    except hf.CheckpointError as exc:
        raise UsageError(f"--model: {exc}") from None
    ck = source.checkpoint
    layers = sorted(resolve(layer_sel, source.num_layers, "--layers", "layer"))
    heads = resolve(head_sel, source.num_heads, "--heads", "head")
    show_explain.check_image(args, ck)
    options = ImageRunOptions(layers, heads, top_k=args.top_k, progress=not args.quiet)
    try:
        source.load(head=args.explain is not None)  # one model for the page and --explain
        run = image_show.attend_image(source, picture, options)
    except hf.CheckpointError as exc:
        raise UsageError(f"--model: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--image: {exc}") from None
    explained = show_explain.run_image(args, ck, picture)
    return _write(args, ck, run, picture, layers, heads, outputs, explained)


def _write(
    args: argparse.Namespace,
    ck: Any,
    run: Any,
    picture: Any,
    layers: list[int],
    heads: list[int],
    outputs: ShowOutputs,
    explained: Any = None,
) -> int:
    """Write the page, the picture of layers × heads and the weights (all or none), then print
    the summary."""
    from ..viz import to_html
    from ..viz.export import save_weights

    s, layout = run.sets[0], run.layout
    size = f"{count(ck.num_layers, 'layer')} × {count(ck.num_heads, 'head')}"
    h, w = layout.picture.shape[:2]
    image_name = Path(args.image).name
    meta = {
        "model": f"{ck.name} ({ck.family.name}, {size})",
        "image": f"{image_name}, {picture.size[0]} × {picture.size[1]} px, seen at {w} × {h}",
        "tokens": f"{len(run.tokens)}: {layout.describe()}",
    }

    def page(path: Path) -> None:
        to_html(
            run.sets,
            None,
            path,
            title=f"Attention of {ck.name} on {image_name}",
            subtitle=layout.describe(),
            meta=meta,
            notes=[*run.notes, *s.notes],
            scale=args.scale,
            image=layout,
            explain=explained,
        )

    jobs: list[tuple[Output, Callable[[Path], Any]]] = [(outputs.page, page)]
    if outputs.picture is not None and outputs.picture_format is not None:
        fmt = outputs.picture_format
        jobs.append(
            (outputs.picture, lambda path: save_picture(run.sets, path, fmt, ck.name, args.scale))
        )
    if outputs.weights is not None:
        jobs.append(
            (
                outputs.weights,
                lambda path: save_weights(run.sets, path, meta=meta, explain=explained),
            )
        )
    written = write_all(jobs)

    print(
        f"{ck.name}: {ck.family.name}, {size}, {count(len(run.tokens), 'token')}: "
        f"{layout.describe()} on {image_name} (seen at {w} × {h} px)"
    )
    print("most focused head of each layer (lowest mean entropy of a query's attention):")
    for line in focus_lines(s, layers, heads):
        print(line)
    out_html = outputs.page.path
    size_kb = out_html.stat().st_size / 1024
    print(
        f"wrote {shown_path(out_html)}  ({size_kb:,.0f} KB; open it in a browser: "
        f"{page_views(run.sets, first=('image', 'explain') if explained is not None else ('image',))})"
    )
    if outputs.picture is not None:
        px = written[1]
        grid = f"{count(len(layers), 'layer')} × {count(len(heads), 'head')}"
        pic_note = f"  ({grid}, {px[0]}×{px[1]} px)" if px else f"  ({grid}, SVG)"
        print(f"wrote {shown_path(outputs.picture.path)}{pic_note}")
    if explained is not None:
        print(show_explain.summary(explained))
    if outputs.weights is not None:
        holds = "every weight" if not s.long else "block overviews and exact top-k"
        holds += ", and the attribution (explain.*)" if explained is not None else ""
        kb = outputs.weights.path.stat().st_size / 1024
        print(f"wrote {shown_path(outputs.weights.path)}  ({kb:,.0f} KB; {holds})")
    if args.open:
        open_page(out_html)
    return 0


def run(args: argparse.Namespace) -> int:
    """``attnkit show --image``; UsageError on bad input (the caller prints it, exit 2)."""
    return _run(args)
