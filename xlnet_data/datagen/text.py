"""Text to ids: the original's normalisation, SentencePiece encoding and its digit-comma rule."""

import dataclasses
import functools
import itertools
import sys
import unicodedata

import numpy as np

from xlnet_data.dataformat import vocab
from xlnet_data.dataformat.vocab import SPIECE_UNDERLINE
from xlnet_data.datagen import encoder_check


def _other_spaces(below):
    """The characters below code point `below` that str.split() collapses, beyond the single space between
    words and the line breaks between joined lines (two spaces are checked apart)."""
    return tuple(c for c in map(chr, range(below)) if c.isspace() and c not in " \n")


_ASCII_OTHER_SPACE = _other_spaces(128)


@functools.cache
def _all_other_spaces():
    """_other_spaces of every code point: 27 characters, 50 ms to list (once, at the first line that is not ASCII)."""
    return _other_spaces(sys.maxunicode + 1)


# The Arabic marks (harakat, Quranic annotation) among those the accent removal drops: optional vowel marks,
# usually left out of written Arabic, so they are counted apart from the marks that are part of a letter.
_ARABIC_MARKS = ((0x0610, 0x061A), (0x064B, 0x065F), (0x0670, 0x0670), (0x06D6, 0x06ED), (0x08D3, 0x08FF))


@functools.cache
def _is_arabic_mark():
    table = np.zeros(sys.maxunicode + 1, dtype=bool)
    for first, last in _ARABIC_MARKS:
        table[first:last + 1] = True
    return table


@dataclasses.dataclass
class StrippedMarks:
    """What the original's accent removal (keep_accents off) took from a text: the characters that lost a
    combining mark (Thai tone marks, viramas, nuktas, kana voicing, Vietnamese tones, Greek tonos, Hebrew
    points, Latin accents...), and apart, those that lost only Arabic harakat."""
    letters: int = 0
    arabic: int = 0

    def count(self, code_points, dropped):
        """Counts the characters of NFKD `code_points` that lose marks, `dropped` the marks: one per run of
        marks (a run belongs to the character before it), Arabic where the run's first mark is."""
        starts = np.flatnonzero(dropped[1:] & ~dropped[:-1]) + 1
        if dropped.size and dropped[0]:
            starts = np.concatenate(([0], starts))
        arabic = int(np.count_nonzero(_is_arabic_mark()[code_points[starts]]))
        self.letters += starts.size - arabic
        self.arabic += arabic


def _collapse_whitespace(lines):
    return [" ".join(line.split()) for line in lines]


def _nfkd_without_combining(text, stripped=None):
    """NFKD, then the combining characters dropped, by a table lookup over the code points in numpy (a
    per-character str.translate dictionary lookup costs ten times as much); counted into `stripped`."""
    code_points = np.frombuffer(unicodedata.normalize("NFKD", text).encode("utf-32-le"), dtype=np.uint32)
    dropped = vocab.is_combining()[code_points]
    if stripped is not None:
        stripped.count(code_points, dropped)
    return code_points[~dropped].tobytes().decode("utf-32-le")


def _doubled(ascii_text):
    """Counts, by character code, of the characters of an ASCII text that follow themselves. One vectorised
    pass answers whether "  ", "``" or "''" occur: str searches for two-character strings run at about
    1 GB/s, and the three of them took 24 ms per 7 MB block, this 6 ms."""
    codes = np.frombuffer(ascii_text.encode("ascii"), dtype=np.uint8)
    return np.bincount(codes[1:][codes[1:] == codes[:-1]], minlength=128)


def _preprocess_ascii(lines, lower):
    """preprocess_texts of ASCII lines (blank ones allowed): NFKD and accent removal leave them as they are,
    and whitespace collapsing and the quote replacements are only needed when the block has what they
    replace (collapsing never makes or breaks a "``" or "''": the lines are stripped)."""
    text = "\n".join(lines)
    doubled = _doubled(text)
    if doubled[ord(" ")] or any(space in text for space in _ASCII_OTHER_SPACE):
        text = "\n".join(_collapse_whitespace(lines))
    if doubled[ord("`")]:
        text = text.replace("``", '"')
    if doubled[ord("'")]:
        text = text.replace("''", '"')
    return (text.lower() if lower else text).split("\n")


def _preprocess_wide(lines, lower, keep_accents, stripped=None):
    """preprocess_texts of lines that are not ASCII: every step (Unicode whitespace, NBSP, U+2028, ...,
    only occur in them). Whitespace is collapsed only when the block has any to collapse: splitting and
    joining every line cost 7 ns a token, a search for each such character 1 ns."""
    text = "\n".join(lines)
    if "  " in text or any(space in text for space in _all_other_spaces()):
        text = "\n".join(_collapse_whitespace(lines))
    text = text.replace("``", '"').replace("''", '"')
    if not keep_accents:
        text = _nfkd_without_combining(text, stripped)
    return (text.lower() if lower else text).split("\n")


def preprocess_texts(lines, lower, keep_accents=False, stripped: "StrippedMarks | None" = None):
    """The original's `preprocess_text` of many stripped, non-empty lines: whitespace collapsed, `` and ''
    to ", NFKD without combining marks (unless `keep_accents`, the original's option of that name),
    lower-cased if `lower`. The characters that lose a mark are counted into `stripped` (ASCII lines have
    none: they are not looked at).

    The steps run on lines joined by "\n": each acts within a line (NFKD reorders only between starters,
    and "\n" is one; final-sigma lower-casing stops at it), so the result is line by line's. Most lines
    of most corpora are ASCII with single spaces, which whitespace collapsing, NFKD and the accent removal
    leave as they are; and str methods on a string with one non-ASCII character run at their slow,
    per-character speed over all of it (lower-casing a block with a few accented lines took 8x as long
    as an ASCII block). So the ASCII lines (str.isascii is a flag lookup) are joined and processed apart
    from the others, the places of the others left blank, and those filled in from the second batch.
    """
    wide = [i for i, line in enumerate(lines) if not line.isascii()]
    if not wide:
        return _preprocess_ascii(lines, lower)
    wide_lines = [lines[i] for i in wide]
    if len(wide) == len(lines):
        return _preprocess_wide(wide_lines, lower, keep_accents, stripped)
    narrow_lines = list(lines)
    for i in wide:
        narrow_lines[i] = ""
    out = _preprocess_ascii(narrow_lines, lower)
    for i, line in zip(wide, _preprocess_wide(wide_lines, lower, keep_accents, stripped)):
        out[i] = line
    return out


def _split_digit_comma(sp, piece):
    """A piece like `▁1990,` becomes the pieces of `1990` followed by `,` (the original's encode_pieces)."""
    pieces = sp.encode(piece[:-1].replace(SPIECE_UNDERLINE, ""), out_type=str)
    if piece[0] != SPIECE_UNDERLINE and pieces and pieces[0][0] == SPIECE_UNDERLINE:
        pieces = pieces[1:] if len(pieces[0]) == 1 else [pieces[0][1:]] + pieces[1:]
    return pieces + [piece[-1]]


def _encodes_to_numpy(sp):
    """Whether `sp` encodes a batch to int32 arrays (out_type="numpy", as sentencepiece 0.2.3 does; older
    versions refuse it, and encode_batch takes their lists of ints)."""
    try:
        return sp.encode(["a"], out_type="numpy")[0].dtype == np.int32
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return False


_PROBE = ["In 1865, Alice fell.", "", "東京 and 한국어 café", "x"]


def _buffer_batch(sp):
    """SentencePiece's batch call that returns one int32 buffer a line, as `f(texts, num_threads)`, or None.

    out_type="numpy" wraps each of these buffers in an array (np.frombuffer, a line at a time, in Python):
    about 30 ns a token, a seventh of the encoding itself; the buffers joined as bytes give the same ids
    at once. The call is a private method of sentencepiece's binding (0.2.3), with the arguments its
    Python wrapper passes for a processor loaded with default options; it is used only where it exists and
    gives what the public call gives on a probe.
    """
    method = getattr(getattr(sp, "_processor", None), "_EncodeAsBufferBatch", None)
    if method is None:
        return None

    def encode(texts, num_threads):
        # texts, num_threads, thread_pool, enable_sampling, nbest_size, alpha, add_bos, add_eos, reverse
        return method(texts, num_threads, None, False, -1, 0.1, False, False, False)
    try:
        probe = [np.frombuffer(buffer, dtype=np.int32).tolist() for buffer in encode(_PROBE, 1)]
    except (TypeError, ValueError, RuntimeError):
        return None
    return encode if probe == sp.encode(_PROBE, out_type=int) else None


class Encoder:
    """Encodes batches of normalised lines to ids exactly as the original's `encode_ids` does, one by one.

    The ids come from our own encoder where `encoder` (datagen/encoder_check.ENCODERS) and its checks allow
    it, the first lines it encodes checked against SentencePiece's under "auto"; else from SentencePiece.
    """

    def __init__(self, sp, num_threads=-1, encoder="auto"):
        self._sp = sp
        self._num_threads = num_threads  # SentencePiece's threads for a batch; -1: all cores
        self._unigram = encoder_check.unigram_encoder(sp, encoder)
        self._corpus_checked = encoder != "auto"
        pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        # Ids whose piece triggers the digit-comma rule: encode_batch replaces them by their split.
        self._digit_comma = np.array(
            [len(p) > 1 and p[-1] == "," and p[-2].isdigit() for p in pieces], dtype=bool)
        self._splits = {}
        self._buffer_batch = _buffer_batch(sp)
        # How SentencePiece's ids come back, fastest first: "buffers", "numpy" (arrays), "lists" (of ints).
        self.output = "buffers" if self._buffer_batch else "numpy" if _encodes_to_numpy(sp) else "lists"

    def encode_original(self, text):
        """One line through the piece-level path, as the original writes it."""
        ids = []
        for piece in self._sp.encode(text, out_type=str):
            if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
                ids.extend(self._sp.piece_to_id(p) for p in _split_digit_comma(self._sp, piece))
            else:
                ids.append(self._sp.piece_to_id(piece))
        return ids

    def _split_ids(self, piece_id):
        """The ids a digit-comma piece becomes (the original's rule), computed once per piece."""
        if piece_id not in self._splits:
            pieces = _split_digit_comma(self._sp, self._sp.id_to_piece(piece_id))
            self._splits[piece_id] = np.array([self._sp.piece_to_id(p) for p in pieces], dtype=np.int32)
        return self._splits[piece_id]

    def encode_batch(self, texts):
        """Ids of each text as one flat int32 array, and the number of ids of each text.

        Pieces the digit-comma rule applies to are replaced in place by their split, so a line holding
        one costs no more than any other (re-encoding a 50 MB line piece by piece took most of its time).
        """
        flat, lengths = self._encode_ids(texts)
        hits = np.flatnonzero(np.take(self._digit_comma, flat))  # take: half the time of self._digit_comma[flat]
        if hits.size:
            line_of_hit = np.searchsorted(np.cumsum(lengths), hits, side="right")
            parts, start = [], 0
            for at, line in zip(hits.tolist(), line_of_hit.tolist()):
                split = self._split_ids(int(flat[at]))
                parts += [flat[start:at], split]
                lengths[line] += split.size - 1
                start = at + 1
            parts.append(flat[start:])
            flat = np.concatenate(parts)
        return flat, lengths

    @property
    def uses_ours(self) -> bool:
        """Whether our encoder gives the ids (else SentencePiece)."""
        return self._unigram is not None

    def _encode_ids(self, texts):
        """SentencePiece's ids of `texts`: one flat int32 array, and the number of ids of each text."""
        if self._unigram is not None and not self._corpus_checked:
            self._corpus_checked = True
            if not encoder_check.corpus_agrees(self._unigram, self._sp, texts):
                self._unigram = None
        if self._unigram is not None:
            return self._unigram.encode_ids(texts)
        if self.output == "buffers":  # joined as bytes; a buffer's memoryview counts its int32 items
            buffers = self._buffer_batch(texts, self._num_threads)
            lengths = np.fromiter(map(len, map(memoryview, buffers)), dtype=np.int64, count=len(buffers))
            return np.frombuffer(b"".join(buffers), dtype=np.int32), lengths
        # An int32 array a line where SentencePiece gives one: no Python int an id to make, copy and free (7 ns a token).
        encoded = self._sp.encode(texts, out_type="numpy" if self.output == "numpy" else int,
                                  num_threads=self._num_threads)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        if self.output == "numpy":
            flat = np.concatenate(encoded) if encoded else np.zeros(0, dtype=np.int32)
        else:
            flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
        return flat, lengths
