"""Readable tokens: the text each token stands for, from the tokenizer's own decoder.

``Ġquick`` (byte-level BPE), ``▁quick`` (SentencePiece), ``<0x0A>`` (byte
fallback) and ``##ing`` (WordPiece) are the tokenizer's spelling, not the text.
:func:`readable_tokens` decodes each token in its context, as the tokenizer
would decode the whole text, and takes the part that token adds: no string
rules per tokenizer family. A leading space is then shown as a faint ``·`` on
the page (``display`` keeps the real space; :func:`mark` makes it visible) and
a newline as ``↵``; the raw token stays available (on hover).

A token that completes a character begun by earlier tokens (a multi-byte UTF-8
character split by byte-level BPE or byte fallback) gets the whole character;
the earlier pieces are shown as their bytes, e.g. ``\\xe2``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["NEWLINE_MARK", "SPACE_MARK", "mark", "readable_tokens"]

SPACE_MARK = "·"
NEWLINE_MARK = "↵"
_WINDOW = 4  # tokens of context decoded before each token


def _decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """decode(ids) -> text for a transformers tokenizer or a ``tokenizers.Tokenizer``."""
    decode = tokenizer.decode
    try:
        decode([], skip_special_tokens=False)
        return lambda ids: str(decode(ids, skip_special_tokens=False))
    except TypeError:
        return lambda ids: str(decode(ids))


def readable_tokens(
    tokenizer: Any,
    ids: Sequence[int],
    raw: Sequence[str] | None = None,
    special: Sequence[bool] | None = None,
) -> list[str]:
    """The text each token adds when the tokenizer decodes ``ids``.

    Args:
        tokenizer: a transformers tokenizer or a ``tokenizers.Tokenizer``.
        ids: token ids of one input.
        raw: the raw tokens (shown for special tokens and for pieces of a character).
        special: which tokens are special (``[CLS]``, ``<s>``); None = ask the
            tokenizer (``all_special_ids``), when it can tell.

    Returns:
        one string per token, with real spaces and newlines (see :func:`mark`).
    """
    decode = _decoder(tokenizer)
    ids = [int(i) for i in ids]
    raw = list(raw) if raw is not None else [decode([i]) for i in ids]
    if special is None:
        known = set(getattr(tokenizer, "all_special_ids", None) or ())
        special = [i in known for i in ids]
    cache: dict[tuple[int, ...], str] = {}

    def dec(part: list[int]) -> str:
        key = tuple(part)
        if key not in cache:
            if len(cache) > 4 * _WINDOW:
                cache.clear()
            cache[key] = decode(part)
        return cache[key]

    out: list[str] = []
    partial = [False] * len(ids)
    for i in range(len(ids)):
        if special[i]:
            out.append(raw[i])
            continue
        start = i  # decode from before the run of character pieces that ends here
        while start > 0 and partial[start - 1] and i - start < 8:
            start -= 1
        lo = max(0, start - _WINDOW)
        stem, after = dec(ids[lo:start]), dec(ids[lo : i + 1])
        piece = after[len(stem) :] if after.startswith(stem) else decode([ids[i]])
        if "\ufffd" in piece:
            partial[i] = True
            piece = _bytes_of(raw[i])  # a piece of a character the next tokens complete
        out.append(piece if piece else raw[i])
    return out


def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (``Ġ`` for a space), reversed."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_table()


def _bytes_of(token: str) -> str:
    """A piece of a character, as its bytes: ``<0xE2>`` (byte fallback) or ``â`` (byte-level
    BPE) -> ``\\xe2``."""
    if token.startswith("<0x") and token.endswith(">"):
        return "\\x" + token[3:-1].lower()
    if token and all(c in _BYTE_LEVEL for c in token):
        return "".join(f"\\x{_BYTE_LEVEL[c]:02x}" for c in token)
    return token.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")


def mark(piece: str) -> str:
    """A piece as shown: a leading space as ``·``, newlines as ``↵``, tabs as ``→``."""
    if piece.startswith(" "):
        piece = SPACE_MARK + piece[1:]
    return piece.replace("\r\n", NEWLINE_MARK).replace("\n", NEWLINE_MARK).replace("\t", "→")
