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
        the scheduled rate it used. Each operation runs over every tensor at once (torch._foreach_*: a few kernels a
        step instead of a dozen per tensor, about 2,500 at XLNet-Base), the same arithmetic element by element."""
        lr = learning_rate(self.step, self.cfg)
        t = self.step + 1
        names = [name for name, p in self.parameters.items() if p.grad is not None]
        params = [self.parameters[name] for name in names]
        grads = [p.grad for p in params]
        ms, vs = [self.m[name] for name in names], [self.v[name] for name in names]
        eps = self.cfg.adam_epsilon
        if self.cfg.weight_decay == 0:
            # tf.train.AdamOptimizer: alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) (its fused kernel's form);
            # m += (g - m) * (1 - beta1), v += (g * g - v) * (1 - beta2), p -= m * alpha / (sqrt(v) + eps)
            alpha = lr * (1 - BETA_2 ** t) ** 0.5 / (1 - BETA_1 ** t)
            step_m = torch._foreach_sub(grads, ms)
            torch._foreach_mul_(step_m, 1 - BETA_1)
            torch._foreach_add_(ms, step_m)
            step_v = torch._foreach_mul(grads, grads)
            torch._foreach_sub_(step_v, vs)
            torch._foreach_mul_(step_v, 1 - BETA_2)
            torch._foreach_add_(vs, step_v)
            denominator = torch._foreach_sqrt(vs)
            torch._foreach_add_(denominator, eps)
            update = torch._foreach_mul(ms, alpha)
            torch._foreach_div_(update, denominator)
            torch._foreach_sub_(params, update)
        else:  # the original's AdamWeightDecayOptimizer: no bias correction, the decay added to the update
            torch._foreach_mul_(ms, BETA_1)
            torch._foreach_add_(ms, grads, alpha=1 - BETA_1)
            torch._foreach_mul_(vs, BETA_2)
            torch._foreach_add_(vs, torch._foreach_mul(grads, grads), alpha=1 - BETA_2)
            denominator = torch._foreach_sqrt(vs)
            torch._foreach_add_(denominator, eps)
            update = torch._foreach_div(ms, denominator)
            decayed = [i for i, name in enumerate(names) if self.decay[name]]
            if decayed:
                torch._foreach_add_([update[i] for i in decayed],
                                    torch._foreach_mul([params[i] for i in decayed],
                                                       [self.decay[names[i]] for i in decayed]))
            torch._foreach_sub_(params, torch._foreach_mul(update, lr))
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
