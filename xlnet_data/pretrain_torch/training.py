"""The PyTorch trainer's loop (train_torch.py builds its TrainConfig), read top to bottom: train_gpu's run
(pretrain/training.py) on our PyTorch XLNet, step for step.

    setup       the checks (records, plan, model_dir), the model (train_gpu's initialisers, the same seed), the
                optimiser, the resume (checkpoint.py) or --init_checkpoint, the sources (data.py) with their memories
    train       per step: the source the mixing schedule names, this rank's rows of it in K micro-batches
                (accumulation.py) weighted by the step's targets over all ranks (so N ranks take one rank's step; train_gpu
                weights each replica by its own), DDP's mean of the gradients, clipping, the original's Adam (optim.py);
                the log line every --iterations steps, the held-out loss every --eval_every, a checkpoint every
                --save_steps and at the end; SIGTERM/SIGINT: a checkpoint at the current step, then the end (the same
                command resumes exactly: weights, optimiser, memories, positions, random states)
    dry_run     the plan, timed steps, one evaluation and one checkpoint timed, the projection; writes nothing
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from xlnet_data.common import run_lock, stopping
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import save_dir_lock
from xlnet_data.dataformat.examples.generated import Position
from xlnet_data.dataformat.record_reader import RecordError
from xlnet_data.dataformat.token_cache import TokenCacheError
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.held_out import Best
from xlnet_data.pretrain.layout import (
    NoRecordsError,
    check_records,
    mixture_line,
    records_gone,
    source_identity,
    stopped_at,
)
from xlnet_data.pretrain.model_dir import check_model_dir, check_same_sources, check_trained_from, model_dir_lock
from xlnet_data.pretrain_torch import checkpoint, distributed, planning
from xlnet_data.pretrain_torch.accumulation import forward_backward
from xlnet_data.pretrain_torch.data import ReplicaSource, SourcePosition, open_sources, tfrecords_folders
from xlnet_data.pretrain_torch.device_features import on_device
from xlnet_data.pretrain_torch.evaluation import Evaluator, HeldOut
from xlnet_data.pretrain_torch.examples import PermutationFn, shipped
from xlnet_data.pretrain_torch.modeling import XLNet, init_weights
from xlnet_data.pretrain_torch.optim import AdamWeightDecay, clip_by_global_norm
from xlnet_data.pretrain_torch.reporting import Reporter, check_losses

log = logging.getLogger("xlnet_data")
MODEL_DIR_LOCK = model_dir_lock("train_torch")


@dataclasses.dataclass
class TrainResult:
    step: int  # the global step reached
    first_step: int  # the step this run started from (> 0 when it resumed)
    losses: list[float]  # the loss of every step of this run
    model: XLNet
    sources: list[ReplicaSource]  # closed; each with its memories (.mems) and its steps this run (.steps)
    stopped_by: Optional[int] = None  # the signal (SIGTERM, SIGINT) that ended the run early
    checkpoint: Optional[str] = None  # the last checkpoint this run wrote
    best: Optional[Best] = None  # the lowest held-out loss so far


@dataclasses.dataclass
class Run:
    """What setup made: everything the steps read and change."""

    cfg: TrainConfig
    ranks: distributed.Ranks
    model: XLNet  # the module (its state_dict is the checkpoint's)
    net: torch.nn.Module  # the module under DDP with several ranks, compiled with --compile
    optimizer: AdamWeightDecay
    sources: list[ReplicaSource]
    schedule: np.ndarray  # the source of every step
    probs: np.ndarray
    cost: object  # costs.StepCost
    settings: checkpoint.DirectorySettings

    @property
    def step(self) -> int:
        return self.optimizer.step

    def autocast(self):
        """bfloat16 compute (--use_bfloat16): matmuls in bfloat16, softmaxes, layer norms and the loss in float32."""
        if not self.cfg.run.use_bfloat16:
            return contextlib.nullcontext()
        return torch.autocast(self.ranks.device.type, dtype=torch.bfloat16)

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One update: (this rank's share of the step's loss, the gradient norm before clipping, the learning
        rate)."""
        source = self.sources[self.schedule[self.step]]
        batch = on_device(source.next_batch(), self.ranks.device, self.cfg.data.num_predict)
        no_sync = getattr(self.net, "no_sync", contextlib.nullcontext)
        num_targets = None  # one rank: its own count
        if self.ranks.distributed:  # the step's count over the ranks: their shares sum to one rank's mean
            num_targets = float(distributed.all_sum([float(batch["target_mask"].sum())], self.ranks)[0])
        loss, source.mems = forward_backward(self.net, batch, source.mems, self.cfg.gradient_accumulation_steps,
                                             self.cfg.run.bi_data, self.autocast, no_sync, num_targets,
                                             self.ranks.world_size)
        parameters = list(self.optimizer.parameters.values())
        gnorm = clip_by_global_norm(parameters, self.cfg.clip)
        lr = self.optimizer.apply()
        for p in parameters:
            p.grad = None
        return loss, gnorm, lr

    def state(self) -> dict:
        """training_state.pt: what the next step depends on besides the weights, every rank's (gathered)."""
        per_rank = {"random": checkpoint.random_states(),
                    "mems": [[mem.cpu() for mem in s.mems] if s.mems is not None else None for s in self.sources]}
        if self.ranks.distributed:
            gathered = [None] * self.ranks.world_size
            dist.all_gather_object(gathered, per_rank)
        else:
            gathered = [per_rank]
        sources = []
        for i, source in enumerate(self.sources):
            at = source.position()
            generated = at.generated
            sources.append({"record_dir": source.name, "identity": source_identity(source.name), "step": at.step,
                            "generated": None if generated is None else [generated.step,
                                                                         torch.from_numpy(generated.numpy_mt),
                                                                         torch.from_numpy(generated.python_mt)],
                            "mems": [rank["mems"][i] for rank in gathered]})
        return {"seed": self.cfg.seed, "step": self.step, "optimizer": self.optimizer.state_dict(),
                "random": [rank["random"] for rank in gathered], "sources": sources}

    def save(self, model_dir: str) -> str:
        state = self.state()  # a collective: every rank
        if not self.ranks.chief:
            return ""
        return checkpoint.save(model_dir, self.step, self.model, state, self.settings, self.cfg.max_save)

    def save_best(self, directory: str) -> None:
        """The weights of this step as a Transformers directory (evaluation.HeldOut's best)."""
        checkpoint.write_weights(directory, self.model, self.settings, f"the best held-out loss, step {self.step}")

    def close(self) -> None:
        for source in self.sources:
            source.close()


def _resumed_sources(path: str, cfg: TrainConfig, state: dict, ranks: distributed.Ranks):
    """Each source's position and this rank's memories from checkpoint `path`'s state; (None, None) where it was
    trained on other sources (each then starts where the schedule puts it, with empty memories)."""
    saved = state["sources"]
    if len(saved) != len(cfg.sources):
        log.warning("%s was trained on other sources than --record_info_dir: each starts where the mixing schedule "
                    "puts it, with empty memories", path)
        return None, None
    check_same_sources(path, cfg, [(s["identity"], s["record_dir"]) for s in saved])
    positions = [SourcePosition(s["step"], None if s["generated"] is None else Position(
        int(s["generated"][0]), s["generated"][1].numpy(), s["generated"][2].numpy())) for s in saved]
    if len(saved[0]["mems"]) != ranks.world_size:
        log.warning("%s was trained on %d rank(s), this run has %d: memories start empty", path, len(saved[0]["mems"]),
                    ranks.world_size)
        return positions, None
    return positions, [s["mems"][ranks.rank] for s in saved]


def _evaluates(cfg: TrainConfig) -> bool:
    return bool(cfg.eval_every and cfg.eval_record_info_dir)


def setup(cfg: TrainConfig, held: contextlib.ExitStack, permutation: Optional[PermutationFn], *,
          device: str = "auto", writes: bool = True) -> Run:
    """The run, ready for its next step (see the module doc), after every check it makes before its first step (as
    train_gpu's _start): the records and held-out records, the readers' lock on their save_dirs (held in `held`),
    the plan, model_dir's lock, its xlnet_config.json and run_config.json, the checkpoint it resumes from or
    --init_checkpoint. `writes` False (the dry run): model_dir is only checked, never locked or written."""
    ranks = distributed.start(device)
    if cfg.attention == "flex" and ranks.device.type == "cpu":
        raise ConfigError("--attention=flex trains on a GPU only (torch has no FlexAttention backward on the CPU): "
                          "give --attention=eager")
    # Full float32 matmuls on GPUs unless --tf32 (TF32 keeps 10 bits of mantissa: about 1e-3 off the original).
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.tf32
    check_records(cfg)
    record_dirs = cfg.record_info_dir.split(",") + (cfg.eval_record_info_dir.split(",") if _evaluates(cfg) else [])
    held.enter_context(save_dir_lock.reading(record_dirs, "train_torch"))  # no create --overwrite while it reads
    cost = planning.announce(cfg, ranks.world_size, ranks.device)  # a run that cannot fit stops before the model
    latest = checkpoint.latest(cfg.model_dir)
    if not writes:
        run_lock.refuse_if_busy(cfg.model_dir, MODEL_DIR_LOCK)
    elif ranks.chief:  # one writer per model_dir: a second run on it stops here (FolderBusy)
        held.enter_context(run_lock.hold(cfg.model_dir, MODEL_DIR_LOCK))
    check_model_dir(cfg, ranks.chief, trained=latest is not None, write=writes)
    model = XLNet(cfg.model, cfg.run, recompute=cfg.recompute, attention=cfg.attention)
    init_weights(model, cfg.run, torch.Generator().manual_seed(cfg.seed))
    torch.manual_seed(cfg.seed + ranks.rank)  # dropout's draws, each rank its own
    model.to(ranks.device)
    optimizer = AdamWeightDecay({name: p for name, p in model.named_parameters()}, cfg)
    positions = mems = None
    if latest:
        checkpoint.load_weights(model, latest)
        state = checkpoint.read_state(latest, cfg)
        optimizer.load_state_dict(state["optimizer"])
        positions, mems = _resumed_sources(latest, cfg, state, ranks)
        random_states = state["random"]
        checkpoint.set_random_states(random_states[ranks.rank] if len(random_states) == ranks.world_size
                                     else random_states[0])
        log.info("resumed from %s (step %d)", latest, optimizer.step)
    elif cfg.init_checkpoint:
        if not os.path.isfile(cfg.init_checkpoint):
            check_trained_from(cfg.init_checkpoint, cfg.init_checkpoint if os.path.isdir(cfg.init_checkpoint)
                               else os.path.dirname(cfg.init_checkpoint) or ".", cfg)
        log.info("model initialised from %s", checkpoint.initialise(model, cfg.init_checkpoint))
    distributed.check_same_start(optimizer.step, ranks, cfg.model_dir)
    sources, schedule, probs = open_sources(cfg, ranks.world_size, ranks.rank, optimizer.step, permutation, positions,
                                            make=shipped)  # perm_mask and target_mapping made on the device
    rows = sources[0].rows.size
    for i, source in enumerate(sources):
        source.mems = ([mem.to(ranks.device) for mem in mems[i]] if mems and mems[i] is not None
                       else model.initial_mems(rows, ranks.device))
    log.info("%d rank(s) of %d rows on %s; %s parameters; %s", ranks.world_size, rows, ranks.device,
             f"{sum(p.numel() for p in optimizer.parameters.values()):,}",
             "bfloat16" if cfg.run.use_bfloat16 else "float32")
    net = distributed.wrap(model, ranks)
    if cfg.torch_compile:  # the step's module compiled; `model` keeps the weights' names for the checkpoints
        net = torch.compile(net)
    return Run(cfg, ranks, model, net, optimizer, sources, schedule, probs, cost, checkpoint.directory_settings(cfg))


def _in_tfrecords_folders(cfg: TrainConfig) -> TrainConfig:
    """The config with each record dir as its tfrecords/ folder (the library takes create's save_dirs too)."""
    held_out_dirs = cfg.eval_record_info_dir and tfrecords_folders(cfg.eval_record_info_dir)
    return dataclasses.replace(cfg, record_info_dir=tfrecords_folders(cfg.record_info_dir),
                               eval_record_info_dir=held_out_dirs)


def train(cfg: TrainConfig, *, permutation: Optional[PermutationFn] = None, stop_after: Optional[int] = None,
          device: str = "auto") -> TrainResult:
    """Trains until global step cfg.train_steps, resuming from model_dir's latest checkpoint when it has one.

    On SIGTERM or SIGINT the run saves a checkpoint at the current step and returns early (result.stopped_by).
    permutation: fixes the factorization orders (examples.fixed_permutation; default examples.seeded_permutation).
    stop_after: end after that many steps of this run without a final checkpoint, as if the job were killed.
    """
    cfg = _in_tfrecords_folders(cfg)
    with stopping.SignalNote() as stop, contextlib.ExitStack() as held:
        run = setup(cfg, held, permutation, device=device)
        held.callback(run.close)
        return _train(run, stop, stop_after)


def _train(run: Run, stop: stopping.SignalNote, stop_after: Optional[int]) -> TrainResult:
    cfg, chief = run.cfg, run.ranks.chief
    reporter = Reporter(cfg.model_dir, run.cost, chief)
    held_out = HeldOut(cfg, run.ranks, run.probs, reporter, run.save_best) if _evaluates(cfg) else None
    first_step = step = run.step
    saved, saved_step = None, first_step
    losses, window, tic = [], [], time.time()
    gnorm, lr = None, 0.0
    damage = None  # damaged or vanished records met: the run ends after a checkpoint of the steps before

    def check_window():
        """The steps since the last report, read (the device waits for them) and checked for divergence."""
        nonlocal window
        window = [float(value) for value in window]
        check_losses(window, step - len(window), None if gnorm is None else float(gnorm), lr, cfg.max_loss,
                     checkpoint.latest(cfg.model_dir))

    def save():
        nonlocal saved, saved_step
        check_window()  # never a checkpoint of diverged weights
        saved, saved_step = run.save(cfg.model_dir) or saved, step
        if chief:
            log.info("saved %s", saved)

    end = cfg.train_steps if stop_after is None else min(cfg.train_steps, step + stop_after)
    while step < end and stop.signum is None:
        try:
            loss, gnorm, lr = run.train_step()  # reads its batch first: a read error leaves the step untaken
        except (RecordError, NoRecordsError, TokenCacheError) as err:
            gone = isinstance(err, RecordError) and err.path and not os.path.exists(err.path)
            damage = records_gone(str(err)) if gone else err
            break
        if run.ranks.distributed:  # the step's loss: the sum of the ranks' shares
            loss = torch.tensor(distributed.all_sum([float(loss)], run.ranks)[0])
        step += 1
        window.append(loss)  # a tensor: read at the next report, so the device need not wait
        if step % cfg.iterations == 0 or step == cfg.train_steps:
            check_window()
            reporter.report(step, window, float(gnorm), lr, time.time() - tic, cfg.train_steps - step)
            if len(run.sources) > 1:
                log.info("%s", mixture_line([source.steps for source in run.sources], run.probs, cfg.sources))
            losses.extend(window)
            window, tic = [], time.time()
        if held_out and held_out.due(step):
            started = time.time()
            held_out.evaluate(step, run.model)
            tic += time.time() - started  # not training's time
        if cfg.save_steps and step % cfg.save_steps == 0 or step == cfg.train_steps:
            save()
    if (stop.signum is not None or damage is not None) and step != saved_step:
        save()  # what this run did since its last checkpoint is kept
    if step == first_step and stop.signum is None and damage is None:
        log.info("nothing to do: %s is at step %d, train_steps is %d", cfg.model_dir, step, cfg.train_steps)
    reporter.close()
    if damage is not None:
        raise stopped_at(damage, step, saved)
    if step == end:
        distributed.finish(run.ranks)
    return TrainResult(step, first_step, losses + [float(value) for value in window], run.model, run.sources,
                       stop.signum, saved, held_out.best if held_out else None)


def dry_run(cfg: TrainConfig, started: float, steps: int = 5, seconds: float = 20.0,
            device: str = "auto") -> planning.DryRun:
    """The plan (refused if it cannot fit), then timed steps of the run on its records from model_dir's latest
    checkpoint (or fresh weights), one checkpoint timed in a temporary folder, and the projected wall time to
    cfg.train_steps (planning.dry_run). Writes nothing to model_dir. `started`: when the process started."""
    cfg = _in_tfrecords_folders(cfg)
    with contextlib.ExitStack() as held:
        run = setup(cfg, held, None, device=device, writes=False)
        held.callback(run.close)
        start = run.step

        def step(i):
            run.optimizer.step = start + i % max(cfg.train_steps - start, 1)  # the schedule's sources and rates
            float(run.train_step()[0])  # waits for the device

        evaluate = None
        if _evaluates(cfg):
            evaluator = Evaluator(cfg, run.ranks, cfg.eval_record_info_dir, cfg.eval_batches, split=cfg.eval_split)
            evaluate = functools.partial(evaluator.evaluate, run.model)
        return planning.dry_run(cfg, run.cost, start, started, step, evaluate, run.save, steps=steps,
                                seconds=seconds)
