"""The encode stage of `create`: a task's files read, normalised and encoded once per run, for all its passes.

Passes differ only in the shard order, the A/B draws and the masks, so a task's files are encoded once
into a token cache in save_dir (see common/save_dir.py for its names) and every (task, pass) unit
reads it back in its own order. The cache is two files:

- `tokens-{task}.{key}.bin`: file after file, its ids (int32, little-endian) then its sentence flags
  packed eight to a byte (np.packbits, the last byte zero-padded): about 4.1 bytes a token;
- `tokens-{task}.{key}.json`: the index (each file's offsets, token and line counts), written last, so
  that its presence means the cache is complete.

A task with one unit to run in a run (one pass) and no complete cache is encoded into memory instead
(encode_in_memory) and its unit takes the stream from there: the same stream, without writing 4.1 bytes
a token and reading them back.

Both files are written atomically. `key` hashes everything the ids depend on: the files (path, size,
modification time), the SentencePiece model's bytes and the encode flags, so a stale cache is never
read; a re-run after a kill finds a complete cache and does not encode the task again. `create`
removes the caches when the run completes (unless --keep_cache).
"""

import dataclasses
import hashlib
import json
import logging
import os
from typing import Optional

import numpy as np

from xlnet_data.common import fileio, memory, save_dir
from xlnet_data.common.errors import UserError
from xlnet_data.datagen import corpus, provenance
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.text import Encoder

log = logging.getLogger("xlnet_data")

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


@dataclasses.dataclass
class EncodeResult:
    task: int
    encoded: bool  # False: a complete cache was found
    tokens: int = 0


def cache_key(config: CreateConfig, files, model_sha256=None) -> str:
    """A digest of what a task's ids are made from: its files as they are now, the model (`model_sha256`, its
    bytes' hash, computed when not given), the encode flags."""
    model = model_sha256 or provenance.sha256_of(config.sp_path)
    made_from = {"format": CACHE_FORMAT, "files": [[path, fileio.size(path), fileio.modified_ns(path)] for path in files],
                 "model": model, "from_raw_text": config.from_raw_text, "uncased": config.uncased,
                 "keep_accents": config.keep_accents, "use_eod": config.use_eod, "strict": config.strict}
    return hashlib.sha256(json.dumps(made_from).encode()).hexdigest()[:16]


def read_index(config: CreateConfig, task, key) -> Optional[CacheIndex]:
    """The index of the task's complete cache under `key`, or None when there is none."""
    _, index_path = save_dir.token_cache_paths(config.save_dir, task, key)
    if not fileio.exists(index_path):
        return None
    index = json.loads(fileio.read_text(index_path))
    return CacheIndex(index["task"], index["key"], index["shards"], index["skipped_files"])


def _packed(flag_chunks):
    """The flags of a shard packed eight to a byte, chunk by chunk (a chunk's last < 8 flags carry over)."""
    rest = np.empty(0, dtype=bool)
    for chunk in flag_chunks:
        flags = np.concatenate([rest, chunk]) if rest.size else chunk
        whole = flags.size - flags.size % 8
        yield np.packbits(flags[:whole])
        rest = flags[whole:]
    if rest.size:
        yield np.packbits(rest)


def _encoded_shards(config: CreateConfig, files, sp, on_progress, encode_threads):
    """Each file's corpus.Shard in file order, or None for a file without tokens (warned about)."""
    encoder = Encoder(sp, encode_threads) if config.from_raw_text else None
    for path in files:
        shard = corpus.read_shard(path, encoder, from_raw_text=config.from_raw_text, uncased=config.uncased,
                                  keep_accents=config.keep_accents, use_eod=config.use_eod,
                                  vocab_size=sp.get_piece_size(), strict=config.strict,
                                  allow_binary=config.allow_binary, on_progress=on_progress)
        if shard is None:
            log.warning("%s: no tokens (empty, or only blank lines without --use_eod); skipped", path)
        yield shard


def _entry(shard):
    """A shard's entry of the index, its offsets in the cache file apart."""
    stats = shard.stats
    return {"path": shard.path, "tokens": shard.num_tokens, "lines": stats.lines,
            "invalid_utf8_lines": stats.invalid_utf8_lines, "chars": stats.chars, "unk": stats.unk,
            "marks": stats.stripped.letters, "arabic_marks": stats.stripped.arabic}


def encode_task(config: CreateConfig, task, files, key, sp, on_progress=None, encode_threads=-1) -> EncodeResult:
    """Writes the task's token cache unless a complete one exists under `key`."""
    found = read_index(config, task, key)
    if found is not None:
        log.info("task %d: token cache found (%d tokens); not encoded again", task, found.tokens)
        return EncodeResult(task, encoded=False, tokens=found.tokens)
    data_path, index_path = save_dir.token_cache_paths(config.save_dir, task, key)
    fileio.makedirs(os.path.dirname(data_path))
    shards, skipped, offset = [], 0, 0
    with fileio.atomic_write(data_path) as out:
        for shard in _encoded_shards(config, files, sp, on_progress, encode_threads):
            if shard is None:
                skipped += 1
                continue
            entry = {**_entry(shard), "ids_offset": offset}
            flag_chunks = []
            while shard.ids:  # released as written: the file is never held twice
                chunk = shard.ids.pop(0)
                fileio.write_array(out, chunk.astype("<i4", copy=False))
                memory.freed(chunk.nbytes)
                flag_chunks.append(shard.sent_ids.pop(0))
            offset += 4 * shard.num_tokens
            entry["flags_offset"] = offset
            for packed in _packed(flag_chunks):
                fileio.write_array(out, packed)
                offset += packed.size
            shards.append(entry)
            memory.freed(sum(flags.nbytes for flags in flag_chunks))
            del shard, flag_chunks
    index = {"format": CACHE_FORMAT, "task": task, "key": key, "files": list(files), "skipped_files": skipped,
             "shards": shards}
    save_dir.write_json(index_path, index)
    tokens = sum(shard["tokens"] for shard in shards)
    log.info("task %d: %d files encoded (%d tokens) into its token cache", task, len(shards), tokens)
    return EncodeResult(task, encoded=True, tokens=tokens)


@dataclasses.dataclass
class EncodedTask:
    """A task's files encoded and held in memory, for a task with one unit to run and no cache: its pass
    takes the stream from here, without the round trip through the token cache (4.1 bytes a token written
    to the page cache, read back and unpacked). The same ids and flags as the cache would give, and no more
    memory: the stream is filled as the encoded files are released."""
    index: CacheIndex  # shard entries without offsets
    shards: list  # corpus.Shard of each entry

    def stream(self, order):
        """read_stream's (ids, sent_ids) with the shards in `order`; the shards are released as copied (so
        the stream can be made once)."""
        ids = np.empty(self.index.tokens, dtype=np.int32)
        sent_ids = np.empty(self.index.tokens, dtype=bool)
        pos, prev_last = 0, None
        for i in order:
            shard, self.shards[i] = self.shards[i], None
            end = pos + shard.num_tokens
            at = pos
            for chunk in _released(shard.ids):
                ids[at:at + chunk.size] = chunk
                at += chunk.size
            _put_flags(sent_ids[pos:end], _released(shard.sent_ids), prev_last)
            pos = end
            prev_last = bool(sent_ids[pos - 1])
        return ids, sent_ids


def _released(chunks):
    """Yields the arrays of the list `chunks`, taking each out of it and counting it as freed (memory.freed
    hands the memory back to the system every RETURN_EVERY_BYTES), so that a file copied into the stream is
    held twice by at most that much."""
    while chunks:
        chunk = chunks.pop(0)
        nbytes = chunk.nbytes
        yield chunk
        del chunk
        memory.freed(nbytes)


def encode_in_memory(config: CreateConfig, task, files, sp, on_progress=None, encode_threads=-1) -> EncodedTask:
    """The task's files encoded as encode_task encodes them, held in memory (see EncodedTask)."""
    shards = list(_encoded_shards(config, files, sp, on_progress, encode_threads))
    kept = [shard for shard in shards if shard is not None]
    encoded = EncodedTask(CacheIndex(task, "", [_entry(shard) for shard in kept], len(shards) - len(kept)), kept)
    log.info("task %d: %d files encoded (%d tokens) in memory, for its one unit", task, len(kept), encoded.index.tokens)
    return encoded


def _put_flags(out, flag_pieces, prev_last):
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


def read_stream(config: CreateConfig, index: CacheIndex, order):
    """The task's stream with the shards in `order`: (ids int32, sent_ids bool), a shard whose first flag
    equals the previous shard's last flag inverted whole, so that a sentence boundary falls between files."""
    data_path, _ = save_dir.token_cache_paths(config.save_dir, index.task, index.key)
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
            _put_flags(sent_ids[pos:end], flag_pieces(f, shard), prev_last)
            pos = end
            prev_last = bool(sent_ids[pos - 1])
    return ids, sent_ids


def model_digest(sp_path) -> str:
    with fileio.open_read(sp_path) as f:
        return hashlib.sha256(f.read()).hexdigest()


def cache_reference(config: CreateConfig, index: CacheIndex) -> dict:
    """What a cache-backed unit's record_info says of the cache its records are made from (--write_records=false):
    enough to find it and to tell a stale or damaged one (datagen/generated.py checks it)."""
    data_path, _ = save_dir.token_cache_paths(config.save_dir, index.task, index.key)
    return {"task": index.task, "key": index.key, "tokens": index.tokens, "bytes": fileio.size(data_path),
            "sp_sha256": model_digest(config.sp_path)}


def referenced_cache_exists(config: CreateConfig, reference: dict) -> bool:
    data_path, index_path = save_dir.token_cache_paths(config.save_dir, reference["task"], reference["key"])
    return fileio.exists(index_path) and fileio.exists(data_path)


def remove(config: CreateConfig):
    """Deletes the token caches of the run's tasks (when the run has completed)."""
    save_dir.remove_token_caches(config.save_dir, config.tasks)
