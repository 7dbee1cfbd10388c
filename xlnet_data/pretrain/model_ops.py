"""The tensor functions XLNet is made of, as the original's modeling.py has them (time-major, [len, bsz, ...]):
the relative positional encoding and shifts, the attention masks, the heads' projection, layer norm, the memory
cache, GELU and the LM head's loss. No weights here: modeling.py's XLNet holds them and wires these together.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from xlnet_data.pretrain.config import LAYER_NORM_EPSILON


@tf.custom_gradient
def lm_loss(hidden: tf.Tensor, table: tf.Tensor, bias: tf.Tensor, labels: tf.Tensor):
    """Cross-entropy [rows] float32 of the LM head tied to the input embedding: the original's
    sparse_softmax_cross_entropy_with_logits of the logits hidden [rows, d_model] x table [n_token, d_model]
    transposed + bias, for labels [rows].

    The loss is logsumexp - logit[label], with logsumexp = max + log(sum(exp(x - max))) read off the softmax
    at the row's largest logit, x_max - log(p_max): p_max >= 1 / n_token never underflows, where
    log(p[label]) would for a very unlikely label (two reduce_max: argmax is 3x slower). The softmax is
    oneDNN's on CPUs: the fused cross-entropy op took 44 ms of a 590 ms step (its Eigen exp), the softmax a
    fifth of that. The gradient of the logits, upstream * (softmax - one_hot), is never formed: the row
    scale goes onto the small operands of the three products (hidden, the product with the table, the
    bias' row sum), which saves a pass over the [rows, n_token] matrix.
    """
    logits = lm_logits(hidden, table, bias)
    prob = tf.nn.softmax(logits)
    at_label = tf.stack([tf.range(tf.shape(logits)[0]), labels], 1)
    logsumexp = tf.reduce_max(logits, axis=-1) - tf.math.log(tf.reduce_max(prob, axis=-1))
    loss = logsumexp - tf.gather_nd(logits, at_label)

    def grad(upstream):
        residual = tf.cast(tf.tensor_scatter_nd_sub(prob, at_label, tf.ones_like(upstream)), hidden.dtype)
        scale = tf.cast(upstream, hidden.dtype)[:, None]
        return (scale * tf.matmul(residual, table), tf.matmul(residual, scale * hidden, transpose_a=True),
                tf.matmul(scale, residual, transpose_a=True)[0], None)

    return loss, grad


def lm_logits(hidden: tf.Tensor, table: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """The LM head's logits [rows, n_token], float32: hidden [rows, d_model] x the tied embedding table + bias."""
    return tf.cast(tf.nn.bias_add(tf.matmul(hidden, table, transpose_b=True), bias), tf.float32)


_SQRT_2_OVER_PI = float(np.sqrt(2 / np.pi))


@tf.custom_gradient
def gelu(x: tf.Tensor):
    """The original's GELU: the tanh approximation (not tf.nn.gelu's exact erf form), with its derivative in
    closed form.

    x * square(x), not tf.pow(x, 3): Pow is a general power on CPUs (it and its gradient's Pow took 12% of
    the step's op time in a profile) and Grappler no longer rewrites it (sum_in_graph_order turns off the
    arithmetic optimizer, which did exactly this). The derivative, cdf + x/2 (1 - t^2) sqrt(2/pi) (1 +
    3 * 0.044715 x^2) with t the forward pass's tanh, is 8 element-wise passes where differentiating the 9
    of the forward pass took 15 (GELU was 7% of the step's op time, half of it the backward pass).
    """
    square = tf.square(x)
    t = tf.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * square)))
    cdf = 0.5 * (1.0 + t)

    def grad(upstream):
        slope = (0.5 * _SQRT_2_OVER_PI) + (1.5 * 0.044715 * _SQRT_2_OVER_PI) * square  # d(tanh's argument)/dx / 2
        return upstream * (cdf + x * (1.0 - tf.square(t)) * slope)

    return x * cdf, grad


def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor) -> tf.Tensor:
    # Moments in float32 even under bfloat16: bfloat16 variance over d_model is too coarse.
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
    out = tf.nn.batch_normalization(x32, mean, variance, offset=tf.cast(beta, tf.float32),
                                    scale=tf.cast(gamma, tf.float32), variance_epsilon=LAYER_NORM_EPSILON)
    return tf.cast(out, x.dtype)


def rel_shift(x: tf.Tensor, klen: tf.Tensor) -> tf.Tensor:
    """[..., qlen, rlen] scores against relative positions -> [..., qlen, klen] against keys.

    tf.slice, not Python slices: a slice's gradient is a Pad, a strided slice's a StridedSliceGrad,
    which took over a quarter of the backward pass in a profile of the training step.
    """
    shape = tf.shape(x)
    lead, qlen, rlen = shape[:-2], shape[-2], shape[-1]
    zeros = tf.zeros_like(lead)
    x = tf.reshape(x, tf.concat([lead, [rlen, qlen]], 0))
    x = tf.slice(x, tf.concat([zeros, [1, 0]], 0), tf.concat([lead, [rlen - 1, qlen]], 0))
    x = tf.reshape(x, tf.concat([lead, [qlen, rlen - 1]], 0))
    return tf.slice(x, tf.concat([zeros, [0, 0]], 0), tf.concat([lead, [qlen, klen]], 0))


def rel_shift_rows(x: tf.Tensor, positions: tf.Tensor, klen: tf.Tensor) -> tf.Tensor:
    """rel_shift for queries at some positions only: x [bsz, n_head, num_predict, rlen] (rlen = klen +
    qlen) of the queries at positions [bsz, num_predict] -> [bsz, n_head, num_predict, klen]: query p
    against key j is relative position column qlen - p + j.

    One gather from x flattened (its gradient one scatter): a gather along the last axis with batch
    dimensions, and the transposes it needs, took 1.7x the time forward and backward.
    """
    shape = tf.shape(x)
    rows, rlen = shape[0] * shape[1] * shape[2], shape[3]
    columns = (rlen - klen - positions)[:, None, :, None] + tf.range(klen)  # [bsz, 1, num_predict, klen]
    row_starts = tf.reshape(tf.range(rows) * rlen, tf.concat([shape[:3], [1]], 0))
    return tf.gather(tf.reshape(x, [-1]), row_starts + columns)


def rows_at(mask: tf.Tensor, positions: tf.Tensor, bsz: tf.Tensor) -> tf.Tensor:
    """Rows `positions` [bsz, num_predict] of a [bsz or 1, 1, qlen, klen] mask: [bsz, 1, num_predict, klen]."""
    mask = tf.broadcast_to(mask[:, 0], tf.concat([[bsz], tf.shape(mask)[2:]], 0))
    return tf.gather(mask, positions, axis=1, batch_dims=1)[:, None]


def causal_mask(qlen: tf.Tensor, mlen: tf.Tensor, dtype: tf.DType, same_length: bool) -> tf.Tensor:
    """The original's `_create_mask` (attn_type "uni"): [qlen, mlen + qlen], 1 = may not attend."""
    ones = tf.ones([qlen, qlen], dtype=dtype)
    mask_u = tf.linalg.band_part(ones, 0, -1)
    mask_dia = tf.linalg.band_part(ones, 0, 0)
    mask = tf.concat([tf.zeros([qlen, mlen], dtype=dtype), mask_u - mask_dia], 1)
    if same_length:
        # As the original: it edits the first qlen columns, which are memory when mlen > 0.
        mask_l = tf.linalg.band_part(ones, -1, 0)
        mask = tf.concat([mask[:, :qlen] + mask_l - mask_dia, mask[:, qlen:]], 1)
    return mask


def relative_positional_encoding(qlen: tf.Tensor, klen: tf.Tensor, d_model: int, clamp_len: int,
                                 attn_type: str, bi_data: bool, dtype: tf.DType) -> tf.Tensor:
    """Sinusoids of the relative distances klen, klen-1, ... ([rlen, n_dir, d_model]).

    n_dir is 2 with bi_data: [:, 0] for the forward rows (first half of the
    batch), [:, 1] for the backward rows with negated distances; else 1. The
    original tiles this over the batch; broadcasting gives the same numbers.
    """
    freq_seq = tf.cast(tf.range(0, d_model, 2.0), dtype)
    inv_freq = 1 / (10000 ** (freq_seq / d_model))
    end = -qlen if attn_type == "bi" else -1

    def embed(pos_seq):
        pos_seq = tf.cast(pos_seq, dtype)
        if clamp_len > 0:
            pos_seq = tf.clip_by_value(pos_seq, -clamp_len, clamp_len)
        sinusoid = tf.einsum("i,d->id", pos_seq, inv_freq)
        return tf.concat([tf.sin(sinusoid), tf.cos(sinusoid)], -1)

    directions = [embed(tf.range(klen, end, -1))]
    if bi_data:
        directions.append(embed(tf.range(-klen, -end, 1)))
    return tf.stack(directions, axis=1)


def heads(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
    """A projection to heads, head-major: x [len, bsz, d_model], kernel [d_model, n_head, d_head] -> [bsz, n_head,
    len, d_head] (einsum "ibh,hnd->bnid").

    One 2-D matmul and a transpose: the einsum (oneDNN's on CPUs) took 1.4x their time, forward and backward.
    """
    d_model, n_head, d_head = kernel.shape
    heads = tf.matmul(tf.reshape(x, [-1, d_model]), tf.reshape(kernel, [d_model, n_head * d_head]))
    heads = tf.reshape(heads, tf.concat([tf.shape(x)[:2], [n_head, d_head]], 0))
    return tf.transpose(heads, [1, 2, 0, 3])


def cache_mem(curr_out: tf.Tensor, prev_mem: Optional[tf.Tensor], mem_len: int, reuse_len: int):
    """Next batch's memory of one layer: the last mem_len of (old memory + first reuse_len inputs)."""
    if not mem_len:
        return None
    if reuse_len:
        curr_out = curr_out[:reuse_len]
    new_mem = curr_out if prev_mem is None else tf.concat([prev_mem, curr_out], 0)
    return tf.stop_gradient(new_mem[-mem_len:])


def attention_masks(qlen, mlen, bsz, perm_mask: Optional[tf.Tensor], attn_type: str, same_length: bool, dtype):
    """(attn_mask, non_tgt_mask) of the query and the content stream, head-major [bsz or 1, 1, qlen, klen]
    (1 = may not attend), or (None, None) when nothing is masked. perm_mask [len, len, bsz] as transformer's."""
    # Attention masks: 1 = may not attend. The content stream (h) may see
    # itself, the query stream (g) may not.
    attn_mask = None
    if attn_type == "uni":
        attn_mask = causal_mask(qlen, mlen, dtype, same_length)[:, :, None, None]
    data_mask = None
    if perm_mask is not None:
        data_mask = tf.cast(perm_mask, dtype)
    if data_mask is not None:
        # Memories can always be attended to.
        data_mask = tf.concat([tf.zeros([tf.shape(data_mask)[0], mlen, bsz], dtype=dtype), data_mask], 1)
        attn_mask = data_mask[:, :, :, None] if attn_mask is None else attn_mask + data_mask[:, :, :, None]
    non_tgt_mask = None
    if attn_mask is not None:
        attn_mask = tf.cast(attn_mask > 0, dtype)
        non_tgt_mask = tf.concat([tf.zeros([qlen, mlen], dtype=dtype), -tf.eye(qlen, dtype=dtype)], axis=-1)
        non_tgt_mask = tf.cast((attn_mask + non_tgt_mask[:, :, None, None]) > 0, dtype)
        # [qlen, klen, bsz or 1, 1] -> the attention's head-major [bsz or 1, 1, qlen, klen].
        attn_mask = tf.transpose(attn_mask, [2, 3, 0, 1])
        non_tgt_mask = tf.transpose(non_tgt_mask, [2, 3, 0, 1])
    return attn_mask, non_tgt_mask
