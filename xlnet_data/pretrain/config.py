"""What a pretraining run is made of, as frozen, validated dataclasses; no TensorFlow, so that train_gpu reports a
wrong flag (and the Python API builds a config) before TensorFlow loads.

    XLNetConfig    what a checkpoint fixes: the model's shape (the original's xlnet_config.json)
    RunConfig      what may change from run to run: memory, attention, dropout, initialisation
    InputConfig    what the records were made with, and how they are cut into training features
    TrainConfig    a whole training run: the three above, the optimizer's settings, steps, checkpoints, devices
    ExportConfig   what export_hf writes: a checkpoint, its model and run settings, the tokenizer

Their defaults are the original train_gpu.py flags' (train_gpu and export_hf take their flag defaults from here).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Optional

from xlnet_data.common import fileio
from xlnet_data.common.config_types import check_field_types
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import save_dir

ACTIVATIONS = ("relu", "gelu")
INITS = ("normal", "uniform")
DECAY_METHODS = ("poly", "cos")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
JIT_COMPILE = ("auto", "on", "off")
ATTENTIONS = ("eager", "flex")  # train_torch's attention: matmuls and a softmax, or FlexAttention's fused kernel


def check_attention(attention: str, dropatt: float) -> None:
    """ConfigError unless `attention` is one of ATTENTIONS and, for flex, dropatt is 0 (FlexAttention has no
    dropout of the attention weights)."""
    if attention not in ATTENTIONS:
        raise ConfigError(f"--attention={attention} must be one of {', '.join(ATTENTIONS)}")
    if attention == "flex" and dropatt:
        raise ConfigError(f"--attention=flex has no attention dropout (FlexAttention has none): give --dropatt=0 "
                          f"(not {dropatt:g}), or --attention=eager")
MAX_TRAIN_STEPS = 1 << 27  # the mixing schedule holds a source index per step
MAX_MEM_LEN = 1 << 16
# contrib.layers.layer_norm's epsilon, which the original uses everywhere (and Transformers' XLNet too): here, without
# a framework, for both models and hf.py.
LAYER_NORM_EPSILON = 1e-12

# Far above any XLNet's (large: 24 layers, d_model 1024, d_inner 4096, 32000 tokens); beyond them the weights
# alone would not fit in any memory.
_SHAPE_LIMITS = {"n_layer": 1024, "d_model": 1 << 16, "n_head": 1024, "d_head": 1 << 14, "d_inner": 1 << 18,
                 "n_token": 1 << 24}


@dataclasses.dataclass(frozen=True)
class XLNetConfig:
    """What a checkpoint fixes: the original's xlnet_config.json. The defaults, a tiny model, are the original
    train_gpu.py flags'."""

    n_layer: int = 6
    d_model: int = 32
    n_head: int = 4
    d_head: int = 8
    d_inner: int = 32
    ff_activation: str = "relu"
    untie_r: bool = False
    n_token: int = 32000

    def __post_init__(self):
        check_field_types(self)
        if self.ff_activation not in ACTIVATIONS:
            raise ConfigError(f"ff_activation must be one of {ACTIVATIONS}, got {self.ff_activation!r}")
        for name, most in _SHAPE_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ConfigError(f"{name}={value!r} must be an integer in [1, {most}]")

    @classmethod
    def from_json(cls, path: str) -> XLNetConfig:
        data = save_dir.read_json(path)  # bad JSON: one line for the user
        names = [field.name for field in dataclasses.fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise ConfigError(f"{path}: missing {', '.join(missing)}")
        return cls(**{name: data[name] for name in names})

    def to_json(self, path: str) -> None:
        """Writes the config atomically (a full disk leaves no half-written file)."""
        fileio.write_text_atomic(path, json.dumps(dataclasses.asdict(self), indent=4, sort_keys=True))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What may change from run to run (the original's RunConfig plus its pretraining flags).

    reuse_len: how many leading positions of a batch are cached as memory (0: all).
    attn_type: "bi" as the original's XLNetModel always uses; "uni" adds a causal
      mask (and only then does same_length have an effect, as in the original).
    """

    mem_len: int = 0
    reuse_len: int = 0
    bi_data: bool = False
    clamp_len: int = -1
    same_length: bool = False
    attn_type: str = "bi"
    dropout: float = 0.0
    dropatt: float = 0.0
    use_bfloat16: bool = False
    init: str = "normal"
    init_std: float = 0.02
    init_range: float = 0.1

    def __post_init__(self):
        check_field_types(self)
        if self.attn_type not in ("bi", "uni"):
            raise ConfigError(f"attn_type must be 'bi' or 'uni', got {self.attn_type!r}")
        if self.init not in INITS:
            raise ConfigError(f"init must be 'normal' or 'uniform', got {self.init!r}")
        for name in ("dropout", "dropatt"):
            if not 0 <= getattr(self, name) < 1:  # NaN fails too
                raise ConfigError(f"--{name}={getattr(self, name)} must be in [0, 1)")
        if not 0 <= self.mem_len <= MAX_MEM_LEN:
            raise ConfigError(f"--mem_len={self.mem_len} must be in [0, {MAX_MEM_LEN}]")
        if self.clamp_len < -1:
            raise ConfigError(f"--clamp_len={self.clamp_len} must be -1 (no clamping) or more")
        for name in ("init_std", "init_range"):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"--{name}={getattr(self, name)} must be a positive number")

    @classmethod
    def from_json(cls, path: str) -> RunConfig:
        """Reads the fields this class knows; a run_config.json may also hold data-side keys
        (seq_len, perm_size, num_predict, bsz_per_core) that belong to the input pipeline."""
        data = save_dir.read_json(path)  # bad JSON: one line for the user
        return cls(**{field.name: data[field.name] for field in dataclasses.fields(cls) if field.name in data})



@dataclasses.dataclass(frozen=True)
class InputConfig:
    """What the records were made with, and how to cut them into training features.

    `mask_alpha`, `mask_beta` and `uncased` only name the record files (the
    original's file-name scheme); `bsz_per_host` and `bi_data` also set the batch
    per core and how a batch is split; `num_predict` also fixes the padded
    prediction count. `num_core_per_host`
    should be the one the records were made with (corpus_info.json): with
    bi_data each core's block of rows is its own forward + backward halves.
    """

    seq_len: int
    reuse_len: int
    perm_size: int
    bsz_per_host: int
    num_predict: Optional[int] = None
    num_core_per_host: int = 1
    bi_data: bool = True
    mask_alpha: int = 6
    mask_beta: int = 1
    uncased: bool = False
    split: str = "train"
    num_passes: Optional[int] = None
    sp_path: Optional[str] = None  # a cache-backed save_dir's SentencePiece model, where it is now (None: as recorded)

    def __post_init__(self):
        check_field_types(self)
        non_reuse_len = self.seq_len - self.reuse_len
        if not 0 < self.reuse_len < self.seq_len:
            raise ConfigError(f"need 0 < reuse_len ({self.reuse_len}) < seq_len ({self.seq_len})")
        # The original asserts this: a permutation block crossing into the
        # other part would leak the memory part's future into the past.
        if not 0 < self.perm_size <= min(self.reuse_len, non_reuse_len):
            raise ConfigError(f"perm_size ({self.perm_size}) must be in 1..min(reuse_len, seq_len - reuse_len)"
                             f" = {min(self.reuse_len, non_reuse_len)}")
        if self.reuse_len % self.perm_size or non_reuse_len % self.perm_size:
            raise ConfigError(f"perm_size ({self.perm_size}) must divide reuse_len ({self.reuse_len}) "
                             f"and seq_len - reuse_len ({non_reuse_len})")
        if self.bsz_per_host % self.num_core_per_host:
            raise ConfigError(f"bsz_per_host ({self.bsz_per_host}) must be a multiple of "
                             f"num_core_per_host ({self.num_core_per_host})")
        if self.num_predict is not None and self.num_predict <= 0:
            raise ConfigError(f"num_predict must be positive, got {self.num_predict}")

    @property
    def bsz_per_core(self) -> int:
        """The batch one replica gets; with bi_data its halves are forward and backward rows."""
        return self.bsz_per_host // self.num_core_per_host



@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A training run. Names and defaults are the original train_gpu.py flags'.

    record_info_dir: comma-separated save_dirs of create (or their `tfrecords/` folders); without
      mix_sampling_factor their files are read one after the other (the original), with it each step reads one dir.
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
    gradient_accumulation_steps: int = 1  # K: each replica's rows in K micro-batches, one update (Trainer)
    recompute: bool = False  # each layer's activations recomputed in the backward pass
    device_memory: Optional[int] = None  # bytes of a replica's device to plan for (None: a GPU's own; 0: no check)
    peak_tflops: Optional[float] = None  # one device's dense peak, for the MFU (None: PEAK_TFLOPS by its name)
    attention: str = "eager"  # train_torch: ATTENTIONS
    torch_compile: bool = False  # train_torch: torch.compile of the model
    # The held-out loss (pretrain/evaluation.py): the records of eval_split in these comma-separated dirs (one per
    # source when mixing; "": none), eval_batches of them every eval_every steps (0: never).
    eval_record_info_dir: str = ""
    eval_split: str = "dev"
    eval_every: int = 0
    eval_batches: int = 10

    def __post_init__(self):
        check_field_types(self)
        def need(ok, message):
            if not ok:
                raise ConfigError(message)

        need(self.decay_method in DECAY_METHODS, f"--decay_method={self.decay_method} must be poly or cos")
        need(self.strategy in STRATEGIES, f"--strategy={self.strategy} must be one of {', '.join(STRATEGIES)}")
        need(self.jit_compile in JIT_COMPILE, f"--jit_compile={self.jit_compile} must be one of {', '.join(JIT_COMPILE)}")
        for name in ("train_steps", "iterations", "max_save", "gradient_accumulation_steps"):
            need(getattr(self, name) > 0, f"--{name}={getattr(self, name)} must be positive")
        need(self.save_steps is None or self.save_steps > 0, f"--save_steps={self.save_steps} must be positive")
        need(self.eval_every >= 0 and self.eval_batches > 0,
             f"--eval_every={self.eval_every} must be >= 0 and --eval_batches={self.eval_batches} positive")
        need(not self.eval_every or not self.eval_record_info_dir or self.mix_sampling_factor is None
             or len(self.eval_record_info_dir.split(",")) == len(self.sources),
             f"--eval_record_info_dir={self.eval_record_info_dir} must name one held-out dir per --record_info_dir "
             "dir when they are mixed")
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
        # A negative or NaN peak would log an MFU of -0.0% or nan%; a negative memory is no plan.
        need(self.peak_tflops is None or 0 < self.peak_tflops < math.inf,
             f"--peak_tflops={self.peak_tflops} must be a positive number (a device's dense peak TFLOP/s)")
        need(self.device_memory is None or self.device_memory >= 0,
             f"device_memory={self.device_memory} must be a number of bytes (0: no check)")
        need(0 <= self.seed < 2**63, f"--seed={self.seed} must be in [0, 2**63)")
        check_attention(self.attention, self.run.dropatt)
        need(self.mix_sampling_factor is None or 0 <= self.mix_sampling_factor < math.inf,
             f"--mix_sampling_factor={self.mix_sampling_factor} must be a finite number >= 0")
        duplicated = sorted({d for d in self.devices if self.devices.count(d) > 1})
        need(not duplicated, f"--devices names {', '.join(duplicated)} twice: each device holds one replica")
        for device in self.devices:
            need(is_device_name(device), f"--devices: {device!r} is not a device name such as /gpu:0 or /cpu:0")
        need(self.run.reuse_len == self.data.reuse_len and self.run.bi_data == self.data.bi_data,
             f"RunConfig(reuse_len={self.run.reuse_len}, bi_data={self.run.bi_data}) must be the data's: "
             f"InputConfig(reuse_len={self.data.reuse_len}, bi_data={self.data.bi_data})")

    @property
    def sources(self) -> list[str]:
        """The record dirs read as separate streams: each dir when mixing, else all of them as one."""
        if self.mix_sampling_factor is None:
            return [self.record_info_dir]
        return self.record_info_dir.split(",")



@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """What export writes: the weights of `checkpoint` (a prefix, or a directory with a `checkpoint` file; ours
    or an original TF1 one) for `model`, config.json with `run`'s memory and attention settings (fine-tuning's
    by default), the training run's (`pretraining`, where it recorded them) beside it, and the tokenizer of
    `sp_path` (lower-casing when `uncased`, keeping accents when `keep_accents`, as create made the records)."""

    checkpoint: str
    model: XLNetConfig
    run: RunConfig
    pretraining: Optional[RunConfig]
    sp_path: str
    output_dir: str
    uncased: bool = False
    keep_accents: bool = False
    overwrite: bool = False

    def __post_init__(self):
        check_field_types(self)


# A part of a device name, as tf.DeviceSpec.from_string reads it: /job:NAME, /replica:N, /task:N, and the device,
# /device:TYPE:N of any type, or /TYPE[:N] of a type TensorFlow knows (N may be *).
_DEVICE_PART = re.compile(r"(?P<where>job:[^:]+|replica:\d+|task:\d+)"
                          r"|device:\w+:(?:\d+|\*)|(?i:cpu|gpu|tpu|epu|custom)(?::(?:\d+|\*))?")


def is_device_name(name: str) -> bool:
    """Whether tf.DeviceSpec reads `name` as a device (without loading TensorFlow): one device part, the job,
    replica and task optional. Whether this machine has it is make_strategy's check."""
    parts = [_DEVICE_PART.fullmatch(part) for part in name.split("/") if part]
    return all(parts) and sum(part["where"] is None for part in parts) == 1
