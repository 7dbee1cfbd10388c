"""Text to ids: the original's normalisation, SentencePiece encoding and its digit-comma rule."""

import dataclasses
import itertools

import numpy as np

from xlnet_data.dataformat.vocab import SPIECE_UNDERLINE
from xlnet_data.datagen import encoder_check, preprocess_utf8
from xlnet_data.datagen.utf8_lines import Utf8Lines


@dataclasses.dataclass
class StrippedMarks:
    """What the original's accent removal (keep_accents off) took from a text: the characters that lost a
    combining mark (Thai tone marks, viramas, nuktas, kana voicing, Vietnamese tones, Greek tonos, Hebrew
    points, Latin accents...), and apart, those that lost only Arabic harakat."""
    letters: int = 0
    arabic: int = 0


def preprocess_lines(lines: Utf8Lines, lower, keep_accents=False, stripped: "StrippedMarks | None" = None):
    """The original's `preprocess_text` of each of `lines`: whitespace collapsed (and stripped), `` and '' to ",
    NFKD without combining marks (unless `keep_accents`, the original's option of that name), lower-cased if
    `lower`. The lines as a Utf8Lines, and a bool a line: whether it is text (not blank: a character beyond
    whitespace). The characters that lose a mark are counted into `stripped`.

    One compiled pass over the lines' UTF-8 (preprocess_utf8) does it all but the lower-casing of what is not
    ASCII, which str.lower does on those lines alone (its final sigma and dotted I depend on the line)."""
    tables = preprocess_utf8.tables()
    for size in (lines.data.size + lines.data.size // 8, tables.growth * lines.data.size):
        out = np.empty(size + 4 * preprocess_utf8.ROOM, dtype=np.uint8)
        n, line_starts, is_text, needs_lower, counts = preprocess_utf8.preprocess(
            lines.data, len(lines), out, tables.flags, tables.ccc, tables.starts, tables.decomposed, keep_accents,
            lower)
        if n >= 0:
            break
    if stripped is not None:
        stripped.letters += int(counts[0])
        stripped.arabic += int(counts[1])
    done = Utf8Lines(out[:n], line_starts)
    if needs_lower.any():
        done = _lowered(done, np.flatnonzero(needs_lower))
    return done, is_text


def _lowered(lines: Utf8Lines, rows):
    """`lines` with the lines `rows` lower-cased by str.lower, the others as they are."""
    parts, done = [], 0
    for i in rows.tolist():
        parts += [lines.data[done:lines.line_starts[i]].tobytes(), lines.line(i).lower().encode("utf-8", "surrogatepass")]
        done = lines.line_starts[i + 1] - 1
    parts.append(lines.data[done:].tobytes())
    return Utf8Lines.split(np.frombuffer(b"".join(parts), dtype=np.uint8))


def preprocess_texts(texts, lower, keep_accents=False, stripped: "StrippedMarks | None" = None) -> list:
    """preprocess_lines of str lines, as str lines ("\\n" in one is whitespace, as for the original)."""
    texts = [text.replace("\n", " ") for text in texts] if any("\n" in text for text in texts) else texts
    return preprocess_lines(Utf8Lines.of(texts), lower, keep_accents, stripped)[0].texts()


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
        # Models of scripts without such pieces (the Chinese ones spm_train makes have none) skip the look-up of every
        # id: ~2 ns a token of Chinese create's ~158.
        self._any_digit_comma = bool(self._digit_comma.any())
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
        """Ids of each text (str, or a Utf8Lines) as one flat int32 array, and the number of ids of each text.

        Pieces the digit-comma rule applies to are replaced in place by their split, so a line holding
        one costs no more than any other (re-encoding a 50 MB line piece by piece took most of its time).
        """
        flat, lengths = self._encode_ids(texts)
        if not self._any_digit_comma:
            return flat, lengths
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
        """SentencePiece's ids of `texts` (str, or a Utf8Lines): one flat int32 array, and the number of ids of
        each text."""
        if self._unigram is not None and not self._corpus_checked:
            self._corpus_checked = True
            first = texts.texts(encoder_check.CORPUS_CHECK_LINES) if isinstance(texts, Utf8Lines) else texts
            if not encoder_check.corpus_agrees(self._unigram, self._sp, first):
                self._unigram = None
        if self._unigram is not None:
            return self._unigram.encode_ids(texts)
        if isinstance(texts, Utf8Lines):
            texts = texts.texts()
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
