"""What a run keeps in its model_dir, and how a run starts from it.

    save, restore          checkpoints under the original's variable names (+ adam_m/adam_v, global_step),
                           the last --max_save kept (with a warning when a better one would go)
    run_state, restore_state    the rest of what the next step depends on (memories, positions, RNG),
                           checkpointed too, so a resumed run takes the uninterrupted run's steps
    resume_or_initialise   the newest readable checkpoint, else --init_checkpoint, else scratch
    check_model_dir        xlnet_config.json (the model must be the one there) and run_config.json (for export_hf)

A model_dir knows what it was trained from and refuses what contradicts it: the model (xlnet_config.json), the
records' SentencePiece model and normalisation (run_config.json, for a model_dir with a checkpoint, and beside an
--init_checkpoint of ours), the sources, by what their records were made from (in each checkpoint). One run
writes it at a time (MODEL_DIR_LOCK, taken by training.train).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import TYPE_CHECKING, Optional

import numpy as np
import tensorflow as tf

from xlnet_data.common import fileio
from xlnet_data.common.errors import ConfigError
from xlnet_data.common.run_lock import FolderLock
from xlnet_data.dataformat import save_dir, validation
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.dataformat.examples.generated import Position
from xlnet_data.pretrain import checkpoints, hf
from xlnet_data.pretrain.config import TrainConfig, XLNetConfig
from xlnet_data.pretrain.layout import source_identity
from xlnet_data.pretrain.modeling import XLNet
from xlnet_data.pretrain.optimization import AdamWeightDecay
from xlnet_data.pretrain.trainer import Trainer

if TYPE_CHECKING:
    from xlnet_data.pretrain.sources import Source

log = logging.getLogger("xlnet_data")

MODEL_DIR_LOCK = FolderLock(".train.lock", "train_gpu", "--model_dir")
RUN_CONFIG = "run_config.json"


# ----- checkpoints -------------------------------------------------------------------------------
# The model's variables, the slots as "<name>/adam_m", "<name>/adam_v", and "global_step", as the
# original's Saver writes them (see checkpoints.py).

def save(model_dir: str, model: XLNet, optimizer: AdamWeightDecay, max_save: int,
         state: Optional[dict[str, tf.Tensor]] = None) -> str:
    """Writes model_dir/model.ckpt-<step>, lists it in model_dir/checkpoint, keeps the last max_save.
    `state`: more tensors to keep in it (run_state's)."""
    step = int(optimizer.step.numpy())
    slots = {var.name.split(":")[0]: var for var in [*optimizer.m.values(), *optimizer.v.values()]}
    return checkpoints.save(os.path.join(model_dir, f"model.ckpt-{step}"),
                            {"global_step": optimizer.step, **model.weights, **slots, **(state or {})}, max_save)


def restore(path: str, model: XLNet, optimizer: AdamWeightDecay) -> None:
    """Model, slots and step from one of our checkpoints (slots missing from it stay zero)."""
    checkpoints.load(path, model.weights)
    slots = {var.name.split(":")[0]: var for var in [*optimizer.m.values(), *optimizer.v.values()]}
    checkpoints.load(path, {"global_step": optimizer.step, **slots}, required=False)


def say_if_a_better_checkpoint_goes(cfg: TrainConfig, step: int, loss: Optional[float],
                                    saved_losses: dict[str, float]) -> None:
    """Warns when --max_save rotates out a checkpoint of this run whose loss was clearly lower (by more than
    10%) than the one about to be saved: the loss is growing, and the better weights would go unsaid."""
    listed = [os.path.basename(p) for p in checkpoints.listed(cfg.model_dir)]
    name = f"model.ckpt-{step}"
    going = ([p for p in listed if p != name] + [name])[:-cfg.max_save]
    better = [(saved_losses[p], p) for p in going if p in saved_losses]
    if loss is not None and better and min(better)[0] * 1.1 < loss:
        log.warning("--max_save=%d deletes %s (loss %.4g) for %s (loss %.4g): the loss is growing; --max_loss "
                    "stops a diverging run, a larger --max_save keeps more", cfg.max_save, min(better)[1],
                    min(better)[0], name, loss)


# ----- the rest of what a step depends on: in the checkpoint too, for an exact resume --------------
# Beside the variables, a checkpoint holds under "train_state/": the seed (it draws the factorization
# orders and the mixing schedule), the dropout generator's state, and for every source the steps of
# records read (its position in the stream) and each replica's memories. A run resumed from it takes
# the very steps the uninterrupted run would have taken.

STATE = "train_state/"


def run_state(cfg: TrainConfig, trainer: Trainer, sources: list[Source]) -> dict[str, tf.Tensor]:
    """The tensors that, with the variables, decide the next step."""
    state = {f"{STATE}seed": tf.constant(cfg.seed, tf.int64), f"{STATE}dropout_rng": trainer.model.dropout_rng.state}
    for i, source in enumerate(sources):
        state[f"{STATE}source_{i}/steps_read"] = tf.constant(source.position, tf.int64)
        state[f"{STATE}source_{i}/made_from"] = tf.constant(source.identity)  # what the position is a position in
        state[f"{STATE}source_{i}/record_dir"] = tf.constant(source.name)  # for the message when it is not
        at = source.feed.stream.position(source.position) if source.feed and source.feed.stream else None
        if at is not None:  # where the generator's random streams stood, at or before the position
            state[f"{STATE}source_{i}/generator/step"] = tf.constant(at.step, tf.int64)
            state[f"{STATE}source_{i}/generator/numpy_mt"] = tf.constant(at.numpy_mt, tf.int64)
            state[f"{STATE}source_{i}/generator/python_mt"] = tf.constant(at.python_mt, tf.int64)
        for replica, layers in enumerate(trainer.replica_mems(source.mems)):
            for layer, mem in enumerate(layers):
                state[f"{STATE}source_{i}/mems/replica_{replica}/layer_{layer}"] = mem
    return state


@dataclasses.dataclass
class ResumedState:
    """What restore_state found: per source, its position and its memories ([replica][layer] arrays), or None."""

    positions: Optional[list[int]] = None
    mems: Optional[list[Optional[list[list[np.ndarray]]]]] = None
    generators: Optional[list[Optional[Position]]] = None  # cache-backed sources: where generation resumes


def restore_state(path: str, cfg: TrainConfig, trainer: Trainer) -> ResumedState:
    """Restores the dropout generator from checkpoint `path` and returns the sources' positions and memories.

    A checkpoint without that state (an older one, the original's) or one of other sources resumes as before:
    positions from the schedule, empty memories (with a warning). Another --seed is refused.
    """
    saved = checkpoints.read_prefixed(path, STATE)
    if not saved:
        log.warning("%s holds no training state (memories, positions): memories start empty", path)
        return ResumedState()
    seed = int(saved[f"{STATE}seed"])
    if seed != cfg.seed:
        raise ConfigError(f"--seed={cfg.seed}, but {path} was trained with --seed={seed} (it draws the factorization "
                          f"orders and the mixing schedule): resume with --seed={seed}, or use a new --model_dir")
    trainer.model.dropout_rng.state.assign(saved[f"{STATE}dropout_rng"])
    count = len(cfg.sources)
    positions = [saved.get(f"{STATE}source_{i}/steps_read") for i in range(count)]
    if None in positions or f"{STATE}source_{count}/steps_read" in saved:
        log.warning("%s was trained on other sources than --record_info_dir: each starts where the mixing schedule "
                    "puts it, with empty memories", path)
        return ResumedState()
    check_same_sources(path, cfg, saved)
    replicas = trainer.strategy.num_replicas_in_sync if cfg.run.mem_len else 0  # replica_mems' count, unbuilt
    shape = (cfg.run.mem_len, trainer.bsz_per_replica, cfg.model.d_model)
    mems = []
    for i in range(count):
        found = [[saved.get(f"{STATE}source_{i}/mems/replica_{r}/layer_{layer}") for layer in range(cfg.model.n_layer)]
                 for r in range(replicas)]
        usable = all(mem is not None and mem.shape == shape for layers in found for mem in layers)
        if replicas and not usable:
            log.warning("%s holds no memories of this shape (%d replica(s) x %s): memories start empty", path,
                        replicas, list(shape))
        mems.append(found if replicas and usable else None)
    generators = [Position(int(saved[f"{STATE}source_{i}/generator/step"]),
                           saved[f"{STATE}source_{i}/generator/numpy_mt"], saved[f"{STATE}source_{i}/generator/python_mt"])
                  if f"{STATE}source_{i}/generator/step" in saved else None for i in range(count)]
    return ResumedState([int(position) for position in positions], mems, generators)


def check_same_sources(path: str, cfg: TrainConfig, saved: dict[str, np.ndarray]) -> None:
    """ConfigError when a source of --record_info_dir holds other records than the one of its place in checkpoint
    `path` (one swapped for another, or the list reordered): its position, memories and generator state would
    continue on other records. Matched by what the records were made from, so moved save_dirs still resume."""
    count = len(cfg.sources)
    trained = [(saved.get(f"{STATE}source_{i}/made_from", b"").decode(),
                saved.get(f"{STATE}source_{i}/record_dir", b"?").decode()) for i in range(count)]
    here = [source_identity(name) for name in cfg.sources]
    differ = [i for i in range(count) if trained[i][0] and here[i] and trained[i][0] != here[i]]
    if not differ:
        return
    i = differ[0]
    order = [identity for identity, _ in trained]
    how = (f"the same sources in another order: give them as that run did ({','.join(d for _, d in trained)})"
           if sorted(order) == sorted(here) else
           f"its source {i + 1} was {trained[i][1]}, of other records: give the record dirs that run read")
    raise ConfigError(f"--record_info_dir's source {i + 1} ({cfg.sources[i]}) holds other records than the one "
                      f"{path} was trained on in that place ({how}); or train on these in a new --model_dir, with "
                      f"--init_checkpoint={path} to start from its weights")


def check_model_dir(cfg: TrainConfig, chief: bool) -> None:
    """Writes model_dir/xlnet_config.json (the chief of several workers), or checks that the one there is
    this model's."""
    path = os.path.join(cfg.model_dir, "xlnet_config.json")
    if not os.path.exists(path) and not chief:
        return
    os.makedirs(cfg.model_dir, exist_ok=True)
    if os.path.exists(path):
        try:
            there = XLNetConfig.from_json(path)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{path} is not an xlnet_config.json ({str(err).splitlines()[0]}): a model_dir of "
                              "another run? Use a new --model_dir") from None
        if there != cfg.model:
            changed = ", ".join(f"{key}={value} (here {getattr(cfg.model, key)})"
                                for key, value in dataclasses.asdict(there).items()
                                if value != getattr(cfg.model, key))
            raise ConfigError(f"--model_dir={cfg.model_dir} holds another model: {changed}; use a new model_dir")
    else:
        try:
            cfg.model.to_json(path)
        except OSError as err:
            raise OSError(f"cannot write {path}: {err.strerror or err}") from None
    if not chief:
        return
    # This run's settings, for export_hf's config.json (memory, attention) and tokenizer (uncased, keep_accents);
    # rewritten by every run, since a resumed run may change them, but never those of the records it learnt from.
    trained_from = records_trained_from(cfg)
    run_config = os.path.join(cfg.model_dir, RUN_CONFIG)
    if checkpoints.listed(cfg.model_dir) and os.path.exists(run_config):
        recorded = save_dir.read_json(run_config)
        contradiction = contradicts(recorded, trained_from)
        if contradiction:
            raise ConfigError(f"--model_dir={cfg.model_dir} was trained on records of {contradiction} ({run_config}): "
                              "its checkpoints learnt those pieces; resume with records made as before, or train "
                              "these in a new --model_dir")
        # What the checkpoints learnt from stays recorded where these records do not say (an older create's).
        trained_from["sp_model_sha256"] = sorted({*(recorded.get("sp_model_sha256") or []),
                                                  *trained_from["sp_model_sha256"]})
        if "keep_accents" in recorded:
            trained_from.setdefault("keep_accents", recorded["keep_accents"])
    settings = {**dataclasses.asdict(cfg.run), "seq_len": cfg.data.seq_len, "perm_size": cfg.data.perm_size,
                "train_batch_size": cfg.data.bsz_per_host,  # with seq_len, the tokens of a step (curves.py)
                "num_predict": cfg.data.num_predict,
                # how the last run took its steps (it changes no number: a resume may take others)
                "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "recompute": cfg.recompute,
                # the records (absolute: export_hf reads them from anywhere), and what they were made from
                "record_info_dir": ",".join(os.path.abspath(d) for d in cfg.record_info_dir.split(",")),
                **trained_from}
    fileio.write_text_atomic(run_config, json.dumps(settings, indent=2) + "\n")


def records_trained_from(cfg: TrainConfig) -> dict:
    """run_config.json's record of the records: uncased, the SentencePiece model(s) (for export_hf to ship the
    very tokenizer) and keep_accents (left out where no corpus_info.json says: export_hf takes its flag)."""
    trained_from = {"uncased": cfg.data.uncased, "sp_model_sha256": records_models(cfg.record_info_dir)}
    keep_accents = records_keep_accents(cfg.record_info_dir)
    if keep_accents is not None:
        trained_from["keep_accents"] = keep_accents
    return trained_from


def contradicts(recorded: dict, trained_from: dict) -> Optional[str]:
    """What of a run_config.json (`recorded`) the records (`trained_from`) contradict, in words, or None. A key
    either lacks (an older run_config.json, records of an older create) contradicts nothing."""
    there, here = recorded.get("sp_model_sha256") or [], trained_from["sp_model_sha256"]
    if there and set(here) - set(there):
        return f"another SentencePiece model (sha256 {', '.join(there)}; these records': {', '.join(here)})"
    for key in ("uncased", "keep_accents"):
        if key in recorded and key in trained_from and bool(recorded[key]) != trained_from[key]:
            return f"{key}={str(bool(recorded[key])).lower()} (these records: {str(trained_from[key]).lower()})"
    return None


def check_init_checkpoint(cfg: TrainConfig) -> None:
    """ConfigError when --init_checkpoint is one of ours (run_config.json beside it, or in its directory) trained on
    records that the records of this run contradict (another SentencePiece model, other normalisation): its
    embeddings are of other pieces. Transformers directories are checked by their tokenizer (train_gpu.py)."""
    if not cfg.init_checkpoint or hf.is_hf_dir(cfg.init_checkpoint):
        return
    parent = os.path.dirname(cfg.init_checkpoint) or "."
    if os.path.isfile(cfg.init_checkpoint) and hf.is_hf_dir(parent):
        raise ConfigError(f"--init_checkpoint={cfg.init_checkpoint} is a file of the Transformers directory {parent}: "
                          f"give the directory, --init_checkpoint={parent}")
    problem = checkpoints.unreadable(cfg.init_checkpoint)
    if problem:
        raise ConfigError(f"--init_checkpoint={cfg.init_checkpoint} cannot be read as a checkpoint ({problem}); give "
                          "a TensorFlow checkpoint (a prefix such as MODEL_DIR/model.ckpt-1000, or a model_dir), or "
                          "an export_hf directory")
    where = cfg.init_checkpoint if os.path.isdir(cfg.init_checkpoint) else parent
    run_config = os.path.join(where, RUN_CONFIG)
    if not os.path.isfile(run_config):  # the original's checkpoints, ours from elsewhere: nothing to compare
        return
    contradiction = contradicts(save_dir.read_json(run_config), records_trained_from(cfg))
    if contradiction:
        raise ConfigError(f"--init_checkpoint={cfg.init_checkpoint} was trained on records of {contradiction} "
                          f"({run_config}): its embeddings are of other pieces; use records made with its model and "
                          "settings, or another --init_checkpoint")


def records_models(record_info_dir: str) -> list[str]:
    """The sha256 of the SentencePiece model(s) the records of every comma-separated dir were made with (their
    record_infos' made_from; an older create's records name none), sorted."""
    return sorted({validation.check_units_agree(d) for d in record_info_dir.split(",")} - {None})


def records_keep_accents(record_info_dir: str) -> Optional[bool]:
    """Whether create kept accents in the records (their corpus_info.json; no key: the original's stripping),
    None where no corpus_info.json is found."""
    paths = [path for path in map(save_dir.find_corpus_info, record_info_dir.split(",")) if path]
    return any(CorpusInfo.read(path).value("keep_accents") for path in paths) if paths else None


def newest_readable(model_dir: str) -> Optional[str]:
    """The newest checkpoint listed in model_dir whose every tensor can be read (a `.data` file deleted or cut
    short is passed over, with one line saying so), or None when none is listed."""
    listed = checkpoints.listed(model_dir)
    for newer, path in enumerate(reversed(listed)):
        problem = checkpoints.unreadable(path)
        if problem is None:
            return path
        older = listed[-newer - 2] if newer + 1 < len(listed) else None
        log.warning("checkpoint %s cannot be read (%s): %s", path, problem,
                    f"resuming from {older}, the one before it" if older else "no older checkpoint to resume from")
    if listed:
        raise ConfigError(f"no checkpoint in --model_dir={model_dir} can be read (the newest, {listed[-1]}: "
                          f"{checkpoints.unreadable(listed[-1])}); nothing in it was changed: put back the files "
                          f"{os.path.join(model_dir, 'checkpoint')} lists (e.g. from a copy) and run the same command")
    return None


def resume_or_initialise(cfg: TrainConfig, trainer: Trainer) -> tuple[int, ResumedState]:
    """Resumes from model_dir's latest checkpoint, else starts from --init_checkpoint or scratch."""
    latest = newest_readable(cfg.model_dir)
    resumed = ResumedState()
    if latest:
        restore(latest, trainer.model, trainer.optimizer)
        resumed = restore_state(latest, cfg, trainer)
        log.info("resumed from %s (step %d)", latest, int(trainer.optimizer.step.numpy()))
    elif cfg.init_checkpoint and hf.is_hf_dir(cfg.init_checkpoint):  # a Transformers directory (export_hf's)
        for name, value in hf.load_weights(cfg.init_checkpoint, cfg.model).items():
            trainer.model.weights[name].assign(value)
        log.info("model initialised from the Transformers directory %s", cfg.init_checkpoint)
    elif cfg.init_checkpoint:
        checkpoints.load(cfg.init_checkpoint, trainer.model.weights)
        log.info("model initialised from %s", cfg.init_checkpoint)
    return int(trainer.optimizer.step.numpy()), resumed
