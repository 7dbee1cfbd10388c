"""python -m xlnet_data.curves: a training run's curves as a PNG, for a look without TensorBoard.

Reads the TensorBoard event files train_gpu wrote in --model_dir (every run of it, a resumed one included) and
draws the training loss, the held-out loss (the mixture and each source's, with the best marked) and the learning
rate against the steps, with the tokens trained on along the top. Needs TensorFlow (to read the events) and
matplotlib (pip install 'xlnet-data[plot]'). docs/pretraining.md says how to read the two losses.

  python -m xlnet_data.curves --model_dir=models/austen --output=curves.png
"""

import importlib.util
import os
import sys

from absl import flags

from xlnet_data import cli
from xlnet_data.common.errors import ConfigError

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("model_dir", None, "A --model_dir of train_gpu (its events.out.tfevents.* files).")
    flags.DEFINE_string("output", "curves.png", "The PNG to write.")
    flags.DEFINE_string("title", None, "The figure's title (default: the model_dir).")


def main(argv):
    if len(argv) > 1:
        return cli.fail("curves", f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.model_dir or not os.path.isdir(FLAGS.model_dir):
        raise ConfigError(f"--model_dir={FLAGS.model_dir}: not a folder; give a --model_dir of train_gpu")
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("curves needs matplotlib: pip install matplotlib (or pip install 'xlnet-data[plot]')")
    from xlnet_data.pretrain import curves

    scalars = curves.read_scalars(FLAGS.model_dir)
    drawn = curves.plot_curves(scalars, FLAGS.output, FLAGS.title or FLAGS.model_dir,
                               curves.tokens_per_step(FLAGS.model_dir))
    last = int(scalars["loss"][0][-1])
    print(f"done: {', '.join(drawn)} to step {last} in {FLAGS.output}", file=sys.stderr)
    return 0


def run():
    cli.run(main, "curves", __doc__, define_flags)


if __name__ == "__main__":
    run()
