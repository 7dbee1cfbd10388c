"""One (task, pass) unit of `create`: token cache → stream → rows → A/B pairs + masks → records.

The per-example loop (pairing, masking, serialisation) runs in compiled code over chunks of steps;
the random streams are the original's (numpy's legacy generator for the file order and the masks,
Python's `random` for A/B), seeded with 100 * task + pass_id, so the records are the original's.
"""

import dataclasses
import logging
from collections.abc import Callable
from typing import Optional

import numpy as np

from xlnet_data.common import compiled, fileio, records, save_dir
from xlnet_data.common.vocab import CLS_ID, SEP_ID, start_piece_table
from xlnet_data.datagen import layout, provenance, rng, token_cache
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.masking import ngram_cdf, sample_mask
from xlnet_data.datagen.pairing import row_boundaries, split_a_and_b

log = logging.getLogger("xlnet_data")

CHUNK_BYTES = 16 << 20  # serialised records buffered between writes


@dataclasses.dataclass(frozen=True)
class Unit:
    task: int
    pass_id: int

    @property
    def seed(self):
        return 100 * self.task + self.pass_id


@dataclasses.dataclass
class UnitResult:
    unit: Unit
    files: int = 0
    lines: int = 0
    tokens: int = 0
    records: int = 0
    num_batch: int = 0
    dropped_tokens: int = 0
    invalid_utf8_lines: int = 0
    skipped_files: int = 0  # files without any token
    record_path: Optional[str] = None
    skipped: str = ""  # why nothing was written, if so
    input_counts: dict = dataclasses.field(default_factory=dict)  # see input_counts


COUNTS = ("files", "lines", "tokens", "records", "num_batch", "dropped_tokens", "invalid_utf8_lines", "skipped_files")
RECORD_INFO_COUNTS = "create_counts"  # record_info's key for a unit's COUNTS, read back by runners without metrics
TOKEN_CACHE = "token_cache"  # record_info's key of a cache-backed unit (no records): which cache makes them
RECORD_INFO_INPUT_COUNTS = "input_counts"
INPUT_COUNTS = ("chars", "tokens", "unk", "marks", "arabic_marks")  # of an input file: see input_counts


def input_counts(shards):
    """{path: {INPUT_COUNTS}} of the files (token cache index entries) with <unk> ids or characters that lost a
    mark to the accent removal (`marks`; Arabic harakat apart, `arabic_marks`); the others need no word.
    Per file, not per unit: the passes of a task share its files."""
    return {shard["path"]: {key: int(shard.get(key, 0)) for key in INPUT_COUNTS} for shard in shards
            if shard.get("unk") or shard.get("marks") or shard.get("arabic_marks")}


def plan_units(config: CreateConfig):
    return [Unit(task, pass_id) for task in config.tasks for pass_id in config.pass_ids]


def record_paths(config: CreateConfig, unit: Unit):
    """(tfrecords path, record_info path) of a unit, named as the original names them."""
    return save_dir.unit_paths(config.save_dir, config.split, unit.task, unit.pass_id,
                              save_dir.RecordSettings.of(config))


def corpus_info(config: CreateConfig, vocab_size):
    """corpus_info.json's content, in the original's key order; vocab_size is the model's real size."""
    return {
        "vocab_size": vocab_size, "bsz_per_host": config.bsz_per_host, "num_core_per_host": config.num_core,
        "seq_len": config.seq_len, "reuse_len": config.reuse_len, "uncased": config.uncased,
        "bi_data": config.bi_data, "mask_alpha": config.mask_alpha, "mask_beta": config.mask_beta,
        "num_predict": config.num_predict, "use_eod": config.use_eod, "sp_path": config.sp_path,
        "input_glob": config.input_glob, "keep_accents": config.keep_accents,
    }


INPUT, IS_MASKED, TARGET, SEG_ID, LABEL = (records.FEATURES.index(name)
                                          for name in ("input", "is_masked", "target", "seg_id", "label"))


@compiled.jit(inline="always")
def _put_features(payloads, begins, ends, ids, mask, a_sep, b_sep, after_a, after_b, label):
    """Writes an example's features as varints (records.put_record's payloads) at `begins`; sets `ends`.

    `ids` is the input: memory and A, <sep> at `a_sep`, B, <sep> at `b_sep`, <cls>; `after_a` and `after_b`
    are the row's tokens after A and after B. The target is each input token's next one in the row: the
    input shifted left by one, except that the tokens before the two <sep> are followed by `after_a` and
    `after_b`, and the last <cls> by <cls>. So the target's varints are copies of the input's bytes with
    those three put in between: 512 ids encoded once, not twice.
    """
    pos = records.put_varints(payloads, begins[INPUT], ids, 0, 1)
    second_at = pos  # where the input's second varint begins; a_sep_at, b_at, b_sep_at likewise
    pos = records.put_varints(payloads, pos, ids, 1, a_sep)
    a_sep_at = pos
    b_at = records.put_varints(payloads, pos, ids, a_sep, a_sep + 1)
    b_sep_at = records.put_varints(payloads, b_at, ids, a_sep + 1, b_sep)
    ends[INPUT] = records.put_varints(payloads, b_sep_at, ids, b_sep, ids.shape[0])

    pos = records.copy_bytes(payloads, begins[TARGET], payloads, second_at, a_sep_at)
    pos = records.put_varint(payloads, pos, after_a)
    pos = records.copy_bytes(payloads, pos, payloads, b_at, b_sep_at)
    pos = records.put_varint(payloads, pos, after_b)
    pos = records.put_varint(payloads, pos, CLS_ID)
    ends[TARGET] = records.put_varint(payloads, pos, CLS_ID)

    # is_masked, seg_id and label are below 128: each value is its own varint byte. Written through views,
    # indexed from 0: indices the compiler cannot tell are never negative made this loop 50x slower.
    seq_len = ids.shape[0]
    is_masked = payloads[begins[IS_MASKED]:begins[IS_MASKED] + seq_len]
    seg_id = payloads[begins[SEG_ID]:begins[SEG_ID] + seq_len]
    for k in range(seq_len):
        is_masked[k] = mask[k]
        seg_id[k] = 0 if k <= a_sep else 1 if k <= b_sep else 2  # memory, A, <sep>: 0; B, <sep>: 1; <cls>: 2
    ends[IS_MASKED] = begins[IS_MASKED] + seq_len
    ends[SEG_ID] = begins[SEG_ID] + seq_len
    payloads[begins[LABEL]] = label
    ends[LABEL] = begins[LABEL] + 1


@compiled.jit(nogil=True)
def _write_steps(data, bounds, bound_offsets, source, reverse, first_step, max_steps, seq_len, reuse_len, goal_mem,
                 goal_ab, mask_alpha, mask_beta, word_spans, is_start, cdf, np_mt, py_mt,
                 keys, key_lengths, keep, buf):
    """Serialises up to `max_steps` steps (one example per row each) from step `first_step` into `buf`.

    Returns (steps written, bytes written, done). `done` is True once the rows are used up or a row
    cannot give A/B any more; the original drops that whole step and stops there. `bounds` and
    `bound_offsets` are the rows' sentence boundaries (pairing.row_boundaries). Only rows r with `keep[r]`
    are serialised; the others still draw their A/B and masks, which the rows after them depend on (a
    worker's share, pretrain/cache_input.py; a count of the steps). nogil: the training input pipeline
    runs it beside the step.
    """
    bsz = source.shape[0]
    num_rows = data.shape[0]
    row_len = data.shape[1]
    tot_len = seq_len - reuse_len - 3
    ids = np.zeros(seq_len, dtype=data.dtype)
    mask = np.zeros(seq_len, dtype=np.bool_)
    region = records.varints_bytes_bound(seq_len)  # each feature's varints in a region of its own
    begins = np.arange(len(records.FEATURES)) * region
    ends = begins.copy()
    payloads = np.zeros(len(records.FEATURES) * region, dtype=np.uint8)
    pos = 0
    for step in range(max_steps):
        i = (first_step + step) * reuse_len
        if i + seq_len > row_len:
            return step, pos, True
        step_start = pos
        for r in range(bsz):
            direction = -1 if reverse[r] else 1
            row = data[source[r]][::direction]
            k = source[r] + num_rows if reverse[r] else source[r]
            ok, a_begin, a_end, b_begin, b_end, label = split_a_and_b(
                row_len, bounds[bound_offsets[k]:bound_offsets[k + 1]], i + reuse_len, tot_len, py_mt)
            if not ok:
                return step, step_start, True
            n = 0
            for k in range(i, i + reuse_len):
                ids[n] = row[k]
                n += 1
            for k in range(a_begin, a_end):
                ids[n] = row[k]
                n += 1
            a_sep = n
            ids[n] = SEP_ID
            n += 1
            for k in range(b_begin, b_end):
                ids[n] = row[k]
                n += 1
            b_sep = n
            ids[n], ids[n + 1] = SEP_ID, CLS_ID

            for k in range(seq_len):  # not mask[:] = False: a slice assignment costs ~70 ns here
                mask[k] = False
            mem, ab = ids[:reuse_len], ids[reuse_len:]
            mask_mem, mask_ab = mask[:reuse_len], mask[reuse_len:]
            sample_mask(mem[::direction], mask_mem[::direction], is_start, goal_mem, mask_alpha, mask_beta,
                        cdf, np_mt, word_spans)
            sample_mask(ab[::direction], mask_ab[::direction], is_start, goal_ab, mask_alpha, mask_beta,
                        cdf, np_mt, word_spans)
            if keep[r]:
                _put_features(payloads, begins, ends, ids, mask, a_sep, b_sep, row[a_end], row[b_end], label)
                pos = records.put_record(buf, pos, payloads, begins, ends, keys, key_lengths)
    return max_steps, pos, False


class UnitLoop:
    """A unit's rows as the compiled loop reads them, and its two random streams where they stand: `write` goes
    on from there. create writes a unit's records with it; train_gpu and dump make a cache-backed unit's
    records with it (pretrain/cache_input.py, datagen/generated.py), so both are the same bytes."""

    def __init__(self, config: CreateConfig, rows: layout.Rows, is_start, np_mt, py_mt):
        self.config, self.rows, self.is_start, self.np_mt, self.py_mt = config, rows, is_start, np_mt, py_mt
        self.bounds, self.bound_offsets = row_boundaries(rows.sent_ids)
        self.cdf = ngram_cdf()
        self.every_row = np.ones(rows.source.shape[0], dtype=np.bool_)

    @property
    def bsz(self):
        return self.rows.source.shape[0]

    def write(self, first_step, max_steps, buf, keep=None):
        """Up to `max_steps` steps from `first_step` (where the random streams stand) into `buf`, the rows of
        `keep` only (default: all); returns (steps, bytes, done) as _write_steps."""
        config = self.config
        goal_mem, goal_ab = config.num_predict_parts
        return _write_steps(
            self.rows.data, self.bounds, self.bound_offsets, self.rows.source, self.rows.reverse, first_step,
            max_steps, config.seq_len, config.reuse_len, goal_mem, goal_ab, config.mask_alpha, config.mask_beta,
            config.span_unit == "word", self.is_start, self.cdf, self.np_mt, self.py_mt, records.FEATURE_KEYS,
            records.FEATURE_KEY_LENGTHS, self.every_row if keep is None else keep, buf)


def steps_per_chunk(config: CreateConfig, chunk_bytes=CHUNK_BYTES):
    """Steps of records that fit `chunk_bytes` (at least one)."""
    return max(1, chunk_bytes // (config.bsz_per_host * records.max_record_bytes(config.seq_len)))


def write_unit_records(config: CreateConfig, rows: layout.Rows, is_start, np_mt, py_mt, out,
                       on_records: Optional[Callable[[int], None]] = None):
    """Writes the unit's records to the binary file `out`; returns the number of batches (steps). With
    `out` None nothing is serialised, the steps are only counted (a cache-backed unit: --write_records=false)."""
    loop = UnitLoop(config, rows, is_start, np_mt, py_mt)
    chunk = steps_per_chunk(config)
    buf = np.empty(chunk * loop.bsz * records.max_record_bytes(config.seq_len) if out else 0, dtype=np.uint8)
    keep = None if out else np.zeros(loop.bsz, dtype=np.bool_)
    num_batch, done = 0, False
    while not done:
        steps, nbytes, done = loop.write(num_batch, chunk, buf, keep)
        if out:
            fileio.write_array(out, buf[:nbytes])
        num_batch += steps
        if on_records:
            on_records(steps * loop.bsz)
    return num_batch


class _NoBatches(Exception):
    """Raised inside the atomic write so that no empty tfrecords file is left behind."""


def record_settings(config: CreateConfig):
    """What decides a unit's records beyond its file name; kept in record_info to recognise it on a re-run."""
    settings = dataclasses.asdict(config)
    for run_only in ("save_dir", "pass_id", "num_passes", "task", "strict", "allow_binary", "write_records"):
        settings.pop(run_only)
    return settings


def run_unit(config: CreateConfig, unit: Unit, cache_key, sp, on_records=None,
             encoded: Optional[token_cache.EncodedTask] = None, made_from: Optional[dict] = None) -> UnitResult:
    """Creates one unit's tfrecords from its task's token cache (or from `encoded`, the task encoded in
    memory), then its record_info JSON (last, so it marks completion).

    record_info holds the original's keys (`filenames`, `num_batch`), `create_settings`, the unit's counts
    and `made_from` (the plan's provenance.made_from of its task, with the records file's size).
    """
    index = encoded.index if encoded else token_cache.read_index(config, unit.task, cache_key)
    if index is None:
        raise token_cache.TokenCacheError(f"task {unit.task} pass {unit.pass_id}: its token cache is missing "
                                          f"from {config.save_dir}; run the same command again")
    result = UnitResult(unit, files=len(index.shards), lines=sum(s["lines"] for s in index.shards),
                        tokens=index.tokens, invalid_utf8_lines=sum(s["invalid_utf8_lines"] for s in index.shards),
                        skipped_files=index.skipped_files, input_counts=input_counts(index.shards))
    rows, random_state = unit_rows(config, unit, index, encoded)
    record_path, info_path = record_paths(config, unit)
    try:
        if config.write_records:
            with fileio.atomic_write(record_path) as out:
                num_batch = write_unit_records(config, rows, start_piece_table(sp), rng.numpy_state(random_state),
                                               rng.python_state(unit.seed), out, on_records)
                if num_batch == 0:
                    raise _NoBatches
        else:  # counted only: train_gpu and dump make the records from the token cache
            num_batch = write_unit_records(config, rows, start_piece_table(sp), rng.numpy_state(random_state),
                                           rng.python_state(unit.seed), None, on_records)
            if num_batch == 0:
                raise _NoBatches
    except _NoBatches:
        rows_of_stream = rows.data.shape[0]  # bsz_per_host, or half of it with bi_data
        result.skipped = (f"task {unit.task} has {result.tokens} tokens, too few for one batch (more than "
                          f"{(config.seq_len + 1) * rows_of_stream} are needed: {rows_of_stream} rows of seq_len + 1, "
                          "and room for A/B); nothing written")
        return result
    result.num_batch = num_batch
    result.records = num_batch * config.bsz_per_host
    result.dropped_tokens = result.tokens - num_batch * config.reuse_len * rows.data.shape[0]
    info = {"filenames": [record_path], "num_batch": num_batch, "create_settings": record_settings(config),
            RECORD_INFO_COUNTS: {field: getattr(result, field) for field in COUNTS},
            RECORD_INFO_INPUT_COUNTS: result.input_counts}
    if config.write_records:
        result.record_path = record_path
    else:
        info["filenames"] = []
        info[TOKEN_CACHE] = token_cache.cache_reference(config, index)
    if made_from is not None:  # what the unit was made from, and the size its records file must have
        info[provenance.MADE_FROM] = ({**made_from, "record_bytes": fileio.size(record_path)} if config.write_records
                                      else made_from)
    save_dir.write_json(info_path, info)
    return result


def unit_rows(config: CreateConfig, unit: Unit, index: token_cache.CacheIndex,
              encoded: Optional[token_cache.EncodedTask] = None):
    """The unit's rows (its task's stream in the unit's seeded file order, laid out) and numpy's generator after
    the file-order draw (the masks' draws follow)."""
    random_state = np.random.RandomState(unit.seed)
    order = random_state.permutation(len(index.shards))
    ids, sent_ids = encoded.stream(order) if encoded else token_cache.read_stream(config, index, order)
    return layout.layout_rows(ids, sent_ids, config.bsz_per_host, config.num_core, config.bi_data), random_state


def recorded_result(config: CreateConfig, unit: Unit) -> UnitResult:
    """A complete unit's UnitResult as run_unit stored it in its record_info (for runners whose workers
    cannot report counts back); a record_info without counts (an older create) gives zeros but num_batch."""
    record_path, info_path = record_paths(config, unit)
    info = save_dir.read_json(info_path)
    counts = info.get(RECORD_INFO_COUNTS, {"num_batch": info.get("num_batch", 0)})
    return UnitResult(unit, **{field: int(counts.get(field, 0)) for field in COUNTS},
                      record_path=record_path if info.get("filenames") else None,
                      input_counts=info.get(RECORD_INFO_INPUT_COUNTS, {}))
