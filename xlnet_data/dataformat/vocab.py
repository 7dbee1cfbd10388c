"""The SentencePiece vocabulary XLNet expects: special ids and a checked loader; and the characters the
original's accent removal drops, which create's text (datagen/text.py) and the Hugging Face tokenizer
(hf_tokenizer.py) both follow."""

import functools
import os
import sys
import unicodedata

import numpy as np
import sentencepiece as spm

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import spm_model

# Every id constant in the data and the model depends on these positions.
SPECIAL_SYMBOLS = {
    "<unk>": 0,
    "<s>": 1,
    "</s>": 2,
    "<cls>": 3,
    "<sep>": 4,
    "<pad>": 5,
    "<mask>": 6,
    "<eod>": 7,
    "<eop>": 8,
}
UNK_ID = SPECIAL_SYMBOLS["<unk>"]
CLS_ID = SPECIAL_SYMBOLS["<cls>"]
SEP_ID = SPECIAL_SYMBOLS["<sep>"]
EOD_ID = SPECIAL_SYMBOLS["<eod>"]
EOP_ID = SPECIAL_SYMBOLS["<eop>"]

SPIECE_UNDERLINE = "\u2581"
# A piece of one of these characters starts a word (the original's `_is_start_piece`). The set is the
# original's string.punctuation with its slip kept on purpose: `"` twice and no apostrophe, so a piece
# "'" does not start a word, exactly as in the original's records.
_PUNCTUATION_PIECES = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')


class VocabError(UserError, ValueError):
    """The SentencePiece model is missing, unreadable or not XLNet-compatible."""


def special_id_mismatches(sp):
    """The special symbols whose id in `sp` differs from XLNet's, as 'symbol=id' strings."""
    wrong = []
    for piece, want in SPECIAL_SYMBOLS.items():
        got = sp.piece_to_id(piece)
        if got != want or sp.id_to_piece(want) != piece:
            wrong.append(f"{piece}={got} (want {want})")
    return wrong


def load_sentencepiece(path):
    """Loads a SentencePiece model and checks that its special ids are XLNet's."""
    if not path:
        raise VocabError("--sp_path is required: the SentencePiece model (.model file)")
    from xlnet_data.common import fileio
    if not fileio.exists(path) or (not fileio.is_remote(path) and not os.path.isfile(path)):
        raise VocabError(f"SentencePiece model not found: {path}")
    with fileio.open_read(path) as f:
        data = f.read()
    try:  # our own checks first: an older sentencepiece walks a damaged charsmap out of its array
        spm_model.read_model_proto(data)
    except spm_model.ModelFormatError as err:
        raise VocabError(f"cannot load SentencePiece model {path}: {err}") from None
    sp = spm.SentencePieceProcessor()
    try:
        sp.load_from_serialized_proto(data)
    except (OSError, RuntimeError) as err:
        raise VocabError(f"cannot load SentencePiece model {path}: {str(err).splitlines()[0]}") from None
    wrong = special_id_mismatches(sp)
    if wrong:
        raise VocabError(
            f"SentencePiece model {path} does not have XLNet's special ids: {', '.join(wrong)}; "
            "train one with `python -m xlnet_data.spm_train`")
    return sp


def is_start_piece(piece):
    """Whether a piece begins a word, as the original decides it for span masking."""
    return piece.startswith((SPIECE_UNDERLINE, "<")) or piece in _PUNCTUATION_PIECES


def start_piece_table(sp):
    """A bool array over ids: True where the id's piece begins a word."""
    return np.array([is_start_piece(sp.id_to_piece(i)) for i in range(sp.get_piece_size())], dtype=bool)


@functools.cache
def is_combining():
    """A table over every code point: True where the original drops it after NFKD (a combining character)."""
    return np.fromiter((unicodedata.combining(chr(c)) != 0 for c in range(sys.maxunicode + 1)), dtype=bool,
                       count=sys.maxunicode + 1)


def combining_code_points():
    """The code points the original drops after NFKD, ascending (the Hugging Face export writes them as a regex)."""
    return np.flatnonzero(is_combining())
