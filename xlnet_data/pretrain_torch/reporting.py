"""What the PyTorch trainer says as it goes: train_gpu's log line and TensorBoard scalars (the same words, tags and
numbers: pretrain/log_lines.py), written without TensorFlow (dataformat/event_file.py), and the loss guard.

What the loop (training.py) calls, on every rank (only the chief's Reporter writes a file):

    Reporter(model_dir, cost, chief)          one run's event file in model_dir (the chief's); none on other ranks
    reporter.report(step, losses, gnorm, lr, seconds, steps_left)   a window of steps: the log line, the scalars
    reporter.scalars(step, {tag: value})      other scalars (the held-out ones: evaluation.py)
    check_losses(window, first, gnorm, lr, max_loss, latest)   DivergedError naming the first bad step
    reporter.close()
"""

from __future__ import annotations

import logging
from typing import Optional

from xlnet_data.dataformat.event_file import EventWriter
from xlnet_data.pretrain.costs import StepCost
from xlnet_data.pretrain.log_lines import DivergedError, diverged, divergence, window_scalars

__all__ = ["DivergedError", "Reporter", "check_losses"]

log = logging.getLogger("xlnet_data")


def check_losses(window: list[float], first: int, gnorm: Optional[float], lr: float, max_loss: Optional[float],
                 latest: Optional[str]) -> None:
    """`window`: the losses of steps first+1, first+2, ...; DivergedError (one line: the step, the learning rate,
    the last checkpoint `latest`, what to change) for a non-finite loss or gradient norm, or a loss above
    max_loss. The loop calls it before each checkpoint, so no checkpoint holds diverged weights."""
    why = divergence(window, first, gnorm, max_loss)
    if why:
        raise diverged(why, lr, latest)


class Reporter:
    """The log lines and TensorBoard scalars of a run; the event file is the chief's (other ranks log only)."""

    def __init__(self, model_dir: str, cost: StepCost, chief: bool):
        self.cost = cost
        self.writer = EventWriter(model_dir) if chief else None

    def report(self, step: int, losses: list[float], gnorm: float, lr: float, seconds: float, steps_left: int) -> None:
        """The window of steps that ended at `step` (their losses, the last gradient norm and learning rate, the
        seconds they took): the log line, and the scalars under train_gpu's tags (loss, perplexity,
        bits_per_token, gnorm, learning_rate, tokens_per_second, sequences_per_second, model_tflops_per_second,
        mfu where the device's peak is known, seconds_left)."""
        scalars, line = window_scalars(losses, gnorm, lr, seconds, self.cost, steps_left)
        log.info("step %d | %s", step, line)
        self.scalars(step, scalars)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is not None:
            self.writer.scalars(step, values)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
