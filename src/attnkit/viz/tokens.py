"""Tokens as written: the text each token covers, with a space only where the text has one.

:func:`display_tokens` is the one function that turns a tokenizer's output into
what the page, the terminal and the picture show, for the CLI and the Python
path alike. Where the tokenizer gives character offsets (every fast tokenizer:
``tokenizers.Encoding.offsets``, ``return_offsets_mapping=True``), a token shows
the characters it covers in the text, and a leading space only when the text has
whitespace before it: "didn't" under WordPiece is ``didn``, ``'``, ``t`` with no
space inside the word, ``##`` continuations attach, and byte-level ``Ġ`` and
SentencePiece ``▁`` markers become the spaces they stand for. Without offsets
(slow tokenizers, generated tokens) :func:`readable_tokens` decodes each token
in its context, as the tokenizer would decode the whole text, and takes the part
that token adds: no string rules per tokenizer family.

A leading space is shown as a faint ``·`` (``shown`` keeps the real space;
:func:`mark` makes it visible) and a newline as ``↵``; the raw token stays
available (on hover). A token that completes a character begun by earlier tokens
(a multi-byte UTF-8 character split by byte-level BPE or byte fallback) gets the
whole character; the earlier pieces are shown as their bytes, e.g. ``\\xe2``.

:class:`TokenText` also carries the word each token belongs to, for the word
view (:mod:`attnkit.viz.positions`): the tokenizer's own words (its
pre-tokenizer's split) where it has them, else the runs of tokens between
whitespace in the text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NEWLINE_MARK",
    "SPACE_MARK",
    "TokenText",
    "display_tokens",
    "encoding_tokens",
    "mark",
    "readable_tokens",
]

SPACE_MARK = "·"
NEWLINE_MARK = "↵"
_WINDOW = 4  # tokens of context decoded before each token
_MARKERS = "▁Ġ "  # SentencePiece's and byte-level BPE's space markers

Offsets = Sequence[tuple[int, int] | None]


@dataclass
class TokenText:
    """The tokens of one input as the page shows them.

    Attributes:
        shown: the text of each token as written, with a real leading space (or
            newline) where the text has whitespace before it.
        raw: the tokenizer's own spelling (``##ing``, ``Ġcat``, ``[CLS]``).
        special: which tokens are the tokenizer's special tokens.
        words: the word of each token, one int per token (special tokens are a
            word of their own); None when the tokenizer tells nothing of words.
        word_source: ``"tokenizer"`` (its pre-tokenizer's words), ``"spaces"``
            (runs of tokens between whitespace in the text) or ``""`` (none).
        partial: which tokens are pieces of a character that a later token completes
            (shown as their bytes, ``\\xe2``); None when none is.
    """

    shown: list[str]
    raw: list[str]
    special: list[bool]
    words: list[int] | None = None
    word_source: str = ""
    partial: list[bool] | None = None

    def __len__(self) -> int:
        return len(self.shown)


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
    """The text each token adds when the tokenizer decodes ``ids`` (no offsets needed).

    Args:
        tokenizer: a transformers tokenizer or a ``tokenizers.Tokenizer``.
        ids: token ids of one input.
        raw: the raw tokens (shown for special tokens and for pieces of a character).
        special: which tokens are special (``[CLS]``, ``<s>``); None = ask the
            tokenizer (``all_special_ids``), when it can tell.

    Returns:
        one string per token, with real spaces and newlines (see :func:`mark`).
    """
    return _readable(tokenizer, ids, raw, special)[0]


def _readable(
    tokenizer: Any,
    ids: Sequence[int],
    raw: Sequence[str] | None,
    special: Sequence[bool] | None,
) -> tuple[list[str], list[bool]]:
    """:func:`readable_tokens`, and which tokens are pieces of a character that later
    tokens complete (shown as their bytes)."""
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
    return out, partial


def _gap_prefix(gap: str) -> str:
    """What the text between two tokens shows as: a newline, a space, or nothing."""
    if "\n" in gap or "\r" in gap:
        return "\n"
    return " " if any(c.isspace() for c in gap) else ""


def _from_offsets(
    texts: Sequence[str],
    offsets: Offsets,
    sequence: Sequence[int | None],
    special: Sequence[bool],
    raw: Sequence[str],
    fallback: Callable[[], tuple[list[str], list[bool]]],
) -> tuple[list[str], list[bool], list[bool]]:
    """Each token's text as written, from its offsets, whether it starts a word
    (whitespace before it, or it is whitespace itself, or it follows whitespace), and
    whether it is a piece of a character that a later token completes.

    A token whose offsets say nothing (an empty span) takes the decoded piece from
    ``fallback``; a token that shares its span with the next one (a piece of a
    multi-byte character) shows its bytes, and the last piece the whole character.
    """
    n = len(raw)
    shown: list[str] = [""] * n
    starts = [False] * n
    partial = [False] * n
    decoded: tuple[list[str], list[bool]] | None = None
    prev_end: dict[int, int] = {}
    after_space = False
    for i in range(n):
        span, seq = offsets[i], sequence[i]
        if special[i]:
            shown[i], after_space = raw[i], False
            continue
        if span is None or seq is None or not 0 <= seq < len(texts) or span[1] <= span[0]:
            decoded = decoded if decoded is not None else fallback()
            shown[i], partial[i] = decoded[0][i], decoded[1][i]
            blank = not shown[i].strip()
            starts[i] = after_space or blank or shown[i][:1].isspace()
            after_space = blank
            continue
        text = texts[seq]
        start, end = span
        before = prev_end.get(seq, 0)
        piece = text[start:end]
        if piece.strip() and not raw[i].strip(_MARKERS):  # a space marker the tokenizer
            shown[i], starts[i], after_space = " ", True, True  # put in (a prepended "▁")
            continue
        if piece.strip():  # offsets that take in the spaces around the token's text
            start += len(piece) - len(piece.lstrip())
            end -= len(piece) - len(piece.rstrip())
            piece = text[start:end]
        prefix = _gap_prefix(text[before:start]) if start >= before and piece.strip() else ""
        blank = not piece.strip()
        starts[i] = bool(prefix) or blank or after_space
        after_space = blank
        nxt = offsets[i + 1] if i + 1 < n else None
        if nxt is not None and sequence[i + 1] == seq and tuple(nxt) == tuple(span):
            shown[i] = prefix + _bytes_of(raw[i])  # a piece of a character the next completes
            partial[i] = True
            prev_end[seq] = start
            continue
        shown[i] = prefix + piece
        prev_end[seq] = max(before, end)
    return shown, starts, partial


def _words(
    word_ids: Sequence[int | None] | None,
    sequence: Sequence[int | None],
    special: Sequence[bool],
    starts: Sequence[bool] | None,
) -> tuple[list[int] | None, str]:
    """One word number per token (runs of equal numbers): the tokenizer's words, else the
    runs of tokens between whitespace; special tokens are words of their own."""
    n = len(special)
    content = [i for i in range(n) if not special[i]]
    keys: list[Any] = []
    source = ""
    if word_ids is not None and any(word_ids[i] is not None for i in content):
        per_text: dict[Any, set[Any]] = {}
        for i in content:
            per_text.setdefault(sequence[i], set()).add(word_ids[i])
        one_word = all(len(ws) == 1 for ws in per_text.values())
        # One word over a text with spaces: a tokenizer without a pre-tokenizer (no words).
        if not (one_word and starts is not None and any(starts[i] for i in content[1:])):
            source = "tokenizer"
            keys = [
                ("s", i) if special[i] or word_ids[i] is None else ("w", sequence[i], word_ids[i])
                for i in range(n)
            ]
    if not source and starts is not None:
        source = "spaces"
        word = 0
        for i in range(n):
            if special[i]:
                keys.append(("s", i))
                continue
            if starts[i] or i == 0 or special[i - 1] or sequence[i] != sequence[i - 1]:
                word += 1
            keys.append(("w", word))
    if not source:
        return None, ""
    out: list[int] = []
    for i, key in enumerate(keys):
        out.append(0 if i == 0 else out[-1] + (key != keys[i - 1]))
    return out, source


def display_tokens(
    tokenizer: Any,
    ids: Sequence[int],
    *,
    texts: Sequence[str] = (),
    offsets: Offsets | None = None,
    sequence_ids: Sequence[int | None] | None = None,
    special: Sequence[bool] | None = None,
    word_ids: Sequence[int | None] | None = None,
    raw: Sequence[str] | None = None,
) -> TokenText:
    """The tokens of one input as written: the one display function of the viewer.

    Args:
        tokenizer: a transformers tokenizer or a ``tokenizers.Tokenizer`` (decodes the
            tokens that offsets do not cover).
        ids: (N,) token ids.
        texts: the text (and a pair's second text) the offsets point into.
        offsets: (N,) (start, end) character spans into ``texts[sequence_ids[i]]``;
            None (or a None entry) = unknown: decoded instead.
        sequence_ids: (N,) which text each token comes from (0 or 1; None for special
            tokens); None = every token from ``texts[0]``.
        special: (N,) special tokens (``[CLS]``); None = the tokenizer's special ids.
        word_ids: (N,) the tokenizer's word of each token (its pre-tokenizer's split).
        raw: (N,) the tokenizer's spelling of each token; None = asked of the tokenizer.
    """
    ids = [int(i) for i in ids]
    n = len(ids)
    if raw is None:
        convert = getattr(tokenizer, "convert_ids_to_tokens", None) or tokenizer.id_to_token
        raw = [str(convert(i)) for i in ids]
    raw = [str(t) for t in raw]
    if special is None:
        known = set(getattr(tokenizer, "all_special_ids", None) or ())
        special = [i in known for i in ids]
    special = [bool(s) for s in special]
    given = list(sequence_ids) if sequence_ids is not None else [0] * n
    seq: list[int | None] = [None if special[i] else given[i] for i in range(n)]

    def fallback() -> tuple[list[str], list[bool]]:
        return _readable(tokenizer, ids, raw, special)

    starts: list[bool] | None = None
    if offsets is not None and texts and len(offsets) == n:
        spans = [(int(o[0]), int(o[1])) if o is not None else None for o in offsets]
        shown, starts, partial = _from_offsets(texts, spans, seq, special, raw, fallback)
    else:
        shown, partial = fallback()
    if word_ids is not None and len(word_ids) != n:
        word_ids = None
    words, source = _words(word_ids, seq, special, starts)
    return TokenText(
        shown=shown, raw=raw, special=special, words=words, word_source=source,
        partial=partial if any(partial) else None,
    )  # fmt: skip


def encoding_tokens(tokenizer: Any, encoding: Any, texts: Sequence[str]) -> TokenText:
    """:func:`display_tokens` of a tokenizer's encoding of ``texts`` (a text, or a pair).

    Reads a ``tokenizers.Encoding`` (``.ids``, ``.offsets``, ``.word_ids``...) or a
    transformers ``BatchEncoding`` of one input made with ``return_offsets_mapping=True``
    and ``return_special_tokens_mask=True`` (a slow tokenizer gives no offsets: its tokens
    are decoded).
    """
    if hasattr(encoding, "offsets"):  # tokenizers.Encoding
        return display_tokens(
            tokenizer, encoding.ids, texts=texts, offsets=encoding.offsets,
            sequence_ids=encoding.sequence_ids, special=encoding.special_tokens_mask,
            word_ids=encoding.word_ids, raw=encoding.tokens,
        )  # fmt: skip
    ids = list(encoding["input_ids"])
    offsets = encoding.get("offset_mapping")
    special = encoding.get("special_tokens_mask")
    fast = getattr(encoding, "is_fast", False)
    return display_tokens(
        tokenizer, ids, texts=texts, offsets=offsets,
        sequence_ids=encoding.sequence_ids() if fast else None, special=special,
        word_ids=encoding.word_ids() if fast else None,
    )  # fmt: skip


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
