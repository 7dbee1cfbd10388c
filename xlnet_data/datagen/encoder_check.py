"""Which encoder gives a model's ids: ours (datagen/unigram.py) only where it was seen to agree with SentencePiece.

`--encoder=auto` (create's default): when a model is loaded, our encoder is built if it supports the model
and checked against the installed SentencePiece on PROBES, lines chosen where an encoder can go wrong; the
Encoder (datagen/text.py) checks it again on the first lines of the corpus it encodes. On any difference, or
a model it does not support, SentencePiece encodes the run; each is said once in the log. `ours` uses it
unchecked (an error for a model it does not support); `sentencepiece` never uses it.
"""

import functools
import logging

import numpy as np

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import spm_model
from xlnet_data.datagen import tries
from xlnet_data.datagen.config import ENCODERS
from xlnet_data.datagen.unigram import UnigramEncoder, unigram_unsupported

log = logging.getLogger("xlnet_data")

CORPUS_CHECK_LINES = 2000  # the first lines of a corpus that are encoded by both

PROBES = (
    # ties broken by SentencePiece's loop order; repeated characters
    "ulyulyu", "x ulyulyu", "aaaaaaaaaaaaaaaa", "ababababab abab", "lalalalala", "mmmmmm hmm", "oooo", "!!!???...",
    # unknown characters, alone and in runs (merged into one <unk>), among known ones
    "東京 and 한국어 café", "日本語の文です。", "x\u4e00\u4e01y", "ภาษาไทย", "नमस्ते दुनिया", "😀👍🏽 ok", "\U0001F600\U0001F600",
    # Hangul jamo and other sequences NFKC composes (SentencePiece's table matches the longest)
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab", "e\u0301 a\u0308 n\u0303", "\uff76\uff9e \uff8a\uff9f", "\u0b95\u0bca",
    "ﬁ ﬂ ① ㍿ ½ ℃ Ⅻ ｆｕｌｌ", "\u00a8 \u00b4x", "Å Ω K",
    # control characters, spaces and SentencePiece's own space symbol
    "a\x01b\x7fc\x1fd", "\u200bzero\u200dwidth\ufeff", "tab\tsep\u3000ideographic\u00a0nbsp", "  leading and  double  ",
    "\u2581literal\u2581 \u2581", "\x0b\x0c", " ", "",
    # user-defined symbols (XLNet's <eop>, ., (, ), ", -, –, £, €) and the digit-comma rule
    "the end.<eop>", "<eop><eop>x<eop>", "(a) \"b\" - c – £5 €6", "1,000, 1990, and 2, 3,4,5,", "a1, b22, c333,",
    "In 1865, Alice fell.", "x<eo p><e op>", "...---(((", "10,000,000,",
    # long lines: the path's float32 sums grow large
    "the quick brown fox jumps over the lazy dog " * 300, "ulyulyu " * 2000, "東京" * 3000, "a" * 20000,
    "1,2,3, " * 3000,
)


class EncoderChoiceError(UserError, ValueError):
    """--encoder=ours for a model our encoder does not reproduce."""


def _unigram_ids(encoder, texts):
    flat, lengths = encoder.encode_ids(texts)
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(texts) else []


def first_difference(encoder, sp, texts):
    """The first of `texts` that our encoder and SentencePiece encode differently, or None."""
    ours = _unigram_ids(encoder, texts)
    for text, mine, theirs in zip(texts, ours, sp.encode(list(texts), num_threads=1)):
        if mine.tolist() != list(theirs):
            return text
    return None


def _shown(text):
    return repr(text if len(text) <= 60 else text[:60] + "...")


@functools.lru_cache(maxsize=4)
def _built(model_bytes: bytes, choice: str):
    """(our encoder or None, the log level and line to say, or None) for a model's bytes."""
    why = unigram_unsupported(spm_model.read_model_proto(model_bytes))
    if why is None:
        try:
            encoder = UnigramEncoder(model_bytes)
        except tries.TrieTooLarge as err:
            encoder, why = None, str(err)
    if why is not None:
        if choice == "ours":
            raise EncoderChoiceError(f"--encoder=ours: our encoder does not reproduce this SentencePiece model "
                                     f"({why}); use --encoder=auto or --encoder=sentencepiece")
        return None, (logging.INFO, f"SentencePiece encodes the text: our encoder does not reproduce this model "
                                    f"({why})")
    if choice == "ours":
        return encoder, None
    import sentencepiece as spm  # the installed version, as create uses it
    differs = first_difference(encoder, spm.SentencePieceProcessor(model_proto=model_bytes), PROBES)
    if differs is not None:
        return None, (logging.WARNING, f"our encoder differs from the installed SentencePiece on its check line "
                                       f"{_shown(differs)}; SentencePiece encodes this run")
    return encoder, None


_SAID = set()


def say_once(level, message):
    """Logs `message` once in this process."""
    if message not in _SAID:
        _SAID.add(message)
        log.log(level, "%s", message)


def unigram_encoder(sp, choice: str):
    """Our encoder for the SentencePiece processor `sp` where `choice` (ENCODERS) and its check allow it,
    else None (and the reason logged once)."""
    if choice not in ENCODERS:
        raise EncoderChoiceError(f"--encoder={choice} must be one of {', '.join(ENCODERS)}")
    if choice == "sentencepiece":
        return None
    encoder, said = _built(sp.serialized_model_proto(), choice)
    if said is not None:
        say_once(*said)
    return encoder


def corpus_agrees(encoder, sp, texts) -> bool:
    """Whether our encoder gives SentencePiece's ids on the first CORPUS_CHECK_LINES of `texts`; a
    difference is warned about once."""
    differs = first_difference(encoder, sp, texts[:CORPUS_CHECK_LINES])
    if differs is None:
        return True
    say_once(logging.WARNING, f"our encoder differs from the installed SentencePiece on the corpus line "
                              f"{_shown(differs)}; SentencePiece encodes the rest of the run")
    return False
