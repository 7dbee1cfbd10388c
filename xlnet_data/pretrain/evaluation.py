"""The held-out loss: the model's own PLM loss on the same held-out batches at every evaluation.

    Evaluator   one source's first `num_batches` held-out batches: loss, accuracy of the predicted tokens
    HeldOut     a run's evaluations: each source's and their mixture's, the log line and TensorBoard scalars,
                and the best checkpoint (model_dir/best/, held_out.py), which a resumed run keeps

What makes the numbers comparable from one evaluation to the next: no dropout; the factorization order of each
batch drawn, as training draws it, from (--seed, the index of the batch's first example), so always the same
one; memories started afresh at each evaluation and carried across its batches, as training carries them; the
loss of every predicted token summed in float64 over the replicas (gathered, so that any replica count gives the
same sum) and divided by their number. Training's log line is the mean of each step's per-replica means on
the batch it has just trained on, with dropout and a new order: see docs/pretraining.md for how the two differ.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from xlnet_data.pretrain import checkpoints, held_out
from xlnet_data.pretrain.cache_input import CacheFeed
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.distribution import batch_source
from xlnet_data.pretrain.held_out import Measure
from xlnet_data.pretrain.inputs import PermutationFn
from xlnet_data.pretrain.layout import find_records, sampling_probs, source_tokens
from xlnet_data.pretrain.reporting import write_scalars
from xlnet_data.pretrain.sources import replica_batches
from xlnet_data.pretrain.trainer import Trainer

log = logging.getLogger("xlnet_data")


class Evaluator:
    """The first `num_batches` batches (from batch `start`) of one source's held-out records, evaluated with
    the trainer's model on its strategy. `split` is the records' split (dev; train to evaluate on the training
    records); `permutation` fixes the factorization orders (default: training's, drawn from cfg.seed)."""

    def __init__(self, cfg: TrainConfig, trainer: Trainer, record_dir: str, num_batches: int, *,
                 split: str = "dev", start: int = 0, permutation: Optional[PermutationFn] = None):
        self.cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, split=split, num_passes=None))
        self.trainer, self.record_dir, self.start, self.permutation = trainer, record_dir, start, permutation
        available = find_records(record_dir, self.cfg.data).num_batch - start
        if available < num_batches:
            log.info("held-out %s: %d batch(es), fewer than --eval_batches=%d: all of them are evaluated",
                     record_dir, available, num_batches)
        self.num_batches = max(min(num_batches, available), 0)
        self._step = None  # made at the first evaluation, once the trainer knows whether XLA compiles
        self._batches = None  # the batches, made once: each evaluation iterates them from the start

    def _dataset(self, context):
        return replica_batches(self.record_dir, self.cfg, self.trainer.strategy.num_replicas_in_sync,
                               start_step=self.start, permutation=self.permutation, input_context=context,
                               feed=CacheFeed())

    def _replica(self, features, mems):
        out = self.trainer.model.plm_loss(features, mems, training=False, with_correct=True)
        mask = tf.cast(features["target_mask"], tf.float32)
        return out.token_loss * mask, mask, out.correct * mask, out.new_mems

    def _distributed(self, features, mems):
        strategy = self.trainer.strategy
        loss, mask, correct, new_mems = strategy.run(self._replica_pass, args=(features, mems))
        return [strategy.gather(value, axis=0) for value in (loss, mask, correct)], new_mems

    def evaluate(self) -> Measure:
        """The source's loss and accuracy over its batches, memories started afresh."""
        if self._step is None:
            self._replica_pass = (tf.function(self._replica, jit_compile=True, autograph=False)
                                  if self.trainer.uses_xla else self._replica)
            self._step = tf.function(self._distributed, autograph=False)  # as the trainer's step (trainer.py)
            self._batches = batch_source(self.trainer.strategy, self._dataset)
        batches = iter(self._batches)
        mems = self.trainer.initial_mems()
        totals = np.zeros(3)
        for _ in range(self.num_batches):
            values, mems = self._step(next(batches), mems)
            totals += [np.sum(value.numpy(), dtype=np.float64) for value in values]
        return held_out.measure(*totals)


class HeldOut:
    """A run's held-out evaluations: one Evaluator per source (the dev split of each mixed dir, or of the dirs
    read one after the other), the mixture weighted as training samples the sources; the best checkpoint."""

    def __init__(self, cfg: TrainConfig, trainer: Trainer, chief: bool, writer):
        self.cfg, self.trainer, self.chief, self.writer = cfg, trainer, chief, writer
        dirs = cfg.eval_record_info_dir.split(",")
        groups = dirs if cfg.mix_sampling_factor is not None else [cfg.eval_record_info_dir]
        self.evaluators = [Evaluator(cfg, trainer, group, cfg.eval_batches, split=cfg.eval_split) for group in groups]
        self.labels = [held_out.source_label(group.split(",")[0]) for group in groups]
        self.probs = (sampling_probs([source_tokens(name, cfg.data) for name in cfg.sources], cfg.mix_sampling_factor)
                      if len(groups) > 1 else np.ones(1))
        self.measured_on = held_out.measured_on(groups, cfg.eval_split, [e.num_batches for e in self.evaluators],
                                                list(self.probs), cfg.run.mem_len)
        self.best = held_out.resumed_best(cfg.model_dir, self.measured_on)

    def due(self, step: int) -> bool:
        return step % self.cfg.eval_every == 0 or step == self.cfg.train_steps

    def measure(self) -> tuple[Measure, list[Measure]]:
        """The mixture's numbers and each source's, with no log, summary or checkpoint (the dry run times it)."""
        measures = [evaluator.evaluate() for evaluator in self.evaluators]
        return held_out.mixture(0, measures, self.probs, self.labels)[0], measures

    def evaluate(self, step: int) -> Measure:
        """Evaluates every source, logs and writes the numbers, keeps the checkpoint when it is the best."""
        measures = self.measure()[1]
        mixture, self.best = held_out.conclude(
            step, measures, self.probs, self.labels, self.best, lambda scalars: write_scalars(step, scalars, self.writer),
            lambda mixed: self._keep_best(step, mixed, measures))
        return mixture

    def _keep_best(self, step: int, mixture: Measure, measures: list[Measure]) -> held_out.Best:
        """model_dir/best/: the weights at `step` (one checkpoint, the earlier best deleted) and best.json."""
        name = f"model.ckpt-{step}"
        self.best = held_out.Best(step, mixture.loss, name, {
            **self.measured_on, "eval_batches": self.cfg.eval_batches,
            "sources": {label: m.loss for label, m in zip(self.labels, measures)}})
        if self.chief:
            checkpoints.save(os.path.join(held_out.best_dir(self.cfg.model_dir), name),
                             {"global_step": self.trainer.optimizer.step, **self.trainer.model.weights}, max_save=1)
            held_out.write_best(self.cfg.model_dir, self.best)
        return self.best
