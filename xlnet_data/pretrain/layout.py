"""How a training run lays out its records, without TensorFlow (train_gpu's tf.data pipeline and the PyTorch
trainer's numpy one, pretrain_torch/data.py, read them the same way):

    find_records, check_records    the record files (or cache-backed units) of record dirs, in stream order; the
                                   config's settings and the files checked before training
    replica_rows                   which rows of a step (in the records' order) each replica gets
    sampling_probs, mixing_schedule    which source each step reads when several are mixed (XLM's sampling factor)
    source_identity, source_tokens     what a source was made from; its size
    position_tables                each position's part and permutation block (the permutation features' layout)
    in_tfrecords_folders           a config's record dirs as tfrecords/ folders (the commands take save_dirs)
"""

from __future__ import annotations

import dataclasses
import glob

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.errors import ConfigError, UserError
from xlnet_data.dataformat import provenance, record_info, save_dir, settings, validation
from xlnet_data.dataformat.examples import generated
from xlnet_data.pretrain import held_out
from xlnet_data.pretrain.config import InputConfig, TrainConfig


class NoRecordsError(UserError, FileNotFoundError):
    """A record dir without the records of the settings asked for."""


class DamagedRecordsError(UserError, ValueError):
    """Training met a record it cannot read; the message names the file, the record and the byte."""


class RecordsGoneError(UserError):
    """A records file that training read is no longer there."""


def records_gone(reason: str) -> RecordsGoneError:
    """A records file gone while training read it (after find_records found it); `reason`: the read's error."""
    return RecordsGoneError(f"{reason}: a records file went away while training read it (create --overwrite?); check "
                            "the records, then run the same command to resume")


def stopped_at(damage: Exception, step: int, saved) -> DamagedRecordsError:
    """What ends a run that met damaged or vanished records (`damage`) at `step`, after its checkpoint `saved`
    (None: it wrote none)."""
    kept = f"; {saved} holds the steps before it" if saved else ""
    return DamagedRecordsError(f"{damage} (training stopped at step {step}{kept})")


@dataclasses.dataclass(frozen=True)
class RecordInfo:
    """The record files chosen for training, in stream order, and their batch count (of bsz_per_host)."""

    filenames: tuple[str, ...]
    num_batch: int
    units: tuple[tuple[str, int, tuple[str, ...]], ...] = ()  # (record_info path, its num_batch, its files)
    cache_units: tuple = ()  # generated.CacheUnit of each cache-backed unit (create --write_records=false)


def tfrecords_folders(record_dirs: str) -> str:
    """Comma-separated record dirs with each save_dir as its tfrecords/ folder ("" stays "")."""
    return ",".join(save_dir.tfrecords_dir(d) for d in record_dirs.split(",")) if record_dirs else record_dirs


def in_tfrecords_folders(cfg: TrainConfig) -> TrainConfig:
    """The config with each record dir as its tfrecords/ folder: the library takes create's save_dirs, as
    train_gpu does."""
    return dataclasses.replace(cfg, record_info_dir=tfrecords_folders(cfg.record_info_dir),
                               eval_record_info_dir=tfrecords_folders(cfg.eval_record_info_dir))


def find_records(record_info_dir: str, config: InputConfig) -> RecordInfo:
    """Collects the record files of comma-separated record dirs, like the original's get_input_fn.

    Dirs are taken in the given order, record_info files sorted within a dir.
    """
    settings = save_dir.RecordSettings.of(config)
    filenames: list[str] = []
    num_batch = 0
    units = []
    cache_units = []
    for record_dir in record_info_dir.split(","):
        pattern = save_dir.record_info_glob(record_dir, config.split, settings)
        info_paths = sorted(glob.glob(pattern))
        if not info_paths:
            raise NoRecordsError(f"no record_info file matches {pattern}: give a save_dir of create (or its tfrecords/ "
                                 "folder) made with these data settings")
        for info_path in info_paths:
            if config.num_passes is not None and save_dir.parse_name(info_path).pass_id >= config.num_passes:
                continue
            info = save_dir.read_json(info_path)
            batches = validation.read_num_batch(info_path, info)
            num_batch += batches
            if record_info.is_cache_backed(info):
                cache_units.append(generated.cache_unit(info_path, info, batches, config.sp_path))
                continue
            files = save_dir.record_files(info_path, info)
            filenames += files
            units.append((info_path, batches, tuple(files)))
    if cache_units and units:
        raise save_dir.SaveDirError(f"{record_info_dir}: holds both records and cache-backed units (create "
                                    "--write_records=false) for these settings; train on one kind (another save_dir)")
    return RecordInfo(tuple(filenames), num_batch, tuple(units), tuple(cache_units))


def replica_rows(num_core: int, bsz_per_host: int, num_replicas: int, bi_data: bool) -> np.ndarray:
    """The rows of one step of the records that each replica gets: [num_replicas, bsz_per_host // num_replicas]
    indices into the step's bsz_per_host rows in the records' order.

    The records hold num_core blocks of bsz_per_core rows (each core's forward rows, then, with bi_data, the same
    rows reversed). Replica r gets forward rows r*k .. r*k+k-1 of all cores' forward rows in order and, with
    bi_data, their backward rows after them, so its batch has the halves the model expects.
    """
    if bsz_per_host % num_core or (bsz_per_host // num_core) % (2 if bi_data else 1):
        raise ConfigError(f"bsz_per_host={bsz_per_host} is not {num_core} core block(s) of "
                          f"{'forward and backward halves' if bi_data else 'rows'}")
    halves = 2 if bi_data else 1
    if (bsz_per_host // halves) % num_replicas:
        raise ConfigError(f"{bsz_per_host // halves} {'forward ' if bi_data else ''}rows a step do not split into "
                          f"{num_replicas} replicas: give a train_batch_size that is a multiple of "
                          f"{num_replicas * halves}")
    blocks = np.arange(bsz_per_host).reshape(num_core, halves, -1)  # [core, half, row]
    forward = blocks[:, 0].reshape(num_replicas, -1)
    if not bi_data:
        return forward
    return np.concatenate([forward, blocks[:, 1].reshape(num_replicas, -1)], axis=1)


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
            generated.check_cache(unit)


def position_tables(config: InputConfig) -> dict[str, np.ndarray]:
    """Per position constants of the layout (int32 [seq_len] each), computed once, not per batch.

    offset: the position's part's smallest factorization index + 1 (0 in the memory part, seq_len in the
      rest: offsetting the rest's indices by seq_len gives the two off-diagonal blocks of perm_mask from the
      same comparison as the diagonal ones);
    block_start + the permutation entry at perm_column of the two parts' permutations side by side: the
      position's index within its part (the same shuffle in every block of perm_size);
    part: 0 in the memory part, 1 in the rest;
    shift_source: where the model's target comes from in [record target | input] (the next token of the
      previous position, each part's first position its own input, as the original shifts each part on its own).
    """
    seq_len, reuse_len, perm_size = config.seq_len, config.reuse_len, config.perm_size
    position = np.arange(seq_len)
    part = (position >= reuse_len).astype(np.int32)
    in_part = position - part * reuse_len
    first_of_part = in_part == 0
    return {
        "offset": part * seq_len,
        "block_start": (in_part // perm_size * perm_size).astype(np.int32),
        "perm_column": (in_part % perm_size + part * perm_size).astype(np.int32),
        "part": part,
        "shift_source": np.where(first_of_part, seq_len + position, position - 1).astype(np.int32),
    }
