"""A cache-backed save_dir's records, made on demand: the bytes create would have written, without writing them.

`create --write_records=false` keeps each task's token cache and writes, per (task, pass) unit, a record_info
whose `token_cache` entry names the cache (record_info.TOKEN_CACHE_KEY) and whose `num_batch` is the count of
the records it would hold. Here a unit's records are made again by the loop that writes them (loop.UnitLoop:
the same stream, seeds `100 * task + pass_id`, pairing and masking), so they are create's, byte for byte. train_gpu
feeds them to its input pipeline (pretrain/cache_input.py) and dump shows them; both read them through
GeneratedStream, which walks the units in stream order, a chunk of steps at a time, and remembers where its
random streams stood at the start of recent chunks, so that a checkpoint can hold the position (`Position`)
and a resumed run start there instead of at the start of the pass. No TensorFlow here.
"""

import collections
import dataclasses
import functools
import logging
import os
import threading
from typing import Optional

import numpy as np

from xlnet_data.common import compiled, fileio
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import provenance, record_info, records, save_dir, token_cache
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.dataformat.examples import rng
from xlnet_data.dataformat.examples.loop import ExampleSettings, Unit, UnitLoop, steps_per_chunk, unit_rows
from xlnet_data.dataformat.token_cache import TokenCacheError
from xlnet_data.dataformat.vocab import load_sentencepiece, start_piece_table

log = logging.getLogger("xlnet_data")

CHUNK_BYTES = 4 << 20  # records made per call of the compiled loop (a chunk of whole steps, one unit's)
HISTORY_CHUNKS = 512  # chunk starts remembered for Position (the input pipeline runs at most this far ahead)


@dataclasses.dataclass(frozen=True)
class CacheUnit:
    """A cache-backed unit as its record_info describes it."""
    info_path: str
    num_batch: int
    unit: Unit
    settings: ExampleSettings
    save_dir: str  # where the token cache is
    sp_path: str  # the SentencePiece model create ran with (whole-word spans need its pieces)
    reference: dict  # record_info's token_cache entry (token_cache.cache_reference)
    word_boundaries: str = "spaces"  # create --word_boundaries: the cache holds the word starts the masks follow


def cache_unit(info_path: str, info: dict, num_batch: int, sp_path: Optional[str] = None) -> CacheUnit:
    """The CacheUnit of a record_info (`info`, read from `info_path`); SaveDirError when it cannot say one.
    sp_path: where its SentencePiece model is now (a reader's --sp_path), else where create recorded it
    (record_info.recorded_model); check_cache checks that it is the model by its sha256."""
    settings, reference = info.get(record_info.SETTINGS_KEY), info.get(record_info.TOKEN_CACHE_KEY)
    parsed = save_dir.parse_name(info_path)
    if not isinstance(settings, dict) or not isinstance(reference, dict) or parsed is None or parsed.task is None:
        raise save_dir.SaveDirError(f"{info_path}: a token_cache entry without create_settings (or a renamed file); "
                                    "re-create the unit")
    try:  # create's rules, before the compiled loop indexes its arrays by these settings
        example_settings = ExampleSettings.from_create_settings(settings)
    except ConfigError as err:
        raise save_dir.SaveDirError(f"{info_path}: its create_settings are not settings create runs with ({err}); "
                                    "re-create the unit") from None
    root = os.path.dirname(os.path.dirname(os.path.abspath(info_path)))  # save_dir/tfrecords/record_info-…
    return CacheUnit(info_path, num_batch, Unit(parsed.task, parsed.pass_id), example_settings, root,
                     sp_path or record_info.recorded_model(info_path, info), reference,
                     settings.get("word_boundaries", "spaces"))


def _rerun_hint(unit: CacheUnit):
    return (f"re-run create with the same flags, --nowrite_records and --overwrite (save_dir "
            f"{unit.save_dir})")


def check_cache(unit: CacheUnit) -> token_cache.CacheIndex:
    """The unit's cache index, after checking that the cache is there and is the one its record_info was counted
    from (tokens, bytes, SentencePiece model); TokenCacheError, one line naming the file, when not."""
    ref = unit.reference
    data_path, index_path = save_dir.token_cache_paths(unit.save_dir, ref["task"], ref["key"])
    for path in (index_path, data_path):
        if not fileio.exists(path):
            raise TokenCacheError(f"{unit.info_path}: its token cache {path} is missing; {_rerun_hint(unit)}")
    index = token_cache.read_index(unit.save_dir, ref["task"], ref["key"])
    size = fileio.size(data_path)
    if unit.word_boundaries != "spaces" and not index.word_starts:
        raise TokenCacheError(f"{data_path}: the token cache has no word starts, but {unit.info_path} was made with "
                              f"--word_boundaries={unit.word_boundaries}; {_rerun_hint(unit)}")
    if index.tokens != ref["tokens"] or size != ref["bytes"]:
        raise TokenCacheError(f"{data_path}: stale token cache: it holds {index.tokens} tokens in {size} bytes, but "
                              f"{unit.info_path} was counted from {ref['tokens']} tokens in {ref['bytes']} bytes; "
                              f"{_rerun_hint(unit)}")
    sp_path = unit.sp_path
    if not fileio.exists(sp_path):
        raise TokenCacheError(f"{unit.info_path}: the SentencePiece model {sp_path} (its create_settings' sp_path, "
                              "needed to mask whole-word spans) is missing; put it back there, or give its new "
                              "place (--sp_path)")
    sha256 = provenance.sha256_of(sp_path)
    if sha256 != ref.get("sp_sha256"):
        raise TokenCacheError(f"{sp_path} is not the SentencePiece model {unit.info_path} was made with (sha256 "
                              f"{sha256[:12]}..., the unit's {str(ref.get('sp_sha256'))[:12]}...); give that model "
                              f"(--sp_path), or {_rerun_hint(unit)}")
    return index


@functools.lru_cache(maxsize=4)
def _start_piece_table(sp_sha256, sp_path):
    """The model's word-start table, made once per model (keyed on its content): every unit opens a loop, again
    on every cycle of the stream."""
    return start_piece_table(load_sentencepiece(sp_path))


def open_loop(unit: CacheUnit, vocab_size: Optional[int] = None) -> UnitLoop:
    """The unit's loop at its first step: its task's stream read back in the unit's order, laid out, seeded; a
    context manager, which closes the stream's mapped file."""
    index = check_cache(unit)
    is_start = _start_piece_table(provenance.sha256_of(unit.sp_path), unit.sp_path)  # check_cache hashed it
    # the model's vocabulary (is_start's size: the loop reads is_start[id]), or a training model's smaller one
    vocabulary = is_start.size if vocab_size is None else min(vocab_size, is_start.size)
    rows, random_state = unit_rows(unit.settings, unit.unit, len(index.shards),
                                   functools.partial(token_cache.mapped_stream, unit.save_dir, index,
                                                     vocab_size=vocabulary))
    return UnitLoop(unit.settings, rows, is_start, rng.numpy_state(random_state), rng.python_state(unit.unit.seed))


@compiled.jit()
def record_frames(buf, nbytes, keep, steps):
    """(offsets, lengths) of the payloads of `steps` steps of framed records in buf[:nbytes], one slot per row of
    each step; rows without `keep` were not written and get length 0."""
    bsz = keep.shape[0]
    offsets = np.zeros(steps * bsz, dtype=np.int64)
    lengths = np.zeros(steps * bsz, dtype=np.int64)
    pos = 0
    for k in range(steps * bsz):
        if not keep[k % bsz]:
            continue
        length = 0
        for b in range(8):
            length |= np.int64(buf[pos + b]) << (8 * b)
        offsets[k] = pos + 12
        lengths[k] = length
        pos += length + 16
    if pos != nbytes:
        raise ValueError("record frames do not fill the buffer")
    return offsets, lengths


@dataclasses.dataclass(frozen=True)
class Position:
    """Where generation can start again: at global step `step` (counted from the start of the stream, cycles
    included, at a chunk start), with the random streams in these states (rng's 625-slot arrays)."""
    step: int
    numpy_mt: np.ndarray
    python_mt: np.ndarray


class GeneratedStream:
    """The records of cache-backed units, in order, as chunks: (bytes of framed records, payload offsets,
    payload lengths), `bsz_per_host` slots a step (a row not in `keep` is an empty slot).

    `chunks(start_step, resume)` starts at a global step (repeating the units forever with `repeat`); from
    `resume` (a Position at or before it, in the same unit) it makes only the steps between, unserialised,
    else it makes the unit's steps before it that way from the unit's start (logged). `position(step)` is the
    latest remembered chunk start at or before `step`, for a checkpoint.
    """

    def __init__(self, cache_units, keep=None, repeat=True, vocab_size=None, chunk_bytes=None):
        self.units = list(cache_units)
        if not self.units:
            raise ValueError("no cache-backed unit to generate from")
        for unit in self.units:  # a missing or stale cache is one line now, not an error inside the pipeline
            check_cache(unit)
        settings = self.units[0].settings
        self.bsz = settings.bsz_per_host
        self.keep = np.ones(self.bsz, dtype=np.bool_) if keep is None else np.asarray(keep, dtype=np.bool_)
        self.repeat, self.vocab_size = repeat, vocab_size
        self.chunk_steps = steps_per_chunk(settings.bsz_per_host, settings.seq_len, chunk_bytes or CHUNK_BYTES)
        self.ends = np.cumsum([unit.num_batch for unit in self.units])
        self.total = int(self.ends[-1])
        self._history = collections.deque(maxlen=HISTORY_CHUNKS)
        self._lock = threading.Lock()

    def _remember(self, step, loop):
        with self._lock:
            self._history.append(Position(step, loop.np_mt.copy(), loop.py_mt.copy()))

    def position(self, step: int) -> Optional[Position]:
        with self._lock:
            found = [p for p in self._history if p.step <= step]
        return found[-1] if found else None

    def _locate(self, step):
        """(unit index, global step of the unit's first step) of a global step."""
        cycle, within = divmod(step, self.total)
        i = int(np.searchsorted(self.ends, within, side="right"))
        return i, cycle * self.total + int(self.ends[i] - self.units[i].num_batch)

    def chunks(self, start_step=0, resume: Optional[Position] = None):
        if not self.repeat and start_step >= self.total:
            return
        i, unit_start = self._locate(start_step)
        step = start_step
        while True:
            unit = self.units[i]
            # the unit's mapped cache file closed at its end, or where the consumer stops (the generator closed)
            with open_loop(unit, self.vocab_size) as loop:
                at = 0  # the loop's next step in the unit
                if resume is not None and unit_start <= resume.step <= step:
                    loop.np_mt[:], loop.py_mt[:] = resume.numpy_mt, resume.python_mt
                    at = resume.step - unit_start
                elif step > unit_start:
                    log.info("%s: no saved position in the checkpoint; making its first %d steps again to resume",
                             unit.info_path, step - unit_start)
                resume = None
                at = self._skip(loop, unit, at, step - unit_start)
                buf = np.empty(self.chunk_steps * self.bsz * records.max_record_bytes(unit.settings.seq_len), np.uint8)
                while at < unit.num_batch:
                    self._remember(unit_start + at, loop)
                    want = min(self.chunk_steps, unit.num_batch - at)
                    steps, nbytes, _ = loop.write(at, want, buf, self.keep)
                    if steps < want:
                        raise TokenCacheError(f"{unit.info_path}: its token cache gives {at + steps} batches, the "
                                              f"record_info lists {unit.num_batch}; {_rerun_hint(unit)}")
                    offsets, lengths = record_frames(buf, nbytes, self.keep, steps)
                    yield buf[:nbytes].tobytes(), offsets, lengths
                    at += steps
            i, unit_start = i + 1, unit_start + unit.num_batch
            if i == len(self.units):
                if not self.repeat:
                    return
                i = 0
            step = unit_start

    def _skip(self, loop, unit, at, to):
        """Makes steps at..to-1 of the unit without serialising them (their draws are needed); returns `to`."""
        nothing = np.zeros(self.bsz, dtype=np.bool_)
        empty = np.empty(0, dtype=np.uint8)
        while at < to:
            steps, _, _ = loop.write(at, to - at, empty, nothing)
            if steps < to - at:
                raise TokenCacheError(f"{unit.info_path}: its token cache gives {at + steps} batches, the "
                                      f"record_info lists {unit.num_batch}; {_rerun_hint(unit)}")
            at += steps
        return at


def unit_payloads(unit: CacheUnit, vocab_size=None):
    """Yields each serialized record (bytes) of one cache-backed unit, in order (dump)."""
    stream = GeneratedStream([unit], repeat=False, vocab_size=vocab_size)
    for data, offsets, lengths in stream.chunks():
        view = memoryview(data)
        for offset, length in zip(offsets, lengths):
            yield bytes(view[offset:offset + length])


def find_cache_units(path: str, sp_path: Optional[str] = None) -> list[CacheUnit]:
    """The cache-backed units of a save_dir (or its tfrecords/ folder), in stream order (sorted record_info names,
    as train_gpu reads them); [] when it has none. sp_path: as cache_unit's."""
    found = []
    for info_path in save_dir.record_info_paths(save_dir.tfrecords_dir(path)):
        info = save_dir.read_json(info_path)
        if record_info.is_cache_backed(info):
            found.append(cache_unit(info_path, info, int(info.get("num_batch", 0)), sp_path))
    return found


def check_corpus_info(corpus_info_path: str, info: CorpusInfo, unit: CacheUnit) -> None:
    """corpus_info.json against a cache-backed unit: its SentencePiece model (sp_path) is the one the cache was
    made with, and vocab_size is that model's (the names and create_settings: dataformat/validation.py)."""
    sp_path = info.sp_path
    if sp_path and os.path.isfile(sp_path) and provenance.sha256_of(sp_path) != unit.reference.get("sp_sha256"):
        raise TokenCacheError(f"{corpus_info_path}: sp_path={sp_path} is not the SentencePiece model "
                              f"{unit.info_path} was made with; re-create the save_dir, or fix corpus_info.json")
    vocab_size = info.vocab_size
    if vocab_size is not None and fileio.exists(unit.sp_path):
        pieces = load_sentencepiece(unit.sp_path).get_piece_size()
        if pieces != vocab_size:
            raise TokenCacheError(f"{corpus_info_path}: vocab_size={vocab_size} contradicts the token cache's "
                                  f"SentencePiece model {unit.sp_path} ({pieces} pieces); re-create the "
                                  "save_dir, or fix corpus_info.json")
