"""python -m xlnet_data.train_gpu: pretrain XLNet on records made by create (CPU, one GPU, many GPUs).

The original train_gpu.py's flags, same names and defaults (the config classes' of
xlnet_data/pretrain/config.py), except that the data flags (train_batch_size, seq_len, reuse_len,
bi_data, ...) and n_token default to the records' corpus_info.json, and an explicit flag that
contradicts it is refused: train_flags.py defines them, for train_torch too; here only TensorFlow's
own. The loop itself is xlnet_data/pretrain/training.py; docs/pretraining.md has examples.
"""

import logging
import os
import sys

from absl import flags

from xlnet_data import cli, train_flags
from xlnet_data.common import run_lock
from xlnet_data.common.errors import ConfigError
from xlnet_data.pretrain import costs, held_out
from xlnet_data.pretrain.config import JIT_COMPILE, STRATEGIES
from xlnet_data.pretrain.model_dir import model_dir_lock

FLAGS = flags.FLAGS


def define_flags():
    """The training flags both trainers read (train_flags.py), and TensorFlow's own: the strategy, its devices,
    XLA, and the original's num_hosts and use_tpu."""
    train_flags.define_flags()
    define = train_flags.define
    define("enum", "strategy", "auto: all local GPUs (mirrored) or the one GPU or the CPU; multi_worker: the cluster "
           "of TF_CONFIG.", STRATEGIES)
    define("list", "devices", "one_device / mirrored: the devices, e.g. /gpu:0,/gpu:1 (default: all GPUs).")
    define("string", "tpu", "strategy tpu: the TPU's name or grpc:// address.")
    define("enum", "jit_compile", "Compile each replica's forward and backward pass with XLA. auto: on GPUs (and "
           "uncompiled if XLA cannot compile an op), off on CPUs, where TensorFlow's own kernels are faster, and on "
           "TPUs, which compile the whole step anyway.", JIT_COMPILE)
    flags.DEFINE_integer("num_hosts", 1, "The original's flag, which its train_gpu.py ignores. Only 1: for several "
                         "machines use --strategy=multi_worker.")
    flags.DEFINE_bool("use_tpu", False, "The original's flag (TPU-friendly ops, the same values). Only False: to "
                      "train on a TPU use --strategy=tpu --tpu=NAME.")


def config_from_flags():
    if FLAGS.num_hosts != 1:
        raise ConfigError(f"--num_hosts={FLAGS.num_hosts}: the original's train_gpu.py reads the records as one host "
                          "whatever it says; to train on several machines use --strategy=multi_worker (TF_CONFIG)")
    if FLAGS.use_tpu:
        raise ConfigError("--use_tpu=True: train_gpu does not switch to TPU ops with it; to train on a TPU use "
                          "--strategy=tpu --tpu=NAME")
    return train_flags.config_from_flags(devices=tuple(FLAGS.devices))


def _train():
    started = train_flags.process_start()
    config = config_from_flags()  # a UserError or OSError (a flag, the records, a model file) is cli.run's line
    if config.strategy != "multi_worker":  # (there the chief alone takes the lock, whenever it starts)
        # A model_dir another run holds stops this one now, not after TensorFlow's start-up (10-20 s measured on a
        # loaded 2-core machine); training.train takes the lock itself.
        run_lock.refuse_if_busy(config.model_dir, model_dir_lock("train_gpu"))
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
        return train_flags.stopped("train", result)
    best = (f"; best held-out loss {result.best.loss:.4f} at step {result.best.step} "
            f"({held_out.best_dir(config.model_dir)})" if result.best else "")
    print(f"done: step {result.step}, checkpoints and summaries in {config.model_dir}{best}", file=sys.stderr)
    return 0


main = train_flags.main_of(_train, "train")


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
    # The process ends as soon as the run has: freeing TensorFlow's input iterators waited for tf.data's
    # autotuning thread (5-18 s after `done`, a third of a short run's wall time; inputs.py now leaves that
    # thread off), so the result is kept in _FINISHED and the process leaves without freeing it. Everything
    # the run writes is closed by then (checkpoints, summaries flushed, the model_dir's lock released).
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
