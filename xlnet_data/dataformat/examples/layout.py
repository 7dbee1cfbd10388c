"""The token stream laid out in rows: plain batches, or forward rows each followed by their reverse.

The rows are never copied out of the stream: the loop reads row r's position k at stream position
source[r] * row_len + k (a reversed row from the other end) through a TokenStream, whose ids (and word-start bits)
are segments of a byte source: a task's token cache file mapped into memory, its files in the unit's order
(token_cache.mapped_stream), or arrays in memory (in_memory_stream). So a unit holds its rows' sentence
boundaries, not its tokens: the mapped pages are the page cache's, dropped from the process now and then
(TokenStream.release). The rows are read through the map where each row's examples stand, which moves on
slowly; a B drawn anywhere in the row is read from the file by pread(2) (copy_read): through the map, each such
B faulted in a large folio (~300 KB here, kernel 6.18), which then had to be dropped again.
"""

import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Optional

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from xlnet_data.common import compiled
from xlnet_data.dataformat.examples.pairing import row_boundaries

BITS = 0  # a `width` of the readers below: one bit a token (np.packbits' order), not an id of `width` bytes


@dataclasses.dataclass(frozen=True)
class TokenStream:
    """A task's tokens in a unit's file order, as segments (one a file, or one for arrays in memory) of two
    read-only uint8 sources: the ids, little-endian, `id_bytes` each, and the word-start bits."""
    tokens: int
    id_source: np.ndarray  # uint8
    id_bytes: int  # 2 or 4
    bit_source: np.ndarray  # uint8; empty without word starts
    word_starts: bool  # whether the stream has word starts of its own (else the piece-id table decides)
    seg_starts: np.ndarray  # int64 [n + 1]: the stream position of each segment's first token, then `tokens`
    seg_ids: np.ndarray  # int64 [n]: the byte of id_source where each segment's ids begin
    seg_bits: np.ndarray  # int64 [n]: the byte of bit_source where each segment's bits begin
    flags: Callable[[], Iterator[np.ndarray]]  # the sentence flags in stream order, in bool chunks (files flipped)
    max_id: int  # -1 when empty
    release: Callable[[], None] = lambda: None  # drops the pages read so far from the process (a mapped file)
    file: Optional[object] = None  # the mapped file, open: copy_read's reads; None in memory

    @property
    def fd(self) -> int:
        """The mapped file's descriptor (copy_read), -1 for a stream in memory."""
        return -1 if self.file is None else self.file.fileno()

    def close(self) -> None:
        """Closes the mapped file now, not when the stream is garbage-collected (the map goes with the last
        array that views it)."""
        if self.file is not None:
            self.file.close()

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def arrays(self):
        """(ids int32, sent_ids bool, word starts bool or None) of the whole stream, in memory (tests, small
        streams): token_cache.read_stream's."""
        ids = np.empty(self.tokens, dtype=np.int32)
        copy_values(ids, 0, self.id_source, self.id_bytes, self.seg_starts, self.seg_ids, 0, 0, False, 0, self.tokens)
        starts = None
        if self.word_starts:
            starts = np.empty(self.tokens, dtype=np.int32)
            copy_values(starts, 0, self.bit_source, BITS, self.seg_starts, self.seg_bits, 0, 0, False, 0, self.tokens)
        flags = list(self.flags())
        return ids, np.concatenate(flags) if flags else np.empty(0, bool), None if starts is None else starts == 1


def _read_only(array):
    array.flags.writeable = False  # the mapped sources are read-only: one compiled variant for both
    return array


def in_memory_stream(ids, sent_ids, word_starts=None) -> TokenStream:
    """A stream held in memory: ids, sent_ids and word starts (or None) as arrays of a token each."""
    ids = np.ascontiguousarray(ids, dtype="<i4")
    sent_ids = np.asarray(sent_ids, dtype=bool)
    bits = np.zeros(0, np.uint8) if word_starts is None else np.packbits(np.asarray(word_starts, dtype=bool))
    zero = np.zeros(1, dtype=np.int64)
    return TokenStream(ids.size, _read_only(ids.view(np.uint8)), 4, _read_only(bits), word_starts is not None,
                       np.array([0, ids.size], dtype=np.int64), zero, zero, lambda: iter([sent_ids]),
                       int(ids.max()) if ids.size else -1)


def _unaligned_load(bits, signed):
    """A function of compiled code: the little-endian int of `bits` at buf[i:] (a uint8 array; need not be aligned),
    as an int32, by one native load. Assembled from byte loads and shifts, an id cost 12-57 ns instead of
    1.5 (benchmarks: the examples' gather was most of a pass on Chinese)."""
    @intrinsic
    def load(typingctx, buf, i):
        def codegen(context, builder, signature, args):
            address = compiled.element_pointer(context, builder, signature.args[0], args[0], args[1], ir.IntType(bits))
            value = builder.load(address, align=1)
            if sys.byteorder == "big":
                value = builder.bswap(value)
            return value if bits == 32 else (builder.sext if signed else builder.zext)(value, ir.IntType(32))
        return types.int32(buf, types.intp), codegen
    return load


_load_u16 = _unaligned_load(16, signed=False)  # the ids of a token cache of at most 65,536 pieces
_load_i32 = _unaligned_load(32, signed=True)


@intrinsic
def _pread(typingctx, fd, buf, nbytes, offset):
    """A function of compiled code: pread(2) of `nbytes` at `offset` of the open file `fd` into the uint8 array
    `buf`; the bytes read, or -1 (an error, or Windows, which has no pread: the caller reads the map instead)."""
    def codegen(context, builder, signature, args):
        if sys.platform == "win32":
            return ir.Constant(ir.IntType(64), -1)
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), [
            ir.IntType(32), ir.IntType(8).as_pointer(), ir.IntType(64), ir.IntType(64)]), "pread")
        data = compiled.element_pointer(context, builder, signature.args[1], args[1], ir.IntType(64)(0), ir.IntType(8))
        return builder.call(function, [builder.trunc(args[0], ir.IntType(32)), data, args[2], args[3]])
    return types.int64(fd, buf, nbytes, offset), codegen


@compiled.jit(inline="always")
def _segment(seg_starts, p, s):
    """The segment holding stream position p: `s` (the last one found) when it does, else a binary search for
    the last segment starting at or before p (after empty ones)."""
    if seg_starts[s] <= p < seg_starts[s + 1]:
        return s
    lo, hi = 0, seg_starts.shape[0] - 1  # seg_starts[lo] <= p < seg_starts[hi]
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if seg_starts[mid] <= p:
            lo = mid
        else:
            hi = mid
    return lo


@compiled.jit(inline="always")
def value_at(source, width, seg_starts, seg_offsets, p, s):
    """(the value at stream position p: its id, or its bit where width is BITS; the segment found)."""
    s = _segment(seg_starts, p, s)
    j = p - seg_starts[s]
    if width == BITS:
        return np.int32((source[seg_offsets[s] + (j >> 3)] >> (7 - (j & 7))) & 1), s
    at = seg_offsets[s] + j * width
    return (_load_u16(source, at) if width == 2 else _load_i32(source, at)), s


@compiled.jit(inline="always")
def copy_values(out, n, source, width, seg_starts, seg_offsets, base, row_len, reverse, begin, end):
    """Copies positions begin..end-1 of the row at stream position `base` (read backwards where `reverse`) into
    out[n:]; returns the next n."""
    if width != BITS and begin < end:
        first = base + (row_len - 1 - begin if reverse else begin)
        last = first + (begin + 1 - end if reverse else end - 1 - begin)
        s = _segment(seg_starts, min(first, last), 0)
        if max(first, last) < seg_starts[s + 1]:  # in one segment (nearly always): ids evenly spaced, no lookups
            step = -width if reverse else width
            at = seg_offsets[s] + (first - seg_starts[s]) * width
            for k in range(end - begin):
                out[n + k] = _load_u16(source, at + k * step) if width == 2 else _load_i32(source, at + k * step)
            return n + end - begin
    s = 0
    for k in range(begin, end):
        value, s = value_at(source, width, seg_starts, seg_offsets, base + (row_len - 1 - k if reverse else k), s)
        out[n] = value
        n += 1
    return n


@compiled.jit(inline="always")
def copy_read(out, n, fd, scratch, window, source, width, seg_starts, seg_offsets, base, row_len, reverse, begin,
              end):
    """copy_values, the bytes read from the open file `fd` (pread) into `scratch` rather than through the map
    `source`: for a range anywhere in the stream, whose mapped pages would be faulted in for it alone. A range
    across segments, larger than `scratch`, or not read (no file: fd -1) is read through `source`. `window`: 3
    int64 of room for the range's segment as copy_values reads it from `scratch`."""
    if fd >= 0 and begin < end:
        first = base + (row_len - 1 - begin if reverse else begin)
        last = first + (begin + 1 - end if reverse else end - 1 - begin)
        low, high = min(first, last), max(first, last)
        s = _segment(seg_starts, low, 0)
        if high < seg_starts[s + 1]:
            j_low, j_high = low - seg_starts[s], high - seg_starts[s]
            if width == BITS:
                at, nbytes = seg_offsets[s] + (j_low >> 3), (j_high >> 3) - (j_low >> 3) + 1
            else:
                at, nbytes = seg_offsets[s] + j_low * width, (j_high - j_low + 1) * width
            if nbytes <= scratch.shape[0] and _pread(fd, scratch, nbytes, at) == nbytes:
                window[0], window[1], window[2] = seg_starts[s], seg_starts[s + 1], seg_offsets[s] - at
                return copy_values(out, n, scratch, width, window[:2], window[2:], base, row_len, reverse, begin,
                                   end)
    return copy_values(out, n, source, width, seg_starts, seg_offsets, base, row_len, reverse, begin, end)


@dataclasses.dataclass(frozen=True)
class Rows:
    """`bsz_per_host` rows over `num_rows` forward rows of `row_len` tokens of the stream; row r is forward row
    `source[r]`, reversed where `reverse[r]`, so the bidirectional layout costs no memory. `bounds` and
    `bound_offsets`: the forward rows' sentence boundaries (pairing.row_boundaries; a reversed row reads
    them from the other end)."""
    stream: TokenStream
    num_rows: int
    row_len: int
    source: np.ndarray      # [bsz_per_host] int64
    reverse: np.ndarray     # [bsz_per_host] bool
    bounds: np.ndarray
    bound_offsets: np.ndarray


def layout_stream(stream: TokenStream, bsz_per_host, num_core, bi_data) -> Rows:
    """The original's layout: with `bi_data`, each core's half-batch of forward rows is followed by the
    same rows reversed; otherwise `bsz_per_host` forward rows (the stream cut to a multiple of them)."""
    if not bi_data:
        num_rows, source, reverse = bsz_per_host, np.arange(bsz_per_host), np.zeros(bsz_per_host, dtype=bool)
    else:
        half = bsz_per_host // num_core // 2
        fwd = np.arange(bsz_per_host // 2).reshape(num_core, 1, half)
        source = np.concatenate([fwd, fwd], axis=1).reshape(-1)
        reverse = np.zeros((num_core, 2, half), dtype=bool)
        reverse[:, 1] = True
        num_rows, reverse = bsz_per_host // 2, reverse.reshape(-1)
    row_len = stream.tokens // num_rows
    bounds, offsets = row_boundaries(stream.flags, num_rows, row_len)
    return Rows(stream, num_rows, row_len, source, reverse, bounds, offsets)


def layout_rows(ids, sent_ids, bsz_per_host, num_core, bi_data, word_starts=None) -> Rows:
    """layout_stream of arrays in memory (a bool a token for `word_starts`, or None)."""
    return layout_stream(in_memory_stream(ids, sent_ids, word_starts), bsz_per_host, num_core, bi_data)


def materialize(rows):
    """The rows' ids as a full array (for tests and small inputs): the original's `data`."""
    stream = rows.stream
    data = np.empty((rows.source.shape[0], rows.row_len), dtype=np.int32)
    for r, (row, reverse) in enumerate(zip(rows.source, rows.reverse)):
        copy_values(data[r], 0, stream.id_source, stream.id_bytes, stream.seg_starts, stream.seg_ids,
                    row * rows.row_len, rows.row_len, reverse, 0, rows.row_len)
    return data
