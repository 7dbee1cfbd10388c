"""A task's token cache, as `create` writes it and readers (create's passes, train_gpu and dump on a
cache-backed save_dir) read it back; its file names are save_dir.py's.

A cache is two files in save_dir/token_cache:

- `tokens-{task}.{key}.bin`: file after file, its ids (int32, little-endian) then its sentence flags
  packed eight to a byte (np.packbits, the last byte zero-padded): about 4.1 bytes a token;
- `tokens-{task}.{key}.json`: the index (each file's offsets, token and line counts), written last, so
  that its presence means the cache is complete.

`key` hashes everything the ids depend on (datagen/encode.py makes it), so a stale cache is never read.
A unit reads its task's stream back with the files in its own seeded order (examples/loop.py).
"""

import dataclasses
import json
from typing import Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat.provenance import sha256_of
from xlnet_data.dataformat.save_dir import token_cache_paths

CACHE_FORMAT = 1
FLAG_PIECE_TOKENS = 1 << 20  # flags unpacked this many at a time when a stream is read back (1 MB of scratch)


class TokenCacheError(UserError, ValueError):
    """A token cache that is missing or does not hold what its index says; the message says what to do."""


@dataclasses.dataclass
class CacheIndex:
    """What a token cache holds: its shards (files with tokens) in file order, and the counts of the task."""
    task: int
    key: str
    shards: list[dict]  # {"path", "tokens", "lines", "invalid_utf8_lines", "chars", "unk", "marks", "arabic_marks",
    #                      "ids_offset", "flags_offset"}: see units.input_counts
    skipped_files: int  # files without any token

    @property
    def tokens(self):
        return sum(shard["tokens"] for shard in self.shards)


def read_index(save_dir: str, task: int, key: str) -> Optional[CacheIndex]:
    """The index of the task's complete cache under `key`, or None when there is none."""
    _, index_path = token_cache_paths(save_dir, task, key)
    if not fileio.exists(index_path):
        return None
    index = json.loads(fileio.read_text(index_path))
    return CacheIndex(index["task"], index["key"], index["shards"], index["skipped_files"])


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


def read_stream(save_dir: str, index: CacheIndex, order):
    """The task's stream with the shards in `order`: (ids int32, sent_ids bool), a shard whose first flag
    equals the previous shard's last flag inverted whole, so that a sentence boundary falls between files."""
    data_path, _ = token_cache_paths(save_dir, index.task, index.key)
    ids = np.empty(index.tokens, dtype=np.int32)
    sent_ids = np.empty(index.tokens, dtype=bool)
    pos, prev_last = 0, None

    def flag_pieces(f, shard):
        for begin in range(0, shard["tokens"], FLAG_PIECE_TOKENS):
            count = min(FLAG_PIECE_TOKENS, shard["tokens"] - begin)
            packed = np.empty((count + 7) // 8, dtype=np.uint8)
            _read_exactly(f, shard["flags_offset"] + begin // 8, packed, data_path)
            yield np.unpackbits(packed, count=count).view(bool)

    with fileio.open_read(data_path) as f:
        for i in order:
            shard = index.shards[i]
            end = pos + shard["tokens"]
            _read_exactly(f, shard["ids_offset"], ids[pos:end], data_path)
            put_flags(sent_ids[pos:end], flag_pieces(f, shard), prev_last)
            pos = end
            prev_last = bool(sent_ids[pos - 1])
    return ids, sent_ids


def cache_reference(save_dir: str, sp_path: str, index: CacheIndex) -> dict:
    """What a cache-backed unit's record_info says of the cache its records are made from (--write_records=false):
    enough to find it and to tell a stale or damaged one (examples/generated.py checks it)."""
    data_path, _ = token_cache_paths(save_dir, index.task, index.key)
    return {"task": index.task, "key": index.key, "tokens": index.tokens, "bytes": fileio.size(data_path),
            "sp_sha256": sha256_of(sp_path)}


def referenced_cache_exists(save_dir: str, reference: dict) -> bool:
    data_path, index_path = token_cache_paths(save_dir, reference["task"], reference["key"])
    return fileio.exists(index_path) and fileio.exists(data_path)
