"""Pretraining XLNet on the records: `train`, the loop, read top to bottom; the rest of a run lives beside it.

    config.py        TrainConfig: everything a run depends on (frozen; train_gpu.py builds it from flags)
    trainer.py       Trainer: the model, the optimizer (optimization.py) and one distributed step (accumulation.py:
                     in K micro-batches)
    distribution.py  the strategy, XLA, and the scoped process settings the steps run under
    sources.py       records -> per-replica batches; which source each step reads when several are mixed
    resume.py        checkpoints (+ the run state for an exact resume), resume, xlnet_config/run_config.json
    reporting.py     the log lines, TensorBoard scalars and the loss guard
    planning.py      the plan (costs.py: parameters, FLOPs, memory) on the run's devices; a run that cannot fit
    evaluation.py    the held-out loss every --eval_every steps, and the best checkpoint (held_out.py)
    train            the loop: steps, logs, TensorBoard summaries, checkpoints; on SIGTERM/SIGINT
                     a checkpoint at the current step, and the run ends (a re-run resumes exactly)
    dry_run          the plan, a few timed steps, the projected wall time to train_steps; writes nothing
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from xlnet_data.common import run_lock, stopping
from xlnet_data.dataformat import save_dir_lock
from xlnet_data.pretrain import checkpoints, planning
from xlnet_data.pretrain.cache_input import CacheFeed
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.costs import StepCost
from xlnet_data.pretrain.distribution import (
    batch_iterator,
    check_workers_start_alike,
    make_strategy,
    meet_at_the_end,
    sum_in_graph_order,
    tensor_float_32,
)
from xlnet_data.pretrain.evaluation import HeldOut
from xlnet_data.pretrain.held_out import Best, evaluations
from xlnet_data.pretrain.inputs import PermutationFn
from xlnet_data.pretrain.layout import (
    check_records,
    in_tfrecords_folders,
    mixing_schedule,
    mixture_line,
    records_gone,
    sampling_probs,
    source_identity,
    source_tokens,
    stopped_at,
)
from xlnet_data.pretrain.reporting import check_losses, report
from xlnet_data.pretrain.resume import (
    MODEL_DIR_LOCK,
    ResumedState,
    check_init_checkpoint,
    check_model_dir,
    resume_or_initialise,
    run_state,
    save,
    say_if_a_better_checkpoint_goes,
)
from xlnet_data.pretrain.sources import Source, find_damage, replica_batches
from xlnet_data.pretrain.trainer import Trainer

log = logging.getLogger("xlnet_data")


@dataclasses.dataclass
class TrainResult:
    step: int  # the global step reached
    first_step: int  # the global step this run started from (> 0 when it resumed)
    losses: list[float]  # loss of every step of this run
    trainer: Trainer
    sources: list[Source]
    stopped_by: Optional[int] = None  # the signal (SIGTERM, SIGINT) that ended the run early
    checkpoint: Optional[str] = None  # the last checkpoint this run wrote
    best: Optional[Best] = None  # the lowest held-out loss so far (with --eval_every and held-out records)


def open_sources(cfg: TrainConfig, trainer: Trainer, step: int, permutation: Optional[PermutationFn],
                 resumed: ResumedState):
    """The sources, each positioned where this run starts in its own stream (and with its memories, when
    resumed from a checkpoint that has them), and the source of every step."""
    names = cfg.sources
    probs = sampling_probs([source_tokens(name, cfg.data) for name in names], cfg.mix_sampling_factor or 0.0)
    schedule = mixing_schedule(probs, cfg.train_steps, cfg.seed)  # all zeros with one source
    done = resumed.positions or np.bincount(schedule[:step], minlength=len(names))
    replicas = trainer.strategy.num_replicas_in_sync
    sources = []
    for i, (name, start) in enumerate(zip(names, done)):
        feed = CacheFeed(resume=resumed.generators[i] if resumed.generators else None)

        def dataset_fn(context, name=name, start=int(start), feed=feed):
            return replica_batches(name, cfg, replicas, start_step=start, permutation=permutation,
                                   input_context=context, feed=feed)
        batches = batch_iterator(trainer.strategy, dataset_fn)
        saved_mems = resumed.mems[i] if resumed.mems else None
        mems = trainer.distribute_mems(saved_mems) if saved_mems else trainer.initial_mems()
        sources.append(Source(name, batches, mems, position=int(start), feed=feed, identity=source_identity(name)))
    return sources, schedule, probs


@dataclasses.dataclass
class DryRun:
    cost: StepCost
    start_step: int  # model_dir's latest checkpoint's step (0 without one)
    first_step_seconds: float  # from `started` to the end of the first step: start-up, tracing, compiling
    timed_steps: int
    step_seconds: float  # the mean of the timed steps after it
    evaluations: int  # held-out evaluations of the run from start_step to train_steps
    evaluation_batches: int  # held-out batches of each (all sources)
    first_evaluation_seconds: float  # the first (tracing), then each other at evaluation_seconds
    evaluation_seconds: float
    projected_seconds: float  # of a run from start_step to train_steps: steps and evaluations (not checkpoints)
    sources: list  # the input sources it read: returned, not freed here, since freeing their tf.data iterators
    # waits for those iterators' threads (seconds; train_gpu.run lets the process end without it)


@dataclasses.dataclass
class _Started:
    """A run at its first step: what _start made."""

    strategy: tf.distribute.Strategy
    chief: bool
    cost: StepCost
    trainer: Trainer
    step: int
    resumed: ResumedState


def dry_run(cfg: TrainConfig, steps: int = 5, started: Optional[float] = None, seconds: float = 20.0) -> DryRun:
    """Every check the run makes before its first step (_start's: the records, the held-out records, the plan,
    --init_checkpoint, model_dir and the checkpoint it resumes from), then 1 + `steps` steps (more while they have
    taken under `seconds`, up to 50 x `steps`) of the run on its records, from where it would resume, and one
    held-out evaluation (two where the run makes several: the first traces), and the wall time projected for the
    run from model_dir's latest checkpoint to cfg.train_steps: the start-up and first step as measured (from
    `started`, default now), every other step at the mean of the timed ones, its evaluations as timed. Writes
    nothing: no model_dir, checkpoint, best checkpoint or summary."""
    started = time.time() if started is None else started
    cfg = in_tfrecords_folders(cfg)
    with sum_in_graph_order(), tensor_float_32(cfg.tf32), contextlib.ExitStack() as held:
        run = _start(cfg, held, None, write=False)
        start = min(run.step, cfg.train_steps)
        sources, schedule, _ = open_sources(cfg, run.trainer, start, None, run.resumed)
        trainer = run.trainer

        def one_step(i):
            source = sources[schedule[(start + i) % len(schedule)]]
            loss, _, _, source.mems = trainer.train_step(next(source.batches), source.mems)
            return loss

        float(one_step(0))
        first = time.time() - started
        tic, timed = time.time(), 0
        # Fast steps for `seconds`: a few of them would weigh the input pipeline's warm-up (and a busy machine's
        # hiccups) far more than a long run does.
        while timed < steps or (time.time() - tic < seconds and timed < 50 * steps):
            timed += 1
            float(one_step(timed))
        step_seconds = (time.time() - tic) / timed
        evaluator = HeldOut(cfg, trainer, False, tf.summary.create_noop_writer()) if _evaluates(cfg) else None
        count = evaluations(start, cfg.train_steps, cfg.eval_every) if evaluator else 0
        timings = [0.0, 0.0]
        for i in range(min(count, 2)):  # the first traces the evaluation; the second is what the others take
            tic = time.time()
            evaluator.measure()
            timings[i:] = [time.time() - tic] * (2 - i)
    left = max(cfg.train_steps - start, 0)
    projected = (first + (left - 1) * step_seconds if left else 0.0) + (
        timings[0] + (count - 1) * timings[1] if count else 0.0)
    return DryRun(run.cost, start, first, timed, step_seconds, count,
                  sum(e.num_batches for e in evaluator.evaluators) if evaluator else 0, timings[0], timings[1],
                  projected, sources)


def _evaluates(cfg: TrainConfig) -> bool:
    return bool(cfg.eval_every and cfg.eval_record_info_dir)


def _start(cfg: TrainConfig, held: contextlib.ExitStack, strategy: Optional[tf.distribute.Strategy], *,
           write: bool = True) -> _Started:
    """What a run does before its first step, every check included: the records (and held-out records) and the
    readers' lock on their save_dirs, --init_checkpoint, the plan (a run that cannot fit stops here, before the model
    is built), model_dir's lock, its xlnet_config.json and run_config.json, and the checkpoint it resumes from (or
    the initial weights). `write` False (the dry run): model_dir is only checked, never locked or written."""
    check_records(cfg)
    record_dirs = cfg.record_info_dir.split(",") + (cfg.eval_record_info_dir.split(",") if _evaluates(cfg) else [])
    held.enter_context(save_dir_lock.reading(record_dirs, "train_gpu"))  # no create --overwrite while it reads
    check_init_checkpoint(cfg)
    strategy = strategy or make_strategy(cfg.strategy, cfg.devices, cfg.tpu)
    chief = strategy.extended.should_checkpoint  # multi-worker: only the chief writes
    cost = planning.announce(cfg, strategy)
    if not write:
        run_lock.refuse_if_busy(cfg.model_dir, MODEL_DIR_LOCK)
    elif chief:  # one writer per model_dir: a second run on it stops here (FolderBusy)
        held.enter_context(run_lock.hold(cfg.model_dir, MODEL_DIR_LOCK))
    check_model_dir(cfg, chief, trained=bool(checkpoints.listed(cfg.model_dir)), write=write)
    trainer = Trainer(cfg, strategy)
    step, resumed = resume_or_initialise(cfg, trainer)
    return _Started(strategy, chief, cost, trainer, step, resumed)


def train(cfg: TrainConfig, *, strategy: Optional[tf.distribute.Strategy] = None,
          permutation: Optional[PermutationFn] = None, stop_after: Optional[int] = None) -> TrainResult:
    """Trains until global step cfg.train_steps (resuming from model_dir when it has a checkpoint).

    On SIGTERM or SIGINT the run saves a checkpoint at the current step and returns early (result.stopped_by).
    Before training, every unit's record count is checked against its record_info; a damaged record met
    while training raises layout.DamagedRecordsError naming it (after a checkpoint at the current step).
    permutation: fixes the factorization orders (see inputs.fixed_permutation).
    stop_after: end after that many steps of this run without a final checkpoint, as if
      the job were killed (to test resuming).
    """
    cfg = in_tfrecords_folders(cfg)
    # Full float32 matmuls on GPUs unless asked (TF32 keeps 10 bits of mantissa: ~1e-3 off the original).
    with stopping.SignalNote() as stop, sum_in_graph_order(), tensor_float_32(cfg.tf32), \
            contextlib.ExitStack() as held:
        return _train(cfg, stop, held, strategy, permutation, stop_after)


def _train(cfg: TrainConfig, stop: stopping.SignalNote, held: contextlib.ExitStack,
           strategy: Optional[tf.distribute.Strategy], permutation: Optional[PermutationFn],
           stop_after: Optional[int]) -> TrainResult:
    run = _start(cfg, held, strategy)
    strategy, chief, cost, trainer, step, resumed = (run.strategy, run.chief, run.cost, run.trainer, run.step,
                                                     run.resumed)
    first_step = step
    check_workers_start_alike(strategy, step, cfg.model_dir)
    log.info("%d replica(s) of %d rows; %s parameters; %s; XLA %s", strategy.num_replicas_in_sync,
             trainer.bsz_per_replica, f"{sum(int(np.prod(v.shape)) for v in trainer.variables):,}",
             "bfloat16" if cfg.run.use_bfloat16 else "float32", "on" if trainer.uses_xla else "off")
    sources, schedule, probs = open_sources(cfg, trainer, step, permutation, resumed)
    writer = tf.summary.create_file_writer(cfg.model_dir) if chief else tf.summary.create_noop_writer()
    held_out = HeldOut(cfg, trainer, chief, writer) if _evaluates(cfg) else None

    saved, saved_step = None, first_step  # this run's last checkpoint (the one it resumed from is at first_step)
    saved_losses: dict[str, float] = {}  # this run's checkpoints: the mean loss of the steps before each

    def check_window():
        """The steps since the last report, read (the device waits for them) and checked for divergence."""
        nonlocal window
        window = [float(value) for value in window]
        check_losses(window, step - len(window), gnorm, lr, cfg)

    def checkpoint():
        nonlocal saved, saved_step
        check_window()  # never a checkpoint of diverged weights
        recent = (losses + window)[-cfg.iterations:]
        loss = sum(recent) / len(recent) if recent else None
        say_if_a_better_checkpoint_goes(cfg, step, loss, saved_losses)
        saved = save(cfg.model_dir, trainer.model, trainer.optimizer, cfg.max_save, run_state(cfg, trainer, sources))
        saved_step = step
        if loss is not None:
            saved_losses[os.path.basename(saved)] = loss
        log.info("saved %s", saved)

    losses, window, tic = [], [], time.time()
    gnorm = lr = None
    damage = None
    end = cfg.train_steps if stop_after is None else min(cfg.train_steps, step + stop_after)
    while step < end and stop.signum is None:
        source = sources[schedule[step]]
        try:
            loss, gnorm, lr, source.mems = trainer.train_step(next(source.batches), source.mems)
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as err:
            log.info("a read failed at step %d; locating the damaged record in %s", step, source.name)
            damage = find_damage(source.name, cfg)
            if damage is None and isinstance(err, tf.errors.NotFoundError):  # a file gone, and back by now
                damage = records_gone(err.message.splitlines()[0])
            if damage is None:
                raise  # not the records: a bug worth its traceback
            break
        source.position += 1
        source.steps += 1
        step += 1
        window.append(loss)  # a tensor: read at the next report, so the device need not wait
        if step % cfg.iterations == 0 or step == cfg.train_steps:
            check_window()
            report(step, window, gnorm, lr, time.time() - tic, cost, cfg.train_steps - step, writer)
            if len(sources) > 1:
                log.info("%s", mixture_line([source.steps for source in sources], probs, cfg.sources))
            losses.extend(window)
            window, tic = [], time.time()
        if held_out and held_out.due(step):
            started = time.time()
            held_out.evaluate(step)
            tic += time.time() - started  # not training's time (but for the steps still queued on the device)
        if chief and (cfg.save_steps and step % cfg.save_steps == 0 or step == cfg.train_steps):
            checkpoint()
    if (stop.signum is not None or damage is not None) and chief and step != saved_step:
        checkpoint()  # what this run did since its last checkpoint is kept
    if step == first_step and stop.signum is None and damage is None:
        log.info("nothing to do: %s is at step %d, train_steps is %d", cfg.model_dir, step, cfg.train_steps)
    writer.flush()
    if step == end and damage is None:
        meet_at_the_end(strategy)
    if damage is not None:
        raise stopped_at(damage, step, saved)
    return TrainResult(step, first_step, losses + [float(value) for value in window], trainer, sources,
                       stop.signum, saved, held_out.best if held_out else None)
