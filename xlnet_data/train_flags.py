"""The training flags both trainers read (train_gpu: TensorFlow, train_torch: PyTorch), defined once: the original
train_gpu.py's, same names and defaults (the config classes' of xlnet_data/pretrain/config.py), except that the data
flags (train_batch_size, seq_len, reuse_len, bi_data, ...) and n_token default to the records' corpus_info.json, and
an explicit flag that contradicts it is refused; and flags -> TrainConfig. No framework is imported here.

Each trainer's command module calls define_flags() in its own define_flags (adding the flags only it reads) and
config_from_flags() in its main.
"""

import dataclasses
import logging
import os
import signal
import sys
import time

from absl import flags

from xlnet_data import cli
from xlnet_data.common import stopping
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import hf_tokenizer, settings
from xlnet_data.pretrain import costs, held_out, hf
from xlnet_data.pretrain.config import (
    ACTIVATIONS,
    DECAY_METHODS,
    INITS,
    InputConfig,
    RunConfig,
    TrainConfig,
    XLNetConfig,
)

FLAGS = flags.FLAGS
# The data flags whose defaults (where the records have no corpus_info.json) are InputConfig's.
_DATA_DEFAULTS_FROM_INPUTS = ("bi_data", "mask_alpha", "mask_beta", "uncased", "num_core_per_host")


def define(kind, name, help_text, *enum_values):
    """Defines a flag whose default is the config classes' field of its name (the original's), None where none
    has a default."""
    default = cli.field_defaults(TrainConfig, RunConfig, XLNetConfig).get(name)
    getattr(flags, f"DEFINE_{kind}")(name, default, *enum_values, help_text)


def define_flags():
    """The original train_gpu.py's flags that both trainers read, same names and defaults (the config classes'); the
    data ones default to the records'."""
    _define_run_flags()
    _define_data_and_model_flags()


def _define_run_flags():
    # Experiment.
    define("string", "record_info_dir", "Records: a save_dir of create (or its tfrecords/ folder); several, "
            "comma-separated, are read one after the other, or mixed with --mix_sampling_factor.")
    define("string", "model_dir", "Checkpoints, xlnet_config.json and TensorBoard summaries go here; a run resumes "
            "from the latest checkpoint in it.")
    define("string", "init_checkpoint", "Start from this checkpoint (the original's TF1 ones or ours; model weights "
            "only), or a Hugging Face Transformers directory (config.json + model.safetensors, as export_hf writes; its "
            "config.json gives the model shape); ignored when model_dir has a checkpoint to resume from.")
    # Optimization.
    define("float", "learning_rate", "Peak learning rate.")
    define("float", "clip", "Clip the gradients to this global norm.")
    define("float", "min_lr_ratio", "The rate decays to learning_rate * min_lr_ratio at train_steps.")
    define("integer", "warmup_steps", "Steps of linear warmup from 0.")
    define("float", "adam_epsilon", "Adam epsilon.")
    define("enum", "decay_method", "Decay after warmup: linear (poly) or cosine.", DECAY_METHODS)
    define("float", "weight_decay", "Decoupled weight decay (not on LayerNorm and biases, as the original).")
    # Training.
    define("integer", "train_batch_size", "Global batch, split over the replicas (default: the records' bsz_per_host, "
            "which it must equal).")
    define("integer", "gradient_accumulation_steps", "Gradient accumulation (Hugging Face's name): each replica's rows "
            "run as this many micro-batches of rows, one after the other (with bi_data each has forward rows and their "
            "backward rows), their gradients summed by their targets and applied once: K=1's step to float rounding "
            "with one micro-batch's activations in memory at a time. It must divide each replica's rows (half of them with "
            "bi_data); a resume may change it.")
    define("bool", "recompute", "Recompute each layer's activations in the backward pass instead of keeping them: "
            "less memory, about one more forward pass of time, the same gradients (to float rounding).")
    define("integer", "train_steps", "Total number of steps.")
    define("integer", "iterations", "Log (and write summaries) every this many steps.")
    define("integer", "save_steps", "Checkpoint every this many steps (and always at the end).")
    define("integer", "max_save", "Checkpoints kept.")
    define("float", "max_loss", "Stop (without a checkpoint of it) when a step's loss is above this: a diverging run. A "
            "non-finite loss always stops the run.")
    define("float", "mix_sampling_factor", "With several record dirs: each step reads one, with probability "
            "proportional to its tokens ** factor (1: by size, 0: uniform); each keeps its own memory.")
    define("integer", "seed", "Seeds the initialisation, the factorization orders and the source draws.")
    # Held-out evaluation (pretrain/evaluation.py).
    flags.DEFINE_string("eval_record_info_dir", None, "Held-out records: save_dirs (or tfrecords/ folders) holding a "
                        "dev split (create --split=dev), one per --record_info_dir dir when mixing. Default: the dev "
                        "split of each --record_info_dir dir, where they have one.")
    flags.DEFINE_integer("eval_every", None, "Evaluate the held-out loss every this many steps (and at the last); "
                         "the lowest one's checkpoint is kept in model_dir/best/. Default: --iterations where there "
                         "are held-out records; 0: never.", lower_bound=0)
    define("integer", "eval_batches", "Held-out batches (of train_batch_size) per evaluation: the first ones, the "
            "same at every evaluation.")
    define("bool", "tf32", "Let GPUs run float32 matmuls in TF32 (faster on Ampere and later, about 1e-3 relative "
            "error); off, every float32 matmul is full float32.")
    # Fitting a run (docs/pretraining.md#fitting-a-run).
    flags.DEFINE_string("device_memory", None, "Plan for a device of this memory per replica, e.g. 16GB (GB = GiB), "
                        "also on a CPU; a run whose estimated peak is above it stops before any step, naming the "
                        "smallest change that fits. Default: a GPU's own memory; none on CPUs. off: no check (the plan "
                        "is an estimate: within 20% of the measured peak on CPUs, see BENCHMARKS.md).")
    define("float", "peak_tflops", "One device's dense peak TFLOP/s (a positive number), for the MFU of the log "
           "line (default: known GPUs' from a table, bfloat16 or float32 as the run computes; no MFU on CPUs).")
    flags.DEFINE_bool("dry_run", False, "Make every check the run makes before its first step (records, held-out "
                      "records, the plan: parameters, FLOPs, tokens, memory; model_dir and the checkpoint it resumes "
                      "from), time --dry_run_steps steps after the first and one held-out evaluation, and project the "
                      "wall time to --train_steps (steps and evaluations; not checkpoints); writes nothing to "
                      "--model_dir.")
    flags.DEFINE_integer("dry_run_steps", 5, "--dry_run: steps timed after the first (tracing, compiling), at least.",
                         lower_bound=1)
    flags.DEFINE_float("dry_run_seconds", 20, "--dry_run: time steps for this long at least (up to 50 x "
                       "--dry_run_steps): a few fast steps weigh the input pipeline's warm-up too much.", lower_bound=0)


def _define_data_and_model_flags():
    # Data: from the records' corpus_info.json unless given (and then they must agree with it); these defaults
    # apply where the records have none (num_passes None: all passes).
    data_defaults = {field.name: field.default for field in dataclasses.fields(InputConfig)}
    cli.define_data_flags({name: data_defaults[name] for name in _DATA_DEFAULTS_FROM_INPUTS} | {"keep_accents": False},
                          note=" Default: the records' (corpus_info.json).")
    define("integer", "n_token", "Vocabulary size (default: the records' vocab_size).")
    flags.DEFINE_string("sp_path", None, "The SentencePiece model the records were made with, where it is now: a "
                        "cache-backed save_dir (create --nowrite_records) makes its records with it, and finds it "
                        "where create ran (or beside the save_dir as it was, if the two moved together) without "
                        "this flag. Checked by its sha256 against the records' record_info.")
    define("integer", "perm_size", "Factorization-order block size (default: reuse_len).")
    # Model.
    define("string", "xlnet_config", "Take the model shape (n_layer ... n_token) from this xlnet_config.json, e.g. a "
            "released model's.")
    define("integer", "mem_len", "Memory length (positions of earlier batches attended to).")
    define("bool", "same_length", "Same-length attention. Inert in pretraining, as in the original: it applies to "
            "uni-directional attention, and pretraining always attends both ways.")
    define("integer", "clamp_len", "Clamp relative distances to this (-1: no clamping).")
    define("integer", "n_layer", "Layers.")
    define("integer", "d_model", "Hidden size.")
    flags.DEFINE_integer("d_embed", None, "The original's flag, which its model never used: the embedding size is "
                         "d_model (given, it must equal it).")
    define("integer", "n_head", "Attention heads.")
    define("integer", "d_head", "Size of each head.")
    define("integer", "d_inner", "Feed-forward inner size.")
    define("float", "dropout", "Dropout rate.")
    define("float", "dropatt", "Attention dropout rate.")
    define("bool", "untie_r", "Untie the attention biases across layers.")
    define("enum", "ff_activation", "Feed-forward activation.", ACTIVATIONS)
    define("bool", "use_bfloat16", "Compute in bfloat16: mixed precision, the weights, the layer norms' moments, the "
            "softmaxes and the loss stay float32.")
    define("enum", "init", "Initialisation.", INITS)
    define("float", "init_std", "Standard deviation of the normal initialisation.")
    define("float", "init_range", "Range of the uniform initialisation.")
    # The original's flags that select nothing here (its train_gpu.py ignores num_hosts and summary_type).
    flags.DEFINE_enum("summary_type", "last", ["last", "first", "mean", "attn"], "The original's flag for "
                      "fine-tuning heads: pretraining does not read it (nor does the original).")


SHAPE_FLAGS = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "ff_activation", "untie_r", "n_token")


def config_from_flags(**trainer_fields) -> TrainConfig:
    """The TrainConfig of the flags (and of the records, of an --init_checkpoint Transformers directory); `trainer_fields`:
    the trainer's own fields (train_gpu's devices)."""
    if not FLAGS.record_info_dir or not FLAGS.model_dir:
        raise ConfigError("--record_info_dir and --model_dir are needed")
    record_dirs = settings.find_record_dirs(FLAGS.record_info_dir, FLAGS.sp_path)
    resolved = settings.train_settings(
        record_dirs, given={flag: FLAGS[flag].value for flag in settings.TRAIN_FLAGS if FLAGS[flag].present},
        defaults={flag: FLAGS[flag].value for flag in settings.TRAIN_FLAGS})
    data = {flag: value for flag, (value, _) in resolved.items()}
    evaluation = _held_out_flags(record_dirs)

    data_config = InputConfig(
        seq_len=data["seq_len"], reuse_len=data["reuse_len"], perm_size=FLAGS.perm_size or data["reuse_len"],
        bsz_per_host=data["train_batch_size"], num_predict=data["num_predict"],
        num_core_per_host=data["num_core_per_host"], bi_data=data["bi_data"], mask_alpha=data["mask_alpha"],
        mask_beta=data["mask_beta"], uncased=data["uncased"], num_passes=FLAGS.num_passes, sp_path=FLAGS.sp_path)

    shape = {name: FLAGS[name].value for name in SHAPE_FLAGS} | {"n_token": data["n_token"]}
    model = origin = None
    if FLAGS.xlnet_config:
        model, origin = XLNetConfig.from_json(FLAGS.xlnet_config), f"--xlnet_config={FLAGS.xlnet_config}"
    elif hf.is_hf_dir(FLAGS.init_checkpoint):  # a Transformers directory brings its shape
        model, _ = hf.read_config(FLAGS.init_checkpoint)
        origin = f"--init_checkpoint={FLAGS.init_checkpoint} (config.json)"
        if FLAGS["untie_r"].present:  # Transformers keeps biases per layer: they load either way
            model = dataclasses.replace(model, untie_r=FLAGS.untie_r)
    if hf.is_hf_dir(FLAGS.init_checkpoint):
        infos = [(d.corpus_info_path, d.corpus_info) for d in record_dirs if d.corpus_info]
        hf_tokenizer.check_vocabulary(FLAGS.init_checkpoint, infos)
        hf.check_tokenizer_fits_records(FLAGS.init_checkpoint, infos, f"--init_checkpoint={FLAGS.init_checkpoint}")
    if model:
        given = {name: f"--{name}" for name in SHAPE_FLAGS if FLAGS[name].present}
        if resolved["n_token"][1] and not FLAGS["n_token"].present:
            given["n_token"] = f"the records' vocab_size ({resolved['n_token'][1]})"
        for name, source in given.items():
            if shape[name] != getattr(model, name):
                raise ConfigError(f"{source}={shape[name]} contradicts {origin}: {name}={getattr(model, name)}")
    else:
        model = XLNetConfig(**shape)
    if FLAGS.d_embed is not None and FLAGS.d_embed != model.d_model:
        raise ConfigError(f"--d_embed={FLAGS.d_embed} must equal d_model={model.d_model} (XLNet embeds in d_model)")

    run = cli.config_from_flags(RunConfig, reuse_len=data_config.reuse_len, bi_data=data_config.bi_data,
                                **_pretraining_of_export())
    return cli.config_from_flags(
        TrainConfig, record_info_dir=",".join(d.tfrecords for d in record_dirs), model=model,
        run=run, data=data_config,
        device_memory=costs.parse_bytes(FLAGS.device_memory) if FLAGS.device_memory else None, **evaluation,
        **trainer_fields)


def _held_out_flags(record_dirs):
    """eval_record_info_dir and eval_every of TrainConfig: the dev splits beside the records unless given."""
    eval_every = FLAGS.iterations if FLAGS.eval_every is None else FLAGS.eval_every
    dirs = held_out.held_out_dirs([d.tfrecords for d in record_dirs], FLAGS.eval_record_info_dir) if eval_every else ""
    found = len(dirs.split(",")) if dirs else 0
    if FLAGS.mix_sampling_factor is not None and not FLAGS.eval_record_info_dir and 0 < found < len(record_dirs):
        raise ConfigError(f"only {found} of the {len(record_dirs)} mixed --record_info_dir dirs hold a dev split: "
                          "make the others' (create --split=dev), or pass --eval_record_info_dir")
    if FLAGS["eval_every"].present and eval_every and not dirs:
        raise ConfigError(f"--eval_every={eval_every}: no held-out records (no dev split in --record_info_dir); "
                          "make them with prepare --dev_fraction and create --split=dev, or pass "
                          "--eval_record_info_dir")
    return {"eval_record_info_dir": dirs, "eval_every": eval_every if dirs else 0}


# The training run's settings an export keeps (xlnet_pretraining.json) that train_gpu takes where not given; reuse_len
# and bi_data are the records'.
_EXPORT_RUN_FLAGS = ("mem_len", "clamp_len", "same_length")


def _pretraining_of_export() -> dict:
    """mem_len, clamp_len and same_length of the run that pretrained an --init_checkpoint export (its
    xlnet_pretraining.json), for the flags not given: continuing pretraining goes on as it was."""
    recorded = hf.read_pretraining(FLAGS.init_checkpoint) if hf.is_hf_dir(FLAGS.init_checkpoint) else None
    taken = {name: recorded[name] for name in _EXPORT_RUN_FLAGS if recorded and not FLAGS[name].present}
    if taken:
        logging.info("from %s/%s: %s", FLAGS.init_checkpoint, hf.PRETRAINING_FILE,
                     ", ".join(f"{name}={value}" for name, value in taken.items()))
    return taken


def process_start() -> float:
    """When this process started (time.time()'s clock), read from /proc where there is one, else now: the dry
    run's projection counts the interpreter's and the framework's start-up as a real run's wall time does."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return time.time() - float(uptime.read().split()[0]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def main_of(train, program: str):
    """A trainer command's absl main: `train()` (returning the exit status), with a signal that arrives before or
    after the training loop (which saves a checkpoint first) ending it in one line and 130/143."""
    def main(argv):
        del argv
        logging.getLogger().setLevel(logging.INFO)
        try:
            with stopping.stop_on_signals():  # outside the training loop, which saves a checkpoint first
                return train()
        except stopping.Stopped as stop:
            print(f"{program}: stopped by {stop.name}; no checkpoint written since the last one", file=sys.stderr)
            return stop.exit_status
    return main


def stopped(program: str, result) -> int:
    """Says how a run ended by a signal (result: a trainer's TrainResult with stopped_by) and returns its exit
    status."""
    kept = f"saved {result.checkpoint}" if result.checkpoint else "no step since the last checkpoint, nothing to save"
    print(f"{program}: stopped by {signal.Signals(result.stopped_by).name} at step {result.step}: {kept}; run the "
          "same command to resume", file=sys.stderr)
    return 128 + result.stopped_by
