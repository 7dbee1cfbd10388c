"""The PyTorch trainer's plan: what a step costs (costs.py's FLOPs and tokens), a memory model of
pretrain_torch/modeling.XLNet, the refusal of a run that cannot fit before its model is built, and the dry run.

What the loop (training.py) and the command (train_torch.py) call:

    announce(cfg, replicas, device) -> costs.StepCost   the plan line; DoesNotFitError (one line, the smallest change
                                                       that fits: costs.fitting_change) before the model is built
    dry_run(cfg, cost, start_step, started, step, evaluate, save) -> DryRun   after the run's checks and the plan:
                                                       timed steps, one evaluation and one checkpoint timed, the
                                                       projection (DryRun.lines: what --dry_run prints)
    memory_plan(model, shape)                          bytes one rank holds at its peak (costs.MemoryPlan)
    allocator_check(model, shape, step, device)        the plan against torch.cuda.max_memory_allocated, a row of
                                                       benchmarks/gpu_torch.py's table
    saved_activation_bytes(module, features, mems)     what autograd keeps of a forward pass, measured on any device

The memory model is costs.memory_plan's (counted tensor by tensor from the TF model, which computes the same
tensors), with what this module holds otherwise: the memories in float32 (the module keeps them so under
autocast), one float32 gradient per weight however many micro-batches (backward() adds into .grad; DDP's buckets
another one with several ranks), the query stream's position scores before their row shift (the TF model
shifts all positions' and then gathers), and each stream's copy of the position heads per row (torch.matmul
broadcasts them over the rows by copying them). On the CPU, where no allocator keeps a peak, saved_activation_bytes
checks the activations' part (tests/test_torch_run.py); on a GPU allocator_check checks the whole.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Optional

import torch

from xlnet_data.pretrain import costs
from xlnet_data.pretrain.config import TrainConfig, XLNetConfig
from xlnet_data.pretrain.held_out import evaluations

log = logging.getLogger("xlnet_data")


def _extra_row_bytes(model: XLNetConfig, shape: costs.StepShape, c: int) -> int:
    """Bytes per row and layer that this module keeps for the backward pass and the TF model does not: the query
    stream's position scores before their row shift, and each stream's copy of the position heads (matmul
    broadcasts them over the rows of a direction by copying them, once there are several)."""
    rlen = 2 * shape.seq_len + shape.mem_len
    rows_per_direction = shape.micro_rows // (2 if shape.bi_data else 1)
    copies = 2 * c * model.n_head * model.d_head * rlen if rows_per_direction > 1 else 0
    return c * model.n_head * shape.predicted * rlen + copies


def memory_plan(model: XLNetConfig, shape: costs.StepShape) -> costs.MemoryPlan:
    """The peak bytes of one rank of this module's run (see the module's docstring)."""
    plan = costs.memory_plan(model, shape)
    c = 2 if shape.bfloat16 else 4
    params = costs.param_count(model)
    memories = 2 * model.n_layer * 4 * shape.mem_len * shape.bsz_per_replica * model.d_model
    layers = 1 if shape.recompute else model.n_layer  # whose activations are held at once
    return dataclasses.replace(
        plan, gradients=params * (8 if shape.replicas > 1 else 4), memories=memories,
        activations=plan.activations + shape.micro_rows * layers * _extra_row_bytes(model, shape, c))


def saved_activations_plan(model: XLNetConfig, shape: costs.StepShape) -> int:
    """The part of memory_plan's activations that autograd keeps after a forward pass of one micro-batch (what
    saved_activation_bytes measures): the backward workspace is not yet allocated then, nor, with recomputation,
    the layer recomputed in the backward pass."""
    c = 2 if shape.bfloat16 else 4
    _, layer, workspace = costs._row_activations(model, shape, c)
    later = workspace + (layer + _extra_row_bytes(model, shape, c) if shape.recompute else 0)
    return memory_plan(model, shape).activations - shape.micro_rows * later


def saved_activation_bytes(module: torch.nn.Module, features: dict, mems) -> tuple[int, object]:
    """(bytes of the tensors autograd keeps for the backward pass of module(features, mems), each storage once,
    the weights not counted; the output). Works on any device: the CPU check of the memory model."""
    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = module(features, mems)
    return sum(kept.values()), out


@dataclasses.dataclass(frozen=True)
class AllocatorCheck:
    """The plan of one step against the allocator's peak, on a GPU."""

    planned: int  # memory_plan(...).total
    measured: int  # torch.cuda.max_memory_allocated over the step

    @property
    def ratio(self) -> float:
        return self.measured / self.planned

    def row(self) -> str:
        return f"planned {costs.gb(self.planned)}, measured {costs.gb(self.measured)} ({self.ratio:.2f}x)"


def allocator_check(model: XLNetConfig, shape: costs.StepShape, step: Callable[[], None],
                    device: torch.device) -> AllocatorCheck:
    """Runs `step` (a training step of `shape` on `device`, its model, optimizer and batch already there, a first
    step already taken so that Adam's slots exist) with the allocator's peak reset, and returns the peak against
    the plan: what benchmarks/gpu_torch.py prints for each shape it measures."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return AllocatorCheck(memory_plan(model, shape).total, torch.cuda.max_memory_allocated(device))


def device_memory(device: torch.device) -> Optional[int]:
    """A GPU's memory in bytes; None on other devices (no check unless --device_memory)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def device_name(device: torch.device) -> str:
    """The GPU's name as the driver gives it ("NVIDIA H100 80GB HBM3"), else the device's ("cpu")."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def step_cost(cfg: TrainConfig, replicas: int, device: torch.device) -> costs.StepCost:
    """FLOPs, tokens and rows of a step of `replicas` ranks, and their peak for the MFU: --peak_tflops, else the
    known GPU's (costs.PEAK_TFLOPS), else none (no MFU on CPUs)."""
    shape = costs.step_shape(cfg, replicas)
    peak = cfg.peak_tflops
    if peak is None and device.type == "cuda":
        peak = costs.peak_tflops(device_name(device), cfg.run.use_bfloat16)
    return costs.StepCost(costs.train_flops(cfg.model, shape), costs.tokens_per_step(shape),
                          shape.bsz_per_replica * replicas, None if peak is None else peak * 1e12 * replicas)


def announce(cfg: TrainConfig, replicas: int, device: torch.device) -> costs.StepCost:
    """Logs the plan in one line; DoesNotFitError (before the model is built) when its memory is above the
    device's: --device_memory's, else a GPU's (--device_memory=off: no check)."""
    shape = costs.step_shape(cfg, replicas)
    cost = step_cost(cfg, replicas, device)
    plan = memory_plan(cfg.model, shape)
    available = device_memory(device) if cfg.device_memory is None else cfg.device_memory  # 0: --device_memory=off
    log.info("plan: %s", costs.plan_line(cfg.model, shape, cost, plan, available))
    if available:
        where = "--device_memory" if cfg.device_memory else device_name(device)
        costs.check_fits(cfg.model, shape, available, where, memory_plan)
    return cost


def checkpoints_between(start: int, end: int, save_steps: Optional[int]) -> int:
    """Checkpoints of a run from step `start` to `end`: every save_steps steps and at the last (as held-out
    evaluations are counted)."""
    return evaluations(start, end, save_steps or end)


@dataclasses.dataclass(frozen=True)
class DryRun:
    cost: costs.StepCost
    start_step: int  # where the run would start (model_dir's latest checkpoint's step, 0 without one)
    train_steps: int
    first_step_seconds: float  # from the process's start to the end of the first step
    timed_steps: int
    step_seconds: float  # the mean of the timed steps after the first
    evaluations: int  # the held-out evaluations the run would make
    evaluation_seconds: float  # one of them, timed (0 without held-out records)
    checkpoints: int
    checkpoint_seconds: float  # one, timed (written to a temporary folder, then deleted)

    @property
    def projected_seconds(self) -> float:
        left = max(self.train_steps - self.start_step, 0)
        steps = self.first_step_seconds + (left - 1) * self.step_seconds if left else 0.0
        return steps + self.evaluations * self.evaluation_seconds + self.checkpoints * self.checkpoint_seconds

    def lines(self, model_dir: str) -> list[str]:
        left = max(self.train_steps - self.start_step, 0)
        return [
            f"dry run: the first step {self.first_step_seconds:.1f} s after start (start-up, first step), then "
            f"{self.step_seconds:.3g} s per step (mean of {self.timed_steps}), "
            f"{self.cost.tokens / self.step_seconds:,.0f} tok/s, {self.cost.flops / self.step_seconds / 1e12:.3g} TFLOP/s",
            f"projected: {left:,} steps (from step {self.start_step} to --train_steps={self.train_steps}) in "
            f"{costs.duration(self.projected_seconds)} ({self.projected_seconds:,.0f} s), {left * self.cost.tokens:,} "
            f"tokens; counted in it: {self.evaluations} held-out evaluation(s) of {self.evaluation_seconds:.3g} s and "
            f"{self.checkpoints} checkpoint(s) of {self.checkpoint_seconds:.3g} s",
            f"dry run: nothing written to {model_dir}"]


def dry_run(cfg: TrainConfig, cost: costs.StepCost, start_step: int, started: float, step: Callable[[int], object],
            evaluate: Optional[Callable[[], object]], save: Callable[[str], None], *, steps: int = 5,
            seconds: float = 20.0) -> DryRun:
    """After the caller's checks and announce() (the real run's, in its order; `cost` is announce's): the
    first step (`step(0)`, which returns once the device has finished it), `steps` more (more while they have taken
    under `seconds`, up to 50 x `steps`), one evaluation (`evaluate`; None without held-out records) and one
    checkpoint (`save` into a temporary folder, deleted after) timed; the run from `start_step` to cfg.train_steps
    projected with its evaluations and checkpoints. `started`: when the process started (time.time()'s clock)."""
    step(0)
    first = time.time() - started
    tic, timed = time.time(), 0
    while timed < steps or (time.time() - tic < seconds and timed < 50 * steps):
        timed += 1
        step(timed)
    step_seconds = (time.time() - tic) / timed
    evaluation_seconds = 0.0
    if evaluate is not None:
        tic = time.time()
        evaluate()
        evaluation_seconds = time.time() - tic
    folder = tempfile.mkdtemp(prefix="xlnet-dry-run-")
    try:
        tic = time.time()
        save(folder)
        checkpoint_seconds = time.time() - tic
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    end = cfg.train_steps
    return DryRun(cost, start_step, end, first, timed, step_seconds,
                  evaluations(start_step, end, cfg.eval_every if evaluate else 0), evaluation_seconds,
                  checkpoints_between(start_step, end, cfg.save_steps), checkpoint_seconds)
