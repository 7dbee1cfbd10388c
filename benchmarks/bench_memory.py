"""The memory plan (xlnet_data/pretrain/costs.py) against the measured peak of real training steps.

    python benchmarks/bench_memory.py                          # every shape, K=1, no recomputation, float32
    python benchmarks/bench_memory.py --shapes=base,small --gradient_accumulation_steps=1,2 --recompute=off,on
    python benchmarks/bench_memory.py --bfloat16=off,on --steps=3

Each case runs in a fresh process: TensorFlow imported and its runtime started (one small op), then the
baseline, then the real step (xlnet_data.pretrain.trainer.Trainer: PLM loss, gradients, clipping, Adam) on
synthetic features of the input pipeline's shapes, the memories carried from step to step, --steps steps. The
measured peak is the process's RSS growth (VmHWM of /proc/self/status less VmRSS at the baseline), with
TensorFlow's BFC allocator on the CPU (TF_CPU_ALLOCATOR_USE_BFC=true, set for the case's process: the allocator
of its GPUs, which keeps its freed blocks for reuse; with glibc's malloc, TensorFlow's default on CPUs, the
growth came out up to 0.2 GB apart either way, see BENCHMARKS.md). Beside it the allocator's own peak
(tf.config.experimental.get_memory_info: the tensors alone), the figure a GPU's memory is spent on (on a GPU the
RSS column means nothing). Prints per case the plan's estimate, both peaks and the plan's ratio to each, and the
median step time after the first step; the figures go to BENCHMARKS.md.
"""

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

# name -> (model shape, seq_len, reuse_len, mem_len, num_predict, rows per replica)
SHAPES = {
    "base": (dict(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072), 512, 256, 384, 85, 2),
    "medium": (dict(n_layer=6, d_model=512, n_head=8, d_head=64, d_inner=2048), 256, 128, 128, 42, 4),
    "long": (dict(n_layer=3, d_model=256, n_head=4, d_head=64, d_inner=1024), 512, 256, 512, 85, 8),
    "small": (dict(n_layer=4, d_model=256, n_head=4, d_head=64, d_inner=1024), 128, 64, 64, 21, 16),
}


def train_config(name, micro_batches=1, recompute=False, bfloat16=False, steps=3, rows=None):
    from xlnet_data.pretrain import config as C

    shape, seq_len, reuse_len, mem_len, num_predict, shape_rows = SHAPES[name]
    rows = rows or shape_rows
    return C.TrainConfig(
        record_info_dir="", model_dir="", strategy="one_device", train_steps=steps,
        model=C.XLNetConfig(**shape, ff_activation="gelu", untie_r=True, n_token=32000),
        run=C.RunConfig(mem_len=mem_len, reuse_len=reuse_len, bi_data=True, use_bfloat16=bfloat16),
        data=C.InputConfig(seq_len=seq_len, reuse_len=reuse_len, perm_size=reuse_len, bsz_per_host=rows,
                           num_predict=num_predict), gradient_accumulation_steps=micro_batches, recompute=recompute)


def status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise SystemExit(f"no {field} in /proc/self/status")


def worker(args):
    """One case in this process: prints {"measured": allocator peak, "rss": RSS growth (bytes), "step_s": [...]}."""
    import tensorflow as tf
    from bench_train import synthetic_features

    from xlnet_data.pretrain import distribution
    from xlnet_data.pretrain.trainer import Trainer

    cfg = train_config(args.shape, args.micro_batches, args.recompute, args.bfloat16, args.steps, args.rows)
    device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
    strategy = distribution.make_strategy("one_device")
    float(tf.reduce_sum(tf.ones([8, 8]) @ tf.ones([8, 8])))  # the runtime and its thread pools started
    tf.config.experimental.reset_memory_stats(device)
    baseline = 1024 * status_kib("VmRSS")
    with distribution.sum_in_graph_order():
        trainer = Trainer(cfg, strategy)
        features = {key: tf.constant(value) for key, value in synthetic_features(
            cfg.data.bsz_per_host, cfg.data.seq_len, cfg.data.num_predict, cfg.model.n_token, 0).items()}
        mems, times = trainer.initial_mems(), []
        for _ in range(args.steps):
            tic = time.perf_counter()
            loss, _, _, mems = trainer.train_step(features, mems)
            float(loss)
            times.append(time.perf_counter() - tic)
    print(json.dumps({"measured": tf.config.experimental.get_memory_info(device)["peak"],
                      "rss": 1024 * status_kib("VmHWM") - baseline, "step_s": times[1:]}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--gradient_accumulation_steps", default="1", help="K values, comma-separated")
    parser.add_argument("--recompute", default="off", help="off, on or off,on")
    parser.add_argument("--bfloat16", default="off", help="off, on or off,on")
    parser.add_argument("--rows", type=int, help="rows per replica instead of each shape's (K must divide its "
                        "forward-backward pairs)")
    parser.add_argument("--steps", type=int, default=3, help="steps per case (the first is not timed)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--micro_batches", type=int, default=1, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args._worker:
        args.recompute, args.bfloat16 = args.recompute == "on", args.bfloat16 == "on"
        return worker(args)

    from run_all import cpu_name

    from xlnet_data.pretrain import costs
    print(f"CPU: {cpu_name()}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| shape | rows | K | recompute | dtype | plan | RSS growth | plan / RSS | allocator peak | plan / allocator "
          "| step (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    cases = itertools.product(args.shapes.split(","), [int(k) for k in args.gradient_accumulation_steps.split(",")],
                              args.recompute.split(","), args.bfloat16.split(","))
    for shape, k, recompute, bfloat16 in cases:
        cfg = train_config(shape, k, recompute == "on", bfloat16 == "on", rows=args.rows)
        plan = costs.memory_plan(cfg.model, costs.step_shape(cfg, 1))
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
        result = subprocess.run([sys.executable, __file__, "--_worker", f"--shape={shape}", f"--micro_batches={k}",
                                 f"--recompute={recompute}", f"--bfloat16={bfloat16}", f"--steps={args.steps}",
                                 *([f"--rows={args.rows}"] if args.rows else [])],
                                env=env, capture_output=True, text=True)
        if result.returncode:
            raise SystemExit(f"{shape} K={k} failed:\n{result.stderr[-3000:]}")
        out = json.loads(result.stdout.strip().splitlines()[-1])
        step = statistics.median(out["step_s"]) if out["step_s"] else float("nan")
        rows.append(dict(shape=shape, k=k, recompute=recompute, bfloat16=bfloat16, plan=plan.total,
                         measured=out["measured"], rss=out["rss"], step_s=step, parts=dataclasses.asdict(plan)))
        print(f"| {shape} | {cfg.data.bsz_per_host} | {k} | {recompute} | {'bfloat16' if bfloat16 == 'on' else 'float32'} | "
              f"{costs.gb(plan.total)} | {costs.gb(out['rss'])} | {plan.total / out['rss']:.2f} | "
              f"{costs.gb(out['measured'])} | {plan.total / out['measured']:.2f} | {step:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)

if __name__ == "__main__":
    main()
