"""Gradient accumulation (--gradient_accumulation_steps=K): a replica's rows in K micro-batches of rows, run one
after the other, for one update (Trainer's step).

Micro-batch k holds rows [k m, (k+1) m) of the replica's rows (m = rows / K); with bi_data the replica's first half
is forward rows and its second half their backward rows (modeling's layout), and micro-batch k takes part k of each
half, so it has the halves the model expects. Its memories are the same rows of the memory tensors (axis 1), and its
next memories go back to those rows. Each micro-batch's loss is its targets' summed losses over the replica's count
of targets, so the K losses, and their gradients, add up to the one pass's target-weighted mean loss and its
gradient (to float rounding: the sums run in another order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import tensorflow as tf

from xlnet_data.pretrain.modeling import XLNet


def micro_rows(value: tf.Tensor, k: tf.Tensor, steps: int, n_dir: int, axis: int = 0) -> tf.Tensor:
    """Micro-batch k of `steps` of the rows of `value` on `axis`: part k of each of its n_dir halves (2: bi_data's
    forward and backward rows, 1: all rows)."""
    shape = tf.shape(value)
    parts = tf.reshape(value, tf.concat([shape[:axis], [n_dir, steps, -1], shape[axis + 1:]], 0))
    return tf.reshape(tf.gather(parts, k, axis=axis + 1), tf.concat([shape[:axis], [-1], shape[axis + 1:]], 0))


def join_micro_rows(parts: tf.Tensor, n_dir: int, axis: int = 0) -> tf.Tensor:
    """The inverse of micro_rows: parts [steps, *micro-batch k's tensor] -> the tensor of all rows, in order."""
    steps, shape = parts.shape[0], tf.shape(parts)[1:]
    split = tf.reshape(parts, tf.concat([[steps], shape[:axis], [n_dir, -1], shape[axis + 1:]], 0))
    # [steps, ..., n_dir, rows per part, ...] -> [..., n_dir, steps, rows per part, ...]
    order = [*range(1, axis + 2), 0, *range(axis + 2, split.shape.rank)]
    return tf.reshape(tf.transpose(split, order), tf.concat([shape[:axis], [-1], shape[axis + 1:]], 0))


def accumulate(model: XLNet, variables: list, features: dict[str, tf.Tensor], mems: Optional[list], steps: int,
               recompute: bool, gradients: Callable[[tf.Tensor], list]):
    """On one replica: (its loss, its gradients, its next memories) as one pass over its rows gives them, from
    `steps` micro-batches. A tf.while_loop that runs one iteration at a time: one micro-batch's activations are
    alive at once (a Python loop in one graph lets TensorFlow run every forward pass before any backward pass).
    gradients(loss): the gradients of loss with respect to `variables`."""
    n_dir = 2 if model.run.bi_data else 1
    num_targets = tf.reduce_sum(tf.cast(features["target_mask"], tf.float32))
    micro_bsz = features["input_k"].shape[0] // steps

    def body(k, loss, grads, mem_parts):
        micro = {key: micro_rows(value, k, steps, n_dir) for key, value in features.items()}
        micro_mems = None if mems is None else [micro_rows(mem, k, steps, n_dir, axis=1) for mem in mems]
        out = model.plm_loss(micro, micro_mems, training=True, recompute=recompute)
        share = tf.reduce_sum(out.token_loss * tf.cast(micro["target_mask"], tf.float32)) / num_targets
        grads = [total + tf.convert_to_tensor(grad) for total, grad in zip(grads, gradients(share))]
        mem_parts = [parts.write(k, mem) for parts, mem in zip(mem_parts, out.new_mems or [])]
        return k + 1, loss + share, grads, mem_parts

    mem_parts = [tf.TensorArray(model.compute_dtype, size=steps, element_shape=[model.run.mem_len, micro_bsz,
                                                                                model.config.d_model])
                 for _ in range(model.config.n_layer if model.run.mem_len else 0)]
    start = (tf.constant(0), tf.constant(0.0), [tf.zeros(var.shape, var.dtype) for var in variables], mem_parts)
    _, loss, grads, mem_parts = tf.while_loop(lambda k, *_: k < steps, body, start, parallel_iterations=1)
    new_mems = [join_micro_rows(parts.stack(), n_dir, axis=1) for parts in mem_parts] if mem_parts else None
    return loss, grads, new_mems
