"""The original's optimisation in PyTorch (model_utils.get_train_op), as train_gpu's pretrain/optimization.py:

    clip_by_global_norm   tf.clip_by_global_norm: every gradient scaled by clip / max(norm, clip)
    AdamWeightDecay       weight_decay == 0: tf.train.AdamOptimizer (bias-corrected, its fused kernel's arithmetic);
                          weight_decay > 0: the original's AdamWeightDecayOptimizer (no bias correction, the weight
                          decay added to the update of the weights schedule.uses_weight_decay names)

The rate of each update is schedule.learning_rate's (warmup, poly/cos decay, min_lr_ratio), shared with nothing
else here. torch.optim.Adam is not used: its bias correction and epsilon differ from the original's weight-decay
rule, and its state is keyed by position, not by the names a checkpoint keeps.
"""

from __future__ import annotations

import torch

from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.schedule import BETA_1, BETA_2, learning_rate, uses_weight_decay


@torch.no_grad()
def clip_by_global_norm(parameters: list[torch.nn.Parameter], clip: float) -> torch.Tensor:
    """Scales the gradients in place as tf.clip_by_global_norm does; returns the norm before clipping (float32)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.sqrt(sum(torch.sum(g.float() * g.float()) for g in grads))
    scale = clip / torch.maximum(norm, torch.tensor(clip, device=norm.device))
    for g in grads:
        g.mul_(scale.to(g.dtype))
    return norm


class AdamWeightDecay:
    """The update rule train_gpu's AdamWeightDecay applies, on named parameters (Transformers' names; a tied or
    shared parameter once). m and v per parameter, `step` the updates done, all in state_dict() for a resume."""

    def __init__(self, named_parameters: dict[str, torch.nn.Parameter], cfg: TrainConfig):
        self.cfg = cfg
        self.parameters = named_parameters
        self.m = {name: torch.zeros_like(p, memory_format=torch.preserve_format) for name, p in named_parameters.items()}
        self.v = {name: torch.zeros_like(p, memory_format=torch.preserve_format) for name, p in named_parameters.items()}
        self.decay = {name: cfg.weight_decay if uses_weight_decay(name) else 0.0 for name in named_parameters}
        self.step = 0

    @torch.no_grad()
    def apply(self) -> float:
        """One update of every parameter from its .grad (already averaged over replicas and clipped); returns
        the scheduled rate it used."""
        lr = learning_rate(self.step, self.cfg)
        t = self.step + 1
        # tf.train.AdamOptimizer: alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) (its fused kernel's form)
        alpha = lr * (1 - BETA_2 ** t) ** 0.5 / (1 - BETA_1 ** t)
        eps = self.cfg.adam_epsilon
        for name, p in self.parameters.items():
            grad, m, v = p.grad, self.m[name], self.v[name]
            if grad is None:
                continue
            if self.cfg.weight_decay == 0:
                m.add_((grad - m) * (1 - BETA_1))
                v.add_((grad * grad - v) * (1 - BETA_2))
                p.sub_(m * alpha / (v.sqrt() + eps))
            else:
                m.mul_(BETA_1).add_(grad, alpha=1 - BETA_1)
                v.mul_(BETA_2).add_(grad * grad, alpha=1 - BETA_2)
                update = m / (v.sqrt() + eps)
                if self.decay[name]:
                    update = update + self.decay[name] * p
                p.sub_(lr * update)
        self.step += 1
        return lr

    def state_dict(self) -> dict:
        return {"step": self.step, "m": dict(self.m), "v": dict(self.v)}

    def load_state_dict(self, state: dict) -> None:
        """The slots and step of a checkpoint; slots it lacks stay zero (a checkpoint of weights only)."""
        self.step = int(state["step"])
        for slots, saved in ((self.m, state["m"]), (self.v, state["v"])):
            for name, value in saved.items():
                if name in slots:
                    slots[name].copy_(value)
