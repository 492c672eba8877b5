"""Tokens as written: one display function for WordPiece, byte-level BPE and SentencePiece.

Every tokenizer is built here from a small vocabulary or trained on a few words
(nothing downloaded), except the default checkpoint's WordPiece tokenizer, which
ships as a package.
"""

from __future__ import annotations

import pytest

from attnkit.viz.positions import PositionMap, WordsError, map_labels, position_map
from attnkit.viz.tokens import TokenText, display_tokens, encoding_tokens, mark

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

WORDS = "the cat didn't sit on the mat because it was tired unbelievably".split()


def _shown(tt: TokenText) -> list[str]:
    return [mark(t) for t in tt.shown]


@pytest.fixture(scope="module")
def wordpiece():  # type: ignore[no-untyped-def]
    from attnkit.models import bert

    return bert.load(None).tokenizer  # the default checkpoint's tokenizer


@pytest.fixture(scope="module")
def byte_level():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([" ".join(WORDS)] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _sentencepiece(pre_tokenizer: bool):  # type: ignore[no-untyped-def]
    """A Unigram tokenizer with SentencePiece's ``▁``: T5-style (a Metaspace pre-tokenizer,
    words) or Llama-style (a normalizer only: no words)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["▁the", "▁cat", "▁didn", "'", "t", "▁sit", "▁", *"thecadinsu"]
    vocab = [("<unk>", 0.0), ("</s>", 0.0), *((p, -1.0) for p in pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0))
    if pre_tokenizer:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    else:
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def _fast(tokenizer, text: str, pair: str | None = None) -> TokenText:  # type: ignore[no-untyped-def]
    enc = tokenizer(text, pair, return_offsets_mapping=True, return_special_tokens_mask=True)
    return encoding_tokens(tokenizer, enc, [text] if pair is None else [text, pair])


def test_wordpiece_shows_didnt_without_a_space_inside_the_word(wordpiece) -> None:  # type: ignore[no-untyped-def]
    text = "The animal didn't cross the street, unbelievably."
    tt = encoding_tokens(wordpiece, wordpiece.encode(text), [text])
    assert _shown(tt) == ["[CLS]", "The", "·animal", "·didn", "'", "t", "·cross", "·the",
                          "·street", ",", "·un", "bel", "ie", "va", "bly", ".", "[SEP]"]  # fmt: skip
    assert tt.raw[11] == "##bel" and tt.special == [True, *[False] * 15, True]
    # the tokenizer's words: ## pieces join the word before them, punctuation is its own
    assert tt.word_source == "tokenizer"
    assert tt.words is not None and tt.words[10:15] == [tt.words[10]] * 5
    assert len(set(tt.words[3:6])) == 3  # didn ' t: three words of the pre-tokenizer


def test_wordpiece_pair_starts_each_text_without_a_space(wordpiece) -> None:  # type: ignore[no-untyped-def]
    enc = wordpiece.encode("the cat", "it sat")
    tt = encoding_tokens(wordpiece, enc, ["the cat", "it sat"])
    assert _shown(tt) == ["[CLS]", "the", "·cat", "[SEP]", "it", "·sat", "[SEP]"]


def test_byte_level_bpe_spaces_newlines_and_split_characters(byte_level) -> None:  # type: ignore[no-untyped-def]
    text = "the cat  sat\n\nit was é"
    tt = _fast(byte_level, text)
    shown = _shown(tt)
    # as written, nothing lost or added (but the bytes of the split character)
    assert "".join(t for t in tt.shown if not t.startswith("\\x")) == text
    assert shown[0] == "the" and "Ġ" not in "".join(shown)
    assert "↵" in shown and shown[shown.index("↵") + 2] == "it"  # the newlines, then "it"
    assert shown[-1] == "é" and shown[-2] == "\\xc3"  # a character split in two bytes
    assert tt.word_source == "tokenizer"


def test_sentencepiece_markers_become_spaces() -> None:
    tok = _sentencepiece(pre_tokenizer=True)
    text = "the cat didn't sit"
    tt = _fast(tok, text)
    assert tt.raw == ["▁the", "▁cat", "▁didn", "'", "t", "▁sit"]
    assert tt.shown == ["the", " cat", " didn", "'", "t", " sit"]
    assert tt.word_source == "tokenizer"
    words = position_map(tt, words=True, drop_special=False)
    assert words is not None and words.size == 4  # the, cat, didn't, sit


def test_a_tokenizer_without_words_groups_by_spaces() -> None:
    tok = _sentencepiece(pre_tokenizer=False)  # Llama-style: every token in one "word"
    text = "the cat didn't sit"
    tt = _fast(tok, text)
    assert tt.raw == ["▁the", "▁cat", "▁didn", "'", "t", "▁sit"]
    assert tt.shown == ["the", " cat", " didn", "'", "t", " sit"]
    assert tt.word_source == "spaces"
    words = position_map(tt, words=True, drop_special=False)
    assert words is not None and words.size == 4


def test_without_offsets_tokens_are_decoded_and_words_are_unknown(byte_level) -> None:  # type: ignore[no-untyped-def]
    ids = byte_level("the cat sat")["input_ids"]
    tt = display_tokens(byte_level, ids)  # no offsets: each token's decoded piece
    assert "".join(tt.shown) == "the cat sat" and tt.words is None
    with pytest.raises(WordsError, match="neither word ids nor character offsets"):
        position_map(tt, words=True, drop_special=False)
    assert position_map(tt, words=False, drop_special=True) is not None  # special: fine


def test_a_word_holding_a_split_character_reads_as_written(byte_level) -> None:  # type: ignore[no-untyped-def]
    # the word view joined each piece as shown: "café" read "caf\xc3é" and "👍" its bytes
    text = "the café 👍 cat"
    tt = _fast(byte_level, text)
    assert tt.partial is not None and any(tt.partial)
    assert all(tt.shown[i].lstrip().startswith("\\x") for i in range(len(tt)) if tt.partial[i])
    words = position_map(tt, words=True, drop_special=False)
    labels, raw = map_labels(tt.shown, tt.raw, words, tt.partial)
    assert labels == ["the", " café", " 👍", " cat"]
    assert "".join(labels) == text
    assert len(raw) == 4  # the raw spellings keep every piece
    # a character left unfinished inside a group keeps its bytes (nothing is lost)
    alone = PositionMap.from_groups([0, 0])
    assert map_labels([" a", "\\xc3"], ["Ġa", "Ã"], alone, [False, True])[0] == [" a\\xc3"]


def test_decoded_tokens_mark_their_split_characters_too(byte_level) -> None:  # type: ignore[no-untyped-def]
    ids = byte_level("it was é")["input_ids"]
    tt = display_tokens(byte_level, ids)  # no offsets: decoded
    assert tt.partial is not None and tt.partial[-2] and not tt.partial[-1]
    assert tt.shown[-1] == "é"


def test_the_decoder_input_keeps_the_split_characters_shifted_right(byte_level) -> None:  # type: ignore[no-untyped-def]
    # a seq2seq decoder's tokens (shifted right by one) dropped the marks: its word view
    # read "caf\xc3é" where the encoder's read "café"
    from attnkit.viz.sources.text_run import _shifted_right

    tt = _fast(byte_level, "the café cat")
    dec = _shifted_right(tt, "<s>")
    assert tt.partial is not None and dec.partial == [False, *tt.partial[:-1]]
    words = position_map(dec, words=True, drop_special=False)
    assert map_labels(dec.shown, dec.raw, words, dec.partial)[0][:3] == ["<s>", "the", " café"]
