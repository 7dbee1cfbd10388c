"""Corpus files to one task's token stream: ids, sentence flags, task split, shard order and flag flip."""

import dataclasses
import itertools
import logging
import lzma
import zlib
from collections.abc import Callable
from typing import Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat.vocab import EOD_ID, UNK_ID
from xlnet_data.datagen import block_tokens
from xlnet_data.datagen.text import Encoder, StrippedMarks, preprocess_lines
from xlnet_data.datagen.utf8_lines import Utf8Lines

log = logging.getLogger("xlnet_data")

READ_BLOCK_BYTES = 1 << 20   # bytes read, normalised and encoded at a time
LONG_LINE_CHARS = 100_000     # a line this long is surely not one sentence: warn once per file
# A file this much <unk> is text in a script the model was not trained on (every unknown character is one
# <unk>, often after a "▁" piece: a file wholly in such a script is about half <unk>).
UNK_WARNING_SHARE = 0.25


# Below this share of pieces that can start a span, a file is taken for text without spaces between words: English
# has 86%, Korean 51% (33,187 movie reviews, e9t/nsmc), Chinese 16-17%, Japanese 6-11%, Thai 10.5%
# (docs/languages.md; Japanese novels 5.7%, issue 43).
NO_SPACES_WARNING_SHARE = 0.3
NO_SPACES_MIN_TOKENS = 1000  # a file of a few lines (a title, a list) is not judged
_NO_TABLE = np.zeros(1, dtype=bool)  # start_pieces where none is given (not read)


class InputError(UserError, ValueError):
    """An input file the run cannot use; the message names the file (and line)."""


@dataclasses.dataclass
class FileStats:
    lines: int = 0
    tokens: int = 0
    invalid_utf8_lines: int = 0
    first_invalid_line: int = 0
    long_lines: int = 0
    chars: int = 0  # decoded characters, line breaks included
    unk: int = 0  # <unk> ids
    start_pieces: int = 0  # ids that can start a span (with --word_boundaries=spaces: a piece after a space)
    stripped: StrippedMarks = dataclasses.field(default_factory=StrippedMarks)  # keep_accents off


@dataclasses.dataclass
class Shard:
    """One file's token stream, held as int32/bool chunks so that no copy of the whole file is made."""
    path: str
    ids: list[np.ndarray]
    sent_ids: list[np.ndarray]
    stats: FileStats
    word_starts: Optional[list[np.ndarray]] = None  # a bool a token: can start a span (dataformat/words.py)

    @property
    def num_tokens(self):
        return self.stats.tokens


def task_files(paths, task, num_task):
    """The files of one task: the sorted list taken interleaved, as the original splits work."""
    return sorted(paths)[task::num_task]


BINARY_INVALID_SHARE = 0.3  # a block whose bytes are this much invalid UTF-8 is not text
_BINARY_HINT = "this is not a text file; take it out of --input_glob, or pass --allow_binary to read it anyway"


def _read_block(f, path, compression):
    """The next block of `f`; damaged compressed data is an InputError naming the file."""
    try:
        return f.read(READ_BLOCK_BYTES)
    except (EOFError, lzma.LZMAError, zlib.error) as err:
        raise InputError(f"{path}: damaged {compression} data ({err}); re-download or re-compress it") from None
    except OSError as err:
        if err.errno is None and compression:  # gzip.BadGzipFile, bz2's "Invalid data stream"
            raise InputError(f"{path}: damaged {compression} data ({err}); re-download or re-compress it") from None
        raise fileio.naming(err, path) from None


def _line_blocks(path, stats, strict, allow_binary=False):
    """Yields (number of the first line, decoded lines, stored bytes read) a block at a time; lines are cut
    at b"\\n" only, as tf.gfile does, and invalid UTF-8 is replaced (or fatal when strict). gzip, bzip2
    and xz files are read decompressed. A block with a NUL byte, or mostly invalid UTF-8, is an
    InputError unless `allow_binary`."""
    pending = []  # the start of a line that no block read so far ends (a long line: joined once, at its end)
    position = 0
    with fileio.open_decompressed(path) as (f, raw, compression):
        while True:
            block = _read_block(f, path, compression)
            if not block:
                break
            cut = block.rfind(b"\n") + 1
            if not cut:
                pending.append(block)
                continue
            first = stats.lines + 1
            lines = _decode_lines(path, b"".join([*pending, memoryview(block)[:cut]]), stats, strict, allow_binary)
            pending = [block[cut:]]
            done, position = position, raw.tell()
            yield first, lines, position - done
        rest = b"".join(pending)
        if rest.replace(b"\r", b""):  # tf.gfile's ReadLine drops CRs: CRs after the last line break are no line
            first = stats.lines + 1
            yield first, _decode_lines(path, rest, stats, strict, allow_binary), raw.tell() - position


def line_blocks(path, allow_binary=False):
    """The lines of `path` as create reads them (decompressed, invalid UTF-8 replaced, a binary file an
    InputError), a block at a time: for spm_train, which trains on what create will read."""
    for _, lines, _ in _line_blocks(path, FileStats(), strict=False, allow_binary=allow_binary):
        yield lines.texts()


def _decode_lines(path, raw_block, stats, strict, allow_binary=False) -> Utf8Lines:
    """The lines of a block (up to its last line break, which the last block of a file may lack), checked as
    UTF-8. Every carriage return byte is dropped, as tf.gfile's ReadLine drops it: CR LF ends a line like LF,
    and a CR inside a line joins what is either side of it."""
    first_line = stats.lines + 1
    raw_block = raw_block.replace(b"\r", b"")
    if not raw_block.endswith(b"\n"):
        raw_block += b"\n"
    if not allow_binary and b"\0" in raw_block:
        number = first_line + raw_block.count(b"\n", 0, raw_block.index(b"\0"))
        raise InputError(f"{path}:{number}: a NUL byte: {_BINARY_HINT}")
    checked = Utf8Lines.checked(np.frombuffer(raw_block, dtype=np.uint8))
    if checked is not None:
        lines, chars = checked
        stats.chars += chars - 1  # for the share of characters that lose a mark; the last line break not counted
        stats.lines += len(lines)
        return lines
    raw_block = raw_block[:-1]
    raw_lines = raw_block.split(b"\n")
    lines = []
    for number, raw in enumerate(raw_lines, first_line):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            if strict:
                raise InputError(f"{path}:{number}: not valid UTF-8 ({err.reason} at byte {err.start}); "
                                 "fix the file or drop --strict to replace bad bytes") from None
            stats.invalid_utf8_lines += 1
            stats.first_invalid_line = stats.first_invalid_line or number
            lines.append(raw.decode("utf-8", errors="replace"))
    stats.chars += sum(map(len, lines)) + len(lines) - 1
    if not allow_binary:
        invalid = sum(line.count("\ufffd") for line in lines) - raw_block.count("\ufffd".encode())
        if invalid > BINARY_INVALID_SHARE * len(raw_block):
            raise InputError(f"{path}:{first_line}: {100 * invalid / len(raw_block):.0f}% of the bytes from here "
                             f"are not UTF-8: {_BINARY_HINT}")
    stats.lines += len(raw_lines)
    return Utf8Lines.of(lines)


def check_first_block(path, allow_binary=False):
    """Reads `path`'s first block, so that a binary or damaged file is refused before anything is written
    (read_shard checks every block; a cut multi-byte character at the block's end is too little to count)."""
    with fileio.open_decompressed(path) as (f, _, compression):
        block = _read_block(f, path, compression)
    _decode_lines(path, block, FileStats(), strict=False, allow_binary=allow_binary)


def _parse_ids(path, number, line, vocab_size):
    ids = []
    for token in line.split():
        try:
            ids.append(int(token))
        except ValueError:
            raise InputError(f"{path}:{number}: {token!r} is not an integer id "
                             "(with --from_raw_text=False every line holds whitespace-separated ids)") from None
    if ids and not all(0 <= i < vocab_size for i in ids):
        bad = next(i for i in ids if not 0 <= i < vocab_size)
        raise InputError(f"{path}:{number}: id {bad} is outside the SentencePiece vocabulary [0, {vocab_size})")
    return ids


def _encode_block(lines: Utf8Lines, first, path, encoder, *, from_raw_text, uncased, keep_accents, use_eod,
                  vocab_size, marks=None):
    """Ids of a block of lines, the number of ids of each kept line, and which kept lines are text; the
    characters that lose a mark are counted into `marks` (a text.StrippedMarks).

    Blank lines are kept (as one <eod>) only with `use_eod`.
    """
    if from_raw_text:
        normalised, is_text = preprocess_lines(lines, uncased, keep_accents, marks)
        ids, all_lengths = encoder.encode_batch(normalised)  # a blank line has no ids
        text_ids, text_lengths = ids, all_lengths[is_text]
    else:
        stripped = [line.strip() for line in lines.texts()]
        is_text = np.fromiter(map(bool, stripped), dtype=bool, count=len(stripped))
        texts = [s for s in stripped if s]
        numbers = [first + i for i in np.flatnonzero(is_text)]
        id_lists = [_parse_ids(path, number, text, vocab_size) for number, text in zip(numbers, texts)]
        text_lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        text_ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int32,
                               count=int(text_lengths.sum()))
    if not use_eod:
        return text_ids, text_lengths, np.ones(text_lengths.size, dtype=bool)
    lengths = np.ones(len(lines), dtype=np.int64)  # a blank line is one <eod>
    lengths[is_text] = text_lengths
    ids = np.full(int(lengths.sum()), EOD_ID, dtype=np.int32)
    ids[np.repeat(is_text, lengths)] = text_ids
    return ids, lengths, is_text


def read_shard(path, encoder: Encoder, **settings):
    """Reads one file into a Shard (shard_blocks' blocks, held; `settings`: its keyword arguments), or None when
    it has no lines or no ids (the original skips the former and crashes on the latter)."""
    stats = FileStats()
    ids_chunks, flag_chunks, start_chunks = [], [], []
    for ids, flags, starts in shard_blocks(path, encoder, stats, **settings):
        ids_chunks.append(ids)
        flag_chunks.append(flags)
        if starts is not None:
            start_chunks.append(starts)
    if stats.tokens == 0:
        return None
    return Shard(path, ids_chunks, flag_chunks, stats, start_chunks if settings.get("word_starts") is not None else None)


def shard_blocks(path, encoder: Encoder, stats: FileStats, *, from_raw_text, uncased, use_eod, vocab_size,
                 keep_accents=False, strict=False, allow_binary=False,
                 on_progress: Optional[Callable[[int, int, int], None]] = None,
                 word_starts: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                 start_pieces: Optional[np.ndarray] = None):
    """Yields one file's tokens a block of lines (READ_BLOCK_BYTES) at a time, as (ids int32, sent_ids bool, word
    starts bool or None), blocks without ids left out, counting into `stats`; so that a file is never held whole
    (the encode stage writes each block to the token cache as it comes). `on_progress(lines, tokens, bytes)` is
    called after every block of lines; `word_starts` (a words.WordStarts), where given, marks each block's tokens
    that can start a span; `start_pieces` (vocab.start_piece_table, with --word_boundaries=spaces), where given,
    counts them, to warn about a file written without spaces between words (Japanese, Chinese, Thai).

    gzip, bzip2 and xz files are read decompressed; a binary file (NUL bytes, or mostly invalid UTF-8)
    is an InputError naming it unless `allow_binary`.

    Flags start True and flip after every line; a blank line with `use_eod` becomes <eod>, flipped
    before and after, so it keeps the flag of the sentence before it and the next sentence flips.
    """
    sent_id = True  # flips after every text line (block_tokens.flags_and_counts)
    for first, lines, nbytes in _line_blocks(path, stats, strict, allow_binary):
        long_bytes = np.flatnonzero(np.diff(lines.line_starts) > LONG_LINE_CHARS + 1)  # as many characters at most
        long_lines = [i for i in long_bytes.tolist() if len(lines.line(i)) > LONG_LINE_CHARS]
        if long_lines and not stats.long_lines:
            log.warning("%s:%d: a line of %d characters (kept; is the file one sentence per line?)",
                        path, first + long_lines[0], len(lines.line(long_lines[0]).strip()))
        stats.long_lines += len(long_lines)
        ids, lengths, is_text = _encode_block(lines, first, path, encoder, from_raw_text=from_raw_text,
                                              uncased=uncased, keep_accents=keep_accents, use_eod=use_eod,
                                              vocab_size=vocab_size, marks=stats.stripped)
        flags, sent_id, unk, starts = block_tokens.flags_and_counts(
            ids, lengths, is_text, sent_id, UNK_ID, _NO_TABLE if start_pieces is None else start_pieces,
            start_pieces is not None)
        if ids.size:
            stats.tokens += int(ids.size)
            stats.unk += int(unk)
            stats.start_pieces += int(starts)
            yield ids, flags, None if word_starts is None else word_starts(ids)
        if on_progress:
            on_progress(len(lines), int(ids.size), nbytes)
    if stats.invalid_utf8_lines:
        log.warning("%s:%d: %d line(s) not valid UTF-8; bad bytes replaced by U+FFFD (--strict stops instead)",
                    path, stats.first_invalid_line, stats.invalid_utf8_lines)
    if stats.tokens and from_raw_text and stats.unk >= UNK_WARNING_SHARE * stats.tokens:
        log.warning("%s: %.0f%% of its tokens are <unk>: the SentencePiece model does not know its characters "
                    "(train one on this text: spm_train, with --character_coverage=1.0 for a small corpus)",
                    path, 100 * stats.unk / stats.tokens)
    if start_pieces is not None and stats.tokens >= NO_SPACES_MIN_TOKENS and \
            stats.start_pieces < NO_SPACES_WARNING_SHARE * stats.tokens:
        log.warning("%s: only %.0f%% of its pieces can start a masked span (a piece after a space): is it written "
                    "without spaces between words (Japanese, Chinese, Thai)? Spans would then cut words; pass "
                    "--word_boundaries=ja, zh or th (the words extra)", path, 100 * stats.start_pieces / stats.tokens)
