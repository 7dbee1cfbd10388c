"""What each step reads: the records (or a cache-backed unit's generated records) as per-replica batches, and,
with several record dirs, which one each step reads.

    replica_batches    records -> per-replica batches that keep the records' layout (and each replica's rows)
    sampling_probs, mixing_schedule    which source each step reads when several are mixed (XLM's sampling factor)
    Source             one stream of batches with its own memories
    check_records, find_damage    the records checked before training, and the damaged one a failed read ran into

Memories never leave their replica: replica r always gets the same rows of the records, so its memory continues
its rows from step to step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from xlnet_data.common import fileio
from xlnet_data.common.errors import ConfigError, UserError
from xlnet_data.dataformat import provenance, save_dir, settings, token_cache, validation
from xlnet_data.dataformat.examples.generated import check_cache, open_loop
from xlnet_data.dataformat.record_reader import RecordError, read_numbered_examples
from xlnet_data.pretrain import held_out
from xlnet_data.pretrain.cache_input import CacheFeed
from xlnet_data.pretrain.config import InputConfig, TrainConfig
from xlnet_data.pretrain.inputs import PermutationFn, find_records, parse_batches, record_batches


def split_host_batch(value: tf.Tensor, num_replicas: int, bi_data: bool) -> tf.Tensor:
    """One step of the records, [num_core, bsz_per_core, ...] (each core's block: its forward rows,
    then the same rows reversed with bi_data) -> [num_replicas, bsz_per_replica, ...].

    Replica r gets forward rows r*k .. r*k+k-1 (of all cores' forward rows in order) and, with
    bi_data, their backward rows after them, so its batch has the halves the model expects.
    """
    shape = [num_replicas, -1, *value.shape[2:]]
    if not bi_data:
        return tf.reshape(value, shape)
    half = value.shape[1] // 2
    forward = tf.reshape(value[:, :half], shape)
    backward = tf.reshape(value[:, half:], shape)
    return tf.concat([forward, backward], axis=1)


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
    dataset = dataset.map(lambda *rows: tuple(split_host_batch(value, num_replicas, data.bi_data) for value in rows))
    if several_pipelines:
        local = num_replicas // input_context.num_input_pipelines
        first = input_context.input_pipeline_id * local
        dataset = dataset.map(lambda *rows: tuple(value[first:first + local] for value in rows))
    return parse_batches(dataset.unbatch(), data)


def pipeline_rows(data: InputConfig, num_replicas: int, input_context: tf.distribute.InputContext) -> np.ndarray:
    """The rows of a step (0..bsz_per_host-1, in the records' order) that input pipeline p gives its replicas."""
    rows = tf.reshape(tf.range(data.bsz_per_host), [data.num_core_per_host, -1])
    local = num_replicas // input_context.num_input_pipelines
    first = input_context.input_pipeline_id * local
    return split_host_batch(rows, num_replicas, data.bi_data)[first:first + local].numpy().reshape(-1)


def source_identity(source: str) -> str:
    """What a source's records were made from, wherever they are now (provenance.made_from_identity of its record
    dirs, in order); "" where no record_info records it (an older create)."""
    return provenance.made_from_identity(source.split(","))


def source_tokens(record_dir: str, data: InputConfig) -> int:
    """Tokens in a source's records (batches x rows x seq_len): what mixing weights are based on."""
    return find_records(record_dir, data).num_batch * data.bsz_per_host * data.seq_len


def sampling_probs(tokens, alpha: float) -> np.ndarray:
    """XLM's language sampling: p_i proportional to tokens_i ** alpha (1: by size, 0: uniform), computed from
    the logarithms: tokens ** alpha itself overflows a float64 for a large alpha (1e9 ** 40)."""
    if alpha == 0:
        return np.full(len(tokens), 1 / len(tokens))
    # log 0 = -inf (a source of 0 tokens: probability 0); a huge alpha times a negative log ratio: -inf, also 0.
    with np.errstate(divide="ignore", over="ignore"):
        logs = np.log(np.asarray(tokens, dtype=np.float64))
        weights = np.exp(alpha * (logs - logs.max()))  # the largest is 1: alpha * log(tokens) itself may be inf
    return weights / weights.sum()


def mixing_schedule(probs, num_steps: int, seed: int) -> np.ndarray:
    """The source of every step of the run, drawn once from the seed (a resumed run draws the same)."""
    return np.random.default_rng(seed).choice(len(probs), size=num_steps, p=probs)


def mixture_line(counts, probs, names) -> str:
    total = max(int(np.sum(counts)), 1)
    return "mixture: " + ", ".join(f"{name} {100 * count / total:.1f}% (expected {100 * p:.1f}%)"
                                   for name, count, p in zip(names, counts, probs))


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


# The settings a TrainConfig must share with the records' corpus_info.json: train_gpu's flag -> the field.
_RECORD_FIELDS = {"train_batch_size": "InputConfig.bsz_per_host", "n_token": "XLNetConfig.n_token",
                  **{flag: f"InputConfig.{flag}" for flag in ("num_core_per_host", "seq_len", "reuse_len", "bi_data", "uncased",
                                                       "mask_alpha", "mask_beta", "num_predict")}}


def check_one_model(record_dirs: list[str]) -> None:
    """ConfigError when the record dirs of one run were made with different SentencePiece models (their
    record_infos' sha256): the same id would be other pieces in one embedding table."""
    models = {}
    for record_dir in record_dirs:
        models.setdefault(validation.check_units_agree(record_dir), record_dir)
    models.pop(None, None)  # an older create's records name no model
    if len(models) > 1:
        named = ", ".join(f"{record_dir} (sha256 {sha[:12]}…)" for sha, record_dir in models.items())
        raise ConfigError(f"--record_info_dir's sources were made with different SentencePiece models: {named}; "
                          "an id would be other pieces in each: make every source with one model")


def check_records(cfg: TrainConfig) -> None:
    """Before training: the config's data settings are the records' (corpus_info.json; ConfigError names the one
    that is not), the held-out records are of the training records' SentencePiece model, no pass is missing
    (validation.missing_passes), and every unit's files hold the records its record_info lists (a cheap walk over
    the frames; RecordError names the file, the record and the byte where they do not)."""
    objects = {"InputConfig": cfg.data, "XLNetConfig": cfg.model}
    given = {flag: getattr(objects[field.split(".")[0]], field.split(".")[1]) for flag, field in _RECORD_FIELDS.items()}
    settings.check_train_config(cfg.record_info_dir.split(","), given, _RECORD_FIELDS)
    check_one_model(cfg.record_info_dir.split(","))
    if cfg.eval_every and cfg.eval_record_info_dir:
        held_out.check_same_model(cfg.record_info_dir.split(","), cfg.eval_record_info_dir.split(","))
    record_settings = save_dir.RecordSettings.of(cfg.data)
    for name in cfg.sources:
        for record_dir in name.split(","):  # all the passes asked for, or of the create run, are there
            info_paths = fileio.glob(save_dir.record_info_glob(record_dir, cfg.data.split, record_settings))
            lacking = validation.missing_passes(record_dir, info_paths, cfg.data.num_passes)
            if lacking:
                raise save_dir.SaveDirError(lacking)
        found = find_records(name, cfg.data)
        for info_path, num_batch, files in found.units:
            validation.check_unit(info_path, num_batch, list(files), cfg.data.bsz_per_host)
        for unit in found.cache_units:  # the cache there, the one the unit was counted from (TokenCacheError)
            check_cache(unit)


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
            open_loop(unit, cfg.model.n_token)  # an id outside the vocabulary, in a cache of no checksums (format 1)
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


class DamagedRecordsError(UserError, ValueError):
    """Training met a record it cannot read; the message names the file, the record and the byte."""


class RecordsGoneError(UserError):
    """A records file that training read is no longer there."""

