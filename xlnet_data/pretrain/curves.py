"""A run's curves from its model_dir: the TensorBoard scalars train_gpu wrote (reporting.py, evaluation.py), read
back and drawn: the training and held-out loss and the learning rate against steps (and tokens).

    read_scalars    {tag: (steps, values)} of every event file of a model_dir (a resumed run's included)
    plot_curves     the PNG
"""

from __future__ import annotations

import glob
import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.util import event_pb2

from xlnet_data.common.errors import UserError

HELD_OUT = "held_out/"


class CurvesError(UserError, ValueError):
    """A model_dir without the summaries to draw."""


def read_scalars(model_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every scalar of the model_dir's event files, by tag, sorted by step. A step written twice (a run resumed
    from an earlier checkpoint takes its steps again) keeps the value written last."""
    paths = glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))
    if not paths:
        raise CurvesError(f"{model_dir}: no TensorBoard event files (events.out.tfevents.*): is it a --model_dir of "
                          "train_gpu?")
    points: dict[str, dict[int, tuple[float, float]]] = {}
    for path in paths:
        for event in _events(path):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                seen = points.setdefault(value.tag, {})
                if event.step not in seen or seen[event.step][0] <= event.wall_time:
                    seen[event.step] = (event.wall_time, number)
    return {tag: (np.array(sorted(seen)), np.array([seen[step][1] for step in sorted(seen)]))
            for tag, seen in points.items()}


def _events(path: str):
    """The Event protos of an event file; one that a running train_gpu is writing ends at its last whole one."""
    try:
        for record in tf.data.TFRecordDataset(path):
            yield event_pb2.Event.FromString(record.numpy())
    except tf.errors.DataLossError:
        return


def tokens_per_step(model_dir: str) -> Optional[int]:
    """Tokens a step trains on (train_batch_size x seq_len, from run_config.json), None where it does not say."""
    path = os.path.join(model_dir, "run_config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        config = json.load(f)
    if config.get("train_batch_size") and config.get("seq_len"):
        return int(config["train_batch_size"]) * int(config["seq_len"])
    return None


def plot_curves(scalars: dict, output: str, title: str = "", tokens: Optional[int] = None) -> list[str]:
    """Draws the loss (training; held-out: the mixture and each source) and the learning rate against steps,
    tokens on a second axis, into the PNG `output`. Returns the tags drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "loss" not in scalars:
        raise CurvesError("no training loss among the summaries: the run logged no step yet (see --iterations)")
    held = sorted(tag for tag in scalars if tag.startswith(HELD_OUT) and tag.endswith("/loss"))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(3, 1.3))
    top.plot(*scalars["loss"], label="training loss (each step's own batch, as trained on)", color="#4c72b0")
    for tag in held:
        name = "held-out loss" + ("" if tag == f"{HELD_OUT}loss" else f": {tag[len(HELD_OUT):-len('/loss')]}")
        steps, values = scalars[tag]
        mixture = tag == f"{HELD_OUT}loss"
        top.plot(steps, values, marker="o", markersize=3, label=name, linewidth=2 if mixture else 1,
                 color="#dd8452" if mixture else None)
    if f"{HELD_OUT}loss" in scalars:
        steps, values = scalars[f"{HELD_OUT}loss"]
        best = int(np.argmin(values))
        top.scatter([steps[best]], [values[best]], s=80, facecolors="none", edgecolors="#c44e52", zorder=3,
                    label=f"best held-out {values[best]:.4f} at step {steps[best]}")
    top.set_ylabel("loss (nats per predicted token)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    if "learning_rate" in scalars:
        bottom.plot(*scalars["learning_rate"], color="#55a868")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    if tokens:
        axis = top.secondary_xaxis("top", functions=(lambda s: s * tokens / 1e6, lambda t: t * 1e6 / tokens))
        axis.set_xlabel("tokens trained on (millions)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return ["loss", *held, *(["learning_rate"] if "learning_rate" in scalars else [])]
