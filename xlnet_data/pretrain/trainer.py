"""The model and its optimizer on a strategy, and one distributed training step.

The step is the original train_gpu.py's: each replica computes the PLM loss of its share of the batch with its
own memories (in K micro-batches of its rows with --gradient_accumulation_steps=K: accumulation.py), the gradients
are averaged over the replicas, clipped by global norm and applied once (the optimizer and its schedule:
optimization.py).
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from xlnet_data.common.errors import ConfigError
from xlnet_data.pretrain.accumulation import accumulate
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.distribution import uses_xla
from xlnet_data.pretrain.modeling import build_model
from xlnet_data.pretrain.optimization import AdamWeightDecay

log = logging.getLogger("xlnet_data")


class Trainer:
    """The model and its optimizer on a strategy, and the training step (`train_step`)."""

    def __init__(self, cfg: TrainConfig, strategy: tf.distribute.Strategy):
        self.cfg = cfg
        self.strategy = strategy
        replicas = strategy.num_replicas_in_sync
        rows = 2 * replicas if cfg.data.bi_data else replicas
        if cfg.data.bsz_per_host % rows:
            raise ConfigError(
                f"--train_batch_size={cfg.data.bsz_per_host} cannot be split over {replicas} replica(s): it must "
                f"be a multiple of {rows}" + (" (each replica needs forward and backward rows)" if cfg.data.bi_data
                                              else ""))
        self.bsz_per_replica = cfg.data.bsz_per_host // replicas
        steps, per_half = cfg.gradient_accumulation_steps, self.bsz_per_replica // (rows // replicas)
        if per_half % steps:
            raise ConfigError(
                f"--gradient_accumulation_steps={steps} cannot split each replica's {self.bsz_per_replica} rows into "
                f"micro-batches: it must divide {per_half}" + (" (with bi_data each micro-batch needs forward rows and "
                                                               "their backward rows)" if cfg.data.bi_data else ""))
        with strategy.scope():
            self.model = build_model(cfg.model, cfg.run, seed=cfg.seed)
            self.optimizer = AdamWeightDecay(self.model.weights, cfg)
        self.variables = list(self.model.weights.values())
        self.uses_xla = uses_xla(cfg.jit_compile, strategy)
        self._stepped = False
        self._build_step()

    def _build_step(self):
        # Only the model's pass is compiled: the all-reduce, clipping and the update stay outside, so
        # the same code compiles under every strategy (as Keras compiles its per-replica step).
        # autograph=False: the step's Python branches and loops are on Python values, never tensors, so AutoGraph's
        # conversion would give the same graph; converting the model's code cost each process ~2 s of CPU.
        self._forward_backward = (tf.function(self._model_forward_backward, jit_compile=True, autograph=False)
                                  if self.uses_xla else self._model_forward_backward)
        self.step = tf.function(self._step, autograph=False)
        self.loss_and_grads = tf.function(self._distributed_loss_and_grads, autograph=False)

    def train_step(self, features, mems):
        """self.step, except that with --jit_compile=auto a first step that XLA cannot compile (an op
        it lacks on this device) is run uncompiled instead, and so are the following ones."""
        try:
            out = self.step(features, mems)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as err:
            if self._stepped or not self.uses_xla or self.cfg.jit_compile != "auto":
                raise
            # Nothing ran: compilation comes before the first op of the compiled pass.
            log.warning("XLA cannot compile the step, running it uncompiled: %s", str(err).strip().splitlines()[0])
            self.uses_xla = False
            self._build_step()
            out = self.step(features, mems)
        self._stepped = True
        return out

    def initial_mems(self):
        if not self.cfg.run.mem_len:
            return None
        # In the compute dtype, as the step returns them (so the step is traced once).
        return self.strategy.experimental_distribute_values_from_function(
            lambda _: [tf.cast(mem, self.model.compute_dtype) for mem in self.model.initial_mems(self.bsz_per_replica)])

    def distribute_mems(self, per_replica) -> Any:
        """Memories from per_replica[r] = [layer 0, layer 1, ...] (arrays, e.g. read from a checkpoint)."""
        return self.strategy.experimental_distribute_values_from_function(
            lambda context: [tf.cast(mem, self.model.compute_dtype)
                             for mem in per_replica[context.replica_id_in_sync_group]])

    def replica_mems(self, mems) -> list[list[tf.Tensor]]:
        """[replica][layer] tensors of memories as initial_mems or a step gives them ([] without memories)."""
        if mems is None:
            return []
        if isinstance(mems, tf.distribute.DistributedValues):  # initial_mems' values: one list per replica
            return [list(layers) for layers in self.strategy.experimental_local_results(mems)]
        return [list(layers) for layers in zip(*(self.strategy.experimental_local_results(mem) for mem in mems))]

    def _model_forward_backward(self, features, mems):
        """On one replica: its loss, its gradients, its next memories."""
        cfg = self.cfg
        if cfg.gradient_accumulation_steps > 1:
            loss, grads, new_mems = accumulate(self.model, self.variables, features, mems,
                                               cfg.gradient_accumulation_steps, cfg.recompute, self._gradients)
        else:
            out = self.model.plm_loss(features, mems, training=True, recompute=cfg.recompute)
            loss, grads, new_mems = out.total_loss, self._gradients(out.total_loss), out.new_mems
        # Those sums (of a variable's several reads) come without a device, where a multi-worker all-reduce
        # looks for its destination.
        with tf.device(loss.device):
            grads = [tf.identity(tf.convert_to_tensor(g)) for g in grads]
        return loss, grads, new_mems

    def _gradients(self, loss):
        # A variable's gradient terms summed two at a time, in the order of the graph (see
        # sum_in_graph_order): a tape sums three or more at once with AddN.
        return tf.gradients(loss, self.variables, aggregation_method=tf.AggregationMethod.EXPERIMENTAL_TREE)

    def _replica_loss_and_grads(self, features, mems):
        """On one replica: its loss, the gradients averaged over all replicas, its next memories."""
        loss, grads, new_mems = self._forward_backward(features, mems)
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        return loss, grads, new_mems

    def _replica_step(self, features, mems):
        loss, grads, new_mems = self._replica_loss_and_grads(features, mems)
        grads, gnorm = tf.clip_by_global_norm(grads, self.cfg.clip)
        lr = tf.distribute.get_replica_context().merge_call(self.optimizer.apply, args=(grads,))
        return loss, gnorm, lr, new_mems

    def _step(self, features, mems):
        """One update: (mean loss over replicas, gradient norm before clipping, learning rate, new mems)."""
        loss, gnorm, lr, new_mems = self.strategy.run(self._replica_step, args=(features, mems))
        mean = lambda value: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        return mean(loss), mean(gnorm), mean(lr), new_mems

    def _distributed_loss_and_grads(self, features, mems):
        """Mean loss, averaged gradients and next memories of a step without applying them (for checks)."""
        loss, grads, new_mems = self.strategy.run(self._replica_loss_and_grads, args=(features, mems))
        first = lambda value: self.strategy.experimental_local_results(value)[0]
        return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None), [first(g) for g in grads], new_mems
