"""What a run keeps in its model_dir, and how a run starts from it.

    save, restore          checkpoints under the original's variable names (+ adam_m/adam_v, global_step),
                           the last --max_save kept (with a warning when a better one would go)
    run_state, restore_state    the rest of what the next step depends on (memories, positions, RNG),
                           checkpointed too, so a resumed run takes the uninterrupted run's steps
    resume_or_initialise   the newest readable checkpoint, else --init_checkpoint, else scratch
    (model_dir.py: what a model_dir holds besides checkpoints and what it refuses, shared with train_torch)

A model_dir knows what it was trained from and refuses what contradicts it: the model (xlnet_config.json), the
records' SentencePiece model and normalisation (run_config.json, for a model_dir with a checkpoint, and beside an
--init_checkpoint of ours), the sources, by what their records were made from (in each checkpoint). One run
writes it at a time (MODEL_DIR_LOCK, taken by training.train).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Optional

import numpy as np
import tensorflow as tf

from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat.examples.generated import Position
from xlnet_data.pretrain import checkpoints, hf
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.model_dir import (  # noqa: F401 (check_model_dir and records_*: resume's callers know them here)
    check_model_dir,
    check_same_sources,
    check_trained_from,
    model_dir_lock,
    records_keep_accents,
    records_models,
)
from xlnet_data.pretrain.modeling import XLNet
from xlnet_data.pretrain.optimization import AdamWeightDecay
from xlnet_data.pretrain.trainer import Trainer

if TYPE_CHECKING:
    from xlnet_data.pretrain.sources import Source

log = logging.getLogger("xlnet_data")

MODEL_DIR_LOCK = model_dir_lock("train_gpu")


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
    check_same_sources(path, cfg, [(saved.get(f"{STATE}source_{i}/made_from", b"").decode(),
                                    saved.get(f"{STATE}source_{i}/record_dir", b"?").decode()) for i in range(count)])
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


def check_init_checkpoint(cfg: TrainConfig) -> None:
    """ConfigError when --init_checkpoint is not a readable checkpoint, or one of ours trained on records that the
    records of this run contradict (model_dir.check_trained_from). Transformers directories are checked by their
    tokenizer (train_gpu.py)."""
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
    check_trained_from(cfg.init_checkpoint, cfg.init_checkpoint if os.path.isdir(cfg.init_checkpoint) else parent, cfg)


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
