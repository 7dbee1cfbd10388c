"""Where a run's held-out records are, and its best checkpoint: what train_gpu and export_hf need before (or
without) TensorFlow. The evaluation itself is evaluation.py.

    held_out_dirs     the held-out records of a run: the dev split beside each of its record dirs (create --split=dev)
    check_same_model  held-out records of the training records' SentencePiece model
    Measure           one evaluation of one source (or of the mixture)
    mixture           the sources' Measures as one, their TensorBoard scalars and log lines
    conclude          an evaluation's end, for both trainers: its lines, its scalars, the best kept
    held_out_set      what makes two evaluations comparable (the same held-out batches)
    BEST_DIR, Best    model_dir/best/: the checkpoint of the lowest held-out loss, and best.json (its step, loss)
    read_best, best_checkpoint
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os
from collections.abc import Callable
from typing import Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import save_dir, validation
from xlnet_data.pretrain.log_lines import held_out_line, loss_scalars

log = logging.getLogger("xlnet_data")

BEST_DIR = "best"  # model_dir/best/: outside the --max_save rotation of model_dir's own checkpoints
BEST_JSON = "best.json"
BEST_NAME = "best"  # export_hf --checkpoint=best


def has_split(tfrecords_dir: str, split: str) -> bool:
    """Whether a tfrecords/ folder holds units of `split` (of any settings)."""
    return bool(glob.glob(os.path.join(tfrecords_dir, f"record_info-{split}-*.json")))


def held_out_dirs(record_dirs: list[str], given: Optional[str], split: str = "dev") -> str:
    """The held-out tfrecords dirs, comma-separated: those `given` (--eval_record_info_dir, save_dirs or tfrecords/
    folders), else the ones of `record_dirs` (the training's tfrecords dirs) that hold a `split` split ("" when
    none does). ConfigError for a given dir without that split."""
    if given:
        dirs = [save_dir.tfrecords_dir(path) for path in given.split(",")]
        for path in dirs:
            if not has_split(path, split):
                raise ConfigError(f"--eval_record_info_dir: no {split} records (record_info-{split}-*.json) in "
                                  f"{os.path.abspath(path)}; make them with create --split={split}")
        return ",".join(dirs)
    return ",".join(path for path in record_dirs if has_split(path, split))


def check_same_model(record_dirs: list[str], held_out: list[str]) -> None:
    """ConfigError, in one line with both sha256s, when held-out records were made with another SentencePiece
    model than the training records (the ids would mean other pieces: the loss would measure nothing). Records
    whose record_info does not say (an older create) pass."""
    trained = {validation.check_units_agree(path): path for path in record_dirs}
    trained.pop(None, None)
    for path in held_out:
        model = validation.check_units_agree(path)
        if model is None or not trained or model in trained:
            continue
        theirs, where = next(iter(trained.items()))
        raise ConfigError(f"the held-out records in {os.path.abspath(path)} were made with another SentencePiece model "
                          f"(sha256 {model}) than the training records in {os.path.abspath(where)} (sha256 {theirs}): "
                          "make them again with create --split=dev and the training records' --sp_path")


def source_label(tfrecords_dir: str) -> str:
    """A held-out source's name in the log and TensorBoard: its save_dir's folder name."""
    path = os.path.abspath(tfrecords_dir)
    return os.path.basename(os.path.dirname(path) if os.path.basename(path) == save_dir.TFRECORDS else path)


@dataclasses.dataclass(frozen=True)
class Measure:
    """One evaluation of one source (or of the mixture)."""

    loss: float  # mean cross-entropy (nats) of the predicted tokens
    accuracy: Optional[float]  # share of the predicted tokens that are the model's top prediction (None: not measured)
    tokens: int  # predicted tokens counted

    @property
    def scalars(self) -> dict[str, float]:
        return {**loss_scalars(self.loss), **({} if self.accuracy is None else {"accuracy": self.accuracy})}


def measure(loss_sum: float, count: float, correct: Optional[float] = None) -> Measure:
    """The Measure of `count` predicted tokens whose losses sum to `loss_sum`, `correct` of them the top guess."""
    def per_token(value):
        return value / count if count else math.nan
    return Measure(per_token(loss_sum), None if correct is None else per_token(correct), int(count))


def mixture(step: int, measures: list[Measure], probs, labels: list[str]) -> tuple[Measure, dict[str, float],
                                                                                list[str]]:
    """The Measure of the mixture of the sources' `measures` (weighted by the sampling probabilities `probs`), the
    TensorBoard scalars (held_out/loss ...; with several sources held_out/<label>/loss ... too), and each source's
    log line (none with one source)."""
    if len(measures) == 1:
        mixed = measures[0]
    else:
        accuracies = [m.accuracy for m in measures]
        mixed = Measure(float(np.dot(probs, [m.loss for m in measures])),
                        None if None in accuracies else float(np.dot(probs, accuracies)), sum(m.tokens for m in measures))
    scalars = {f"held_out/{key}": value for key, value in mixed.scalars.items()}
    lines = []
    if len(measures) > 1:
        for label, measure in zip(labels, measures):
            scalars |= {f"held_out/{label}/{key}": value for key, value in measure.scalars.items()}
            lines.append(held_out_line(step, measure.loss, measure.accuracy, measure.tokens, 0, 0, label))
    return mixed, scalars, lines


def conclude(step: int, measures: list[Measure], probs, labels: list[str], best: Optional[Best],
             write_scalars: Callable[[dict], None], keep_best: Callable[[Measure], Best]) -> tuple[Measure, Best]:
    """The end of an evaluation at `step` of the sources' `measures`: each source's line, the scalars written, the
    mixture kept by `keep_best` (which saves the weights and returns their Best) when it beats `best`, the held-out
    line. Returns the mixture and the best after it."""
    mixed, scalars, lines = mixture(step, measures, probs, labels)
    for line in lines:
        log.info("%s", line)
    write_scalars(scalars)
    if best is None or mixed.loss < best.loss:
        best = keep_best(mixed)
    log.info("%s", held_out_line(step, mixed.loss, mixed.accuracy, mixed.tokens, best.loss, best.step))
    return mixed, best


HELD_OUT_SET_KEYS = ("eval_record_info_dir", "eval_split", "eval_batches", "train_batch_size", "seed")


def held_out_set(eval_record_info_dir: str, eval_split: str, eval_batches: int, train_batch_size: int,
                 seed: int) -> dict:
    """What fixes the held-out batches and their factorization orders: two evaluations of the same set compare."""
    dirs = ",".join(os.path.abspath(path) for path in eval_record_info_dir.split(","))
    return dict(zip(HELD_OUT_SET_KEYS, (dirs, eval_split, eval_batches, train_batch_size, seed)))


@dataclasses.dataclass(frozen=True)
class Best:
    """model_dir/best/best.json: the step of the lowest held-out loss, that loss, its checkpoint's name in
    model_dir/best/, and what it was measured on (the held-out dirs, batches, each source's loss)."""

    step: int
    loss: float
    checkpoint: str
    measured_on: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    def measured_on_set(self, held_out: dict) -> bool:
        """Whether this best was measured on the held-out set `held_out` (held_out_set's)."""
        return all(self.measured_on.get(key) == value for key, value in held_out.items())


def best_dir(model_dir: str) -> str:
    return os.path.join(model_dir, BEST_DIR)


def read_best(model_dir: str) -> Optional[Best]:
    """The best checkpoint's record, None where there is none (a run without held-out records)."""
    path = os.path.join(best_dir(model_dir), BEST_JSON)
    if not fileio.exists(path):
        return None
    data = save_dir.read_json(path)
    try:
        return Best(int(data["step"]), float(data["loss"]), str(data["checkpoint"]), dict(data.get("measured_on", {})))
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path} is not a best.json of train_gpu (step, loss, checkpoint); delete it") from None


def write_best(model_dir: str, best: Best) -> None:
    fileio.write_text_atomic(os.path.join(best_dir(model_dir), BEST_JSON), best.to_json())


def best_checkpoint(model_dir: str) -> str:
    """The prefix of model_dir's best checkpoint (export_hf --checkpoint=best); ConfigError where it has none."""
    best = read_best(model_dir)
    if best is None:
        raise ConfigError(f"--model_dir={model_dir} has no best checkpoint ({os.path.join(BEST_DIR, BEST_JSON)}): "
                          "train_gpu keeps one only when it evaluates held-out records (create --split=dev)")
    return os.path.join(best_dir(model_dir), best.checkpoint)
