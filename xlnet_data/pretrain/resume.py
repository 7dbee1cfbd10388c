"""What a run keeps in its model_dir, and how a run starts from it.

    save, restore          checkpoints under the original's variable names (+ adam_m/adam_v, global_step),
                           the last --max_save kept (with a warning when a better one would go)
    run_state, restore_state    the rest of what the next step depends on (memories, positions, RNG),
                           checkpointed too, so a resumed run takes the uninterrupted run's steps
    resume_or_initialise   the newest readable checkpoint, else --init_checkpoint, else scratch
    check_model_dir        xlnet_config.json (the model must be the one there) and run_config.json (for export_hf)
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
from xlnet_data.dataformat import save_dir, validation
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.dataformat.examples.generated import Position
from xlnet_data.pretrain import checkpoints, hf
from xlnet_data.pretrain.config import TrainConfig, XLNetConfig
from xlnet_data.pretrain.modeling import XLNet
from xlnet_data.pretrain.optimization import AdamWeightDecay
from xlnet_data.pretrain.trainer import Trainer

if TYPE_CHECKING:
    from xlnet_data.pretrain.sources import Source

log = logging.getLogger("xlnet_data")


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
    # rewritten by every run, since a resumed run may change them.
    settings = {**dataclasses.asdict(cfg.run), "seq_len": cfg.data.seq_len, "perm_size": cfg.data.perm_size,
                "train_batch_size": cfg.data.bsz_per_host,  # with seq_len, the tokens of a step (curves.py)
                "num_predict": cfg.data.num_predict, "uncased": cfg.data.uncased,
                # how the last run took its steps (it changes no number: a resume may take others)
                "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "recompute": cfg.recompute,
                # the records and their SentencePiece model(s), for export_hf to ship the very tokenizer
                "record_info_dir": cfg.record_info_dir, "sp_model_sha256": records_models(cfg.record_info_dir)}
    keep_accents = records_keep_accents(cfg.record_info_dir)
    if keep_accents is not None:  # else export_hf takes its flag
        settings["keep_accents"] = keep_accents
    fileio.write_text_atomic(os.path.join(cfg.model_dir, "run_config.json"), json.dumps(settings, indent=2) + "\n")


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
