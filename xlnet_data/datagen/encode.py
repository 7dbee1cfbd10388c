"""The encode stage of `create`: a task's files read, normalised and encoded once per run, for all its passes.

Passes differ only in the shard order, the A/B draws and the masks, so a task's files are encoded once into
its token cache (dataformat/token_cache.py: the files and how they are read back) and every (task, pass) unit
reads it back in its own order.

A task that the plan encodes in memory (plan.TaskPlan.in_memory: one unit to run, one pass, and no complete
cache) is encoded by encode_in_memory instead, and its unit takes the stream from there: the same stream,
without writing 2.1 bytes a token and reading them back.

With --word_boundaries other than `spaces` each token also gets its word-start bit (dataformat/words.py), which the
pass loop reads instead of the piece-id table.

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

import numpy as np

from xlnet_data.common import fileio, memory
from xlnet_data.dataformat import token_cache
from xlnet_data.dataformat.examples import layout
from xlnet_data.dataformat.save_dir import token_cache_paths, write_json
from xlnet_data.dataformat.vocab import start_piece_table
from xlnet_data.dataformat.words import WordStarts
from xlnet_data.datagen import corpus
from xlnet_data.datagen.text import Encoder

log = logging.getLogger("xlnet_data")


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """How a task's files are read into ids (create's flags of these names)."""
    from_raw_text: bool
    uncased: bool
    keep_accents: bool
    use_eod: bool
    strict: bool
    allow_binary: bool
    word_boundaries: str = "spaces"  # words.WORD_BOUNDARIES
    encoder: str = "auto"  # who encodes (encoder_check.ENCODERS); the same ids whichever does

    @classmethod
    def of(cls, config) -> "EncodeSettings":
        """The settings of a config with these fields' names (CreateConfig)."""
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})


@dataclasses.dataclass
class EncodeResult:
    task: int
    encoded: bool  # False: a complete cache was found
    tokens: int = 0


def cache_key(settings: EncodeSettings, files, model_sha256: str) -> str:
    """A digest of what a task's ids are made from: its files as they are now, the model (`model_sha256`, its
    bytes' hash: provenance.sha256_of), the encode flags (allow_binary apart: it refuses files, changes no id)."""
    made_from = {"format": token_cache.CACHE_FORMAT,
                 "files": [[path, fileio.size(path), fileio.modified_ns(path)] for path in files],
                 "model": model_sha256, "from_raw_text": settings.from_raw_text, "uncased": settings.uncased,
                 "keep_accents": settings.keep_accents, "use_eod": settings.use_eod, "strict": settings.strict,
                 "word_boundaries": settings.word_boundaries}
    return hashlib.sha256(json.dumps(made_from).encode()).hexdigest()[:16]


def _read_settings(settings: EncodeSettings, sp, on_progress):
    """corpus.shard_blocks' keyword arguments for `settings`."""
    spaces = settings.word_boundaries == "spaces"
    read_settings = {**dataclasses.asdict(settings), "word_starts": None if spaces else
                     WordStarts.of(sp, settings.word_boundaries),
                     "start_pieces": start_piece_table(sp) if spaces and settings.from_raw_text else None,
                     "vocab_size": sp.get_piece_size(), "on_progress": on_progress}
    del read_settings["word_boundaries"], read_settings["encoder"]
    return read_settings


def _encoder(settings: EncodeSettings, sp, encode_threads):
    return Encoder(sp, encode_threads, settings.encoder) if settings.from_raw_text else None


def _no_tokens(path):
    log.warning("%s: no tokens (empty, or only blank lines without --use_eod); skipped", path)


def _encoded_shards(settings: EncodeSettings, files, sp, on_progress, encode_threads):
    """Each file's corpus.Shard in file order, or None for a file without tokens (warned about)."""
    encoder, read_settings = _encoder(settings, sp, encode_threads), _read_settings(settings, sp, on_progress)
    for path in files:
        shard = corpus.read_shard(path, encoder, **read_settings)
        if shard is None:
            _no_tokens(path)
        yield shard


def _entry(path, stats: corpus.FileStats):
    """A file's entry of the index, its offsets in the cache file apart."""
    return {"path": path, "tokens": stats.tokens, "lines": stats.lines,
            "invalid_utf8_lines": stats.invalid_utf8_lines, "chars": stats.chars, "unk": stats.unk,
            "marks": stats.stripped.letters, "arabic_marks": stats.stripped.arabic}


def encode_task(save_dir: str, settings: EncodeSettings, task, files, key, sp, on_progress=None,
                encode_threads=-1) -> EncodeResult:
    """Writes the task's token cache in `save_dir` unless a complete one exists under `key`."""
    found = token_cache.read_index(save_dir, task, key)
    if found is not None:
        log.info("task %d: token cache found (%d tokens); not encoded again", task, found.tokens)
        return EncodeResult(task, encoded=False, tokens=found.tokens)
    data_path, index_path = token_cache_paths(save_dir, task, key)
    fileio.makedirs(os.path.dirname(data_path))
    index = token_cache.CacheIndex(task, key, [], 0, ids=token_cache.id_dtype(sp.get_piece_size()),
                                   word_starts=settings.word_boundaries != "spaces")
    encoder, read_settings = _encoder(settings, sp, encode_threads), _read_settings(settings, sp, on_progress)
    spill_dir = None if fileio.is_remote(data_path) else os.path.dirname(data_path)
    offset = 0
    with fileio.atomic_write(data_path) as out:
        for path in files:  # each file a block at a time, written as read: no file is held whole
            stats = corpus.FileStats()
            writer = token_cache.ShardWriter(out, offset, index.ids, index.word_starts, spill_dir, index.chunk_tokens)
            try:
                for block in corpus.shard_blocks(path, encoder, stats, **read_settings):
                    writer.add(*block)
                    del block
                if not stats.tokens:
                    _no_tokens(path)
                    index.skipped_files += 1
                    continue
                entry, offset = writer.finish()
            finally:
                writer.close()
            index.shards.append({**_entry(path, stats), **entry})
    write_json(index_path, token_cache.index_json(index, files))
    shards = index.shards
    tokens = sum(shard["tokens"] for shard in shards)
    log.info("task %d: %d files encoded (%d tokens) into its token cache", task, len(shards), tokens)
    return EncodeResult(task, encoded=True, tokens=tokens)


@dataclasses.dataclass
class EncodedTask:
    """A task's files encoded and held in memory, for a task with one unit to run and no cache: its pass
    takes the stream from here, without the round trip through the token cache (2.1 bytes a token written
    to the page cache, read back and unpacked). The same ids and flags as the cache would give, and no more
    memory: the stream is filled as the encoded files are released."""
    index: token_cache.CacheIndex  # shard entries without offsets
    shards: list  # corpus.Shard of each entry

    def stream(self, order) -> layout.TokenStream:
        """token_cache.mapped_stream's stream, with the shards in `order`, in memory; the shards are released as
        copied (so the stream can be made once)."""
        ids = np.empty(self.index.tokens, dtype=np.int32)
        sent_ids = np.empty(self.index.tokens, dtype=bool)
        word_starts = np.empty(self.index.tokens, dtype=bool) if self.index.word_starts else None
        pos, prev_last = 0, None
        for i in order:
            shard, self.shards[i] = self.shards[i], None
            end = pos + shard.num_tokens
            for chunks, out in ((shard.ids, ids), (shard.word_starts, word_starts)):
                at = pos
                for chunk in _released(chunks) if out is not None else ():
                    out[at:at + chunk.size] = chunk
                    at += chunk.size
            token_cache.put_flags(sent_ids[pos:end], _released(shard.sent_ids), prev_last)
            pos = end
            prev_last = bool(sent_ids[pos - 1])
        return layout.in_memory_stream(ids, sent_ids, word_starts)


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


def encode_in_memory(settings: EncodeSettings, task, files, sp, on_progress=None, encode_threads=-1) -> EncodedTask:
    """The task's files encoded as encode_task encodes them, held in memory (see EncodedTask)."""
    shards = list(_encoded_shards(settings, files, sp, on_progress, encode_threads))
    kept = [shard for shard in shards if shard is not None]
    index = token_cache.CacheIndex(task, "", [_entry(shard.path, shard.stats) for shard in kept], len(shards) - len(kept),
                                   word_starts=settings.word_boundaries != "spaces")
    encoded = EncodedTask(index, kept)
    log.info("task %d: %d files encoded (%d tokens) in memory, for its one unit", task, len(kept), encoded.index.tokens)
    return encoded
