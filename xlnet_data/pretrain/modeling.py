"""XLNet for permutation-LM pretraining in TF2, numerically equal to the original.

Mirrors the original `modeling.transformer_xl` + `lm_loss` as `xlnet.XLNetModel`
and `function_builder.two_stream_loss` wire them (attn_type "bi", the GPU
paths: gather embedding, sparse cross-entropy). Variables are plain
`tf.Variable`s kept under the original's names ("model/transformer/layer_0/
rel_attn/q/kernel", ...), so original checkpoints load by name and ours load
into the original.

Typical use (features as `xlnet_data.pretrain.inputs` makes them):

    model = build_model("xlnet_config.json", RunConfig(mem_len=384, reuse_len=256, bi_data=True))
    checkpoints.load("init/model.ckpt", model.weights)   # optional (pretrain/checkpoints.py)
    mems = model.initial_mems(bsz)
    out = model.plm_loss(features, mems, training=True)  # out.total_loss, out.token_loss, out.new_mems
    mems = out.new_mems                                   # feed to the next batch

Inside, like the original, tensors are time-major ([len, bsz, ...]); the
features and `token_loss` are batch-major, memories time-major
([mem_len, bsz, d_model], one per layer).

Equality with the original holds to float32 rounding (about 1e-6 here). On
GPUs TF runs float32 matmuls in TF32 by default; turn that off
(tf.config.experimental.enable_tensor_float_32_execution(False)) to compare.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Optional

import tensorflow as tf

from xlnet_data.common.errors import ConfigError
from xlnet_data.pretrain import checkpoints
from xlnet_data.pretrain import model_ops as ops
from xlnet_data.pretrain.config import RunConfig, XLNetConfig


class PLMOutput(NamedTuple):
    total_loss: tf.Tensor       # scalar float32: mean loss over target_mask
    token_loss: tf.Tensor       # [bsz, num_predict] (or [bsz, seq_len]) float32, unmasked
    new_mems: Optional[list]    # per layer [mem_len, bsz, d_model]; None when mem_len == 0
    correct: Optional[tf.Tensor] = None  # like token_loss: 1.0 where the target is the top logit (with_correct)


def variable_shapes(config: XLNetConfig) -> dict[str, tuple[int, ...]]:
    """Every variable of the pretraining model, by its name in the original's checkpoints."""
    d, n, h = config.d_model, config.n_head, config.d_head
    bias_shape = (config.n_layer, n, h) if config.untie_r else (n, h)
    shapes = {
        "model/transformer/word_embedding/lookup_table": (config.n_token, d),
        "model/transformer/mask_emb/mask_emb": (1, 1, d),
        "model/transformer/r_w_bias": bias_shape,
        "model/transformer/r_r_bias": bias_shape,
        "model/transformer/r_s_bias": bias_shape,
        "model/transformer/seg_embed": (config.n_layer, 2, n, h),
    }
    for i in range(config.n_layer):
        prefix = f"model/transformer/layer_{i}"
        for proj in "qkvro":
            shapes[f"{prefix}/rel_attn/{proj}/kernel"] = (d, n, h)
        shapes[f"{prefix}/rel_attn/LayerNorm/gamma"] = (d,)
        shapes[f"{prefix}/rel_attn/LayerNorm/beta"] = (d,)
        shapes[f"{prefix}/ff/layer_1/kernel"] = (d, config.d_inner)
        shapes[f"{prefix}/ff/layer_1/bias"] = (config.d_inner,)
        shapes[f"{prefix}/ff/layer_2/kernel"] = (config.d_inner, d)
        shapes[f"{prefix}/ff/layer_2/bias"] = (d,)
        shapes[f"{prefix}/ff/LayerNorm/gamma"] = (d,)
        shapes[f"{prefix}/ff/LayerNorm/beta"] = (d,)
    shapes["model/lm_loss/bias"] = (config.n_token,)
    return shapes


def _initial_value(name: str, shape: tuple[int, ...], run: RunConfig, rng: tf.random.Generator) -> tf.Tensor:
    """The original's initializers: biases and LayerNorm beta 0, gamma 1, mask_emb glorot-uniform
    (tf.get_variable's default, the original gives it none), everything else `run.init`."""
    if name.endswith(("/bias", "/beta")):
        return tf.zeros(shape)
    if name.endswith("/gamma"):
        return tf.ones(shape)
    if name.endswith("mask_emb"):
        fan_in, fan_out = shape[-2], shape[-1]
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(shape, -limit, limit)
    if run.init == "uniform":
        return rng.uniform(shape, -run.init_range, run.init_range)
    return rng.normal(shape, stddev=run.init_std)

class XLNet(tf.Module):
    """XLNet with the permutation-LM head. Variables: `weights`, a dict keyed by original names."""

    def __init__(self, config: XLNetConfig, run: RunConfig, seed: Optional[int] = None):
        super().__init__(name="xlnet")
        self.config = config
        self.run = run
        self.compute_dtype = tf.bfloat16 if run.use_bfloat16 else tf.float32
        if seed is None:
            rng = tf.random.Generator.from_non_deterministic_state()
        else:
            rng = tf.random.Generator.from_seed(seed)
        # float32 storage even under bfloat16 (as TPU bfloat16_scope does): casts happen on read.
        self.weights = {name: tf.Variable(_initial_value(name, shape, run, rng), name=name)
                        for name, shape in variable_shapes(config).items()}
        # Dropout masks come from a generator of their own, whose state a training checkpoint keeps, so that a
        # resumed run draws the masks the uninterrupted one would have (under a strategy: one stream per replica).
        self.dropout_rng = rng.split(1)[0]
        self._layer_seed = None  # inside a recomputed layer: the seed of its dropout masks (see _recomputed)
        self._layer_draws = 0

    # ----- helpers -----
    def _w(self, name: str) -> tf.Tensor:
        return tf.cast(self.weights["model/" + name], self.compute_dtype)

    def _dropout(self, x: tf.Tensor, rate: float, training: bool) -> tf.Tensor:
        if not training or rate == 0:
            return x
        if self._layer_seed is None:
            seed = self.dropout_rng.make_seeds(1)[:, 0]
        else:  # the same masks each time the layer runs, forward and recomputed
            self._layer_draws += 1
            seed = tf.random.experimental.stateless_fold_in(self._layer_seed, self._layer_draws)
        return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=seed)

    def _recomputed(self, layer):
        """layer(output_h, output_g), its activations recomputed in the backward pass instead of kept
        (tf.recompute_grad). Its dropout masks come from one seed drawn before it: the generator has moved on
        by the time the backward pass runs the layer again."""
        seed = self.dropout_rng.make_seeds(1)[:, 0]

        def run(output_h, *output_g):  # output_g: () without the query stream (tf.recompute_grad takes no None)
            self._layer_seed, self._layer_draws = seed, 0
            try:
                out = layer(output_h, *output_g or (None,))
            finally:
                self._layer_seed = None
            return out if output_g else out[0]
        recomputed = tf.recompute_grad(run)
        return lambda output_h, output_g: (recomputed(output_h), None) if output_g is None else recomputed(output_h, output_g)

    def _bias(self, name: str, layer: int) -> tf.Tensor:
        bias = self._w(f"transformer/{name}")
        return bias[layer] if self.config.untie_r else bias

    def initial_mems(self, bsz: int) -> Optional[list]:
        """Zero memories for the first batch (train_gpu's initialize_mems_np)."""
        if not self.run.mem_len:
            return None
        return [tf.zeros([self.run.mem_len, bsz, self.config.d_model]) for _ in range(self.config.n_layer)]

    # ----- the network -----
    def _rel_attn_core(self, layer, q_head, k_head_h, v_head_h, k_head_r, seg_mat, attn_mask, training,
                       positions=None):
        """Relative attention of one query stream: content + position + segment scores.

        Head-major, unlike the original's [qlen, klen, bsz, n_head] scores: q_head [bsz, n_head, qlen,
        d_head], k/v_head_h [bsz, n_head, klen, d_head], k_head_r [n_dir, n_head, rlen, d_head],
        seg_mat [bsz, 1, qlen, klen] (1: other segment), attn_mask [bsz or 1, 1, qlen, klen] (1: may
        not attend). Every product is then a plain batched matmul and the softmax runs over the last
        axis, with no transposes of the scores. Returns [bsz, n_head, qlen, d_head].
        positions [bsz, num_predict]: q_head holds only the queries at these positions (the masks stay
        [.., qlen, klen]); returns [bsz, n_head, num_predict, d_head].
        """
        scale = 1 / (self.config.d_head ** 0.5)
        klen = tf.shape(k_head_h)[2]
        ac = tf.matmul(q_head + self._bias("r_w_bias", layer)[:, None], k_head_h, transpose_b=True)

        q_r = q_head + self._bias("r_r_bias", layer)[:, None]
        if k_head_r.shape[0] == 1:
            bd = tf.matmul(q_r, k_head_r[0], transpose_b=True)
        else:
            # bi_data: forward half of the batch against direction 0, backward half against direction 1.
            shape = tf.shape(q_r)
            q_r = tf.reshape(q_r, tf.concat([[2, shape[0] // 2], shape[1:]], 0))
            bd = tf.reshape(tf.matmul(q_r, tf.expand_dims(k_head_r, 1), transpose_b=True),
                            tf.concat([shape[:3], [tf.shape(k_head_r)[2]]], 0))
        if positions is None:
            bd = ops.rel_shift(bd, klen)
        else:
            bsz = tf.shape(q_head)[0]
            bd = ops.rel_shift_rows(bd, positions, klen)
            seg_mat = None if seg_mat is None else ops.rows_at(seg_mat, positions, bsz)
            attn_mask = None if attn_mask is None else ops.rows_at(attn_mask, positions, bsz)

        score = ac + bd
        if seg_mat is not None:
            # The original's einsum with a one-hot seg_mat, as same + seg_mat * (other - same): a
            # product whose gradient is a product and a sum (a tf.where's costs two full selects).
            # `same` is added to every score of a query's row, which the softmax ignores: its gradient
            # through that broadcast is zero but for rounding and is not computed (a sum over the keys).
            seg_embed = tf.transpose(self._w("transformer/seg_embed")[layer], [1, 2, 0])  # [n_head, d_head, 2]
            same, other = tf.unstack(tf.matmul(q_head + self._bias("r_s_bias", layer)[:, None], seg_embed), axis=-1)
            score += tf.stop_gradient(same)[..., None] + seg_mat * (other - same)[..., None]
        score *= scale
        if attn_mask is not None:
            score -= 1e30 * attn_mask

        # The softmax in float32 even under bfloat16.
        prob = tf.cast(tf.nn.softmax(tf.cast(score, tf.float32)), score.dtype)
        prob = self._dropout(prob, self.run.dropatt, training)
        return tf.matmul(prob, v_head_h)

    def _post_attention(self, prefix, h, attn_vec, training):
        # attn_vec [bsz, n_head, len, d_head] -> [len, bsz, d_model] (einsum "bnid,hnd->ibh") as one 2-D
        # matmul, for the reason of ops.heads.
        kernel = self._w(f"{prefix}/o/kernel")
        d_model, n_head, d_head = kernel.shape
        heads = tf.transpose(attn_vec, [2, 0, 1, 3])
        out = tf.matmul(tf.reshape(heads, [-1, n_head * d_head]), tf.reshape(kernel, [d_model, n_head * d_head]),
                        transpose_b=True)
        out = tf.reshape(out, tf.concat([tf.shape(heads)[:2], [d_model]], 0))
        out = self._dropout(out, self.run.dropout, training)
        return ops.layer_norm(out + h, self._w(f"{prefix}/LayerNorm/gamma"), self._w(f"{prefix}/LayerNorm/beta"))

    def _ffn(self, prefix, inp, training):
        activation = tf.nn.relu if self.config.ff_activation == "relu" else ops.gelu
        out = tf.tensordot(inp, self._w(f"{prefix}/layer_1/kernel"), [[2], [0]]) + self._w(f"{prefix}/layer_1/bias")
        out = self._dropout(activation(out), self.run.dropout, training)
        out = tf.tensordot(out, self._w(f"{prefix}/layer_2/kernel"), [[2], [0]]) + self._w(f"{prefix}/layer_2/bias")
        out = self._dropout(out, self.run.dropout, training)
        return ops.layer_norm(out + inp, self._w(f"{prefix}/LayerNorm/gamma"), self._w(f"{prefix}/LayerNorm/beta"))

    def transformer(self, inp_k: tf.Tensor, seg_id: Optional[tf.Tensor] = None, mems: Optional[Sequence] = None,
                    perm_mask: Optional[tf.Tensor] = None, target_mapping: Optional[tf.Tensor] = None,
                    inp_q: Optional[tf.Tensor] = None, training: bool = False, recompute: bool = False):
        """The original's transformer_xl, time-major.

        inp_k [len, bsz] int; seg_id [len, bsz]; mems per layer [mlen, bsz, d_model];
        perm_mask [len, len, bsz] (1: i may not attend to j); target_mapping
        [num_predict, len, bsz] (rows one-hot, or zero for padding, as the input
        pipeline makes them); inp_q [len, bsz] (1: predicted; enables the
        query stream). Pretraining has no padding, so the original's input_mask is not taken.
        recompute: each layer's activations recomputed in the backward pass (less memory, the same gradients).
        Returns (output, new_mems): the query stream's output ([num_predict or
        len, bsz, d_model]) when inp_q is given, else the content stream's.
        """
        cfg, run, dtype = self.config, self.run, self.compute_dtype
        qlen, bsz = tf.shape(inp_k)[0], tf.shape(inp_k)[1]
        if run.bi_data and inp_k.shape[1] is not None and inp_k.shape[1] % 2:
            raise ConfigError(f"bi_data needs an even batch (forward + backward halves), got {inp_k.shape[1]}")
        if mems is not None:
            mems = [tf.cast(mem, dtype) for mem in mems]
        mlen = tf.shape(mems[0])[0] if mems is not None else 0
        klen = mlen + qlen

        attn_mask, non_tgt_mask = ops.attention_masks(qlen, mlen, bsz, perm_mask, run.attn_type, run.same_length, dtype)

        # Embeddings: the content stream sees tokens, the query stream only mask_emb.
        # Gathered from the table's value, not the variable: a gather from a resource variable (ResourceGather)
        # switches it to copy-on-read, and every dense read of it (the LM head's, the optimizer's) then copies
        # all n_token x d_model of it.
        word_emb_k = tf.cast(tf.gather(self.weights["model/transformer/word_embedding/lookup_table"].read_value(), inp_k),
                             dtype)
        output_h = self._dropout(word_emb_k, run.dropout, training)
        output_g = None
        if inp_q is not None:
            mask_emb = self._w("transformer/mask_emb/mask_emb")
            if target_mapping is not None:
                target_mapping = tf.cast(target_mapping, dtype)
                word_emb_q = tf.tile(mask_emb, [tf.shape(target_mapping)[0], bsz, 1])
            else:
                inp_q_ext = tf.cast(inp_q, dtype)[:, :, None]
                word_emb_q = inp_q_ext * mask_emb + (1 - inp_q_ext) * word_emb_k
            output_g = self._dropout(word_emb_q, run.dropout, training)

        # seg_mat[b, 0, i, j]: 1 when query i and key j (memory counts as
        # segment 0) are in different segments.
        seg_mat = None
        if seg_id is not None:
            seg_id = tf.transpose(seg_id)
            cat_ids = tf.concat([tf.zeros([bsz, mlen], dtype=seg_id.dtype), seg_id], 1)
            seg_mat = tf.cast(tf.not_equal(seg_id[:, :, None], cat_ids[:, None, :]), dtype)[:, None]

        # Queries of the predictions at their positions only; "uni" keeps the original's scatter (its
        # relative positions are not those of rel_shift_rows).
        queries = None  # (predicted_positions, predicted_weight)
        if target_mapping is not None and run.attn_type == "bi":
            mapping = tf.transpose(target_mapping, [2, 0, 1])  # [bsz, num_predict, len]
            queries = (tf.argmax(mapping, axis=2, output_type=tf.int32),
                       tf.reduce_sum(mapping, axis=2)[:, None, :, None])

        pos_emb = ops.relative_positional_encoding(qlen, klen, cfg.d_model, run.clamp_len, run.attn_type,
                                                   run.bi_data, dtype)
        pos_emb = self._dropout(pos_emb, run.dropout, training)

        new_mems = []
        for i in range(cfg.n_layer):
            mem = None if mems is None else mems[i]
            new_mems.append(ops.cache_mem(output_h, mem, run.mem_len, run.reuse_len))
            layer = functools.partial(self.layer, i, mem=mem, pos_emb=pos_emb, seg_mat=seg_mat, attn_mask=attn_mask,
                                      non_tgt_mask=non_tgt_mask, target_mapping=target_mapping, queries=queries,
                                      training=training)
            output_h, output_g = (self._recomputed(layer) if recompute and training else layer)(output_h, output_g)

        output = output_g if output_g is not None else output_h
        return self._dropout(output, run.dropout, training), (new_mems if run.mem_len else None)

    def layer(self, i: int, output_h: tf.Tensor, output_g: Optional[tf.Tensor], mem: Optional[tf.Tensor],
              pos_emb: tf.Tensor, seg_mat, attn_mask, non_tgt_mask, target_mapping=None, queries=None,
              training: bool = False):
        """Layer i of both streams (one pass of the original's loop in transformer_xl; Hugging Face's
        XLNetLayer): two-stream relative attention over [mem, output_h], then the feed-forward network.

        output_g is None without the query stream. queries: (predicted_positions, predicted_weight) when
        the query stream attends from the predicted positions only (see transformer).
        Returns (output_h, output_g) of the layer.
        """
        prefix = f"transformer/layer_{i}/rel_attn"
        cat = output_h if mem is None else tf.concat([mem, output_h], 0)
        # Heads are head-major ([bsz, n_head, len, d_head]), see _rel_attn_core.
        k_head_h = ops.heads(cat, self._w(f"{prefix}/k/kernel"))
        v_head_h = ops.heads(cat, self._w(f"{prefix}/v/kernel"))
        k_head_r = ops.heads(pos_emb, self._w(f"{prefix}/r/kernel"))  # [n_dir, n_head, rlen, d_head]
        q_kernel = self._w(f"{prefix}/q/kernel")

        q_head_h = ops.heads(output_h, q_kernel)
        attn_vec_h = self._rel_attn_core(i, q_head_h, k_head_h, v_head_h, k_head_r, seg_mat, non_tgt_mask,
                                         training)
        new_h = self._post_attention(prefix, output_h, attn_vec_h, training)

        if output_g is not None:
            q_head_g = ops.heads(output_g, q_kernel)
            if queries is not None:
                # The original scatters the predictions to their positions (einsum with
                # target_mapping), attends from all seq_len positions and gathers back; attending
                # from the predicted positions only is the same for one-hot rows, and padding rows
                # (all zero) get zero, as there.
                predicted_positions, predicted_weight = queries
                attn_vec_g = self._rel_attn_core(i, q_head_g, k_head_h, v_head_h, k_head_r, seg_mat, attn_mask,
                                                 training, positions=predicted_positions)
                attn_vec_g *= predicted_weight
            elif target_mapping is not None:
                q_head_g = tf.einsum("bnmd,mlb->bnld", q_head_g, target_mapping)
                attn_vec_g = self._rel_attn_core(i, q_head_g, k_head_h, v_head_h, k_head_r, seg_mat, attn_mask,
                                                 training)
                attn_vec_g = tf.einsum("bnld,mlb->bnmd", attn_vec_g, target_mapping)
            else:
                attn_vec_g = self._rel_attn_core(i, q_head_g, k_head_h, v_head_h, k_head_r, seg_mat, attn_mask,
                                                 training)
            output_g = self._ffn(f"transformer/layer_{i}/ff",
                                 self._post_attention(prefix, output_g, attn_vec_g, training), training)
        output_h = self._ffn(f"transformer/layer_{i}/ff", new_h, training)
        return output_h, output_g

    def plm_loss(self, features: Mapping[str, tf.Tensor], mems: Optional[Sequence] = None,
                 training: bool = False, recompute: bool = False, with_correct: bool = False) -> PLMOutput:
        """Permutation-LM loss of a batch of input-pipeline features (batch-major), as two_stream_loss
        (recompute: see transformer); with_correct: also whether each target is the model's top prediction
        (held-out accuracy)."""
        inp_k = tf.transpose(features["input_k"], [1, 0])
        inp_q = tf.transpose(features["input_q"], [1, 0])
        seg_id = tf.transpose(features["seg_id"], [1, 0])
        perm_mask = tf.transpose(features["perm_mask"], [1, 2, 0])
        target_mapping = features.get("target_mapping")
        if target_mapping is not None:
            target_mapping = tf.transpose(target_mapping, [1, 2, 0])
        target = tf.transpose(features["target"], [1, 0])
        target_mask = tf.cast(tf.transpose(features["target_mask"], [1, 0]), tf.float32)

        output, new_mems = self.transformer(inp_k, seg_id=seg_id, mems=mems, perm_mask=perm_mask,
                                            target_mapping=target_mapping, inp_q=inp_q, training=training,
                                            recompute=recompute)
        # The LM head, tied to the input embedding, plus its own bias; the softmax in float32 even under bfloat16.
        head = (tf.reshape(output, [-1, self.config.d_model]), self._w("transformer/word_embedding/lookup_table"),
                self._w("lm_loss/bias"))
        loss = ops.lm_loss(*head, tf.reshape(target, [-1]))
        loss = tf.reshape(loss, tf.shape(target))
        total_loss = tf.reduce_sum(loss * target_mask) / tf.reduce_sum(target_mask)
        correct = None
        if with_correct:
            top = tf.reshape(tf.argmax(ops.lm_logits(*head), axis=-1, output_type=tf.int32), tf.shape(target))
            correct = tf.transpose(tf.cast(tf.equal(top, tf.cast(target, tf.int32)), tf.float32), [1, 0])
        return PLMOutput(total_loss, tf.transpose(loss, [1, 0]), new_mems, correct)


def build_model(xlnet_config: str | XLNetConfig, run: RunConfig, checkpoint: Optional[str] = None,
                seed: Optional[int] = None) -> XLNet:
    """A model from an xlnet_config.json (or config), optionally initialised from a checkpoint."""
    if not isinstance(xlnet_config, XLNetConfig):
        xlnet_config = XLNetConfig.from_json(xlnet_config)
    model = XLNet(xlnet_config, run, seed=seed)
    if checkpoint:
        checkpoints.load(checkpoint, model.weights)
    return model
