"""Times XLNet training steps on synthetic features: median step time and tokens/s.

The step is the real one (xlnet_data.pretrain.training.Trainer: PLM loss, all-reduce, clipping, Adam),
on every local GPU by default, with the memories carried from step to step.

    python benchmarks/bench_train.py                        # XLNet-Base shape, 4 rows per replica, 20 steps
    python benchmarks/bench_train.py --bsz_per_replica=8 --bfloat16
    python benchmarks/bench_train.py --small --steps=5      # a tiny shape: checks the script on a CPU

XLNet-Base: 12 layers, d_model 768, 12 heads of 64, d_inner 3072, seq_len 512, reuse_len 256,
mem_len 384, 85 predictions per example, 32,000 tokens. Do not run it on a CPU beyond a step or two.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from xlnet_data.pretrain import inputs as ip
from xlnet_data.pretrain import modeling as M
from xlnet_data.pretrain import training as T

SHAPES = {  # model, seq_len, reuse_len, mem_len, num_predict
    "base": (M.XLNetConfig(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, ff_activation="gelu",
                           untie_r=True, n_token=32000), 512, 256, 384, 85),
    "small": (M.XLNetConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, ff_activation="gelu",
                            untie_r=True, n_token=1000), 64, 32, 48, 10),
}


def synthetic_features(bsz, seq_len, num_predict, n_token, seed):
    """One replica's batch with the input pipeline's shapes and dtypes (random content)."""
    rng = np.random.default_rng(seed)
    positions = np.stack([rng.choice(seq_len, num_predict, replace=False) for _ in range(bsz)])
    input_q = np.zeros((bsz, seq_len), np.float32)
    np.put_along_axis(input_q, positions, 1.0, axis=1)
    return {
        "input_k": rng.integers(0, n_token, (bsz, seq_len), dtype=np.int32),
        "input_q": input_q,
        "seg_id": np.repeat((np.arange(seq_len) >= seq_len // 2)[None].astype(np.int32), bsz, 0),
        "perm_mask": (rng.random((bsz, seq_len, seq_len)) < 0.5).astype(np.float32),
        "target": rng.integers(0, n_token, (bsz, num_predict), dtype=np.int32),
        "target_mask": np.ones((bsz, num_predict), np.float32),
        "target_mapping": np.eye(seq_len, dtype=np.float32)[positions],
        "label": np.ones((bsz, 1), np.int32),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a tiny shape instead of XLNet-Base")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (tracing, autotuning)")
    parser.add_argument("--bsz_per_replica", type=int, default=4, help="rows per replica (even: bi_data)")
    parser.add_argument("--mem_len", type=int, default=None, help="default: the shape's (384 for Base)")
    parser.add_argument("--bfloat16", action="store_true", help="compute in bfloat16")
    parser.add_argument("--strategy", default="auto", choices=T.STRATEGIES)
    args = parser.parse_args()

    model, seq_len, reuse_len, mem_len, num_predict = SHAPES["small" if args.small else "base"]
    mem_len = mem_len if args.mem_len is None else args.mem_len
    strategy = T.make_strategy(args.strategy)
    replicas = strategy.num_replicas_in_sync
    global_bsz = args.bsz_per_replica * replicas
    cfg = T.TrainConfig(
        record_info_dir="", model_dir="", model=model,
        run=M.RunConfig(mem_len=mem_len, reuse_len=reuse_len, bi_data=True, use_bfloat16=args.bfloat16),
        data=ip.InputConfig(seq_len=seq_len, reuse_len=reuse_len, perm_size=reuse_len, bsz_per_host=global_bsz,
                            num_predict=num_predict),
        train_steps=args.warmup + args.steps)
    trainer = T.Trainer(cfg, strategy)
    features = strategy.experimental_distribute_values_from_function(
        lambda context: {key: tf.constant(value) for key, value in synthetic_features(
            args.bsz_per_replica, seq_len, num_predict, model.n_token, context.replica_id_in_sync_group).items()})
    mems = trainer.initial_mems()
    devices = ", ".join(strategy.extended.worker_devices)
    print(f"{'small' if args.small else 'XLNet-Base'}: {replicas} replica(s) ({devices}), {args.bsz_per_replica} "
          f"rows x {seq_len} tokens each, mem_len {mem_len}, {'bfloat16' if args.bfloat16 else 'float32'}")

    times = []
    for step in range(args.warmup + args.steps):
        tic = time.perf_counter()
        loss, _, _, mems = trainer.step(features, mems)
        loss = float(loss)  # waits for the step
        if step >= args.warmup:
            times.append(time.perf_counter() - tic)
    median = statistics.median(times)
    print(f"median step {1000 * median:.1f} ms, {global_bsz * seq_len / median:,.0f} tokens/s "
          f"(min {1000 * min(times):.1f} ms, max {1000 * max(times):.1f} ms over {len(times)} steps; loss {loss:.3f})")


if __name__ == "__main__":
    main()
