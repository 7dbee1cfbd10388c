"""What the held-out loss costs a run: train_gpu with evaluation off and on, per core.

    taskset -c 0 python benchmarks/bench_eval.py [--rounds=3] [--shape=A] [--steps=40] [--eval_every=10]

Records: create on the train and dev splits of one save_dir (the train split: the first 300 lines of Emma; the
dev split: the next 200, 19 batches), with the real XLNet SentencePiece model (../shared), the shape's seq_len,
8 rows, bi_data. Per round, alternating: train_gpu for --steps with --eval_every=0 (off) and with --eval_every
and --eval_batches (on). Timed from train_gpu's own log lines (absl's timestamps), so that neither start-up nor
tracing counts: from the first evaluation's line (on; the evaluation step traced) or the same step's training
line (off) to the last step's line. In between, the same training steps, and in the run with evaluation on
the evaluations after the first. Prints the medians: seconds per training step, seconds per evaluation and per
held-out batch, a held-out batch against a training step, and the run's time with evaluation on against off.
"""

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dry_run import ROOT, SHAPES, SPM, command
from run_all import cpu_name, git, load_average


def make_splits(work, seq_len, reuse_len, num_predict, sp_path):
    """A save_dir with a train and a dev split of Emma, and the dev split's number of batches."""
    save_dir = os.path.join(work, "records")
    with open(os.path.join(ROOT, "sample_corpus", "austen_emma.txt")) as f:
        lines = f.read().splitlines()
    for split, part in (("train", lines[:300]), ("dev", lines[300:500])):
        text = os.path.join(work, split)
        os.makedirs(text)
        with open(os.path.join(text, "emma.txt"), "w") as f:
            f.write("\n".join(part) + "\n")
        command("xlnet_data.create", f"--input_glob={text}/*.txt", f"--sp_path={sp_path}", f"--save_dir={save_dir}",
                f"--split={split}", "--bsz_per_host=8", "--num_core_per_host=1", f"--seq_len={seq_len}",
                f"--reuse_len={reuse_len}", "--bi_data", f"--num_predict={num_predict}", "--num_workers=1")
    dev_batches = 0
    for path in glob.glob(os.path.join(save_dir, "tfrecords", "record_info-dev-*.json")):
        with open(path) as f:
            dev_batches += json.load(f)["num_batch"]
    return save_dir, dev_batches


_LINE = re.compile(r"^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*\] step (\d+) \| (held-out loss|loss)", re.M)


def timed_span(stderr, first_step, last_step, kind):
    """Seconds between the log line of `kind` ("held-out loss" or "loss") at first_step and the training line
    at last_step."""
    times = {}
    for day, clock, step, what in _LINE.findall(stderr):
        times[int(step), what] = datetime.datetime.strptime(day + " " + clock, "%m%d %H:%M:%S.%f")
    return (times[last_step, "loss"] - times[first_step, kind]).total_seconds()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="A", choices=sorted(SHAPES), help="bench_dry_run's shapes")
    parser.add_argument("--steps", type=int, default=40, help="steps of each run")
    parser.add_argument("--eval_every", type=int, default=10)
    parser.add_argument("--eval_batches", type=int, default=20, help="more than the dev split's: all of them")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sp_path", default=SPM, help="the SentencePiece model of the records (default: ../shared's)")
    args = parser.parse_args()
    seq_len, reuse_len, num_predict, flags, _ = SHAPES[args.shape]
    work = tempfile.mkdtemp(prefix="bench_eval")
    spans = {"off": [], "on": []}
    try:
        records, dev_batches = make_splits(work, seq_len, reuse_len, num_predict, args.sp_path)
        batches = min(dev_batches, args.eval_batches)
        print(f"CPU: {cpu_name()}; commit {git('rev-parse', '--short', 'HEAD')}; load {load_average()}; "
              f"shape {args.shape}; {args.steps} steps; on: --eval_every={args.eval_every} "
              f"--eval_batches={args.eval_batches} ({batches} held-out batches)", flush=True)
        for round_ in range(args.rounds):
            for evaluation, eval_flags in (("off", ["--eval_every=0"]), ("on", [
                    f"--eval_every={args.eval_every}", f"--eval_batches={args.eval_batches}"])):
                model_dir = os.path.join(work, f"model_{round_}_{evaluation}")
                result, _ = command("xlnet_data.train_gpu", f"--record_info_dir={records}", f"--model_dir={model_dir}",
                                    *flags, f"--train_steps={args.steps}", f"--iterations={args.eval_every}",
                                    f"--save_steps={2 * args.steps}", *eval_flags)
                spans[evaluation].append(timed_span(result.stderr, args.eval_every, args.steps,
                                                    "held-out loss" if evaluation == "on" else "loss"))
                shutil.rmtree(model_dir)
            print(f"round {round_ + 1}: off {spans['off'][-1]:.2f} s, on {spans['on'][-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    steps = args.steps - args.eval_every
    evaluations = steps // args.eval_every  # those after the first
    off, on = statistics.median(spans["off"]), statistics.median(spans["on"])
    per_step, per_eval = off / steps, (on - off) / evaluations
    print(f"| training step | evaluation ({batches} batches) | held-out batch | batch / step | run, on / off |")
    print("|---|---|---|---|---|")
    print(f"| {per_step:.3f} s | {per_eval:.2f} s | {per_eval / batches:.3f} s | {per_eval / batches / per_step:.2f} | "
          f"{on / off:.3f} |")


if __name__ == "__main__":
    main()
