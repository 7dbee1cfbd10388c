"""Where a run's held-out records are, and its best checkpoint: what train_gpu and export_hf need before (or
without) TensorFlow. The evaluation itself is evaluation.py.

    held_out_dirs     the held-out records of a run: the dev split beside each of its record dirs (create --split=dev)
    BEST_DIR, Best    model_dir/best/: the checkpoint of the lowest held-out loss, and best.json (its step, loss)
    read_best, best_checkpoint
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Optional

from xlnet_data.common import fileio
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import save_dir

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


def source_label(tfrecords_dir: str) -> str:
    """A held-out source's name in the log and TensorBoard: its save_dir's folder name."""
    path = os.path.abspath(tfrecords_dir)
    return os.path.basename(os.path.dirname(path) if os.path.basename(path) == save_dir.TFRECORDS else path)


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
