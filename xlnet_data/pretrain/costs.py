"""What a training step costs, from the model's shape and the run's settings alone (no TensorFlow, so a plan is
made, and a run that cannot fit refused, before TensorFlow loads a byte): the parameters, the model FLOPs,
the tokens and an estimate of the peak memory of one replica. planning.py applies it to a run.

FLOPs (`train_flops`) follow the usual "model FLOPs" convention (PaLM's MFU): 2 per multiply-add of every
matmul of the forward pass as the model computes it, the backward pass twice that, so a step is 3x the forward
pass. Counted: both streams' projections (q, k, v over memory + sequence, o), the content stream's attention
at every position and the query stream's at the predicted ones, each against the keys (memory + sequence) and
the relative positions (2 x seq_len + mem_len), the segment term, the feed-forward layers, the relative
positions' projection (once per micro-batch, per direction) and the LM head at the predicted positions.
Not counted: element-wise ops, softmaxes, layer norms, gathers, and recomputation (which costs time, not
model FLOPs: MFU stays comparable with and without it).

Memory (`memory_plan`): what one replica holds at its peak, which is at the turn from the forward to the
backward pass: the weights (float32 even under bfloat16, plus their bfloat16 copies then), the gradients,
Adam's two slots, the activations the backward pass reads (counted tensor by tensor from modeling.py) of one
micro-batch, one layer's backward workspace, the memories in and out for all of the replica's rows, the
features, the LM head's softmax. With recomputation only each layer's inputs are kept, plus one layer's
activations while it is recomputed. benchmarks/bench_memory.py measures it against real steps.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Optional

from xlnet_data.common.errors import ConfigError, UserError
from xlnet_data.pretrain.config import TrainConfig, XLNetConfig

GIB = 1 << 30

# Dense (no sparsity) peak TFLOP/s per GPU from NVIDIA's datasheets: (bfloat16 tensor cores, float32 without
# TF32). V100 and T4 have no bfloat16 units: theirs is the float16 tensor-core peak, which TensorFlow's
# bfloat16 does not reach there. Matched against the device's name, longest key first.
PEAK_TFLOPS = {
    "H200": (989.4, 66.9),       # H200 SXM datasheet (2024): BF16 1,979 with sparsity; FP32 67
    "H100 PCIe": (756.0, 51.2),  # H100 PCIe datasheet: BF16 1,513 with sparsity; FP32 51
    "H100": (989.4, 66.9),       # H100 SXM5 datasheet: BF16 1,979 with sparsity; FP32 67
    "A100": (312.0, 19.5),       # A100 40 GB and 80 GB datasheet: BF16 312; FP32 19.5
    "L40S": (362.0, 91.6),       # L40S datasheet: BF16 733 with sparsity; FP32 91.6
    "A10": (125.0, 31.2),        # A10 datasheet: BF16 125 (250 with sparsity); FP32 31.2
    "L4": (121.0, 30.3),         # L4 datasheet: BF16 242 with sparsity; FP32 30.3
    "V100": (125.0, 15.7),       # V100 SXM2 datasheet: FP16 tensor 125; FP32 15.7
    "T4": (65.0, 8.1),           # T4 datasheet: FP16 tensor 65; FP32 8.1
}


class DoesNotFitError(UserError):
    """The plan's peak memory per replica is above the device's: the run stops before its first step."""


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What a step is made of besides the model: the rows, their lengths, and how they are computed.

    bsz_per_replica: the rows one replica gets per step (with bi_data, forward and backward halves);
    micro_batches: K of --gradient_accumulation_steps, each replica's rows split in K; num_predict: the query
    stream's positions per row (None: every position).
    """

    seq_len: int
    reuse_len: int
    mem_len: int
    bsz_per_replica: int
    num_predict: Optional[int] = None
    bi_data: bool = False
    replicas: int = 1
    micro_batches: int = 1
    recompute: bool = False
    bfloat16: bool = False
    dropout: bool = False  # dropout > 0 (each dropped tensor keeps its mask and its output)
    dropatt: bool = False

    @property
    def micro_rows(self) -> int:
        return self.bsz_per_replica // self.micro_batches

    @property
    def predicted(self) -> int:
        return self.num_predict or self.seq_len


def step_shape(cfg: TrainConfig, replicas: int) -> StepShape:
    """The shape of one of `replicas` replicas' steps of the run `cfg`."""
    return StepShape(
        seq_len=cfg.data.seq_len, reuse_len=cfg.data.reuse_len, mem_len=cfg.run.mem_len,
        bsz_per_replica=cfg.data.bsz_per_host // replicas, num_predict=cfg.data.num_predict, bi_data=cfg.data.bi_data,
        replicas=replicas, micro_batches=cfg.gradient_accumulation_steps, recompute=cfg.recompute,
        bfloat16=cfg.run.use_bfloat16, dropout=cfg.run.dropout > 0, dropatt=cfg.run.dropatt > 0)


def param_count(model: XLNetConfig) -> int:
    """The model's trainable numbers (modeling.variable_shapes')."""
    d, hd = model.d_model, model.n_head * model.d_head
    biases = 3 * hd * (model.n_layer if model.untie_r else 1)  # r_w, r_r, r_s
    per_layer = 5 * d * hd + 2 * d + 2 * d * model.d_inner + model.d_inner + d + 2 * d  # attn, its LN, ff, its LN
    return model.n_token * d + d + biases + model.n_layer * 2 * hd + model.n_layer * per_layer + model.n_token


def forward_flops_per_row(model: XLNetConfig, shape: StepShape) -> float:
    """Matmul FLOPs of one row's forward pass, without the relative positions' projection (per micro-batch)."""
    d, hd, inner = model.d_model, model.n_head * model.d_head, model.d_inner
    seq, pred, klen = shape.seq_len, shape.predicted, shape.mem_len + shape.seq_len
    rlen = klen + seq  # relative distances klen .. -seq_len + 1

    def stream(rows, kv):  # q and o projections (+ k and v over klen for the content stream), attention, FFN
        projections = 2 * rows * d * hd + (2 * klen * d * hd if kv else 0)
        attention = rows * hd * (klen + rlen + klen) + rows * hd * 2  # scores vs keys, vs positions; values; segment
        return 2 * (projections + attention + 2 * rows * d * inner)

    return model.n_layer * (stream(seq, True) + stream(pred, False)) + 2 * pred * d * model.n_token


def train_flops(model: XLNetConfig, shape: StepShape) -> float:
    """Model FLOPs of one training step of all replicas (3x the forward pass, see the module's docstring)."""
    rows = shape.bsz_per_replica * shape.replicas
    rlen = 2 * shape.seq_len + shape.mem_len
    directions = 2 if shape.bi_data else 1
    positions = 2 * rlen * directions * model.d_model * model.n_head * model.d_head * model.n_layer
    return 3 * (rows * forward_flops_per_row(model, shape) + shape.replicas * shape.micro_batches * positions)


def tokens_per_step(shape: StepShape) -> int:
    return shape.bsz_per_replica * shape.replicas * shape.seq_len


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one step of a run does, for the log line's rates."""

    flops: float  # model FLOPs of a step, all replicas
    tokens: int
    sequences: int
    peak_flops: Optional[float]  # all replicas' dense peak FLOP/s; None where unknown (no MFU)

    def rates(self, steps: int, seconds: float, steps_left: int) -> dict[str, float]:
        """Per second over `steps` steps that took `seconds`: sequences, model TFLOP/s, the MFU (where the peak is
        known), and the seconds the `steps_left` would take at this pace."""
        rates = {"sequences_per_second": steps * self.sequences / seconds,
                 "model_tflops_per_second": steps * self.flops / seconds / 1e12}
        if self.peak_flops:
            rates["mfu"] = steps * self.flops / seconds / self.peak_flops
        rates["seconds_left"] = steps_left * seconds / steps
        return rates


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes one replica holds at its peak, by what holds them."""

    weights: int  # float32 (and their bfloat16 copies under bfloat16)
    gradients: int  # float32 (with K > 1 also the running sum)
    adam: int  # the two slots, float32
    activations: int  # what one micro-batch's backward pass reads, and one layer's backward workspace
    memories: int  # mem_len of every layer, in and out, for all of the replica's rows
    inputs: int  # the features of the step and the next one (prefetched)

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))

    def line(self) -> str:
        parts = ", ".join(f"{name} {gb(value)}" for name, value in dataclasses.asdict(self).items())
        return f"{gb(self.total)} per replica ({parts})"


def _layer_activations(model: XLNetConfig, shape: StepShape, rows: int, keys: int, c: int) -> int:
    """Bytes per row of one layer's tensors the backward pass reads, for one stream of `rows` positions
    attending to `keys` (modeling.XLNet.layer, _rel_attn_core, _post_attention, _ffn; c: compute dtype size)."""
    d, hd, n, inner = model.d_model, model.n_head * model.d_head, model.n_head, model.d_inner
    scores = n * rows * keys
    total = 4 * scores + (c * scores if c != 4 else 0)  # softmax in float32 (+ its cast back)
    total += c * 4 * rows * hd  # q + each of the 3 biases, the heads before the o projection
    total += 2 * (8 * rows * d + c * rows * d)  # 2 layer norms: float32 input and scale, the output
    total += c * (5 if model.ff_activation == "gelu" else 1) * rows * inner  # gelu: x, x^2, tanh, cdf, out
    if shape.dropatt:
        total += 2 * c * scores  # the mask and the dropped probabilities
    if shape.dropout:
        total += 2 * c * (2 * rows * d + rows * inner)
    return total


def _row_activations(model: XLNetConfig, shape: StepShape, c: int) -> tuple[int, int, int]:
    """Bytes per row: (everything the backward pass reads, one layer of it, one layer's backward workspace)."""
    d, hd, n = model.d_model, model.n_head * model.d_head, model.n_head
    seq, pred, klen = shape.seq_len, shape.predicted, shape.mem_len + shape.seq_len
    content = _layer_activations(model, shape, seq, klen, c) + c * (klen * d + 2 * klen * hd)  # cat, k and v heads
    query = _layer_activations(model, shape, pred, klen, c) + (4 * n + c) * pred * klen  # shift indices, segment rows
    layer = content + query
    shared = c * seq * klen + c * (seq + pred) * d  # the segment matrix, the embeddings
    head = 4 * pred * model.n_token + c * pred * d  # the LM head's softmax, its input
    # Backward of a layer's attention: the gradients of its probabilities, scores and position scores.
    workspace = 4 * n * (seq + pred) * (3 * klen + seq) + head
    if shape.recompute:  # each layer's inputs kept (the memory is counted apart), one layer recomputed
        return shared + head + model.n_layer * c * (seq + pred) * d + layer, layer, workspace
    return shared + head + model.n_layer * layer, layer, workspace


def memory_plan(model: XLNetConfig, shape: StepShape) -> MemoryPlan:
    """The peak bytes of one replica (see the module's docstring)."""
    c = 2 if shape.bfloat16 else 4
    params = param_count(model)
    d, hd = model.d_model, model.n_head * model.d_head
    rlen = 2 * shape.seq_len + shape.mem_len
    directions = 2 if shape.bi_data else 1
    saved, _, workspace = _row_activations(model, shape, c)
    positions = model.n_layer * c * rlen * directions * hd + 4 * rlen * directions * d  # r heads, sinusoids
    activations = shape.micro_rows * (saved + workspace) + positions
    memories = 2 * model.n_layer * c * shape.mem_len * shape.bsz_per_replica * d
    seq, pred = shape.seq_len, shape.predicted
    features = 4 * (seq * seq + pred * seq + 3 * seq + 3 * pred)  # perm_mask, target_mapping, the rest
    return MemoryPlan(
        weights=params * (4 + (2 if shape.bfloat16 else 0)), gradients=params * (4 if shape.micro_batches == 1 else 8),
        adam=8 * params, activations=activations, memories=memories,
        inputs=2 * shape.bsz_per_replica * features)


PlanFn = Callable[[XLNetConfig, StepShape], MemoryPlan]


def plan_line(model: XLNetConfig, shape: StepShape, cost: StepCost, plan: MemoryPlan, available: Optional[int]) -> str:
    """The plan a run logs at its start (without "plan: "): parameters, FLOPs, tokens, rows, peak memory (of the
    device's `available` bytes where known)."""
    return (f"{param_count(model):,} parameters; {cost.flops / 1e12:.4g} TFLOP per step (model FLOPs); {cost.tokens:,} "
            f"tokens per step ({shape.replicas} x {shape.bsz_per_replica} rows of {shape.seq_len}, {shape.micro_batches} "
            f"micro-batch(es){', recomputed' if shape.recompute else ''}); peak memory {plan.line()}"
            f"{f' of {gb(available)}' if available else ''}")


def gb(n: float) -> str:
    """Bytes in GB (GiB), or MB below one."""
    return f"{n / GIB:.2f} GB" if n >= GIB else f"{n / (1 << 20):.1f} MB"


def parse_bytes(text: str) -> int:
    """'16GB', '16 GiB', '16G', '512MB', '1.5TB' or a number of bytes; GB = GiB = 2**30, as GPUs are sold and
    nvidia-smi counts. 'off': 0, no check. ConfigError for anything else, 0 and negative sizes included."""
    if (text or "").strip().lower() == "off":
        return 0
    found = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*(([KMGT])(i?B)?|B)?\s*", text or "", re.IGNORECASE)
    if not found:
        raise ConfigError(f"--device_memory={text!r}: give a size such as 16GB, 80GiB or 512MB (or off: no check)")
    unit = (found[3] or "").upper()
    size = int(float(found[1]) * (1 << (10 * " KMGT".index(unit))) if unit else float(found[1]))
    if size < 1:  # not a quiet `off`: a size of nothing is a slip
        raise ConfigError(f"--device_memory={text!r}: give a size above 0 bytes, or off to plan for no device memory "
                          "(no check)")
    return size


def fitting_change(model: XLNetConfig, shape: StepShape, device_bytes: int,
                   plan: PlanFn = memory_plan) -> Optional[str]:
    """The smallest change of the flags that brings `plan` (train_gpu's memory_plan, or another framework's
    model of its module) under device_bytes: a K alone (the smallest), then --recompute, then --use_bfloat16
    (other numbers), then their combinations; None when nothing fits."""
    unit = 2 if shape.bi_data else 1  # a micro-batch keeps its forward and backward rows together
    ks = [k for k in range(1, shape.bsz_per_replica // unit + 1)
          if shape.bsz_per_replica % (k * unit) == 0 and k >= shape.micro_batches]
    tries = []
    for recompute in sorted({shape.recompute, True}):
        for bfloat16 in sorted({shape.bfloat16, True}):
            tries += [(k, recompute, bfloat16) for k in ks]
    # Fewest flags changed first, then the smallest K.
    tries.sort(key=lambda t: ((t[0] != shape.micro_batches) + (t[1] != shape.recompute)
                              + (t[2] != shape.bfloat16), t[2], t[1], t[0]))
    for k, recompute, bfloat16 in tries:
        changed = dataclasses.replace(shape, micro_batches=k, recompute=recompute, bfloat16=bfloat16)
        estimate = plan(model, changed).total
        if estimate <= device_bytes:
            flags = ([f"--gradient_accumulation_steps={k}"] if k != shape.micro_batches else []) + \
                    (["--recompute"] if recompute != shape.recompute else []) + \
                    (["--use_bfloat16"] if bfloat16 != shape.bfloat16 else [])
            return f"{' '.join(flags)} (estimated {gb(estimate)})"
    return None


def check_fits(model: XLNetConfig, shape: StepShape, device_bytes: int, device: str,
               plan: PlanFn = memory_plan) -> None:
    """DoesNotFitError, in one line with the estimate, the device's memory and the smallest change that fits,
    when `plan` (see fitting_change) is above device_bytes."""
    needed = plan(model, shape)
    if needed.total <= device_bytes:
        return
    change = fitting_change(model, shape, device_bytes, plan)
    fixed = needed.weights + needed.gradients + needed.adam
    fix = (f"it fits with {change}" if change else
           f"nothing fits: weights, gradients and Adam's slots alone take {gb(fixed)}; use a device with more memory")
    raise DoesNotFitError(f"this run needs an estimated {gb(needed.total)} per replica, {device} has "
                          f"{gb(device_bytes)}: {fix}")


def peak_tflops(device_name: str, bfloat16: bool) -> Optional[float]:
    """The dense peak TFLOP/s of a GPU known by name (PEAK_TFLOPS), None for others."""
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_TFLOPS[key][0 if bfloat16 else 1]
    return None


def duration(seconds: float) -> str:
    """'3d04h', '2h05m', '4m07s', '12s'."""
    seconds = max(0, int(math.ceil(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
