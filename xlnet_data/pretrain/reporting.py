"""What a run says as it goes: a log line and TensorBoard scalars per window of steps, and the loss guard that
stops a diverging run before its weights are checkpointed."""

from __future__ import annotations

import logging
import math

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from xlnet_data.common.errors import UserError
from xlnet_data.pretrain import checkpoints
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.costs import StepCost, duration

log = logging.getLogger("xlnet_data")


class DivergedError(UserError, ValueError):
    """The loss (or the gradient) became non-finite, or a loss passed --max_loss: the run stops, without a
    checkpoint of those weights."""


def check_losses(window: list[float], first: int, gnorm, lr, cfg: TrainConfig) -> None:
    """`window`: the losses of steps first+1, first+2, ...; DivergedError names the first bad one."""
    for step, loss in enumerate(window, first + 1):
        if not math.isfinite(loss):
            why = f"the loss is {loss} at step {step}"
        elif cfg.max_loss is not None and loss > cfg.max_loss:
            why = f"the loss {loss:.4g} at step {step} is above --max_loss={cfg.max_loss:g} (diverging)"
        else:
            continue
        break
    else:
        if gnorm is None or math.isfinite(float(gnorm)):
            return
        why, step = f"the gradient norm is {float(gnorm)} at step {first + len(window)}", first + len(window)
    latest = checkpoints.latest(cfg.model_dir)
    raise DivergedError(f"{why}: training stopped, no checkpoint of it written (learning rate {float(lr):.3g}); "
                        f"{f'the last checkpoint is {latest}' if latest else 'no checkpoint yet'}: lower "
                        "--learning_rate (or raise --warmup_steps) and run again")

# What TensorBoard's scalar summaries carry: the scalars plugin's name.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")).SerializeToString()


def report(step: int, losses: list[float], gnorm, lr, seconds: float, cost: StepCost, steps_left: int,
           writer) -> None:
    """Logs the window of steps that ended at `step`, and writes it as TensorBoard scalars: the original's
    fields, then what the steps cost (sequences/s, model TFLOP/s, the MFU where the device's peak is known, the
    time to train_steps at this window's pace)."""
    loss = sum(losses) / len(losses)
    scalars = {"loss": loss, "perplexity": math.exp(min(loss, 700)), "bits_per_token": loss / math.log(2),
               "gnorm": float(gnorm), "learning_rate": float(lr),
               "tokens_per_second": len(losses) * cost.tokens / seconds}
    rates = cost.rates(len(losses), seconds, steps_left)
    mfu = f" | MFU {100 * rates['mfu']:.1f}%" if "mfu" in rates else ""
    log.info("step %d | loss %.4f | pplx %.2f | bpt %.4f | gnorm %.3f | lr %.3e | %.0f tok/s | %.2f seq/s | "
             "%.3g TFLOP/s%s | %s left", step, *scalars.values(), rates["sequences_per_second"],
             rates["model_tflops_per_second"], mfu, duration(rates["seconds_left"]))
    with writer.as_default(step=step):
        for key, value in {**scalars, **rates}.items():  # tf.summary.scalar, without needing the tensorboard package
            tf.summary.write(key, tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)


def write_scalars(step: int, scalars: dict[str, float], writer) -> None:
    """TensorBoard scalars of `step` (the held-out ones: evaluation.py)."""
    with writer.as_default(step=step):
        for key, value in scalars.items():
            tf.summary.write(key, tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)
