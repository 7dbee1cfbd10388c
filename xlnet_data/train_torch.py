"""python -m xlnet_data.train_torch: pretrain XLNet in PyTorch on records made by create (CPU, a GPU, torchrun).

train_gpu's run on our PyTorch XLNet (pretrain_torch/): the same flags wherever they mean the same (train_flags.py
defines them once: the data flags from the records, the model, the optimiser, evaluation, the plan, --dry_run,
--device_memory, --gradient_accumulation_steps, --recompute, --use_bfloat16; --device, --attention and
--compile are its own), the same model_dir checks and
one-line errors, on the records or a token cache; no TensorFlow is imported. Every checkpoint is a Transformers
directory, and the model_dir itself the latest (pretrain_torch/checkpoint.py):

    python -m xlnet_data.train_torch --record_info_dir=proc_data/austen --model_dir=models/austen-torch ...
    XLNetLMHeadModel.from_pretrained("models/austen-torch"); AutoTokenizer.from_pretrained("models/austen-torch")

Several GPUs or machines: `torchrun --nproc_per_node=N -m xlnet_data.train_torch ...` (pretrain_torch/distributed.py).
The loop is pretrain_torch/training.py; docs/pretraining-torch.md has examples.
"""

import dataclasses
import sys

from absl import flags

from xlnet_data import cli, train_flags

FLAGS = flags.FLAGS


def define_flags():
    """The training flags both trainers read (train_flags.py), and PyTorch's own: the device, the attention, the
    compilation."""
    from xlnet_data.pretrain.config import ATTENTIONS
    from xlnet_data.pretrain_torch.distributed import DEVICES

    train_flags.define_flags()
    flags.DEFINE_enum("device", "auto", DEVICES, "auto: each rank the GPU of its LOCAL_RANK where torch sees GPUs, "
                      "else the CPU; cpu; cuda.")
    flags.DEFINE_enum("attention", "eager", ATTENTIONS, "eager: the attention as matmuls, a shift and a softmax (any "
                      "device, attention dropout). flex: both streams' attention as one FlexAttention kernel each "
                      "(the three score terms, the shift and the permutation mask fused; less memory, faster on a "
                      "GPU): the same numbers to float rounding, needs a GPU to train (torch has no FlexAttention "
                      "backward on the CPU) and --dropatt=0.")
    flags.DEFINE_bool("compile", False, "torch.compile the model (its forward and backward): minutes of compiling "
                      "at the first step (and at each new shape: the first evaluation, another "
                      "--gradient_accumulation_steps), then faster steps on a GPU; for long runs.")


def _train():
    started = train_flags.process_start()
    config = train_flags.config_from_flags()  # a UserError or OSError (a flag, the records) is cli.run's line
    config = dataclasses.replace(config, attention=FLAGS.attention, torch_compile=FLAGS.compile)
    from xlnet_data.pretrain_torch import distributed, training

    if FLAGS.dry_run:
        dry = training.dry_run(config, started, FLAGS.dry_run_steps, FLAGS.dry_run_seconds, device=FLAGS.device)
        print("\n".join(dry.lines(config.model_dir)))
        return 0
    try:
        result = training.train(config, device=FLAGS.device)
    except distributed.LOST_RANK_ERRORS as err:
        if not distributed.is_lost_rank(err):
            raise
        ranks = distributed.start(FLAGS.device)
        distributed.leave_lost_run(cli.fail("train_torch", distributed.lost_rank_message(err, ranks, config.model_dir)))
    if result.stopped_by is not None:
        return train_flags.stopped("train_torch", result)
    best = (f"; best held-out loss {result.best.loss:.4f} at step {result.best.step}" if result.best else "")
    print(f"done: step {result.step}; {config.model_dir} is a Transformers directory of its weights (checkpoints "
          f"and summaries in it){best}", file=sys.stderr)
    return 0


main = train_flags.main_of(_train, "train_torch")


def run():
    cli.run(main, "train_torch", __doc__, define_flags)


if __name__ == "__main__":
    run()
