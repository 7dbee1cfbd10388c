"""The original's optimization: the learning-rate schedule and the optimizer (model_utils.get_train_op).

    learning_rate      linear warmup, then poly or cosine decay to min_lr_ratio (the original's)
    AdamWeightDecay    the original's optimizer: Adam, or Adam with decoupled weight decay

Both read their settings from a TrainConfig (config.py); the clipping by global norm is one call in
Trainer's step, before AdamWeightDecay.apply.
"""

from __future__ import annotations

import math

import tensorflow as tf

from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.schedule import BETA_1, BETA_2, uses_weight_decay


def learning_rate(step, cfg: TrainConfig) -> tf.Tensor:
    """The rate of update number `step` (0-based): linear warmup from 0, then poly (linear) or
    cosine decay to learning_rate * min_lr_ratio at train_steps (model_utils.get_train_op)."""
    step = tf.cast(step, tf.float32)
    peak, warmup, floor = cfg.learning_rate, cfg.warmup_steps, cfg.min_lr_ratio
    progress = tf.clip_by_value((step - warmup) / max(cfg.train_steps - warmup, 1), 0.0, 1.0)
    if cfg.decay_method == "poly":
        decayed = peak * (1 - (1 - floor) * progress)
    else:
        decayed = peak * ((1 - floor) * 0.5 * (1 + tf.cos(math.pi * progress)) + floor)
    if warmup == 0:
        return decayed
    return tf.where(step < warmup, peak * step / warmup, decayed)


class AdamWeightDecay(tf.Module):
    """The update rule the original picks in get_train_op.

    weight_decay == 0: tf.train.AdamOptimizer (bias-corrected step size), with its fused kernel
      (one ResourceApplyAdam per weight instead of ten element-wise passes).
    weight_decay > 0: the original's AdamWeightDecayOptimizer: no bias correction,
      lr * weight_decay * w subtracted from every weight `uses_weight_decay` names.
    Slots m and v per weight; `step` is the global step (updates done so far).
    """

    def __init__(self, weights: dict[str, tf.Variable], cfg: TrainConfig):
        super().__init__(name="adam")
        self.cfg = cfg
        self.weights = weights
        self.m = {name: tf.Variable(tf.zeros(var.shape), trainable=False, name=f"{name}/adam_m")
                  for name, var in weights.items()}
        self.v = {name: tf.Variable(tf.zeros(var.shape), trainable=False, name=f"{name}/adam_v")
                  for name, var in weights.items()}
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")

    def apply(self, strategy: tf.distribute.Strategy, grads) -> tf.Tensor:
        """One update of every weight (cross-replica context; grads in `weights` order, one per replica,
        already averaged and clipped). Returns the scheduled learning rate."""
        lr = learning_rate(self.step, self.cfg)
        t = tf.cast(self.step + 1, tf.float32)
        powers = (tf.pow(BETA_1, t), tf.pow(BETA_2, t))
        for (name, var), grad in zip(self.weights.items(), grads):
            # On each device: the local copy of the weight and its slots, with the local gradient.
            if self.cfg.weight_decay == 0:
                strategy.extended.update(var, self._adam, args=(grad, self.m[name], self.v[name], lr, powers),
                                         group=False)
            else:
                decay = self.cfg.weight_decay if uses_weight_decay(name) else 0.0
                strategy.extended.update(var, self._adam_weight_decay,
                                         args=(grad, self.m[name], self.v[name], lr, decay), group=False)
        self.step.assign_add(1)
        return lr

    def _adam(self, var, grad, m, v, lr, powers):
        return tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle, beta1_power=powers[0],
                                            beta2_power=powers[1], lr=lr, beta1=BETA_1, beta2=BETA_2,
                                            epsilon=self.cfg.adam_epsilon, grad=grad)

    def _adam_weight_decay(self, var, grad, m, v, step_size, decay):
        m.assign(BETA_1 * m + (1 - BETA_1) * grad)
        v.assign(BETA_2 * v + (1 - BETA_2) * tf.square(grad))
        update = m / (tf.sqrt(v) + self.cfg.adam_epsilon)
        if decay:
            update += decay * var
        return var.assign_sub(step_size * update)
