"""python -m xlnet_data.train_gpu: pretrain XLNet on records made by create (CPU, one GPU, many GPUs).

The original train_gpu.py's flags, same names and defaults (the config classes' of
xlnet_data/pretrain/config.py), except that the data flags (train_batch_size, seq_len, reuse_len,
bi_data, ...) and n_token default to the records' corpus_info.json, and an explicit flag that
contradicts it is refused. The loop itself is xlnet_data/pretrain/training.py; docs/pretraining.md
has examples.
"""

import dataclasses
import logging
import signal
import sys

from absl import flags

from xlnet_data import cli
from xlnet_data.common import stopping
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import hf_tokenizer, settings
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
    _define("bool", "tf32", "Let GPUs run float32 matmuls in TF32 (faster on Ampere and later, about 1e-3 relative "
            "error); off, every float32 matmul is full float32.")


def _define_data_and_model_flags():
    # Data: from the records' corpus_info.json unless given (and then they must agree with it); these defaults
    # apply where the records have none (num_passes None: all passes).
    data_defaults = {field.name: field.default for field in dataclasses.fields(InputConfig)}
    cli.define_data_flags({name: data_defaults[name] for name in _DATA_DEFAULTS_FROM_INPUTS} | {"keep_accents": False},
                          note=" Default: the records' (corpus_info.json).")
    _define("integer", "n_token", "Vocabulary size (default: the records' vocab_size).")
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
    record_dirs = settings.find_record_dirs(FLAGS.record_info_dir)
    resolved = settings.train_settings(
        record_dirs, given={flag: FLAGS[flag].value for flag in settings.TRAIN_FLAGS if FLAGS[flag].present},
        defaults={flag: FLAGS[flag].value for flag in settings.TRAIN_FLAGS})
    data = {flag: value for flag, (value, _) in resolved.items()}

    # TensorFlow is imported only now that the records are found (a wrong flag fails fast).
    from xlnet_data.pretrain import hf

    data_config = InputConfig(
        seq_len=data["seq_len"], reuse_len=data["reuse_len"], perm_size=FLAGS.perm_size or data["reuse_len"],
        bsz_per_host=data["train_batch_size"], num_predict=data["num_predict"],
        num_core_per_host=data["num_core_per_host"], bi_data=data["bi_data"], mask_alpha=data["mask_alpha"],
        mask_beta=data["mask_beta"], uncased=data["uncased"], num_passes=FLAGS.num_passes)

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

    run = cli.config_from_flags(RunConfig, reuse_len=data_config.reuse_len, bi_data=data_config.bi_data)
    return cli.config_from_flags(
        TrainConfig, record_info_dir=",".join(d.tfrecords for d in record_dirs), model=model,
        run=run, data=data_config, devices=tuple(FLAGS.devices))


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    try:
        with stopping.stop_on_signals():  # outside the training loop, which saves a checkpoint first
            return _train()
    except stopping.Stopped as stop:
        print(f"train: stopped by {stop.name}; no checkpoint written since the last one", file=sys.stderr)
        return stop.exit_status


def _train():
    config = config_from_flags()  # a UserError or OSError (a flag, the records, a model file) is cli.run's line
    import tensorflow as tf

    from xlnet_data.pretrain import distribution, training
    try:
        result = training.train(config)
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
    print(f"done: step {result.step}, checkpoints and summaries in {config.model_dir}", file=sys.stderr)
    return 0


def run():
    cli.run(main, "train", __doc__, define_flags)


if __name__ == "__main__":
    run()
