"""python -m xlnet_data.train_gpu: pretrain XLNet on records made by create (CPU, one GPU, many GPUs).

The original train_gpu.py's flags, same names and defaults, except that the data flags
(train_batch_size, seq_len, reuse_len, bi_data, ...) and n_token default to the records'
corpus_info.json, and an explicit flag that contradicts it is refused. The loop itself is
xlnet_data/pretrain/training.py; docs/pretraining.md has examples.
"""

import dataclasses
import logging
import signal
import sys

from absl import flags

from xlnet_data import cli
from xlnet_data.common import stopping
from xlnet_data.common.errors import ConfigError, UserError
from xlnet_data.dataformat import hf_tokenizer, settings

FLAGS = flags.FLAGS

# Defaults of the data flags where the records have no corpus_info.json (num_passes None: all passes).
_DATA_DEFAULTS = {"bi_data": True, "mask_alpha": 6, "mask_beta": 1, "uncased": False, "keep_accents": False,
                  "num_core_per_host": 1}


def define_flags():
    """The original train_gpu.py's flags, same names and defaults; the data ones default to the records'."""
    # The defaults restate TrainConfig's and RunConfig's (importing those loads TensorFlow before a wrong
    # flag is reported); tests/test_original_flags.py checks that they agree.
    # Experiment.
    flags.DEFINE_string("record_info_dir", None, "Records: a save_dir of create (or its tfrecords/ folder); several, "
                        "comma-separated, are read one after the other, or mixed with --mix_sampling_factor.")
    flags.DEFINE_string("model_dir", None, "Checkpoints, xlnet_config.json and TensorBoard summaries go here; a run "
                        "resumes from the latest checkpoint in it.")
    flags.DEFINE_string("init_checkpoint", None, "Start from this checkpoint (the original's TF1 ones or ours; model "
                        "weights only), or a Hugging Face Transformers directory (config.json + model.safetensors, as "
                        "export_hf writes; its config.json gives the model shape); ignored when model_dir has a "
                        "checkpoint to resume from.")
    # Optimization.
    flags.DEFINE_float("learning_rate", 1e-4, "Peak learning rate.")
    flags.DEFINE_float("clip", 1.0, "Clip the gradients to this global norm.")
    flags.DEFINE_float("min_lr_ratio", 0.001, "The rate decays to learning_rate * min_lr_ratio at train_steps.")
    flags.DEFINE_integer("warmup_steps", 0, "Steps of linear warmup from 0.")
    flags.DEFINE_float("adam_epsilon", 1e-8, "Adam epsilon.")
    flags.DEFINE_enum("decay_method", "poly", ["poly", "cos"], "Decay after warmup: linear (poly) or cosine.")
    flags.DEFINE_float("weight_decay", 0.0, "Decoupled weight decay (not on LayerNorm and biases, as the original).")
    # Training.
    flags.DEFINE_integer("train_batch_size", None, "Global batch, split over the replicas (default: the records' "
                         "bsz_per_host, which it must equal).")
    flags.DEFINE_integer("train_steps", 100000, "Total number of steps.")
    flags.DEFINE_integer("iterations", 1000, "Log (and write summaries) every this many steps.")
    flags.DEFINE_integer("save_steps", None, "Checkpoint every this many steps (and always at the end).")
    flags.DEFINE_integer("max_save", 5, "Checkpoints kept.")
    flags.DEFINE_float("max_loss", None, "Stop (without a checkpoint of it) when a step's loss is above this: a "
                       "diverging run. A non-finite loss always stops the run.")
    flags.DEFINE_float("mix_sampling_factor", None, "With several record dirs: each step reads one, with probability "
                       "proportional to its tokens ** factor (1: by size, 0: uniform); each keeps its own memory.")
    flags.DEFINE_integer("seed", 0, "Seeds the initialisation, the factorization orders and the source draws.")
    flags.DEFINE_enum("strategy", "auto", ["auto", "one_device", "mirrored", "multi_worker", "tpu"],
                      "auto: all local GPUs (mirrored) or the one GPU or the CPU; multi_worker: the cluster of TF_CONFIG.")
    flags.DEFINE_list("devices", [], "one_device / mirrored: the devices, e.g. /gpu:0,/gpu:1 (default: all GPUs).")
    flags.DEFINE_string("tpu", "", "strategy tpu: the TPU's name or grpc:// address.")
    flags.DEFINE_enum("jit_compile", "auto", ["auto", "on", "off"], "Compile each replica's forward and backward "
                      "pass with XLA. auto: on GPUs (and uncompiled if XLA cannot compile an op), off on CPUs, where "
                      "TensorFlow's own kernels are faster, and on TPUs, which compile the whole step anyway.")
    flags.DEFINE_bool("tf32", False, "Let GPUs run float32 matmuls in TF32 (faster on Ampere and later, about 1e-3 "
                      "relative error); off, every float32 matmul is full float32.")
    # Data: from the records' corpus_info.json unless given (and then they must agree with it).
    cli.define_data_flags(_DATA_DEFAULTS, note=" Default: the records' (corpus_info.json).")
    flags.DEFINE_integer("n_token", 32000, "Vocabulary size (default: the records' vocab_size).")
    flags.DEFINE_integer("perm_size", None, "Factorization-order block size (default: reuse_len).")
    # Model.
    flags.DEFINE_string("xlnet_config", None, "Take the model shape (n_layer ... n_token) from this xlnet_config.json, "
                        "e.g. a released model's.")
    flags.DEFINE_integer("mem_len", 0, "Memory length (positions of earlier batches attended to).")
    flags.DEFINE_bool("same_length", False, "Same-length attention. Inert in pretraining, as in the original: it "
                      "applies to uni-directional attention, and pretraining always attends both ways.")
    flags.DEFINE_integer("clamp_len", -1, "Clamp relative distances to this (-1: no clamping).")
    flags.DEFINE_integer("n_layer", 6, "Layers.")
    flags.DEFINE_integer("d_model", 32, "Hidden size.")
    flags.DEFINE_integer("d_embed", None, "The original's flag, which its model never used: the embedding size is "
                         "d_model (given, it must equal it).")
    flags.DEFINE_integer("n_head", 4, "Attention heads.")
    flags.DEFINE_integer("d_head", 8, "Size of each head.")
    flags.DEFINE_integer("d_inner", 32, "Feed-forward inner size.")
    flags.DEFINE_float("dropout", 0.0, "Dropout rate.")
    flags.DEFINE_float("dropatt", 0.0, "Attention dropout rate.")
    flags.DEFINE_bool("untie_r", False, "Untie the attention biases across layers.")
    flags.DEFINE_enum("ff_activation", "relu", ["relu", "gelu"], "Feed-forward activation.")
    flags.DEFINE_bool("use_bfloat16", False, "Compute in bfloat16: mixed precision, the weights, the layer norms' "
                      "moments, the softmaxes and the loss stay float32.")
    flags.DEFINE_enum("init", "normal", ["normal", "uniform"], "Initialisation.")
    flags.DEFINE_float("init_std", 0.02, "Standard deviation of the normal initialisation.")
    flags.DEFINE_float("init_range", 0.1, "Range of the uniform initialisation.")
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
    from xlnet_data.pretrain import hf, training
    from xlnet_data.pretrain.inputs import InputConfig
    from xlnet_data.pretrain.modeling import RunConfig, XLNetConfig

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
        training.TrainConfig, record_info_dir=",".join(d.tfrecords for d in record_dirs), model=model,
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
    try:
        config = config_from_flags()
    except (UserError, OSError) as err:  # a flag, the records, a model file; anything else is a bug
        return cli.fail("train", err)
    import tensorflow as tf

    from xlnet_data.pretrain import training
    try:
        result = training.train(config)
    except (UserError, OSError) as err:  # checkpoint mismatch, bad JSON, damaged records, full disk...
        return cli.fail("train", err)
    except tf.errors.NotFoundError as err:  # e.g. an --init_checkpoint that is not there
        return cli.fail("train", err.message)
    except training.LOST_WORKER_ERRORS as err:
        if config.strategy != "multi_worker":
            raise
        return cli.fail("train", training.lost_worker_message(err, config.model_dir))
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
