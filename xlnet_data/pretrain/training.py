"""Pretraining XLNet on the records: the whole training run, read top to bottom.

    TrainConfig        everything a run depends on (frozen; train_gpu.py builds it from flags)
    (optimization.py   the learning-rate schedule and the original's optimizer)
    save/restore       checkpoints under the original's variable names (+ adam_m/adam_v, global_step)
    run_state          the rest of what the next step depends on (memories, positions, RNG), checkpointed too
    replica_batches    records -> per-replica batches that keep the records' layout
    sampling_probs     which source each step reads when several are mixed (XLM's sampling factor)
    Trainer            the model, the optimizer and one distributed step
    train              the loop: steps, logs, TensorBoard summaries, checkpoints; on SIGTERM/SIGINT
                       a checkpoint at the current step, and the run ends (a re-run resumes exactly)

The step is the original train_gpu.py's: each replica computes the PLM loss of its
share of the batch with its own memories, the gradients are averaged over the
replicas, clipped by global norm and applied once. Memories never leave their
replica: replica r always gets the same rows of the records, so its memory
continues its rows from step to step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import time
from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from xlnet_data.common import fileio, stopping
from xlnet_data.common.errors import ConfigError, UserError
from xlnet_data.dataformat import save_dir, validation
from xlnet_data.dataformat.corpus_info import CorpusInfo
from xlnet_data.dataformat.examples.generated import Position, check_cache
from xlnet_data.dataformat.record_reader import RecordError, read_numbered_examples
from xlnet_data.pretrain import checkpoints, hf
from xlnet_data.pretrain.cache_input import CacheFeed
from xlnet_data.pretrain.inputs import InputConfig, PermutationFn, find_records, parse_batches, record_batches
from xlnet_data.pretrain.modeling import RunConfig, XLNet, XLNetConfig, build_model
from xlnet_data.pretrain.optimization import DECAY_METHODS, AdamWeightDecay

log = logging.getLogger("xlnet_data")

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
JIT_COMPILE = ("auto", "on", "off")
MAX_TRAIN_STEPS = 1 << 27  # the mixing schedule holds a source index per step


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A training run. Names and defaults are the original train_gpu.py flags'.

    record_info_dir: comma-separated `tfrecords/` dirs; without mix_sampling_factor their
      files are read one after the other (the original), with it each step reads one dir.
    data.bsz_per_host is the global batch (train_batch_size), split over the replicas.
    """

    record_info_dir: str
    model_dir: str
    model: XLNetConfig
    run: RunConfig
    data: InputConfig
    init_checkpoint: Optional[str] = None
    learning_rate: float = 1e-4
    clip: float = 1.0
    min_lr_ratio: float = 0.001
    warmup_steps: int = 0
    adam_epsilon: float = 1e-8
    decay_method: str = "poly"
    weight_decay: float = 0.0
    train_steps: int = 100000
    iterations: int = 1000
    save_steps: Optional[int] = None  # None: a checkpoint at the end only
    max_save: int = 5
    mix_sampling_factor: Optional[float] = None
    seed: int = 0  # model init, permutations, source draws
    strategy: str = "auto"
    devices: tuple[str, ...] = ()  # one_device / mirrored: the devices (default: the GPUs, else the CPU)
    tpu: str = ""  # strategy tpu: the TPU's name or address
    jit_compile: str = "auto"  # XLA for each replica's forward and backward pass (see Trainer.uses_xla)
    tf32: bool = False  # let GPUs run float32 matmuls in TF32
    max_loss: Optional[float] = None  # a step's loss above it stops the run as diverging (None: only non-finite)

    def __post_init__(self):
        def need(ok, message):
            if not ok:
                raise ConfigError(message)

        need(self.decay_method in DECAY_METHODS, f"--decay_method={self.decay_method} must be poly or cos")
        need(self.strategy in STRATEGIES, f"--strategy={self.strategy} must be one of {', '.join(STRATEGIES)}")
        need(self.jit_compile in JIT_COMPILE, f"--jit_compile={self.jit_compile} must be one of {', '.join(JIT_COMPILE)}")
        for name in ("train_steps", "iterations", "max_save"):
            need(getattr(self, name) > 0, f"--{name}={getattr(self, name)} must be positive")
        need(self.save_steps is None or self.save_steps > 0, f"--save_steps={self.save_steps} must be positive")
        need(self.train_steps <= MAX_TRAIN_STEPS, f"--train_steps={self.train_steps} must be at most {MAX_TRAIN_STEPS}")
        need(self.warmup_steps >= 0, f"--warmup_steps={self.warmup_steps} must not be negative")
        # Comparisons that NaN fails as well as a value out of range.
        need(0 < self.clip < math.inf, f"--clip={self.clip} must be a positive number")
        need(0 <= self.learning_rate < math.inf, f"--learning_rate={self.learning_rate} must be a number >= 0")
        need(0 <= self.min_lr_ratio <= 1, f"--min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        need(0 < self.adam_epsilon < math.inf, f"--adam_epsilon={self.adam_epsilon} must be a positive number")
        need(0 <= self.weight_decay < math.inf, f"--weight_decay={self.weight_decay} must be a number >= 0")
        need(self.max_loss is None or 0 < self.max_loss < math.inf,
             f"--max_loss={self.max_loss} must be a positive number")
        need(0 <= self.seed < 2**63, f"--seed={self.seed} must be in [0, 2**63)")
        need(self.mix_sampling_factor is None or 0 <= self.mix_sampling_factor < math.inf,
             f"--mix_sampling_factor={self.mix_sampling_factor} must be a number >= 0")
        duplicated = sorted({d for d in self.devices if self.devices.count(d) > 1})
        need(not duplicated, f"--devices names {', '.join(duplicated)} twice: each device holds one replica")
        for device in self.devices:
            try:
                known = tf.DeviceSpec.from_string(device).device_type is not None
            except (ValueError, TypeError):
                known = False
            need(known, f"--devices: {device!r} is not a device name such as /gpu:0 or /cpu:0")
        need(self.run.reuse_len == self.data.reuse_len and self.run.bi_data == self.data.bi_data,
             "the model's reuse_len/bi_data must be the data's")

    @property
    def sources(self) -> list[str]:
        """The record dirs read as separate streams: each dir when mixing, else all of them as one."""
        if self.mix_sampling_factor is None:
            return [self.record_info_dir]
        return self.record_info_dir.split(",")


# ----- checkpoints -------------------------------------------------------------------------------
# The model's variables, the slots as "<name>/adam_m", "<name>/adam_v", and "global_step", as the
# original's Saver writes them (see checkpoints.py).

def save(model_dir: str, model: XLNet, optimizer: AdamWeightDecay, max_save: int,
         state: Optional[dict[str, tf.Tensor]] = None) -> str:
    """Writes model_dir/model.ckpt-<step>, lists it in model_dir/checkpoint, keeps the last max_save.
    `state`: more tensors to keep in it (run_state's)."""
    step = int(optimizer.step.numpy())
    slots = {var.name.split(":")[0]: var for var in [*optimizer.m.values(), *optimizer.v.values()]}
    return checkpoints.save(os.path.join(model_dir, f"model.ckpt-{step}"),
                            {"global_step": optimizer.step, **model.weights, **slots, **(state or {})}, max_save)


def restore(path: str, model: XLNet, optimizer: AdamWeightDecay) -> None:
    """Model, slots and step from one of our checkpoints (slots missing from it stay zero)."""
    checkpoints.load(path, model.weights)
    slots = {var.name.split(":")[0]: var for var in [*optimizer.m.values(), *optimizer.v.values()]}
    checkpoints.load(path, {"global_step": optimizer.step, **slots}, required=False)


# ----- data --------------------------------------------------------------------------------------

def split_host_batch(value: tf.Tensor, num_replicas: int, bi_data: bool) -> tf.Tensor:
    """One step of the records, [num_core, bsz_per_core, ...] (each core's block: its forward rows,
    then the same rows reversed with bi_data) -> [num_replicas, bsz_per_replica, ...].

    Replica r gets forward rows r*k .. r*k+k-1 (of all cores' forward rows in order) and, with
    bi_data, their backward rows after them, so its batch has the halves the model expects.
    """
    shape = [num_replicas, -1, *value.shape[2:]]
    if not bi_data:
        return tf.reshape(value, shape)
    half = value.shape[1] // 2
    forward = tf.reshape(value[:, :half], shape)
    backward = tf.reshape(value[:, half:], shape)
    return tf.concat([forward, backward], axis=1)


def replica_batches(record_dir: str, cfg: TrainConfig, num_replicas: int, *, start_step: int = 0,
                    permutation: Optional[PermutationFn] = None,
                    input_context: Optional[tf.distribute.InputContext] = None,
                    feed: Optional[CacheFeed] = None) -> tf.data.Dataset:
    """Per-replica batches in the order a strategy deals them out: step s, replica r is element
    s * num_replicas + r. start_step skips the steps a resumed run already trained on. With
    several input pipelines (multi-worker), pipeline p keeps only its own replicas' batches; from a
    token cache it makes only their records (`feed`: how a cache-backed source is generated).

    The cores' batches are split into the replicas' before parsing (serialized records and their
    permutations), so the features, the same row for row, are built once and never moved."""
    data = cfg.data
    several_pipelines = input_context is not None and input_context.num_input_pipelines > 1
    feed = feed or CacheFeed()
    feed.vocab_size = cfg.model.n_token
    if several_pipelines:
        feed.keep = np.zeros(data.bsz_per_host, dtype=bool)
        feed.keep[pipeline_rows(data, num_replicas, input_context)] = True
    dataset = record_batches(record_dir, data, seed=cfg.seed, permutation=permutation,
                             start=start_step * data.bsz_per_host, feed=feed)
    if num_replicas == data.num_core_per_host and not several_pipelines:
        # Replica r is core r: the records' batches are already the replicas' (split_host_batch would
        # hand every replica its own core's block).
        return parse_batches(dataset, data)
    dataset = dataset.batch(data.num_core_per_host, drop_remainder=True)  # one step of the records
    dataset = dataset.map(lambda *rows: tuple(split_host_batch(value, num_replicas, data.bi_data) for value in rows))
    if several_pipelines:
        local = num_replicas // input_context.num_input_pipelines
        first = input_context.input_pipeline_id * local
        dataset = dataset.map(lambda *rows: tuple(value[first:first + local] for value in rows))
    return parse_batches(dataset.unbatch(), data)


def pipeline_rows(data: InputConfig, num_replicas: int, input_context: tf.distribute.InputContext) -> np.ndarray:
    """The rows of a step (0..bsz_per_host-1, in the records' order) that input pipeline p gives its replicas."""
    rows = tf.reshape(tf.range(data.bsz_per_host), [data.num_core_per_host, -1])
    local = num_replicas // input_context.num_input_pipelines
    first = input_context.input_pipeline_id * local
    return split_host_batch(rows, num_replicas, data.bi_data)[first:first + local].numpy().reshape(-1)


def source_tokens(record_dir: str, data: InputConfig) -> int:
    """Tokens in a source's records (batches x rows x seq_len): what mixing weights are based on."""
    return find_records(record_dir, data).num_batch * data.bsz_per_host * data.seq_len


def sampling_probs(tokens, alpha: float) -> np.ndarray:
    """XLM's language sampling: p_i proportional to tokens_i ** alpha (1: by size, 0: uniform)."""
    weights = np.asarray(tokens, dtype=np.float64) ** alpha
    return weights / weights.sum()


def mixing_schedule(probs, num_steps: int, seed: int) -> np.ndarray:
    """The source of every step of the run, drawn once from the seed (a resumed run draws the same)."""
    return np.random.default_rng(seed).choice(len(probs), size=num_steps, p=probs)


def mixture_line(counts, probs, names) -> str:
    total = max(int(np.sum(counts)), 1)
    return "mixture: " + ", ".join(f"{name} {100 * count / total:.1f}% (expected {100 * p:.1f}%)"
                                   for name, count, p in zip(names, counts, probs))


@dataclasses.dataclass
class Source:
    """One stream of records with its own memories, so that its rows stay consecutive."""

    name: str
    batches: Any  # iterator of distributed per-replica batches
    mems: Any  # per-replica memories (None without mem_len)
    position: int = 0  # steps of records read from the start of its stream (the next step reads this one)
    steps: int = 0  # steps this run took from it
    feed: Optional[CacheFeed] = None  # a cache-backed source's generation (its stream's positions are checkpointed)


# ----- the distributed step ----------------------------------------------------------------------

def make_strategy(name: str = "auto", devices=(), tpu: str = "") -> tf.distribute.Strategy:
    """auto: all local GPUs mirrored when there are several, else the one GPU, else the CPU."""
    if name == "multi_worker":  # first: its collectives must be configured before TensorFlow initialises
        return multi_worker_strategy()
    gpus = tf.config.list_logical_devices("GPU")
    here = {(spec.device_type, spec.device_index) for spec in map(tf.DeviceSpec.from_string,
                                                                   (d.name for d in tf.config.list_logical_devices()))}
    for device in devices:
        spec = tf.DeviceSpec.from_string(device)
        if (spec.device_type.upper(), spec.device_index or 0) not in here:
            raise ConfigError(f"--devices: {device} is not a device of this machine (it has "
                              f"{', '.join(sorted(f'/{t.lower()}:{i}' for t, i in here))})")
    if name == "auto":
        name = "mirrored" if len(gpus) > 1 else "one_device"
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices[0] if devices else "/gpu:0" if gpus else "/cpu:0")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(list(devices) or None)
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def multi_worker_strategy() -> tf.distribute.Strategy:
    """The cluster of the TF_CONFIG environment variable: every worker's local GPUs (or its CPU) as replicas."""
    return tf.distribute.MultiWorkerMirroredStrategy()


# What a collective op raises on the other workers when one worker dies or stops answering.
LOST_WORKER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                      tf.errors.CancelledError)


def lost_worker_message(err: tf.errors.OpError, model_dir: str) -> str:
    """One line for a multi-worker run that lost a worker: which one, TensorFlow's reason, how to go on."""
    peer = re.search(r"(?:heartbeats\):\s*|remote target |check alive failed, )/job:(\w+)/(?:replica:\d+/)?task:(\d+)",
                     err.message)
    lines = [line.strip() for line in err.message.splitlines() if line.strip() and not line.startswith("\t")]
    reason = next((line.split("aborted by:", 1)[1].strip().rstrip(":") for line in lines if "aborted by:" in line),
                  lines[-1] if lines else type(err).__name__)
    who = f"{peer[1]} {peer[2]}" if peer else "a worker"
    return (f"lost {who} of the cluster ({reason}); every worker stops: start them all again to resume from the "
            f"last checkpoint in {model_dir}")


def uses_xla(jit_compile: str, strategy: tf.distribute.Strategy) -> bool:
    """Whether each replica's forward and backward pass is compiled with XLA. auto: on GPUs; not on CPUs,
    where TensorFlow's oneDNN kernels run the step faster than XLA's CPU code (BENCHMARKS.md), nor on
    TPUs, where the whole step is compiled anyway."""
    if jit_compile != "auto":
        return jit_compile == "on"
    return not isinstance(strategy, tf.distribute.TPUStrategy) and all(
        tf.DeviceSpec.from_string(device).device_type == "GPU" for device in strategy.extended.worker_devices)


@contextlib.contextmanager
def sum_in_graph_order():
    """Within the block, a step on CPU repeats bit for bit, and so a resumed run equals an uninterrupted one.
    TensorFlow's AddN kernel reuses whichever input buffer is free first as its output and adds the others to
    it: with three or more terms the order of the sum, and its rounding, follows the thread schedule (1 gradient
    in a few hundred then differs in the last bit). Grappler's arithmetic optimizer turns chains of two-term
    adds into such AddNs, so it is off for the functions first run in the block (its cost on the step:
    BENCHMARKS.md). The setting is the process's: the caller's is put back after the block."""
    before = tf.config.optimizer.get_experimental_options().get("arithmetic_optimization")  # None: the default
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": before})


@contextlib.contextmanager
def tensor_float_32(enabled: bool):
    """Within the block GPUs run float32 matmuls in TF32 or not (a process setting; the caller's is put back)."""
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(enabled)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


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
        self._forward_backward = (tf.function(self._model_forward_backward, jit_compile=True) if self.uses_xla
                                  else self._model_forward_backward)
        self.step = tf.function(self._step)
        self.loss_and_grads = tf.function(self._distributed_loss_and_grads)

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
        out = self.model.plm_loss(features, mems, training=True)
        # A variable's gradient terms summed two at a time, in the order of the graph (see
        # sum_in_graph_order): a tape sums three or more at once with AddN.
        grads = tf.gradients(out.total_loss, self.variables, aggregation_method=tf.AggregationMethod.EXPERIMENTAL_TREE)
        # Those sums (of a variable's several reads) come without a device, where a multi-worker all-reduce
        # looks for its destination.
        with tf.device(out.total_loss.device):
            grads = [tf.identity(tf.convert_to_tensor(g)) for g in grads]
        return out.total_loss, grads, out.new_mems

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
        """Mean loss and averaged gradients of a step without applying them (for checks)."""
        loss, grads, _ = self.strategy.run(self._replica_loss_and_grads, args=(features, mems))
        first = lambda value: self.strategy.experimental_local_results(value)[0]
        return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None), [first(g) for g in grads]


# ----- the rest of what a step depends on: in the checkpoint too, for an exact resume --------------
# Beside the variables, a checkpoint holds under "train_state/": the seed (it draws the factorization
# orders and the mixing schedule), the dropout generator's state, and for every source the steps of
# records read (its position in the stream) and each replica's memories. A run resumed from it takes
# the very steps the uninterrupted run would have taken.

STATE = "train_state/"


def run_state(cfg: TrainConfig, trainer: Trainer, sources: list[Source]) -> dict[str, tf.Tensor]:
    """The tensors that, with the variables, decide the next step."""
    state = {f"{STATE}seed": tf.constant(cfg.seed, tf.int64), f"{STATE}dropout_rng": trainer.model.dropout_rng.state}
    for i, source in enumerate(sources):
        state[f"{STATE}source_{i}/steps_read"] = tf.constant(source.position, tf.int64)
        at = source.feed.stream.position(source.position) if source.feed and source.feed.stream else None
        if at is not None:  # where the generator's random streams stood, at or before the position
            state[f"{STATE}source_{i}/generator/step"] = tf.constant(at.step, tf.int64)
            state[f"{STATE}source_{i}/generator/numpy_mt"] = tf.constant(at.numpy_mt, tf.int64)
            state[f"{STATE}source_{i}/generator/python_mt"] = tf.constant(at.python_mt, tf.int64)
        for replica, layers in enumerate(trainer.replica_mems(source.mems)):
            for layer, mem in enumerate(layers):
                state[f"{STATE}source_{i}/mems/replica_{replica}/layer_{layer}"] = mem
    return state


@dataclasses.dataclass
class ResumedState:
    """What restore_state found: per source, its position and its memories ([replica][layer] arrays), or None."""

    positions: Optional[list[int]] = None
    mems: Optional[list[Optional[list[list[np.ndarray]]]]] = None
    generators: Optional[list[Optional[Position]]] = None  # cache-backed sources: where generation resumes


def restore_state(path: str, cfg: TrainConfig, trainer: Trainer) -> ResumedState:
    """Restores the dropout generator from checkpoint `path` and returns the sources' positions and memories.

    A checkpoint without that state (an older one, the original's) or one of other sources resumes as before:
    positions from the schedule, empty memories (with a warning). Another --seed is refused.
    """
    saved = checkpoints.read_prefixed(path, STATE)
    if not saved:
        log.warning("%s holds no training state (memories, positions): memories start empty", path)
        return ResumedState()
    seed = int(saved[f"{STATE}seed"])
    if seed != cfg.seed:
        raise ConfigError(f"--seed={cfg.seed}, but {path} was trained with --seed={seed} (it draws the factorization "
                          f"orders and the mixing schedule): resume with --seed={seed}, or use a new --model_dir")
    trainer.model.dropout_rng.state.assign(saved[f"{STATE}dropout_rng"])
    count = len(cfg.sources)
    positions = [saved.get(f"{STATE}source_{i}/steps_read") for i in range(count)]
    if None in positions or f"{STATE}source_{count}/steps_read" in saved:
        log.warning("%s was trained on other sources than --record_info_dir: each starts where the mixing schedule "
                    "puts it, with empty memories", path)
        return ResumedState()
    replicas = len(trainer.replica_mems(trainer.initial_mems()))
    shape = (cfg.run.mem_len, trainer.bsz_per_replica, cfg.model.d_model)
    mems = []
    for i in range(count):
        found = [[saved.get(f"{STATE}source_{i}/mems/replica_{r}/layer_{layer}") for layer in range(cfg.model.n_layer)]
                 for r in range(replicas)]
        usable = all(mem is not None and mem.shape == shape for layers in found for mem in layers)
        if replicas and not usable:
            log.warning("%s holds no memories of this shape (%d replica(s) x %s): memories start empty", path,
                        replicas, list(shape))
        mems.append(found if replicas and usable else None)
    generators = [Position(int(saved[f"{STATE}source_{i}/generator/step"]),
                           saved[f"{STATE}source_{i}/generator/numpy_mt"], saved[f"{STATE}source_{i}/generator/python_mt"])
                  if f"{STATE}source_{i}/generator/step" in saved else None for i in range(count)]
    return ResumedState([int(position) for position in positions], mems, generators)


def check_records(cfg: TrainConfig) -> None:
    """Before training: every unit's files hold the records its record_info lists (a cheap walk over the frames;
    RecordError names the file, the record and the byte where they do not)."""
    for name in cfg.sources:
        found = find_records(name, cfg.data)
        for info_path, num_batch, files in found.units:
            validation.check_unit(info_path, num_batch, list(files), cfg.data.bsz_per_host)
        for unit in found.cache_units:  # the cache there, the one the unit was counted from (TokenCacheError)
            check_cache(unit)


def find_damage(record_dir: str, cfg: TrainConfig) -> Optional[RecordError]:
    """The first record of the source that cannot be trained on (corrupt, or of another schema or vocabulary),
    read with the CRC checks: what a failed read of the input pipeline ran into."""
    for path in find_records(record_dir, cfg.data).filenames:
        try:
            for _ in read_numbered_examples(path, cfg.data.seq_len, cfg.model.n_token):
                pass
        except RecordError as err:
            return err
    return None


class DivergedError(UserError, ValueError):
    """The loss (or the gradient) became non-finite, or a loss passed --max_loss: the run stops, without a
    checkpoint of those weights."""


def _check_losses(window: list[float], first: int, gnorm, lr, cfg: TrainConfig) -> None:
    """`window`: the losses of steps first+1, first+2, ...; DivergedError names the first bad one."""
    for step, loss in enumerate(window, first + 1):
        if not math.isfinite(loss):
            why = f"the loss is {loss} at step {step}"
        elif cfg.max_loss is not None and loss > cfg.max_loss:
            why = f"the loss {loss:.4g} at step {step} is above --max_loss={cfg.max_loss:g} (diverging)"
        else:
            continue
        break
    else:
        if gnorm is None or math.isfinite(float(gnorm)):
            return
        why, step = f"the gradient norm is {float(gnorm)} at step {first + len(window)}", first + len(window)
    latest = checkpoints.latest(cfg.model_dir)
    raise DivergedError(f"{why}: training stopped, no checkpoint of it written (learning rate {float(lr):.3g}); "
                        f"{f'the last checkpoint is {latest}' if latest else 'no checkpoint yet'}: lower "
                        "--learning_rate (or raise --warmup_steps) and run again")


def _say_if_a_better_checkpoint_goes(cfg: TrainConfig, step: int, loss: Optional[float],
                                     saved_losses: dict[str, float]) -> None:
    """Warns when --max_save rotates out a checkpoint of this run whose loss was clearly lower (by more than
    10%) than the one about to be saved: the loss is growing, and the better weights would go unsaid."""
    listed = [os.path.basename(p) for p in checkpoints.listed(cfg.model_dir)]
    name = f"model.ckpt-{step}"
    going = ([p for p in listed if p != name] + [name])[:-cfg.max_save]
    better = [(saved_losses[p], p) for p in going if p in saved_losses]
    if loss is not None and better and min(better)[0] * 1.1 < loss:
        log.warning("--max_save=%d deletes %s (loss %.4g) for %s (loss %.4g): the loss is growing; --max_loss "
                    "stops a diverging run, a larger --max_save keeps more", cfg.max_save, min(better)[1],
                    min(better)[0], name, loss)


class DamagedRecordsError(UserError, ValueError):
    """Training met a record it cannot read; the message names the file, the record and the byte."""


# ----- the loop ----------------------------------------------------------------------------------

@dataclasses.dataclass
class TrainResult:
    step: int  # the global step reached
    first_step: int  # the global step this run started from (> 0 when it resumed)
    losses: list[float]  # loss of every step of this run
    trainer: Trainer
    sources: list[Source]
    stopped_by: Optional[int] = None  # the signal (SIGTERM, SIGINT) that ended the run early
    checkpoint: Optional[str] = None  # the last checkpoint this run wrote


def _check_model_dir(cfg: TrainConfig, chief: bool) -> None:
    """Writes model_dir/xlnet_config.json (the chief of several workers), or checks that the one there is
    this model's."""
    path = os.path.join(cfg.model_dir, "xlnet_config.json")
    if not os.path.exists(path) and not chief:
        return
    os.makedirs(cfg.model_dir, exist_ok=True)
    if os.path.exists(path):
        try:
            there = XLNetConfig.from_json(path)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{path} is not an xlnet_config.json ({str(err).splitlines()[0]}): a model_dir of "
                              "another run? Use a new --model_dir") from None
        if there != cfg.model:
            changed = ", ".join(f"{key}={value} (here {getattr(cfg.model, key)})"
                                for key, value in dataclasses.asdict(there).items()
                                if value != getattr(cfg.model, key))
            raise ConfigError(f"--model_dir={cfg.model_dir} holds another model: {changed}; use a new model_dir")
    else:
        try:
            cfg.model.to_json(path)
        except OSError as err:
            raise OSError(f"cannot write {path}: {err.strerror or err}") from None
    if not chief:
        return
    # This run's settings, for export_hf's config.json (memory, attention) and tokenizer (uncased, keep_accents);
    # rewritten by every run, since a resumed run may change them.
    settings = {**dataclasses.asdict(cfg.run), "seq_len": cfg.data.seq_len, "perm_size": cfg.data.perm_size,
                "num_predict": cfg.data.num_predict, "uncased": cfg.data.uncased,
                # the records' SentencePiece model(s), for export_hf to ship the very tokenizer
                "sp_model_sha256": sorted({validation.check_units_agree(d) for d in cfg.sources} - {None})}
    keep_accents = _records_keep_accents(cfg.record_info_dir)
    if keep_accents is not None:  # else export_hf takes its flag
        settings["keep_accents"] = keep_accents
    fileio.write_text_atomic(os.path.join(cfg.model_dir, "run_config.json"), json.dumps(settings, indent=2) + "\n")


def _records_keep_accents(record_info_dir: str) -> Optional[bool]:
    """Whether create kept accents in the records (their corpus_info.json; no key: the original's stripping),
    None where no corpus_info.json is found."""
    paths = [path for path in map(save_dir.find_corpus_info, record_info_dir.split(",")) if path]
    return any(CorpusInfo.read(path).value("keep_accents") for path in paths) if paths else None


def _newest_readable(model_dir: str) -> Optional[str]:
    """The newest checkpoint listed in model_dir whose every tensor can be read (a `.data` file deleted or cut
    short is passed over, with one line saying so), or None when none is listed."""
    listed = checkpoints.listed(model_dir)
    for newer, path in enumerate(reversed(listed)):
        problem = checkpoints.unreadable(path)
        if problem is None:
            return path
        older = listed[-newer - 2] if newer + 1 < len(listed) else None
        log.warning("checkpoint %s cannot be read (%s): %s", path, problem,
                    f"resuming from {older}, the one before it" if older else "no older checkpoint to resume from")
    if listed:
        raise ConfigError(f"no checkpoint in --model_dir={model_dir} can be read (the newest, {listed[-1]}: "
                          f"{checkpoints.unreadable(listed[-1])}); restore them, or use a new --model_dir")
    return None


def _start(cfg: TrainConfig, trainer: Trainer) -> tuple[int, ResumedState]:
    """Resumes from model_dir's latest checkpoint, else starts from --init_checkpoint or scratch."""
    latest = _newest_readable(cfg.model_dir)
    resumed = ResumedState()
    if latest:
        restore(latest, trainer.model, trainer.optimizer)
        resumed = restore_state(latest, cfg, trainer)
        log.info("resumed from %s (step %d)", latest, int(trainer.optimizer.step.numpy()))
    elif cfg.init_checkpoint and hf.is_hf_dir(cfg.init_checkpoint):  # a Transformers directory (export_hf's)
        for name, value in hf.load_weights(cfg.init_checkpoint, cfg.model).items():
            trainer.model.weights[name].assign(value)
        log.info("model initialised from the Transformers directory %s", cfg.init_checkpoint)
    elif cfg.init_checkpoint:
        checkpoints.load(cfg.init_checkpoint, trainer.model.weights)
        log.info("model initialised from %s", cfg.init_checkpoint)
    return int(trainer.optimizer.step.numpy()), resumed


def _check_workers_start_alike(strategy: tf.distribute.Strategy, step: int, model_dir: str) -> None:
    """Multi-worker: every worker must start from the step the chief starts from, which it does when it reads
    the chief's checkpoints; a worker that cannot see them would train other weights, silently."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    steps = strategy.gather(strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant([step], tf.int64)), axis=0).numpy()
    if len(set(steps.tolist())) > 1:
        raise ConfigError(f"the workers start from different steps ({', '.join(map(str, steps))}, replica by replica): "
                          f"--model_dir={model_dir} must be one folder that every worker sees (a shared filesystem, "
                          "or gs://)")


def _batch_iterator(strategy: tf.distribute.Strategy, dataset_fn):
    """The replicas' batches of dataset_fn(input context). On one CPU device, a plain iterator of its dataset: the
    same batches, but a distributed dataset's iterator, even over one CPU and even unread, doubled the CPU time of
    every step run by TensorFlow's Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0, TensorFlow's default on CPUs without
    AVX512_VNNI: BENCHMARKS.md)."""
    device = strategy.extended.worker_devices[0]
    if isinstance(strategy, tf.distribute.OneDeviceStrategy) and tf.DeviceSpec.from_string(device).device_type == "CPU":
        return iter(dataset_fn(tf.distribute.InputContext()))
    return iter(strategy.distribute_datasets_from_function(dataset_fn))


def _open_sources(cfg: TrainConfig, trainer: Trainer, step: int, permutation: Optional[PermutationFn],
                  resumed: ResumedState):
    """The sources, each positioned where this run starts in its own stream (and with its memories, when
    resumed from a checkpoint that has them), and the source of every step."""
    names = cfg.sources
    probs = sampling_probs([source_tokens(name, cfg.data) for name in names], cfg.mix_sampling_factor or 0.0)
    schedule = mixing_schedule(probs, cfg.train_steps, cfg.seed)  # all zeros with one source
    done = resumed.positions or np.bincount(schedule[:step], minlength=len(names))
    replicas = trainer.strategy.num_replicas_in_sync
    sources = []
    for i, (name, start) in enumerate(zip(names, done)):
        feed = CacheFeed(resume=resumed.generators[i] if resumed.generators else None)

        def dataset_fn(context, name=name, start=int(start), feed=feed):
            return replica_batches(name, cfg, replicas, start_step=start, permutation=permutation,
                                   input_context=context, feed=feed)
        batches = _batch_iterator(trainer.strategy, dataset_fn)
        saved_mems = resumed.mems[i] if resumed.mems else None
        mems = trainer.distribute_mems(saved_mems) if saved_mems else trainer.initial_mems()
        sources.append(Source(name, batches, mems, position=int(start), feed=feed))
    return sources, schedule, probs


# What TensorBoard's scalar summaries carry: the scalars plugin's name.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")).SerializeToString()


def _report(step: int, losses: list[float], gnorm, lr, tokens: int, seconds: float, writer) -> None:
    """Logs the window of steps that ended at `step`, and writes it as TensorBoard scalars."""
    loss = sum(losses) / len(losses)
    scalars = {"loss": loss, "perplexity": math.exp(min(loss, 700)), "bits_per_token": loss / math.log(2),
               "gnorm": float(gnorm), "learning_rate": float(lr), "tokens_per_second": tokens / seconds}
    log.info("step %d | loss %.4f | pplx %.2f | bpt %.4f | gnorm %.3f | lr %.3e | %.0f tok/s", step,
             *scalars.values())
    with writer.as_default(step=step):
        for key, value in scalars.items():  # tf.summary.scalar, without needing the tensorboard package
            tf.summary.write(key, tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)


def train(cfg: TrainConfig, *, strategy: Optional[tf.distribute.Strategy] = None,
          permutation: Optional[PermutationFn] = None, stop_after: Optional[int] = None) -> TrainResult:
    """Trains until global step cfg.train_steps (resuming from model_dir when it has a checkpoint).

    On SIGTERM or SIGINT the run saves a checkpoint at the current step and returns early (result.stopped_by).
    Before training, every unit's record count is checked against its record_info; a damaged record met
    while training raises DamagedRecordsError naming it (after a checkpoint at the current step).
    permutation: fixes the factorization orders (see input_pipeline.fixed_permutation).
    stop_after: end after that many steps of this run without a final checkpoint, as if
      the job were killed (to test resuming).
    """
    # Full float32 matmuls on GPUs unless asked (TF32 keeps 10 bits of mantissa: ~1e-3 off the original).
    with stopping.SignalNote() as stop, sum_in_graph_order(), tensor_float_32(cfg.tf32):
        return _train(cfg, stop, strategy, permutation, stop_after)


def _train(cfg: TrainConfig, stop: stopping.SignalNote, strategy: Optional[tf.distribute.Strategy],
           permutation: Optional[PermutationFn], stop_after: Optional[int]) -> TrainResult:
    check_records(cfg)
    strategy = strategy or make_strategy(cfg.strategy, cfg.devices, cfg.tpu)
    chief = strategy.extended.should_checkpoint  # multi-worker: only the chief writes
    _check_model_dir(cfg, chief)
    trainer = Trainer(cfg, strategy)
    step, resumed = _start(cfg, trainer)
    first_step = step
    _check_workers_start_alike(strategy, step, cfg.model_dir)
    log.info("%d replica(s) of %d rows; %s parameters; %s; XLA %s", strategy.num_replicas_in_sync,
             trainer.bsz_per_replica, f"{sum(int(np.prod(v.shape)) for v in trainer.variables):,}",
             "bfloat16" if cfg.run.use_bfloat16 else "float32", "on" if trainer.uses_xla else "off")
    sources, schedule, probs = _open_sources(cfg, trainer, step, permutation, resumed)
    writer = tf.summary.create_file_writer(cfg.model_dir) if chief else tf.summary.create_noop_writer()

    saved, saved_step = None, first_step  # this run's last checkpoint (the one it resumed from is at first_step)
    saved_losses: dict[str, float] = {}  # this run's checkpoints: the mean loss of the steps before each

    def check_window():
        """The steps since the last report, read (the device waits for them) and checked for divergence."""
        nonlocal window
        window = [float(value) for value in window]
        _check_losses(window, step - len(window), gnorm, lr, cfg)

    def checkpoint():
        nonlocal saved, saved_step
        check_window()  # never a checkpoint of diverged weights
        recent = (losses + window)[-cfg.iterations:]
        loss = sum(recent) / len(recent) if recent else None
        _say_if_a_better_checkpoint_goes(cfg, step, loss, saved_losses)
        saved = save(cfg.model_dir, trainer.model, trainer.optimizer, cfg.max_save, run_state(cfg, trainer, sources))
        saved_step = step
        if loss is not None:
            saved_losses[os.path.basename(saved)] = loss
        log.info("saved %s", saved)

    losses, window, tic = [], [], time.time()
    gnorm = lr = None
    damage = None
    end = cfg.train_steps if stop_after is None else min(cfg.train_steps, step + stop_after)
    while step < end and stop.signum is None:
        source = sources[schedule[step]]
        try:
            loss, gnorm, lr, source.mems = trainer.train_step(next(source.batches), source.mems)
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError):
            log.info("a read failed at step %d; locating the damaged record in %s", step, source.name)
            damage = find_damage(source.name, cfg)
            if damage is None:
                raise  # not the records: a bug worth its traceback
            break
        source.position += 1
        source.steps += 1
        step += 1
        window.append(loss)  # a tensor: read at the next report, so the device need not wait
        if step % cfg.iterations == 0 or step == cfg.train_steps:
            check_window()
            _report(step, window, gnorm, lr, len(window) * cfg.data.bsz_per_host * cfg.data.seq_len,
                    time.time() - tic, writer)
            if len(sources) > 1:
                log.info("%s", mixture_line([source.steps for source in sources], probs, cfg.sources))
            losses.extend(window)
            window, tic = [], time.time()
        if chief and (cfg.save_steps and step % cfg.save_steps == 0 or step == cfg.train_steps):
            checkpoint()
    if (stop.signum is not None or damage is not None) and chief and step != saved_step:
        checkpoint()  # what this run did since its last checkpoint is kept
    if step == first_step and stop.signum is None and damage is None:
        log.info("nothing to do: %s is at step %d, train_steps is %d", cfg.model_dir, step, cfg.train_steps)
    writer.flush()
    if damage is not None:
        kept = f"; {saved} holds the steps before it" if saved else ""
        raise DamagedRecordsError(f"{damage} (training stopped at step {step}{kept})")
    return TrainResult(step, first_step, losses + [float(value) for value in window], trainer, sources,
                       stop.signum, saved)
