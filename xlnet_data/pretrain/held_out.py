"""Where a run's held-out records are, and its best checkpoint: what train_gpu and export_hf need before (or
without) TensorFlow. The evaluation itself is evaluation.py.

    held_out_dirs     the held-out records of a run: the dev split beside each of its record dirs (create --split=dev)
    check_same_model  held-out records of another SentencePiece model than the training records' are refused
    evaluations       how many evaluations a run from one step to another makes (the dry run counts them)
    Measure           one evaluation of one source (or of the mixture)
    mixture           the sources' Measures as one, their TensorBoard scalars and log lines
    conclude          an evaluation's end, for both trainers: its lines, its scalars, the best kept
    measured_on       what makes two evaluations comparable (the same held-out records, batches, weights, mem_len)
    BEST_DIR, Best    model_dir/best/: the checkpoint of the lowest held-out loss, and best.json (its step, loss,
                      what it was measured on: a resume on other held-out batches starts a new best, resumed_best)
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
from xlnet_data.dataformat import provenance, save_dir, validation
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


def check_same_model(record_dirs: list[str], eval_dirs: list[str]) -> None:
    """ConfigError when held-out records (tfrecords dirs) were made with another SentencePiece model than the
    training records (their record_infos' sha256): the held-out loss, and the best checkpoint chosen by it, would
    rest on the ids of another vocabulary. Framework-free: every trainer calls it before its first step."""
    trained = {validation.check_units_agree(d) for d in record_dirs} - {None}
    for eval_dir in eval_dirs:
        theirs = validation.check_units_agree(eval_dir)
        if theirs is not None and trained and theirs not in trained:
            raise ConfigError(f"the held-out records in {os.path.abspath(eval_dir)} were made with another "
                              f"SentencePiece model (sha256 {theirs}) than the training records (sha256 "
                              f"{', '.join(sorted(trained))}): their loss would be of another vocabulary's ids; make "
                              "them with the training records' model (create --split=dev --sp_path=...), or pass "
                              "another --eval_record_info_dir")


def evaluations(start: int, end: int, every: int) -> int:
    """How many evaluations a run from step `start` to `end` makes: at every multiple of `every`, and at the last."""
    if not every or end <= start:
        return 0
    return end // every - start // every + (1 if end % every else 0)


def source_label(tfrecords_dir: str) -> str:
    """A held-out source's name in the log and TensorBoard: its save_dir's folder name."""
    return os.path.basename(save_dir.save_dir_of(tfrecords_dir))


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


def measured_on(eval_dirs: list[str], split: str, batches: list[int], weights: list[float], mem_len: int) -> dict:
    """What makes two evaluations comparable, for best.json: the held-out records (by what they were made from, so
    a moved save_dir is the same set; their paths too, for the reader), the batches evaluated from each source, the
    weights of the sources in the mixture, and the memory carried across batches."""
    return {"eval_record_info_dir": ",".join(os.path.abspath(d) for d in eval_dirs),
            "made_from": [provenance.made_from_identity(d.split(","), split) for d in eval_dirs],
            "batches": list(batches), "weights": [round(float(w), 9) for w in weights], "mem_len": mem_len}


def measure_changed(best: Best, now: dict) -> Optional[str]:
    """How the held-out set of `now` (measured_on's) differs from the one `best` was measured on, in words; None
    where it is the same. A best.json of an older train_gpu (no made_from) is compared by its path and
    --eval_batches."""
    then = best.measured_on
    old_dirs = ",".join(os.path.abspath(d) for d in str(then.get("eval_record_info_dir", "")).split(",") if d)
    by_content = "made_from" in then and "" not in then["made_from"] + now["made_from"]  # else by their paths
    if (then["made_from"] != now["made_from"]) if by_content else old_dirs != now["eval_record_info_dir"]:
        return f"other held-out records ({old_dirs or 'unknown'}, now {now['eval_record_info_dir']})"
    if "made_from" not in then:  # an older best.json: its --eval_batches
        return (None if then.get("eval_batches") in (None, *now["batches"]) else
                f"other held-out batches (--eval_batches={then.get('eval_batches')}, now {now['batches']})")
    for key, what in (("batches", "held-out batches per source"), ("weights", "mixture weights"),
                      ("mem_len", "mem_len")):
        if then.get(key) != now[key]:
            return f"other {what} ({then.get(key)}, now {now[key]})"
    return None


def resumed_best(model_dir: str, now: dict) -> Optional[Best]:
    """The best so far that a resumed run keeps: model_dir's best.json where it was measured on the held-out set
    `now` (measured_on's); None, said in one line, where it was measured on another (a loss of other text is no bar
    to beat: the run's first evaluation starts a new best, which replaces it)."""
    best = read_best(model_dir)
    changed = measure_changed(best, now) if best else None
    if changed:
        log.warning("the best checkpoint so far (held-out loss %.4f at step %d, %s) was measured on %s: this run "
                    "starts a new best at its first evaluation, which replaces it", best.loss, best.step,
                    best_dir(model_dir), changed)
        return None
    if best:
        log.info("best held-out loss so far %.4f at step %d (%s)", best.loss, best.step, best_dir(model_dir))
    return best


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
