"""A run's costs (costs.py) on the devices it has: the plan line at start, the refusal of a run that cannot fit
its device's memory (before any step), and the device's peak FLOP/s for the MFU of the log line."""

from __future__ import annotations

import logging
from typing import Optional

import tensorflow as tf

from xlnet_data.pretrain import costs
from xlnet_data.pretrain.config import TrainConfig

log = logging.getLogger("xlnet_data")


def replica_device(strategy: tf.distribute.Strategy) -> tf.DeviceSpec:
    return tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])


def device_memory(strategy: tf.distribute.Strategy) -> Optional[int]:
    """Bytes TensorFlow may allocate on one replica's GPU (its allocator's limit); None on other devices."""
    spec = replica_device(strategy)
    if spec.device_type != "GPU":
        return None
    from tensorflow.python.client import device_lib  # the one place TensorFlow reports a GPU's memory limit

    for device in device_lib.list_local_devices():
        found = tf.DeviceSpec.from_string(device.name)
        if found.device_type == "GPU" and (found.device_index or 0) == (spec.device_index or 0):
            return int(device.memory_limit)
    return None


def device_name(strategy: tf.distribute.Strategy) -> str:
    """The GPU's name as the driver gives it ("NVIDIA H100 80GB HBM3"), else the device's ("/cpu:0")."""
    spec = replica_device(strategy)
    if spec.device_type == "GPU":
        gpus = tf.config.list_physical_devices("GPU")
        index = spec.device_index or 0
        if index < len(gpus):
            return tf.config.experimental.get_device_details(gpus[index]).get("device_name", f"GPU {index}")
    return f"/{spec.device_type.lower()}:{spec.device_index or 0}"


def step_cost(cfg: TrainConfig, strategy: tf.distribute.Strategy) -> costs.StepCost:
    """FLOPs, tokens and rows of a step of this run on `strategy`, and the replicas' peak (for the MFU): the
    --peak_tflops, else the known GPU's (costs.PEAK_TFLOPS), else none."""
    replicas = strategy.num_replicas_in_sync
    shape = costs.step_shape(cfg, replicas)
    peak = cfg.peak_tflops
    if peak is None and replica_device(strategy).device_type == "GPU":
        peak = costs.peak_tflops(device_name(strategy), cfg.run.use_bfloat16)
    return costs.StepCost(costs.train_flops(cfg.model, shape), costs.tokens_per_step(shape),
                          shape.bsz_per_replica * replicas, None if peak is None else peak * 1e12 * replicas)


def announce(cfg: TrainConfig, strategy: tf.distribute.Strategy) -> costs.StepCost:
    """Logs the plan in one line; DoesNotFitError (before the model is built) when its memory is above the
    device's: --device_memory's, else a GPU's (--device_memory=off: no check)."""
    replicas = strategy.num_replicas_in_sync
    shape = costs.step_shape(cfg, replicas)
    cost = step_cost(cfg, strategy)
    plan = costs.memory_plan(cfg.model, shape)
    available = device_memory(strategy) if cfg.device_memory is None else cfg.device_memory  # 0: --device_memory=off
    log.info("plan: %s", costs.plan_line(cfg.model, shape, cost, plan, available))
    if available:
        where = ("--device_memory" if cfg.device_memory else device_name(strategy))
        costs.check_fits(cfg.model, shape, available, where)
    return cost
