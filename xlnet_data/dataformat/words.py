"""Word starts from a word segmenter (create --word_boundaries): which tokens can start a masked span in text
that has no spaces between its words (Chinese, Japanese, Thai).

The original lets a span start at a piece that begins with "▁", a special token or an ASCII punctuation mark
(vocab.is_start_piece), so in those scripts only a line's first piece and punctuation can. Here a piece can also
start a span where a segmenter for the script finds a word beginning at its first character. The segmenter reads
the text as SentencePiece normalised it, the pieces joined ("▁" a space; a special or unknown piece one space), so
a piece's offset in it is the sum of the lengths before it and the starts are a function of the ids alone. A piece
that runs across a word boundary belongs to its first character's word. Pieces of other scripts, and
punctuation, keep the original's rule, so English text gets the original's spans.

The segmenters, chosen by measurement (benchmarks/bench_words.py; the README says why), are in the `words` extra.
create's encode stage records the starts (datagen/encode.py); dump --stats reckons spans by them.
"""

import dataclasses
import functools
import importlib.util
import os
from collections.abc import Callable

import numpy as np

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import zh_words
from xlnet_data.dataformat.vocab import SPIECE_UNDERLINE, is_start_piece

WORD_BOUNDARIES = ("spaces", "zh", "ja", "th")  # create --word_boundaries; spaces: the original's rule only

_HAN = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x323AF))
_KANA = ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9F))
SCRIPTS = {"zh": _HAN, "ja": _HAN + _KANA, "th": ((0x0E00, 0x0E7F),)}  # code points whose words the segmenter cuts
# SentencePiece's NFKC splits Thai SARA AM (U+0E33) into NIKHAHIT + SARA AA, which the Thai word lists spell whole:
# the segmenter reads it recomposed ("ทำ", not "ทํา", else it cuts the word in two).
_RECOMPOSE = {"th": ("\u0e4d\u0e32", "\u0e33")}
SEGMENTERS = {"zh": "jieba's dictionary and no-HMM route, compiled (zh_words.py)", "ja": "fugashi (MeCab) with unidic-lite",
              "th": "nlpo3 (newmm) with PyThaiNLP's dictionary"}


class WordsError(UserError, RuntimeError):
    """A segmenter that cannot be loaded (its package is missing)."""


def _missing(language, package):
    return WordsError(f"--word_boundaries={language} needs the {package} package: pip install 'xlnet-data[words]'")


def _zh_dictionary():
    spec = importlib.util.find_spec("jieba")
    if spec is None:
        raise _missing("zh", "jieba")
    return zh_words.load_dictionary(os.path.join(spec.submodule_search_locations[0], "dict.txt"))


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


@functools.cache
def load_segmenter(language: str) -> Callable[[str], np.ndarray]:
    """The function that gives, for a text, a bool per character and one past it: True where a word of
    `language` begins; loaded once per process."""
    if language == "zh":
        dictionary = _zh_dictionary()

        def han_starts(text):
            code_points = _code_points(text)
            return zh_words.char_starts(dictionary, code_points, _in_scripts(code_points, _HAN))
        return han_starts
    if language == "ja":
        try:
            import fugashi
            tagger = fugashi.Tagger("-Owakati")  # unidic-lite's dictionary, found by fugashi
        except (ImportError, RuntimeError):
            raise _missing(language, "fugashi and unidic-lite") from None
        return lambda text: char_word_starts(text, tagger.parse(text).split())
    if language == "th":
        try:
            import nlpo3
            import pythainlp
        except ImportError:
            raise _missing(language, "nlpo3 and pythainlp") from None
        nlpo3.load_dict(os.path.join(os.path.dirname(pythainlp.__file__), "corpus", "words_th.txt"), "xlnet_data_th")
        return lambda text: char_word_starts(text, nlpo3.segment(text, "xlnet_data_th"))
    raise ValueError(f"no segmenter for {language!r}")


def boundary_f1(segment: Callable[[str], np.ndarray], lines) -> float:
    """How well a segmenter (load_segmenter's) agrees with hand-cut text (`lines`: lists of words): the F1 of its
    word starts (the measure by which the segmenters were chosen; tests and benchmarks/bench_words.py)."""
    hits = found = wanted = 0
    for line in lines:
        text = "".join(line)
        got = set(np.flatnonzero(segment(text)[:len(text)]).tolist())
        want = set(np.flatnonzero(char_word_starts(text, line)[:len(text)]).tolist())
        hits, found, wanted = hits + len(got & want), found + len(got), wanted + len(want)
    return 2 * hits / (found + wanted)


def _in_scripts(code_points: np.ndarray, ranges) -> np.ndarray:
    found = np.zeros(code_points.size, dtype=bool)
    for low, high in ranges:
        found |= (code_points >= low) & (code_points <= high)
    return found


@dataclasses.dataclass(frozen=True)
class PieceTable:
    """A SentencePiece model's pieces as the segmenter reads them, by id."""
    code_points: np.ndarray  # uint32: every piece's text, one after the other ("▁" a space; a special, control or
    # unknown piece one space; NUL a space)
    offsets: np.ndarray  # int64: where each piece's text begins in code_points
    lengths: np.ndarray  # int64: its number of code points
    in_script: np.ndarray  # bool a code point of code_points: of the segmenter's scripts
    is_start: np.ndarray  # the original's rule (vocab.start_piece_table)
    segmented: np.ndarray  # whose first character is of the segmenter's scripts (the rest keep the original's rule)

    @classmethod
    def of(cls, sp, language: str) -> "PieceTable":
        pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        plain = np.array([not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)) for i in range(len(pieces))])
        text = [piece.replace(SPIECE_UNDERLINE, " ").replace("\0", " ") if keep and piece else " "
                for piece, keep in zip(pieces, plain)]
        lengths = np.fromiter(map(len, text), dtype=np.int64, count=len(text))
        code_points = _code_points("".join(text))
        in_script = _in_scripts(code_points, SCRIPTS[language])
        offsets = np.cumsum(lengths) - lengths
        return cls(code_points, offsets, lengths, in_script,
                   np.array([is_start_piece(piece) for piece in pieces], dtype=bool), in_script[offsets] & plain)

    def joined(self, ids: np.ndarray):
        """The code points of the pieces `ids` one after the other, whether each is of the scripts, and where
        each piece begins among them (gathered in numpy: a str join of the pieces cost 63 ns a token)."""
        lengths = self.lengths[ids]
        firsts = np.cumsum(lengths) - lengths
        at = np.arange(firsts[-1] + lengths[-1]) + np.repeat(self.offsets[ids] - firsts, lengths)
        return self.code_points[at], self.in_script[at], firsts


def char_word_starts(text: str, words) -> np.ndarray:
    """A bool per character of `text` (and one past it): True where one of `words` (the text cut, its spaces
    perhaps left out; the text has no NUL) begins; all False where the words are not the text's."""
    starts = np.zeros(len(text) + 1, dtype=bool)
    # The words joined by NULs, in C: a word starts after each NUL, less the NULs before it (len() per word in
    # Python cost as much again).
    joined = np.frombuffer("\0".join(words).encode("utf-32-le"), dtype=np.uint32)
    separators = np.flatnonzero(joined == 0)
    firsts = np.concatenate([[0], separators - np.arange(separators.size)])
    total = joined.size - separators.size
    if total == len(text):  # the text cut whole
        starts[firsts] = True
        return starts
    kept = np.flatnonzero(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) != 32)
    if total == kept.size:  # spaces left out: the words' starts among the other characters
        starts[kept[firsts[firsts < total]]] = True
    return starts


def _recomposed(text: str, language: str):
    """(the text the segmenter reads, None or the index in `text` of each of its characters)."""
    pair = _RECOMPOSE.get(language)
    if pair is None or pair[0] not in text:
        return text, None
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    seconds = np.flatnonzero((code_points[:-1] == ord(pair[0][0])) & (code_points[1:] == ord(pair[0][1]))) + 1
    return text.replace(*pair), np.delete(np.arange(len(text) + 1), seconds)


def _segmented_text(segment: Callable[[str], np.ndarray], language: str, code_points: np.ndarray, _in_script):
    """A segmenter of text (load_segmenter's) called on code points, back to their characters."""
    text, where = _recomposed(code_points.tobytes().decode("utf-32-le"), language)
    char_starts = segment(text)
    if where is None:
        return char_starts
    mapped = np.zeros(where[-1] + 1, dtype=bool)
    mapped[where[char_starts]] = True
    return mapped


def _mark_by_text(pieces: PieceTable, segment, ids, asked, starts):
    """WordStarts' `mark` by a segmenter of text (`segment`: _segmented_text's), on the block's pieces joined."""
    code_points, in_script, firsts = pieces.joined(ids)
    starts[asked] = segment(code_points, in_script)[firsts[asked]]


@dataclasses.dataclass(frozen=True)
class WordStarts:
    """Which tokens can start a span, for one model and segmenter: called on a block of ids (int32), it gives a
    bool per id."""
    pieces: PieceTable
    mark: Callable[[np.ndarray, np.ndarray, np.ndarray], None]  # (ids, asked, starts): sets starts[asked] to
    # whether a word begins at each asked token's first character

    @classmethod
    def of(cls, sp, language: str) -> "WordStarts":
        pieces = PieceTable.of(sp, language)
        if language == "zh":  # the compiled route reads the pieces' code points where they are
            mark = functools.partial(zh_words.mark_token_starts, _zh_dictionary(), pieces)
        else:
            mark = functools.partial(_mark_by_text, pieces,
                                     functools.partial(_segmented_text, load_segmenter(language), language))
        return cls(pieces, mark)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        starts = self.pieces.is_start[ids]
        asked = self.pieces.segmented[ids] & ~starts
        if asked.any():
            self.mark(ids, asked, starts)
        return starts
