"""python -m xlnet_data.train_gpu: pretrain XLNet on records made by create (CPU, one GPU, many GPUs).

The original train_gpu.py's flags, same names and defaults (the config classes' of
xlnet_data/pretrain/config.py), except that the data flags (train_batch_size, seq_len, reuse_len,
bi_data, ...) and n_token default to the records' corpus_info.json, and an explicit flag that
contradicts it is refused. The loop itself is xlnet_data/pretrain/training.py; docs/pretraining.md
has examples.
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
from xlnet_data.pretrain import costs, held_out
from xlnet_data.pretrain.config import (
    ACTIVATIONS,
    DECAY_METHODS,
    INITS,
    JIT_COMPILE,
    STRATEGIES,
    InputConfig,
    RunConfig,
    TrainConfig,
    XLNetConfig,
)

FLAGS = flags.FLAGS
# The data flags whose defaults (where the records have no corpus_info.json) are InputConfig's.
_DATA_DEFAULTS_FROM_INPUTS = ("bi_data", "mask_alpha", "mask_beta", "uncased", "num_core_per_host")


def _define(kind, name, help_text, *enum_values):
    """Defines a flag whose default is the config classes' field of its name (the original's), None where none
    has a default."""
    default = cli.field_defaults(TrainConfig, RunConfig, XLNetConfig).get(name)
    getattr(flags, f"DEFINE_{kind}")(name, default, *enum_values, help_text)


def define_flags():
    """The original train_gpu.py's flags, same names and defaults (the config classes'); the data ones default to
    the records'."""
    _define_run_flags()
    _define_data_and_model_flags()


def _define_run_flags():
    # Experiment.
    _define("string", "record_info_dir", "Records: a save_dir of create (or its tfrecords/ folder); several, "
            "comma-separated, are read one after the other, or mixed with --mix_sampling_factor.")
    _define("string", "model_dir", "Checkpoints, xlnet_config.json and TensorBoard summaries go here; a run resumes "
            "from the latest checkpoint in it.")
    _define("string", "init_checkpoint", "Start from this checkpoint (the original's TF1 ones or ours; model weights "
            "only), or a Hugging Face Transformers directory (config.json + model.safetensors, as export_hf writes; its "
            "config.json gives the model shape); ignored when model_dir has a checkpoint to resume from.")
    # Optimization.
    _define("float", "learning_rate", "Peak learning rate.")
    _define("float", "clip", "Clip the gradients to this global norm.")
    _define("float", "min_lr_ratio", "The rate decays to learning_rate * min_lr_ratio at train_steps.")
    _define("integer", "warmup_steps", "Steps of linear warmup from 0.")
    _define("float", "adam_epsilon", "Adam epsilon.")
    _define("enum", "decay_method", "Decay after warmup: linear (poly) or cosine.", DECAY_METHODS)
    _define("float", "weight_decay", "Decoupled weight decay (not on LayerNorm and biases, as the original).")
    # Training.
    _define("integer", "train_batch_size", "Global batch, split over the replicas (default: the records' bsz_per_host, "
            "which it must equal).")
    _define("integer", "gradient_accumulation_steps", "Gradient accumulation (Hugging Face's name): each replica's rows "
            "run as this many micro-batches of rows, one after the other (with bi_data each has forward rows and their "
            "backward rows), their gradients summed by their targets and applied once: K=1's step to float rounding "
            "with one micro-batch's activations in memory at a time. It must divide each replica's rows (half of them with "
            "bi_data); a resume may change it.")
    _define("bool", "recompute", "Recompute each layer's activations in the backward pass instead of keeping them: "
            "less memory, about one more forward pass of time, the same gradients (to float rounding).")
    _define("integer", "train_steps", "Total number of steps.")
    _define("integer", "iterations", "Log (and write summaries) every this many steps.")
    _define("integer", "save_steps", "Checkpoint every this many steps (and always at the end).")
    _define("integer", "max_save", "Checkpoints kept.")
    _define("float", "max_loss", "Stop (without a checkpoint of it) when a step's loss is above this: a diverging run. A "
            "non-finite loss always stops the run.")
    _define("float", "mix_sampling_factor", "With several record dirs: each step reads one, with probability "
            "proportional to its tokens ** factor (1: by size, 0: uniform); each keeps its own memory.")
    _define("integer", "seed", "Seeds the initialisation, the factorization orders and the source draws.")
    _define("enum", "strategy", "auto: all local GPUs (mirrored) or the one GPU or the CPU; multi_worker: the cluster "
            "of TF_CONFIG.", STRATEGIES)
    _define("list", "devices", "one_device / mirrored: the devices, e.g. /gpu:0,/gpu:1 (default: all GPUs).")
    _define("string", "tpu", "strategy tpu: the TPU's name or grpc:// address.")
    _define("enum", "jit_compile", "Compile each replica's forward and backward pass with XLA. auto: on GPUs (and "
            "uncompiled if XLA cannot compile an op), off on CPUs, where TensorFlow's own kernels are faster, and on "
            "TPUs, which compile the whole step anyway.", JIT_COMPILE)
    # Held-out evaluation (pretrain/evaluation.py).
    flags.DEFINE_string("eval_record_info_dir", None, "Held-out records: save_dirs (or tfrecords/ folders) holding a "
                        "dev split (create --split=dev), one per --record_info_dir dir when mixing. Default: the dev "
                        "split of each --record_info_dir dir, where they have one.")
    flags.DEFINE_integer("eval_every", None, "Evaluate the held-out loss every this many steps (and at the last); "
                         "the lowest one's checkpoint is kept in model_dir/best/. Default: --iterations where there "
                         "are held-out records; 0: never.", lower_bound=0)
    _define("integer", "eval_batches", "Held-out batches (of train_batch_size) per evaluation: the first ones, the "
            "same at every evaluation.")
    _define("bool", "tf32", "Let GPUs run float32 matmuls in TF32 (faster on Ampere and later, about 1e-3 relative "
            "error); off, every float32 matmul is full float32.")
    # Fitting a run (docs/pretraining.md#fitting-a-run).
    flags.DEFINE_string("device_memory", None, "Plan for a device of this memory per replica, e.g. 16GB (GB = GiB), "
                        "also on a CPU; a run whose estimated peak is above it stops before any step, naming the "
                        "smallest change that fits. Default: a GPU's own memory; none on CPUs. off: no check (the plan "
                        "is an estimate: within 20% of the measured peak on CPUs, see BENCHMARKS.md).")
    _define("float", "peak_tflops", "One device's dense peak TFLOP/s (a positive number), for the MFU of the log "
            "line (default: known "
            "GPUs' from a table, bfloat16 or float32 as the run computes; no MFU on CPUs).")
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
    _define("integer", "n_token", "Vocabulary size (default: the records' vocab_size).")
    flags.DEFINE_string("sp_path", None, "The SentencePiece model the records were made with, where it is now: a "
                        "cache-backed save_dir (create --nowrite_records) makes its records with it, and finds it "
                        "where create ran (or beside the save_dir as it was, if the two moved together) without "
                        "this flag. Checked by its sha256 against the records' record_info.")
    _define("integer", "perm_size", "Factorization-order block size (default: reuse_len).")
    # Model.
    _define("string", "xlnet_config", "Take the model shape (n_layer ... n_token) from this xlnet_config.json, e.g. a "
            "released model's.")
    _define("integer", "mem_len", "Memory length (positions of earlier batches attended to).")
    _define("bool", "same_length", "Same-length attention. Inert in pretraining, as in the original: it applies to "
            "uni-directional attention, and pretraining always attends both ways.")
    _define("integer", "clamp_len", "Clamp relative distances to this (-1: no clamping).")
    _define("integer", "n_layer", "Layers.")
    _define("integer", "d_model", "Hidden size.")
    flags.DEFINE_integer("d_embed", None, "The original's flag, which its model never used: the embedding size is "
                         "d_model (given, it must equal it).")
    _define("integer", "n_head", "Attention heads.")
    _define("integer", "d_head", "Size of each head.")
    _define("integer", "d_inner", "Feed-forward inner size.")
    _define("float", "dropout", "Dropout rate.")
    _define("float", "dropatt", "Attention dropout rate.")
    _define("bool", "untie_r", "Untie the attention biases across layers.")
    _define("enum", "ff_activation", "Feed-forward activation.", ACTIVATIONS)
    _define("bool", "use_bfloat16", "Compute in bfloat16: mixed precision, the weights, the layer norms' moments, the "
            "softmaxes and the loss stay float32.")
    _define("enum", "init", "Initialisation.", INITS)
    _define("float", "init_std", "Standard deviation of the normal initialisation.")
    _define("float", "init_range", "Range of the uniform initialisation.")
    # The original's flags that select nothing here (its train_gpu.py ignores num_hosts and summary_type).
    flags.DEFINE_integer("num_hosts", 1, "The original's flag, which its train_gpu.py ignores. Only 1: for several "
                         "machines use --strategy=multi_worker.")
    flags.DEFINE_bool("use_tpu", False, "The original's flag (TPU-friendly ops, the same values). Only False: to "
                      "train on a TPU use --strategy=tpu --tpu=NAME.")
    flags.DEFINE_enum("summary_type", "last", ["last", "first", "mean", "attn"], "The original's flag for "
                      "fine-tuning heads: pretraining does not read it (nor does the original).")


SHAPE_FLAGS = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "ff_activation", "untie_r", "n_token")


def config_from_flags():
    if not FLAGS.record_info_dir or not FLAGS.model_dir:
        raise ConfigError("--record_info_dir and --model_dir are needed")
    if FLAGS.num_hosts != 1:
        raise ConfigError(f"--num_hosts={FLAGS.num_hosts}: the original's train_gpu.py reads the records as one host "
                          "whatever it says; to train on several machines use --strategy=multi_worker (TF_CONFIG)")
    if FLAGS.use_tpu:
        raise ConfigError("--use_tpu=True: train_gpu does not switch to TPU ops with it; to train on a TPU use "
                          "--strategy=tpu --tpu=NAME")
    record_dirs = settings.find_record_dirs(FLAGS.record_info_dir, FLAGS.sp_path)
    resolved = settings.train_settings(
        record_dirs, given={flag: FLAGS[flag].value for flag in settings.TRAIN_FLAGS if FLAGS[flag].present},
        defaults={flag: FLAGS[flag].value for flag in settings.TRAIN_FLAGS})
    data = {flag: value for flag, (value, _) in resolved.items()}
    evaluation = _held_out_flags(record_dirs)

    # TensorFlow is imported only now that the records are found (a wrong flag fails fast).
    from xlnet_data.pretrain import hf

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
                                **_pretraining_of_export(hf))
    return cli.config_from_flags(
        TrainConfig, record_info_dir=",".join(d.tfrecords for d in record_dirs), model=model,
        run=run, data=data_config, devices=tuple(FLAGS.devices),
        device_memory=costs.parse_bytes(FLAGS.device_memory) if FLAGS.device_memory else None, **evaluation)


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


def _pretraining_of_export(hf) -> dict:
    """mem_len, clamp_len and same_length of the run that pretrained an --init_checkpoint export (its
    xlnet_pretraining.json), for the flags not given: continuing pretraining goes on as it was."""
    recorded = hf.read_pretraining(FLAGS.init_checkpoint) if hf.is_hf_dir(FLAGS.init_checkpoint) else None
    taken = {name: recorded[name] for name in _EXPORT_RUN_FLAGS if recorded and not FLAGS[name].present}
    if taken:
        logging.info("from %s/%s: %s", FLAGS.init_checkpoint, hf.PRETRAINING_FILE,
                     ", ".join(f"{name}={value}" for name, value in taken.items()))
    return taken


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    try:
        with stopping.stop_on_signals():  # outside the training loop, which saves a checkpoint first
            return _train()
    except stopping.Stopped as stop:
        print(f"train: stopped by {stop.name}; no checkpoint written since the last one", file=sys.stderr)
        return stop.exit_status


def _process_start() -> float:
    """When this process started (time.time()'s clock), read from /proc where there is one, else now: the dry
    run's projection counts the interpreter's and TensorFlow's start-up as a real run's wall time does."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return time.time() - float(uptime.read().split()[0]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def _train():
    started = _process_start()
    config = config_from_flags()  # a UserError or OSError (a flag, the records, a model file) is cli.run's line
    import tensorflow as tf

    from xlnet_data.pretrain import distribution, training
    if FLAGS.dry_run:
        dry = training.dry_run(config, FLAGS.dry_run_steps, started, FLAGS.dry_run_seconds)
        _FINISHED.append(dry)  # freed by no one: see run()
        return _dry_run(dry, config)
    try:
        result = training.train(config)
        _FINISHED.append(result)  # freed by no one: see run()
    except tf.errors.NotFoundError as err:  # e.g. an --init_checkpoint that is not there
        return cli.fail("train", err.message)
    except distribution.LOST_WORKER_ERRORS as err:
        if config.strategy != "multi_worker":
            raise
        return cli.fail("train", distribution.lost_worker_message(err, config.model_dir))
    if result.stopped_by is not None:
        kept = (f"saved {result.checkpoint}" if result.checkpoint
                else "no step since the last checkpoint, nothing to save")
        print(f"train: stopped by {signal.Signals(result.stopped_by).name} at step {result.step}: {kept}; run the "
              "same command to resume", file=sys.stderr)
        return 128 + result.stopped_by
    best = (f"; best held-out loss {result.best.loss:.4f} at step {result.best.step} "
            f"({held_out.best_dir(config.model_dir)})" if result.best else "")
    print(f"done: step {result.step}, checkpoints and summaries in {config.model_dir}{best}", file=sys.stderr)
    return 0


def _dry_run(dry, config) -> int:
    left = config.train_steps - dry.start_step
    params = costs.param_count(config.model)
    saves = -(-left // config.save_steps) if config.save_steps else 1
    print(f"dry run: the first step {dry.first_step_seconds:.1f} s after start (start-up, tracing, compiling), then "
          f"{dry.step_seconds:.3g} s per step (mean of {dry.timed_steps}), {dry.cost.tokens / dry.step_seconds:,.0f} "
          f"tok/s, {dry.cost.flops / dry.step_seconds / 1e12:.3g} TFLOP/s")
    evaluations = (f"{dry.evaluations} held-out evaluation(s) of {dry.evaluation_batches} batch(es) (the first "
                   f"{dry.first_evaluation_seconds:.3g} s" + (f", then {dry.evaluation_seconds:.3g} s each)"
                                                             if dry.evaluations > 1 else ")")
                   if dry.evaluations else "no held-out evaluation (none in this run)")
    print(f"projected: {left:,} steps (from step {dry.start_step} to --train_steps={config.train_steps}) in "
          f"{costs.duration(dry.projected_seconds)} ({dry.projected_seconds:,.0f} s), {left * dry.cost.tokens:,} tokens; "
          f"counted: the start-up, the steps, {evaluations}; not counted: {saves} checkpoint(s) of "
          f"{costs.gb(12 * params)}")
    print(f"dry run: nothing written to {config.model_dir}")
    return 0


_FINISHED = []  # the run's result (or the dry run's): its input iterators, whose freeing waits for their threads


def run():
    # The process ends as soon as the run has: freeing TensorFlow's input iterators waits for their threads
    # (measured 5-18 s after `done`, a third of a short run's wall time, which --dry_run cannot project), so
    # the result is kept in _FINISHED and the process leaves without freeing it. Everything the run writes is
    # closed by then (checkpoints, summaries flushed, the model_dir's lock released).
    try:
        cli.run(main, "train", __doc__, define_flags)
        status = 0
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    run()
