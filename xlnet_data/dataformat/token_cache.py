"""A task's token cache, as `create` writes it and readers (create's passes, train_gpu and dump on a
cache-backed save_dir) read it back; its file names are save_dir.py's.

A cache is two files in save_dir/token_cache:

- `tokens-{task}.{key}.bin`: file after file, its ids, then its sentence flags packed eight to a byte
  (np.packbits, the last byte zero-padded), then its word-start bits packed alike where create found the words
  with a segmenter (--word_boundaries; dataformat/words.py);
- `tokens-{task}.{key}.json`: the index (each file's offsets, checksums, token and line counts), written last,
  so that its presence means the cache is complete.

The index's `format` says how to read the file:

    1 (or absent)   ids int32, no checksums: 4.125 bytes a token (an older create's; still read)
    2               ids uint16 where the vocabulary fits (at most 65,536 pieces; else int32), word-start bits where
                    recorded, and a CRC-32C of every chunk of `chunk_tokens` tokens of each region, checked as the
                    stream is read back (a cache damaged at the same size is refused, naming the chunk): about
                    2.13 bytes a token, 2.25 with word starts
    newer           refused in one line

`key` hashes everything the ids depend on (datagen/encode.py makes it), so a stale cache is never read.
A unit reads its task's stream back with the files in its own seeded order (examples/loop.py), through a memory
map of the file (mapped_stream), so that it does not hold the stream: only its rows' sentence boundaries.
"""

import dataclasses
import json
import mmap
import tempfile
from typing import Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat.crc32c import crc32c
from xlnet_data.dataformat.examples import layout
from xlnet_data.dataformat.provenance import sha256_of
from xlnet_data.dataformat.save_dir import token_cache_paths

CACHE_FORMAT = 2
CHUNK_TOKENS = 1 << 20  # tokens of a region checksummed (and read back) at a time: 2 MB of ids, 128 KB of bits
REGIONS = ("ids", "flags", "starts")  # a shard's parts in the file, in order (starts: word starts, if recorded)


class TokenCacheError(UserError, ValueError):
    """A token cache that is missing or does not hold what its index says; the message says what to do."""


def id_dtype(vocab_size: int) -> str:
    """The cache's id type for a vocabulary: two bytes where every id fits."""
    return "<u2" if vocab_size <= 1 << 16 else "<i4"


@dataclasses.dataclass
class CacheIndex:
    """What a token cache holds: its shards (files with tokens) in file order, and the counts of the task."""
    task: int
    key: str
    shards: list[dict]  # {"path", "tokens", "lines", "invalid_utf8_lines", "chars", "unk", "marks", "arabic_marks",
    #                      and per region "{region}_offset" and (format 2) "{region}_crc32c"}: see units.input_counts
    skipped_files: int  # files without any token
    format: int = CACHE_FORMAT
    ids: str = "<i4"  # the ids' numpy type in the file
    chunk_tokens: int = CHUNK_TOKENS
    word_starts: bool = False  # whether each shard has its word-start bits

    @property
    def tokens(self):
        return sum(shard["tokens"] for shard in self.shards)


def read_index(save_dir: str, task: int, key: str) -> Optional[CacheIndex]:
    """The index of the task's complete cache under `key`, or None when there is none; TokenCacheError for a
    cache of a newer format, or an index that cannot be read (cut short, emptied, edited) or whose fields do not
    fit its data file (checked_index)."""
    data_path, index_path = token_cache_paths(save_dir, task, key)
    if not fileio.exists(index_path):
        return None
    try:
        index = json.loads(fileio.read_text(index_path))
        version = index.get("format", 1)
        fields = (index["task"], index["key"], index["shards"], index["skipped_files"], version,
                  index.get("ids", "<i4"), index.get("chunk_tokens", CHUNK_TOKENS), index.get("word_starts", False))
    except (ValueError, AttributeError, KeyError, TypeError) as err:
        raise TokenCacheError(f"{index_path}: the token cache's index is damaged ({type(err).__name__}: {err}); "
                              "delete the token_cache folder and run the same create again") from None
    if _is_count(version) and version > CACHE_FORMAT:
        raise TokenCacheError(f"{index_path}: token cache format {version} is newer than this xlnet-data reads "
                              f"({CACHE_FORMAT}); upgrade xlnet-data, or delete the token_cache folder and run create "
                              "again")
    if not fileio.exists(data_path):
        raise TokenCacheError(f"{index_path}: the token cache's data file {data_path} is missing; delete the "
                              "token_cache folder and run the same create again")
    return checked_index(CacheIndex(*fields), (task, key), fileio.size(data_path), index_path)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def region_bytes(index: CacheIndex, name: str, tokens: int) -> int:
    """The bytes of a region (REGIONS) of `tokens` tokens in the file: ids, or bits packed eight to a byte."""
    return tokens * np.dtype(index.ids).itemsize if name == "ids" else (tokens + 7) // 8


def read_regions(index: CacheIndex):
    """The regions read back from each shard (the word starts where the index says it has them)."""
    return REGIONS if index.word_starts else REGIONS[:2]


def index_problem(index: CacheIndex, names: tuple, data_bytes: int) -> Optional[str]:
    """What in an index (its fields as read from the file) the readers cannot trust, or None: every count,
    offset and checksum list is checked here, before any of them sizes an array or a read, so that a crafted
    index ends in one line instead of a wrong read (`names`: the task and key its file name says)."""
    if not _is_count(index.format) or index.format < 1:
        return f"format {index.format!r} is not a token cache format"
    if index.ids not in (("<i4",) if index.format == 1 else ("<u2", "<i4")):
        return f"ids {index.ids!r} is not an id type create writes in format {index.format}"
    if not _is_count(index.chunk_tokens) or index.chunk_tokens < 1:
        return f"chunk_tokens {index.chunk_tokens!r} is not a chunk size (at least 1)"
    if not isinstance(index.word_starts, bool):
        return f"word_starts {index.word_starts!r} is not true or false"
    if (index.task, index.key) != names:
        return f"task {index.task!r} and key {index.key!r} are not those of its file name"
    if not _is_count(index.skipped_files) or not isinstance(index.shards, list):
        return "skipped_files or shards is not what create writes"
    spans = []
    for number, shard in enumerate(index.shards):
        problem = _shard_problem(index, shard, data_bytes, spans)
        if problem:
            return f"shard {number}: {problem}"
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            return f"the {first} and the {second} overlap in the data file"
    return None


def _shard_problem(index: CacheIndex, shard, data_bytes: int, spans: list) -> Optional[str]:
    """index_problem's checks of one shard entry; appends its regions' (begin, end, name) to `spans`."""
    if not isinstance(shard, dict) or not isinstance(shard.get("path"), str):
        return "not an entry with a path"
    tokens = shard.get("tokens")
    if not _is_count(tokens) or tokens < 1:  # create leaves a file without tokens out (skipped_files)
        return f"tokens {tokens!r} is not a count of at least 1"
    for key in ("lines", "invalid_utf8_lines", "chars", "unk", "marks", "arabic_marks"):
        if key in shard and not _is_count(shard[key]):
            return f"{key} {shard[key]!r} is not a count"
    chunks = -(-tokens // index.chunk_tokens)
    for name in read_regions(index):
        begin, crcs = shard.get(f"{name}_offset"), shard.get(f"{name}_crc32c")
        end = begin + region_bytes(index, name, tokens) if _is_count(begin) else None
        if end is None or end > data_bytes:
            return (f"its {name} (offset {begin!r}, {tokens} tokens) do not lie inside the data file of "
                    f"{data_bytes} bytes")
        if crcs is None and index.format >= 2:
            return f"no CRC-32C list for its {name}"
        if crcs is not None and (not isinstance(crcs, list) or len(crcs) != chunks
                                 or not all(_is_count(crc) and crc < 1 << 32 for crc in crcs)):
            return f"its {name} need {chunks} CRC-32C values (one a chunk of {index.chunk_tokens} tokens)"
        spans.append((begin, end, f"{name} of {shard['path']}"))
    return None


def checked_index(index: CacheIndex, names: tuple, data_bytes: int, index_path: str) -> CacheIndex:
    """`index` when index_problem finds nothing in it, else TokenCacheError naming the file and the field."""
    problem = index_problem(index, names, data_bytes)
    if problem:
        raise TokenCacheError(f"{index_path}: the token cache's index is damaged ({problem}); delete the "
                              "token_cache folder and run the same create again")
    return index


def index_json(index: CacheIndex, files) -> dict:
    """The index file's object (`files`: the task's input files, those without tokens included)."""
    return {"format": index.format, "task": index.task, "key": index.key, "files": list(files),
            "skipped_files": index.skipped_files, "ids": index.ids, "chunk_tokens": index.chunk_tokens,
            "word_starts": index.word_starts, "shards": index.shards}


class _Chunks:
    """Arrays handed in one after another, given back cut into arrays of `size` elements (the last shorter, at
    flush), so that a region's checksummed chunks are the same however its file was read."""

    def __init__(self, size: int):
        self.size, self.pending, self.held = size, [], 0

    def add(self, array):
        self.pending.append(array)
        self.held += array.size
        if self.held >= self.size:
            data = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
            whole = data.size - data.size % self.size
            yield from (data[begin:begin + self.size] for begin in range(0, whole, self.size))
            self.pending = [data[whole:].copy()] if whole < data.size else []
            self.held = data.size - whole

    def flush(self):
        if self.held:
            yield np.concatenate(self.pending)
        self.pending, self.held = [], 0


SPILL_COPY_BYTES = 8 << 20  # bytes of a spilled bit region copied into the cache file at a time


class ShardWriter:
    """Writes one file's regions at `offset` of the cache file `out` as its blocks come (add), so that a file is
    never held whole: its ids straight into the file, its bits (flags, word starts: 1/8 byte a token each) packed
    into an unnamed temporary file (`spill_dir`'s; gone with the process, even a killed one), copied after the ids
    by finish. The same bytes and checksums as the file's regions written whole."""

    def __init__(self, out, offset: int, ids: str, word_starts: bool, spill_dir: Optional[str] = None,
                 chunk_tokens: int = CHUNK_TOKENS):
        self.out, self.offset, self.ids = out, offset, ids
        self.names = REGIONS if word_starts else REGIONS[:2]
        self.chunks = {name: _Chunks(chunk_tokens) for name in self.names}
        self.crcs = {name: [] for name in self.names}
        self.spills = {name: tempfile.TemporaryFile(dir=spill_dir) for name in self.names[1:]}
        self.entry = {"ids_offset": offset}

    def add(self, ids, flags, starts=None):
        """A block's ids, sentence flags and (where recorded) word starts, a token each."""
        for name, values in zip(self.names, (ids, flags, starts)):
            self._put(name, self.chunks[name].add(values))

    def _put(self, name, pieces):
        for piece in pieces:
            data = piece.astype(self.ids, copy=False) if name == "ids" else np.packbits(piece)
            fileio.write_array(self.out if name == "ids" else self.spills[name], data)
            self.crcs[name].append(int(crc32c(data.view(np.uint8))))
            if name == "ids":
                self.offset += data.nbytes

    def finish(self):
        """(the index entry's offsets and checksums, the offset after the file's regions)."""
        for name in self.names:
            self._put(name, self.chunks[name].flush())
            if name != "ids":
                spill = self.spills.pop(name)
                self.entry[f"{name}_offset"] = self.offset
                spill.seek(0)
                with spill:
                    while piece := spill.read(SPILL_COPY_BYTES):
                        self.out.write(piece)
                        self.offset += len(piece)
            self.entry[f"{name}_crc32c"] = self.crcs[name]
        return self.entry, self.offset

    def close(self):
        """Closes the temporary files (finish or not)."""
        for spill in self.spills.values():
            spill.close()


def put_flags(out, flag_pieces, prev_last):
    """Writes a shard's flags (consecutive bool arrays) to `out`, inverted whole when its first flag equals
    `prev_last` (the flag of the stream's token before it, None at the start), so that a sentence boundary
    falls between files."""
    pos, flip = 0, None
    for flags in flag_pieces:
        if flip is None:
            flip = prev_last is not None and bool(flags[0]) == prev_last
        np.logical_xor(flags, flip, out=out[pos:pos + flags.size])
        pos += flags.size


def _read_exactly(f, offset, out, what):
    """Fills the array `out` with the bytes at `offset` of the open cache file."""
    f.seek(offset)
    view = memoryview(out).cast("B")
    if hasattr(f, "readinto"):  # local files: straight into the array
        got = f.readinto(view)
    else:  # tf.io.gfile: by pieces, so that no copy of a whole file is made
        got = 0
        while got < view.nbytes:
            piece = f.read(min(view.nbytes - got, 1 << 24))
            if not piece:
                break
            view[got:got + len(piece)] = piece
            got += len(piece)
    if got != view.nbytes:
        raise TokenCacheError(f"{what}: the token cache is truncated; delete it (or the token_cache folder) "
                              "and run again")


def _read_region(f, index: CacheIndex, shard: dict, name: str, data_path: str):
    """Yields a shard's region (REGIONS) a chunk at a time, as (first token, ids in the file's type or bools),
    each chunk checked against its CRC-32C where the index has them (format 2)."""
    tokens, step, crcs = shard["tokens"], index.chunk_tokens, shard.get(f"{name}_crc32c")
    dtype = np.dtype(index.ids if name == "ids" else np.uint8)
    for k, begin in enumerate(range(0, tokens, step)):
        count = min(step, tokens - begin)
        buf = np.empty(count if name == "ids" else (count + 7) // 8, dtype=dtype)
        _read_exactly(f, shard[f"{name}_offset"] + (begin * dtype.itemsize if name == "ids" else begin // 8), buf,
                      data_path)
        if crcs is not None and int(crc32c(buf.view(np.uint8))) != crcs[k]:
            raise TokenCacheError(f"{data_path}: chunk {k} of the {name} of {shard['path']} (tokens {begin}.."
                                  f"{begin + count - 1}) fails its CRC-32C check: the token cache is damaged; delete "
                                  "it (or the token_cache folder) and run create again")
        yield begin, buf if name == "ids" else np.unpackbits(buf, count=count).view(bool)


def check_ids(chunk: np.ndarray, vocab_size: int, data_path: str, shard: dict, begin: int) -> None:
    """TokenCacheError when a chunk of a shard's ids (from token `begin`) holds an id outside [0, vocab_size): the
    compiled loops index tables with them (examples/loop.py: is_start[ids[k]]), so they are checked before that,
    a chunk at a time (two reductions: the cost of a copy)."""
    low, high = (int(chunk.min()), int(chunk.max())) if chunk.size else (0, 0)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        at = begin + int(np.flatnonzero(chunk == bad)[0])
        raise TokenCacheError(f"{data_path}: token {at} of {shard['path']} is id {bad}, outside the vocabulary "
                              f"[0, {vocab_size}) of its SentencePiece model: the token cache is damaged or not this "
                              "model's; delete it (or the token_cache folder) and run create again")


def read_stream(save_dir: str, index: CacheIndex, order, vocab_size: int):
    """The task's stream with the shards in `order`, read into memory: (ids int32, sent_ids bool, word starts bool
    or None where the cache has none), a shard whose first flag equals the previous shard's last flag inverted
    whole, so that a sentence boundary falls between files. Every id is checked to lie in [0, vocab_size)
    (check_ids). What mapped_stream gives where the cache cannot be mapped (a gs:// save_dir)."""
    data_path, _ = token_cache_paths(save_dir, index.task, index.key)
    ids = np.empty(index.tokens, dtype=np.int32)
    word_starts = np.empty(index.tokens, dtype=bool) if index.word_starts else None
    pos = 0
    with fileio.open_read(data_path) as f:
        for i in order:
            shard = index.shards[i]
            for begin, chunk in _read_region(f, index, shard, "ids", data_path):
                check_ids(chunk, vocab_size, data_path, shard, begin)
                ids[pos + begin:pos + begin + chunk.size] = chunk
            for begin, chunk in _read_region(f, index, shard, "starts", data_path) if index.word_starts else ():
                word_starts[pos + begin:pos + begin + chunk.size] = chunk
            pos += shard["tokens"]
    sent_ids = np.concatenate(list(stream_flags(save_dir, index, order))) if index.tokens else np.empty(0, bool)
    return ids, sent_ids, word_starts


def stream_flags(save_dir: str, index: CacheIndex, order):
    """Yields the sentence flags of the task's stream with the shards in `order`, a chunk (bool array) at a time,
    checked against their CRC-32C, each shard inverted as read_stream says (put_flags)."""
    data_path, _ = token_cache_paths(save_dir, index.task, index.key)
    prev_last = None
    with fileio.open_read(data_path) as f:
        for i in order:
            flip = None
            for _, flags in _read_region(f, index, index.shards[i], "flags", data_path):
                if flip is None:
                    flip = prev_last is not None and bool(flags[0]) == prev_last
                np.logical_xor(flags, flip, out=flags)
                prev_last = bool(flags[-1])
                yield flags


def _max_id_checked(f, index: CacheIndex, data_path: str, vocab_size: int) -> int:
    """Reads the cache's ids and word-start bits a chunk at a time against their checksums (TokenCacheError at
    the first that fails) and the ids against the vocabulary (check_ids); returns the largest id (-1 for none)."""
    largest = -1
    for shard in index.shards:
        for begin, ids in _read_region(f, index, shard, "ids", data_path):
            check_ids(ids, vocab_size, data_path, shard, begin)
            largest = max(largest, int(ids.max()))
        for _ in _read_region(f, index, shard, "starts", data_path) if index.word_starts else ():
            pass
    return largest


def mapped_stream(save_dir: str, index: CacheIndex, order, vocab_size: int) -> layout.TokenStream:
    """The task's stream with the shards in `order` (read_stream's), as the loop reads it without holding it: the
    cache file mapped into memory (read-only), one segment a shard, its ids and word-start bits checked against
    their checksums and the ids against [0, vocab_size) first (the flags as they are read, twice, by stream_flags).
    The mapped pages are the page cache's: TokenStream.release drops those read from the process, so that a unit's
    resident memory does not grow with its stream; the file stays open beside the map, for the reads that would
    fault in pages for a few ids (layout.copy_read), until TokenStream.close (the stream's owner, a unit's loop,
    closes it where it ends). A gs:// cache, which cannot be mapped, is read into memory
    (read_stream)."""
    data_path, _ = token_cache_paths(save_dir, index.task, index.key)
    if fileio.is_remote(data_path) or not index.tokens:
        return layout.in_memory_stream(*read_stream(save_dir, index, order, vocab_size))
    file = open(data_path, "rb")  # kept open with the stream: a B drawn anywhere is read from it (layout.copy_read)
    try:
        max_id = _max_id_checked(file, index, data_path, vocab_size)
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except BaseException:
        file.close()
        raise
    source = np.frombuffer(mapped, dtype=np.uint8)
    shards = [index.shards[i] for i in order]
    seg_starts = np.zeros(len(shards) + 1, dtype=np.int64)
    seg_starts[1:] = np.cumsum([shard["tokens"] for shard in shards])
    seg_ids = np.array([shard["ids_offset"] for shard in shards], dtype=np.int64)
    # read_index checked a shard's word-start region only where the index names word starts
    seg_bits = np.array([shard["starts_offset"] if index.word_starts else 0 for shard in shards], dtype=np.int64)
    return layout.TokenStream(index.tokens, source, np.dtype(index.ids).itemsize, source, index.word_starts,
                              seg_starts, seg_ids, seg_bits, lambda: stream_flags(save_dir, index, order), max_id,
                              lambda: mapped.madvise(mmap.MADV_DONTNEED), file)


def verify(save_dir: str, index: CacheIndex) -> None:
    """Reads every chunk of the cache against its checksum (TokenCacheError, naming the chunk, at the first that
    fails): what a failed read of train_gpu's input pipeline ran into."""
    data_path, _ = token_cache_paths(save_dir, index.task, index.key)
    with fileio.open_read(data_path) as f:
        for shard in index.shards:
            for name in read_regions(index):
                for _ in _read_region(f, index, shard, name, data_path):
                    pass


def cache_reference(save_dir: str, sp_path: str, index: CacheIndex) -> dict:
    """What a cache-backed unit's record_info says of the cache its records are made from (--write_records=false):
    enough to find it and to tell a stale or damaged one (examples/generated.py checks it)."""
    data_path, _ = token_cache_paths(save_dir, index.task, index.key)
    return {"task": index.task, "key": index.key, "tokens": index.tokens, "bytes": fileio.size(data_path),
            "sp_sha256": sha256_of(sp_path)}


def referenced_cache_exists(save_dir: str, reference: dict) -> bool:
    data_path, index_path = token_cache_paths(save_dir, reference["task"], reference["key"])
    return fileio.exists(index_path) and fileio.exists(data_path)
