"""The original's optimisation rules without a framework (model_utils.get_train_op), for both trainers: the
learning rate of an update, and which weights decay. optimization.py (TensorFlow) computes the same rate in its
graph; pretrain_torch/optim.py takes it from here."""

from __future__ import annotations

import math
import re

from xlnet_data.pretrain.config import TrainConfig

BETA_1, BETA_2 = 0.9, 0.999  # the original's (tf.train.AdamOptimizer and AdamWeightDecayOptimizer defaults)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The rate of update number `step` (0-based): linear warmup from 0, then poly (linear) or cosine decay to
    learning_rate * min_lr_ratio at train_steps."""
    peak, warmup, floor = cfg.learning_rate, cfg.warmup_steps, cfg.min_lr_ratio
    if step < warmup:
        return peak * step / warmup
    progress = min(max((step - warmup) / max(cfg.train_steps - warmup, 1), 0.0), 1.0)
    if cfg.decay_method == "poly":
        return peak * (1 - (1 - floor) * progress)
    return peak * ((1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)) + floor)


def uses_weight_decay(name: str) -> bool:
    """The original AdamWeightDecayOptimizer's rule: LayerNorm and biases are not decayed, except the attention
    biases r_w/r_r/r_s_bias (it lists them to include before it looks for 'bias'). It reads the original's variable
    names and Transformers' parameter names alike (layer_norm, ...bias)."""
    if re.search("r_s_bias|r_r_bias|r_w_bias", name):
        return True
    return not re.search("LayerNorm|layer_norm|bias", name)
