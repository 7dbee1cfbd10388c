"""The training step's traced graph, op by op, to compare two checkouts: an unchanged step (the same op types and
counts) runs the same work. Used for issue 32: with the held-out evaluation off, the step is main's.

    PYTHONPATH=CHECKOUT python benchmarks/step_graph_ops.py CHECKOUT SAVE_DIR > ops.CHECKOUT
    cmp ops.A ops.B

SAVE_DIR: records of create --bsz_per_host=8 --num_core_per_host=1 --seq_len=64 --reuse_len=32 --num_predict=10
--bi_data --uncased with a 1000-piece SentencePiece model (the tests' tiny config).
"""

import collections
import sys

import tensorflow as tf


def main(checkout: str, save_dir: str) -> None:
    sys.path.insert(0, f"{checkout}/tests")
    from test_train import tiny_config

    from xlnet_data.pretrain import sources
    from xlnet_data.pretrain.trainer import Trainer

    cfg = tiny_config(save_dir, "/tmp/step_graph_ops_unused")
    trainer = Trainer(cfg, tf.distribute.OneDeviceStrategy("/cpu:0"))
    batch = next(iter(sources.replica_batches(cfg.record_info_dir, cfg, 1)))
    graph = trainer.step.get_concrete_function(batch, trainer.initial_mems()).graph
    ops = collections.Counter(op.type for op in graph.get_operations())
    print(sum(ops.values()), "ops:", ", ".join(f"{name} {count}" for name, count in sorted(ops.items())))


if __name__ == "__main__":
    main(*sys.argv[1:3])
