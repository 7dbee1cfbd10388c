"""Corpus files to one task's token stream: ids, sentence flags, task split, shard order and flag flip."""

import dataclasses
import itertools
import logging
from collections.abc import Callable
from typing import Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.vocab import EOD_ID
from xlnet_data.datagen.text import Encoder, preprocess_texts

log = logging.getLogger("xlnet_data")

READ_BLOCK_BYTES = 1 << 20   # bytes read, normalised and encoded at a time
LONG_LINE_CHARS = 100_000     # a line this long is surely not one sentence: warn once per file


class InputError(ValueError):
    """An input file the run cannot use; the message names the file (and line)."""


@dataclasses.dataclass
class FileStats:
    lines: int = 0
    tokens: int = 0
    invalid_utf8_lines: int = 0
    first_invalid_line: int = 0
    long_lines: int = 0


@dataclasses.dataclass
class Shard:
    """One file's token stream, held as int32/bool chunks so that no copy of the whole file is made."""
    path: str
    ids: list[np.ndarray]
    sent_ids: list[np.ndarray]
    stats: FileStats

    @property
    def num_tokens(self):
        return self.stats.tokens


def task_files(paths, task, num_task):
    """The files of one task: the sorted list taken interleaved, as the original splits work."""
    return sorted(paths)[task::num_task]


def _line_blocks(path, stats, strict):
    """Yields (number of the first line, decoded lines, bytes read) a block at a time; lines are cut at
    b"\\n" only, as tf.gfile does, and invalid UTF-8 is replaced (or fatal when strict)."""
    rest = b""
    with fileio.open_read(path) as f:
        while True:
            block = f.read(READ_BLOCK_BYTES)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            rest = block[cut:]
            if cut:
                first = stats.lines + 1
                yield first, _decode_lines(path, block[:cut - 1], stats, strict), cut
    if rest:
        first = stats.lines + 1
        yield first, _decode_lines(path, rest, stats, strict), len(rest)


def _decode_lines(path, raw_block, stats, strict):
    """The lines of a block (without its last line break)."""
    first_line = stats.lines + 1
    try:
        lines = raw_block.decode("utf-8").split("\n")
        stats.lines += len(lines)
        return lines
    except UnicodeDecodeError:
        pass
    raw_lines = raw_block.split(b"\n")
    stats.lines += len(raw_lines)
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
    return lines


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


def _encode_block(lines, first, path, encoder, *, from_raw_text, uncased, use_eod, vocab_size):
    """Ids of a block of lines, the number of ids of each kept line, and which kept lines are text.

    Blank lines are kept (as one <eod>) only with `use_eod`.
    """
    stripped = [line.strip() for line in lines]
    is_text = np.fromiter(map(bool, stripped), dtype=bool, count=len(stripped))
    texts = [s for s in stripped if s]
    if from_raw_text:
        text_ids, text_lengths = encoder.encode_batch(preprocess_texts(texts, uncased))
    else:
        numbers = [first + i for i in np.flatnonzero(is_text)]
        id_lists = [_parse_ids(path, number, text, vocab_size) for number, text in zip(numbers, texts)]
        text_lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        text_ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int32,
                               count=int(text_lengths.sum()))
    if not use_eod:
        return text_ids, text_lengths, np.ones(len(texts), dtype=bool)
    lengths = np.ones(len(lines), dtype=np.int64)  # a blank line is one <eod>
    lengths[is_text] = text_lengths
    ids = np.full(int(lengths.sum()), EOD_ID, dtype=np.int32)
    ids[np.repeat(is_text, lengths)] = text_ids
    return ids, lengths, is_text


def read_shard(path, encoder: Encoder, *, from_raw_text, uncased, use_eod, vocab_size, strict=False,
               on_progress: Optional[Callable[[int, int, int], None]] = None):
    """Reads one file into a Shard, or None when it has no lines or no ids (the original skips the former
    and crashes on the latter). `on_progress(lines, tokens, bytes)` is called after every block of lines.

    Flags start True and flip after every line; a blank line with `use_eod` becomes <eod>, flipped
    before and after, so it keeps the flag of the sentence before it and the next sentence flips.
    """
    stats = FileStats()
    ids_chunks, flag_chunks = [], []
    sent_id = True
    for first, lines, nbytes in _line_blocks(path, stats, strict):
        long_lines = [i for i, line in enumerate(lines) if len(line) > LONG_LINE_CHARS]
        if long_lines and not stats.long_lines:
            log.warning("%s:%d: a line of %d characters (kept; is the file one sentence per line?)",
                        path, first + long_lines[0], len(lines[long_lines[0]].strip()))
        stats.long_lines += len(long_lines)
        ids, lengths, is_text = _encode_block(lines, first, path, encoder, from_raw_text=from_raw_text,
                                              uncased=uncased, use_eod=use_eod, vocab_size=vocab_size)
        # Text lines flip the flag once; a blank line's <eod> flips it twice, so it takes the flipped flag.
        flips_before = np.cumsum(is_text) - is_text
        flags = (np.bool_(sent_id) ^ (flips_before & 1).astype(bool)) ^ ~is_text
        if ids.size:
            ids_chunks.append(ids)
            flag_chunks.append(np.repeat(flags, lengths))
            stats.tokens += int(ids.size)
        sent_id = bool(sent_id ^ (int(is_text.sum()) & 1))
        if on_progress:
            on_progress(len(lines), int(ids.size), nbytes)
    if stats.invalid_utf8_lines:
        log.warning("%s:%d: %d line(s) not valid UTF-8; bad bytes replaced by U+FFFD (--strict stops instead)",
                    path, stats.first_invalid_line, stats.invalid_utf8_lines)
    if stats.tokens == 0:
        return None
    return Shard(path, ids_chunks, flag_chunks, stats)

