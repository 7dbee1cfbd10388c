"""What each step reads: the records (or a cache-backed unit's generated records) as per-replica batches, and,
with several record dirs, which one each step reads.

    replica_batches    records -> per-replica batches that keep the records' layout (and each replica's rows)
    Source             one stream of batches with its own memories
    find_damage        the damaged record a failed read ran into

Which records, which rows of a step each replica gets and which source each step reads are layout.py's (no
TensorFlow).

Memories never leave their replica: replica r always gets the same rows of the records, so its memory continues
its rows from step to step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import token_cache
from xlnet_data.dataformat.examples.generated import check_cache, open_loop
from xlnet_data.dataformat.record_reader import RecordError, read_numbered_examples
from xlnet_data.pretrain.cache_input import CacheFeed
from xlnet_data.pretrain.config import InputConfig, TrainConfig
from xlnet_data.pretrain.inputs import PermutationFn, as_written, parse_batches, record_batches
from xlnet_data.pretrain.layout import RecordsGoneError, find_records, replica_rows


def split_host_batch(value: tf.Tensor, num_replicas: int, bi_data: bool) -> tf.Tensor:
    """One step of the records, [num_core, bsz_per_core, ...] (each core's block: its forward rows,
    then the same rows reversed with bi_data) -> [num_replicas, bsz_per_replica, ...], each replica's rows
    as layout.replica_rows lays them out."""
    num_core, bsz_per_core = value.shape[0], value.shape[1]
    rows = replica_rows(num_core, num_core * bsz_per_core, num_replicas, bi_data)
    return tf.gather(tf.reshape(value, [num_core * bsz_per_core, *value.shape[2:]]), rows)


def replica_batches(record_dir: str, cfg: TrainConfig, num_replicas: int, *, start_step: int = 0,
                    permutation: Optional[PermutationFn] = None,
                    input_context: Optional[tf.distribute.InputContext] = None,
                    feed: Optional[CacheFeed] = None) -> tf.data.Dataset:
    """Per-replica batches in the order a strategy deals them out: step s, replica r is element
    s * num_replicas + r. start_step skips the steps a resumed run already trained on. With
    several input pipelines (multi-worker), pipeline p keeps only its own replicas' batches; from a
    token cache it makes only their records (`feed`: how a cache-backed source is generated).

    The cores' batches are split into the replicas' before parsing (serialized records and their
    permutations), so the features, the same row for row, are built once and never moved."""
    data = cfg.data
    several_pipelines = input_context is not None and input_context.num_input_pipelines > 1
    feed = feed or CacheFeed()
    feed.vocab_size = cfg.model.n_token
    if several_pipelines:
        feed.keep = np.zeros(data.bsz_per_host, dtype=bool)
        feed.keep[pipeline_rows(data, num_replicas, input_context)] = True
    dataset = record_batches(record_dir, data, seed=cfg.seed, permutation=permutation,
                             start=start_step * data.bsz_per_host, feed=feed)
    if num_replicas == data.num_core_per_host and not several_pipelines:
        # Replica r is core r: the records' batches are already the replicas' (split_host_batch would
        # hand every replica its own core's block).
        return parse_batches(dataset, data)
    dataset = dataset.batch(data.num_core_per_host, drop_remainder=True)  # one step of the records
    dataset = dataset.map(as_written(
        lambda *rows: tuple(split_host_batch(value, num_replicas, data.bi_data) for value in rows)))
    if several_pipelines:
        local = num_replicas // input_context.num_input_pipelines
        first = input_context.input_pipeline_id * local
        dataset = dataset.map(as_written(lambda *rows: tuple(value[first:first + local] for value in rows)))
    return parse_batches(dataset.unbatch(), data)


def pipeline_rows(data: InputConfig, num_replicas: int, input_context: tf.distribute.InputContext) -> np.ndarray:
    """The rows of a step (0..bsz_per_host-1, in the records' order) that input pipeline p gives its replicas."""
    local = num_replicas // input_context.num_input_pipelines
    first = input_context.input_pipeline_id * local
    rows = replica_rows(data.num_core_per_host, data.bsz_per_host, num_replicas, data.bi_data)
    return rows[first:first + local].reshape(-1)


@dataclasses.dataclass
class Source:
    """One stream of records with its own memories, so that its rows stay consecutive."""

    name: str
    batches: Any  # iterator of distributed per-replica batches
    mems: Any  # per-replica memories (None without mem_len)
    position: int = 0  # steps of records read from the start of its stream (the next step reads this one)
    steps: int = 0  # steps this run took from it
    feed: Optional[CacheFeed] = None  # a cache-backed source's generation (its stream's positions are checkpointed)
    identity: str = ""  # source_identity: what its records were made from (checkpointed with its position)


def find_damage(record_dir: str, cfg: TrainConfig) -> Optional[UserError]:
    """The first record of the source that cannot be trained on (corrupt, or of another schema or vocabulary),
    read with the CRC checks, or the first chunk of its token caches that fails its checksum: what a failed read of
    the input pipeline ran into."""
    try:
        found = find_records(record_dir, cfg.data)
    except FileNotFoundError as err:  # a records file gone since training started
        return RecordsGoneError(f"{err}: deleted or moved while training read it (by create --overwrite?); make "
                                "the records again, then run the same command to resume")
    except UserError as err:  # a record_info changed since
        return err
    for unit in found.cache_units:
        try:
            token_cache.verify(unit.save_dir, check_cache(unit))
            with open_loop(unit, cfg.model.n_token):  # an id outside the vocabulary, in a cache of no checksums (format 1)
                pass
        except token_cache.TokenCacheError as err:
            return err
    for path in found.filenames:
        try:
            for _ in read_numbered_examples(path, cfg.data.seq_len, cfg.model.n_token):
                pass
        except RecordError as err:
            return err
        except FileNotFoundError as err:  # gone between find_records and here
            return RecordsGoneError(f"{path}: {err.strerror}: deleted or moved while training read it")
    return None

