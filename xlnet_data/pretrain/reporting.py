"""What a run says as it goes: a log line and TensorBoard scalars per window of steps (their content: log_lines.py),
and the loss guard that stops a diverging run before its weights are checkpointed."""

from __future__ import annotations

import logging

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from xlnet_data.pretrain import checkpoints
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.costs import StepCost
from xlnet_data.pretrain.log_lines import DivergedError, diverged, divergence, window_scalars

__all__ = ["DivergedError", "check_losses", "report", "write_scalars"]

log = logging.getLogger("xlnet_data")


def check_losses(window: list[float], first: int, gnorm, lr, cfg: TrainConfig) -> None:
    """`window`: the losses of steps first+1, first+2, ...; DivergedError names the first bad one."""
    why = divergence(window, first, None if gnorm is None else float(gnorm), cfg.max_loss)
    if why:
        raise diverged(why, lr, checkpoints.latest(cfg.model_dir))


# What TensorBoard's scalar summaries carry: the scalars plugin's name.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")).SerializeToString()


def report(step: int, losses: list[float], gnorm, lr, seconds: float, cost: StepCost, steps_left: int,
           writer) -> None:
    """Logs the window of steps that ended at `step`, and writes it as TensorBoard scalars
    (log_lines.window_scalars)."""
    scalars, line = window_scalars(losses, gnorm, lr, seconds, cost, steps_left)
    log.info("step %d | %s", step, line)
    write_scalars(step, scalars, writer)


def write_scalars(step: int, scalars: dict[str, float], writer) -> None:
    """TensorBoard scalars of `step` (also the held-out ones: evaluation.py)."""
    with writer.as_default(step=step):
        for key, value in scalars.items():  # tf.summary.scalar, without needing the tensorboard package
            tf.summary.write(key, tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)
