"""The options of ``attnkit show``: reading the text, layer/head selections, the picture's format.

Everything here is arithmetic on the command line or reading the text: it runs
before any model is built, so bad input exits with status 2 at once. The output
files are checked by :mod:`.outputs`.
"""

from __future__ import annotations

import argparse
import errno
import re
import sys
from pathlib import Path
from typing import IO

__all__ = [
    "EXAMPLE",
    "MAX_TEXT_BYTES",
    "Selection",
    "UsageError",
    "count",
    "flag_name",
    "parse_selection",
    "picture_format",
    "read_text",
    "resolve",
    "shown_path",
]

EXAMPLE = 'attnkit show "The cat sat on the mat because it was tired."'
# The largest text read from a file or stdin: far more than any model's positions.
MAX_TEXT_BYTES = 10 * 1024 * 1024
_PICTURE_FORMATS = {".png": "png", ".svg": "svg"}
_SHOWN = 120  # characters of a path a message shows (the middle is elided past that)
_ITEM = re.compile(r"^(-?\d+)(?:-(-?\d+))?$")

Selection = list[tuple[int, int]]


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


def flag_name(name: str) -> str:
    """The ``attnkit show`` flag of a :func:`attnkit.viz.show` argument: ``max_length``
    -> ``--max-length``."""
    return "--" + name.replace("_", "-")


def parse_selection(spec: str, option: str) -> Selection | None:
    """'all' -> None; '0,2,4-5' -> [(0, 0), (2, 2), (4, 5)]: inclusive ranges, never expanded.

    A lone negative number counts from the end; ranges go up from a number >= 0.
    """
    text = spec.strip().lower()
    if not text:
        raise UsageError(
            f"{option}: expected 'all' or numbers and ranges like 0,2,4-5, got an empty value"
        )
    if text in ("all", "*"):
        return None
    out: Selection = []
    for part in text.split(","):
        m = _ITEM.match(part.strip())
        if not m:
            raise UsageError(
                f"{option}: cannot read {part.strip()!r} in {spec!r}; expected 'all' or numbers "
                "and ranges like 0,2,4-5"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if m.group(2) is not None and (lo < 0 or hi < lo):
            raise UsageError(f"{option}: range {part.strip()!r} must go up from a number >= 0")
        out.append((lo, hi))
    return out


def resolve(sel: Selection | None, n: int, option: str, what: str) -> list[int]:
    """The selection checked against n items (arithmetic only), then listed in given order."""
    if sel is None:
        return list(range(n))
    bad = [
        str(lo) if lo == hi else f"{lo}-{hi}"
        for lo, hi in sel
        if not (-n <= lo < n and -n <= hi < n)
    ]
    if bad:
        raise UsageError(
            f"{option}: {', '.join(bad)} out of range; the model has {count(n, what)} "
            f"(0 to {n - 1})"
        )
    out: list[int] = []
    seen: set[int] = set()
    for lo, hi in sel:
        for i in range(lo, hi + 1):  # at most n steps: both ends are in range
            if i % n not in seen:
                seen.add(i % n)
                out.append(i % n)
    return out


def count(n: int, word: str) -> str:
    """'1 layer', '2 layers'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _read_limited(stream: IO[bytes], what: str) -> str:
    """At most MAX_TEXT_BYTES of UTF-8 text from a binary stream (a file, stdin, /dev/zero),
    without the byte-order mark some editors write first (it would become a token)."""
    data = stream.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise UsageError(
            f"{what} is larger than {MAX_TEXT_BYTES // (1024 * 1024)} MB; "
            "give a shorter text (no model reads that many tokens)"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{what} is not UTF-8 text") from None


def utf8_argument(value: str, what: str) -> str:
    """``value``, a text given on the command line, or a UsageError when its bytes were
    not UTF-8 (Python keeps such bytes as lone surrogates, which no tokenizer takes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start : exc.end].encode("utf-8", "surrogateescape")
        raise UsageError(
            f"{what} is not UTF-8 text (bytes {bad!r} at character {exc.start}); give it in "
            "UTF-8, or in a file with --text-file"
        ) from None
    return value


def read_text(args: argparse.Namespace) -> str:
    """The text to show: TEXT, '-' (stdin) or --text-file, at most MAX_TEXT_BYTES."""
    if args.text_file is not None and args.text is not None:
        raise UsageError("TEXT and --text-file: give one of them, not both")
    if args.text_file is not None:
        if not args.text_file.strip() or "\0" in args.text_file:
            raise UsageError(
                f"--text-file: expected a file name, got {shown_path(repr(args.text_file))}"
            )
        path = Path(args.text_file).expanduser()
        try:
            with path.open("rb") as f:
                text = _read_limited(f, f"--text-file: {shown_path(path)}")
        except OSError as exc:
            why = "the name is too long for the file system" if exc.errno == errno.ENAMETOOLONG \
                else exc.strerror or str(exc)  # fmt: skip
            raise UsageError(f"--text-file: cannot read {shown_path(path)}: {why}") from None
        if not text.strip():
            raise UsageError(f"--text-file: {shown_path(path)} holds no text"
                             + (" (only whitespace)" if text else ""))  # fmt: skip
        return text
    if args.text is None:
        raise UsageError(
            f"TEXT is missing; give the text, '-' for stdin, or --text-file PATH; try: {EXAMPLE}"
        )
    if args.text == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is not None:
            return _read_limited(buffer, "TEXT: stdin")
        text = sys.stdin.read(MAX_TEXT_BYTES + 1)  # a text stream (tests, notebooks)
        if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise UsageError(
                f"TEXT: stdin is larger than {MAX_TEXT_BYTES // (1024 * 1024)} MB; "
                "give a shorter text (no model reads that many tokens)"
            )
        return text
    return utf8_argument(str(args.text), "TEXT")


def picture_format(path: Path) -> str:
    """'png' or 'svg' from the picture's file name."""
    fmt = _PICTURE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(
            f"--png: expected a file name ending in .png (or .svg for a vector picture), "
            f"got {str(path)!r}"
        )
    return fmt


def shown_path(path: str | Path) -> str:
    """The path for a message: elided in the middle past 120 characters."""
    text = str(path)
    if len(text) <= _SHOWN:
        return text
    keep = _SHOWN // 2
    return f"{text[:keep]}…({len(text) - 2 * keep:,} more characters)…{text[-keep // 2 :]}"
