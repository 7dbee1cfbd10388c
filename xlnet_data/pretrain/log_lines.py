"""What a training run says as it goes, without a framework: train_gpu's (reporting.py, evaluation.py) and the
PyTorch trainer's (pretrain_torch/reporting.py, evaluation.py) log lines and TensorBoard scalars are these.

    window_scalars    the scalars and the log line of a window of steps (the original's fields, then the rates)
    divergence        why a window of losses stops the run (non-finite, above --max_loss), or None
    DivergedError     that reason, in one line for the user
    held_out_line     the held-out evaluation's line
"""

from __future__ import annotations

import math
from typing import Optional

from xlnet_data.common.errors import UserError
from xlnet_data.pretrain.costs import StepCost, duration


class DivergedError(UserError, ValueError):
    """The loss (or the gradient) became non-finite, or a loss passed --max_loss: the run stops, without a
    checkpoint of those weights."""


def loss_scalars(loss: float) -> dict[str, float]:
    """A mean loss (nats per predicted token) as the log shows it: itself, perplexity, bits per token."""
    return {"loss": loss, "perplexity": math.exp(min(loss, 700)), "bits_per_token": loss / math.log(2)}


def window_scalars(losses: list[float], gnorm: float, lr: float, seconds: float, cost: StepCost,
                   steps_left: int) -> tuple[dict[str, float], str]:
    """The TensorBoard scalars of a window of steps that took `seconds` (the original's fields, then what the
    steps cost: sequences/s, model TFLOP/s, the MFU where the device's peak is known, the time to train_steps at
    this window's pace) and its log line without the step."""
    scalars = {**loss_scalars(sum(losses) / len(losses)), "gnorm": float(gnorm), "learning_rate": float(lr),
               "tokens_per_second": len(losses) * cost.tokens / seconds}
    rates = cost.rates(len(losses), seconds, steps_left)
    mfu = f" | MFU {100 * rates['mfu']:.1f}%" if "mfu" in rates else ""
    line = ("loss {:.4f} | pplx {:.2f} | bpt {:.4f} | gnorm {:.3f} | lr {:.3e} | {:.0f} tok/s".format(*scalars.values())
            + f" | {rates['sequences_per_second']:.2f} seq/s | {rates['model_tflops_per_second']:.3g} TFLOP/s{mfu} | "
            f"{duration(rates['seconds_left'])} left")
    return {**scalars, **rates}, line


def divergence(window: list[float], first: int, gnorm: Optional[float], max_loss: Optional[float]) -> Optional[str]:
    """`window`: the losses of steps first+1, first+2, ...; why the first bad one stops the run, or None."""
    for step, loss in enumerate(window, first + 1):
        if not math.isfinite(loss):
            return f"the loss is {loss} at step {step}"
        if max_loss is not None and loss > max_loss:
            return f"the loss {loss:.4g} at step {step} is above --max_loss={max_loss:g} (diverging)"
    if gnorm is not None and not math.isfinite(float(gnorm)):
        return f"the gradient norm is {float(gnorm)} at step {first + len(window)}"
    return None


def diverged(why: str, lr: float, latest: Optional[str]) -> DivergedError:
    """The error of a run stopped by `why` (divergence's), with the last checkpoint left and what to do."""
    return DivergedError(f"{why}: training stopped, no checkpoint of it written (learning rate {float(lr):.3g}); "
                         f"{f'the last checkpoint is {latest}' if latest else 'no checkpoint yet'}: lower "
                         "--learning_rate (or raise --warmup_steps) and run again")


def held_out_line(step: int, loss: float, accuracy: Optional[float], tokens: int, best_loss: float,
                  best_step: int, label: str = "") -> str:
    """`step 700 | held-out loss 5.5582 | pplx 259.35 | bpt 8.0188 | acc 11.73% | 3360 tokens | best 5.5582 at step
    700`; a source's line (`label`) has neither tokens nor best."""
    scalars = loss_scalars(loss)
    acc = "" if accuracy is None else f" | acc {100 * accuracy:.2f}%"
    head = f"step {step} | held-out {label + ' | ' if label else ''}loss {loss:.4f} | pplx {scalars['perplexity']:.2f}" \
           f" | bpt {scalars['bits_per_token']:.4f}{acc}"
    return head if label else f"{head} | {tokens} tokens | best {best_loss:.4f} at step {best_step}"
