"""Where a run's steps execute, and the process settings they run under.

    make_strategy          the tf.distribute strategy of --strategy/--devices/--tpu (multi_worker: TF_CONFIG's cluster)
    batch_iterator         the replicas' batches of a dataset function under a strategy
    uses_xla               whether each replica's pass is compiled with XLA (--jit_compile)
    sum_in_graph_order     a scoped Grappler setting that makes a CPU step repeat bit for bit
    tensor_float_32        a scoped TF32 setting (--tf32)
    LOST_WORKER_ERRORS, lost_worker_message, check_workers_start_alike    a multi-worker run's failures, in one line
    meet_at_the_end        a multi-worker run's workers leave together
"""

from __future__ import annotations

import contextlib
import re

import tensorflow as tf

from xlnet_data.common.errors import ConfigError


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


def check_workers_start_alike(strategy: tf.distribute.Strategy, step: int, model_dir: str) -> None:
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


def meet_at_the_end(strategy: tf.distribute.Strategy) -> None:
    """Multi-worker: returns once every worker has finished its steps (and the chief its checkpoint). A collective
    pulls each peer's part from that peer: a worker that left as soon as it had the others' parts of the last step
    closed its socket while the chief still pulled its own ('lost worker 1 of the cluster (Socket closed)' after a
    complete run, seen in CI). Here every worker is done training, so a peer gone during this last exchange only
    means it left first."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    try:
        strategy.gather(strategy.experimental_distribute_values_from_function(
            lambda _: tf.constant([0], tf.int64)), axis=0).numpy()
    except LOST_WORKER_ERRORS:
        pass


def batch_iterator(strategy: tf.distribute.Strategy, dataset_fn):
    """The replicas' batches of dataset_fn(input context). On one CPU device, a plain iterator of its dataset: the
    same batches, but a distributed dataset's iterator, even over one CPU and even unread, doubled the CPU time of
    every step run by TensorFlow's Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0, TensorFlow's default on CPUs without
    AVX512_VNNI: BENCHMARKS.md)."""
    return iter(batch_source(strategy, dataset_fn))


def batch_source(strategy: tf.distribute.Strategy, dataset_fn):
    """What batch_iterator iterates: each iter() of it starts its batches again (the held-out evaluation's)."""
    device = strategy.extended.worker_devices[0]
    if isinstance(strategy, tf.distribute.OneDeviceStrategy) and tf.DeviceSpec.from_string(device).device_type == "CPU":
        return dataset_fn(tf.distribute.InputContext())
    return strategy.distribute_datasets_from_function(dataset_fn)
