"""The PyTorch trainer's held-out loss and best checkpoint, as train_gpu's (pretrain/evaluation.py): the model's
own PLM loss on the first --eval_batches batches of the dev split, every --eval_every steps and at the last.

What the loop (training.py) calls:

    held_out = HeldOut(cfg, ranks, probs, reporter, save_best)   where cfg.eval_every and cfg.eval_record_info_dir
                                                                  (held_out.held_out_dirs) are set
    if held_out.due(step): held_out.evaluate(step, model)        -> Measure of the mixture; keeps the best
    held_out.best                                                 the lowest held-out loss so far (held_out.Best)

`save_best(directory)` is the loop's: it writes the model's weights at this step as a Transformers directory into
`directory` (a folder that does not exist yet; hf.write, as the checkpoints). HeldOut writes it under a temporary
name in model_dir/best/, renames it to `step-<N>` when whole, then writes best.json, then deletes the earlier best:
a crash leaves the earlier best or the new one, whole.

What makes the numbers comparable from one evaluation to the next: no dropout (model.eval()); each batch's
factorization order drawn from (--seed, the index of its first example), as training draws it; memories started
afresh at each evaluation and carried across its batches; the loss of every predicted token summed in float64
over the ranks (distributed.all_sum), so any rank count gives the same sum. A best is chosen among evaluations of
the same held-out batches only (held_out.measured_on: the records by what they were made from, the batches, the
mixture's weights, mem_len): a
resumed run with another held-out set starts a new best, and says so in one line. Held-out records made with
another SentencePiece model than the training records are refused in one line (held_out.check_same_model).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from typing import Optional

import numpy as np
import torch

from xlnet_data.pretrain import held_out
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.held_out import Measure
from xlnet_data.pretrain.layout import find_records
from xlnet_data.pretrain_torch.data import ReplicaSource, tfrecords_folders
from xlnet_data.pretrain_torch.device_features import on_device
from xlnet_data.pretrain_torch.distributed import Ranks, all_sum
from xlnet_data.pretrain_torch.examples import PermutationFn, shipped
from xlnet_data.pretrain_torch.reporting import Reporter

log = logging.getLogger("xlnet_data")

BEST_PREFIX = "step-"  # model_dir/best/step-<N>/: the Transformers directory of the best step


class Evaluator:
    """The first `num_batches` batches of one source's held-out records (this rank's rows of them). `split`: the
    records' split (dev; train to evaluate on the training records); `permutation`: the factorization orders
    (default: training's, drawn from cfg.seed)."""

    def __init__(self, cfg: TrainConfig, ranks: Ranks, record_dir: str, num_batches: int, *, split: str = "dev",
                 permutation: Optional[PermutationFn] = None):
        self.cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, split=split, num_passes=None))
        self.ranks, self.record_dir, self.permutation = ranks, record_dir, permutation
        available = find_records(tfrecords_folders(record_dir), self.cfg.data).num_batch
        if available < num_batches:
            log.info("held-out %s: %d batch(es), fewer than --eval_batches=%d: all of them are evaluated",
                     record_dir, available, num_batches)
        self.num_batches = max(min(num_batches, available), 0)

    def evaluate(self, model) -> Measure:
        """The source's loss and accuracy over its batches, memories started afresh (`model`: the XLNet module,
        not its DDP wrapper: each rank evaluates its rows alone, and the sums meet in all_sum)."""
        totals = np.zeros(3)  # loss, predicted tokens, correct
        was_training = model.training
        model.eval()
        source = ReplicaSource(self.record_dir, self.cfg, self.ranks.world_size, self.ranks.rank,
                               permutation=self.permutation, make=shipped)
        try:
            with torch.no_grad():
                mems = None
                for _ in range(self.num_batches):
                    features = on_device(source.next_batch(), self.ranks.device, self.cfg.data.num_predict)
                    if mems is None:
                        mems = model.initial_mems(features["input_k"].shape[0], self.ranks.device)
                    out = model(features, mems)
                    mask = features["target_mask"].double()
                    correct = model.logits(out.hidden).argmax(-1) == features["target"]
                    totals += [float((out.token_loss.double() * mask).sum()), float(mask.sum()),
                               float((correct.double() * mask).sum())]
                    mems = out.new_mems
        finally:
            source.close()
            model.train(was_training)
        return held_out.measure(*all_sum(totals, self.ranks))


class HeldOut:
    """A run's held-out evaluations: one Evaluator per source (the dev split of each mixed dir, or of the dirs read
    one after the other), the mixture weighted by `probs` (the loop's sampling probabilities), the best checkpoint."""

    def __init__(self, cfg: TrainConfig, ranks: Ranks, probs: np.ndarray, reporter: Reporter,
                 save_best: Callable[[str], None]):
        self.cfg, self.ranks, self.reporter, self.save_best = cfg, ranks, reporter, save_best
        dirs = cfg.eval_record_info_dir.split(",")
        held_out.check_same_model([tfrecords_folders(name) for name in cfg.record_info_dir.split(",")],
                                  [tfrecords_folders(name) for name in dirs])
        groups = dirs if cfg.mix_sampling_factor is not None else [cfg.eval_record_info_dir]
        self.evaluators = [Evaluator(cfg, ranks, group, cfg.eval_batches, split=cfg.eval_split) for group in groups]
        self.labels = [held_out.source_label(group.split(",")[0]) for group in groups]
        self.probs = np.asarray(probs, dtype=np.float64) if len(groups) > 1 else np.ones(1)
        self.measured_on = held_out.measured_on(groups, cfg.eval_split, [e.num_batches for e in self.evaluators],
                                                list(self.probs), cfg.run.mem_len)
        self.best = held_out.resumed_best(cfg.model_dir, self.measured_on)  # a resumed run keeps its best

    def due(self, step: int) -> bool:
        return step % self.cfg.eval_every == 0 or step == self.cfg.train_steps

    def evaluate(self, step: int, model) -> Measure:
        """Evaluates every source, logs and writes the numbers, keeps the weights when they are the best."""
        measures = [evaluator.evaluate(model) for evaluator in self.evaluators]
        mixture, self.best = held_out.conclude(step, measures, self.probs, self.labels, self.best,
                                               lambda scalars: self.reporter.scalars(step, scalars),
                                               lambda mixed: self._keep_best(step, mixed, measures))
        return mixture

    def _keep_best(self, step: int, mixture: Measure, measures: list[Measure]) -> held_out.Best:
        """model_dir/best/step-<step>/ (the Transformers directory of save_best) and best.json; the earlier best
        deleted once the new one is whole and recorded. Only the chief writes."""
        best = held_out.Best(step, mixture.loss, f"{BEST_PREFIX}{step}", {
            **self.measured_on, "eval_batches": self.cfg.eval_batches,
            "sources": {label: m.loss for label, m in zip(self.labels, measures)}})
        if not self.ranks.chief:
            return best
        folder = held_out.best_dir(self.cfg.model_dir)
        os.makedirs(folder, exist_ok=True)
        final = os.path.join(folder, best.checkpoint)
        temporary = os.path.join(folder, f".{best.checkpoint}.tmp-{os.getpid()}")
        shutil.rmtree(temporary, ignore_errors=True)
        try:
            self.save_best(temporary)
            if os.path.isdir(final):  # an earlier run's best of this step (the run resumed from before it)
                shutil.rmtree(final)
            os.replace(temporary, final)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        held_out.write_best(self.cfg.model_dir, best)
        for name in os.listdir(folder):  # the earlier best, and one of a run that stopped between two of these
            if name.startswith(BEST_PREFIX) and name != best.checkpoint:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
        return best
