"""One (task, pass) unit of `create`: token cache → stream → rows → records file and record_info.

The examples are made by dataformat/examples/loop.py (pairing, masking, serialisation, in compiled code); here
a unit's stream is read, its records written and its record_info, last, marks it complete.
"""

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.dataformat import provenance, record_info, records, save_dir, token_cache
from xlnet_data.dataformat.examples import layout, rng
from xlnet_data.dataformat.examples.loop import ExampleSettings, Unit, UnitLoop, steps_per_chunk, unit_rows
from xlnet_data.dataformat.vocab import start_piece_table
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.encode import EncodedTask

log = logging.getLogger("xlnet_data")

CHUNK_BYTES = 16 << 20  # serialised records buffered between writes


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
    input_counts: dict = dataclasses.field(default_factory=dict)  # see record_info.input_counts


def write_unit_records(settings: ExampleSettings, rows: layout.Rows, is_start, np_mt, py_mt, out,
                       on_records: Optional[Callable[[int], None]] = None):
    """Writes the unit's records to the binary file `out`; returns the number of batches (steps). With
    `out` None nothing is serialised, the steps are only counted (a cache-backed unit: --write_records=false)."""
    loop = UnitLoop(settings, rows, is_start, np_mt, py_mt)
    chunk = steps_per_chunk(settings.bsz_per_host, settings.seq_len, CHUNK_BYTES)
    buf = np.empty(chunk * loop.bsz * records.max_record_bytes(settings.seq_len) if out else 0, dtype=np.uint8)
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


def run_unit(config: CreateConfig, unit: Unit, cache_key, sp, on_records=None,
             encoded: Optional[EncodedTask] = None, made_from: Optional[dict] = None) -> UnitResult:
    """Creates one unit's tfrecords from its task's token cache (or from `encoded`, the task encoded in
    memory), then its record_info JSON (last, so it marks completion).

    record_info holds the original's keys (`filenames`, `num_batch`), `create_settings`, the unit's counts
    and `made_from` (the plan's provenance.made_from of its task, with the records file's size).
    """
    index = encoded.index if encoded else token_cache.read_index(config.save_dir, unit.task, cache_key)
    if index is None:
        raise token_cache.TokenCacheError(f"task {unit.task} pass {unit.pass_id}: its token cache is missing "
                                          f"from {config.save_dir}; run the same command again")
    result = UnitResult(unit, files=len(index.shards), lines=sum(s["lines"] for s in index.shards),
                        tokens=index.tokens, invalid_utf8_lines=sum(s["invalid_utf8_lines"] for s in index.shards),
                        skipped_files=index.skipped_files,
                        input_counts=record_info.input_counts(index.shards))
    stream = encoded.stream if encoded else functools.partial(token_cache.mapped_stream, config.save_dir, index,
                                                              vocab_size=sp.get_piece_size())
    settings = ExampleSettings.of(config)
    rows, random_state = unit_rows(settings, unit, len(index.shards), stream)
    write = functools.partial(write_unit_records, settings, rows, start_piece_table(sp), rng.numpy_state(random_state),
                              rng.python_state(unit.seed), on_records=on_records)
    record_path, info_path = config.unit_paths(unit)
    try:
        with rows.stream:  # the mapped cache file closed once the records are written
            if config.write_records:
                with fileio.atomic_write(record_path) as out:
                    num_batch = write(out)
                    if num_batch == 0:
                        raise _NoBatches
            else:  # counted only: train_gpu and dump make the records from the token cache
                num_batch = write(None)
                if num_batch == 0:
                    raise _NoBatches
    except _NoBatches:
        rows_of_stream = rows.num_rows  # bsz_per_host, or half of it with bi_data
        result.skipped = (f"task {unit.task} has {result.tokens} tokens, too few for one batch (more than "
                          f"{(config.seq_len + 1) * rows_of_stream} are needed: {rows_of_stream} rows of seq_len + 1, "
                          "and room for A/B); nothing written")
        return result
    result.num_batch = num_batch
    result.records = num_batch * config.bsz_per_host
    result.dropped_tokens = result.tokens - num_batch * config.reuse_len * rows.num_rows
    info = {"filenames": [record_path], "num_batch": num_batch,
            record_info.SETTINGS_KEY: record_info.create_settings(config),
            record_info.COUNTS_KEY: {field: getattr(result, field) for field in record_info.COUNTS},
            record_info.INPUT_COUNTS_KEY: result.input_counts}
    if config.num_passes is not None:
        info[record_info.PASSES_KEY] = config.num_passes
    if config.write_records:
        result.record_path = record_path
    else:
        info["filenames"] = []
        info[record_info.TOKEN_CACHE_KEY] = token_cache.cache_reference(config.save_dir, config.sp_path, index)
    if not (fileio.is_remote(config.save_dir) or fileio.is_remote(config.sp_path)):
        info[record_info.SP_PATH_KEY] = os.path.relpath(config.sp_path, config.save_dir)
    if made_from is not None:  # what the unit was made from, and the size its records file must have
        info[provenance.MADE_FROM] = ({**made_from, "record_bytes": fileio.size(record_path)} if config.write_records
                                      else made_from)
    save_dir.write_json(info_path, info)
    return result


def recorded_result(unit: Unit, record_path: str, info_path: str) -> UnitResult:
    """A complete unit's UnitResult as run_unit stored it in its record_info (for runners whose workers
    cannot report counts back); a record_info without counts (an older create) gives zeros but num_batch."""
    info = save_dir.read_json(info_path)
    counts = info.get(record_info.COUNTS_KEY, {"num_batch": info.get("num_batch", 0)})
    return UnitResult(unit, **{field: int(counts.get(field, 0)) for field in record_info.COUNTS},
                      record_path=record_path if info.get("filenames") else None,
                      input_counts=info.get(record_info.INPUT_COUNTS_KEY, {}))
