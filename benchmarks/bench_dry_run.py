"""train_gpu --dry_run's projected wall time against a real run of the same steps, at two shapes.

    python benchmarks/bench_dry_run.py                        # tiny (300 steps) and shape A (30 steps)
    python benchmarks/bench_dry_run.py --shapes=tiny --rounds=3

Records: create on sample_corpus/ with the real XLNet SentencePiece model (../shared), seq_len 64 for the tiny
shape, 128 for shape A (bench_train's "issue" shape: 4 layers, d_model 256, 4 heads of 64, d_inner 1024,
mem_len 64), 8 rows, bi_data; a few steps of them, repeated. Per round: `train_gpu --dry_run` (its
"projected: ... (N s)") then the same command without --dry_run, timed from its launch to its exit as `time`
would (start-up, steps, log lines, the final checkpoint). Prints both and their ratio.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SPM = os.path.join(ROOT, "..", "shared", "data", "spiece", "xlnet_cased_spiece.model")
SHAPES = {  # name -> (records' seq_len, reuse_len, num_predict, train_gpu flags, steps)
    "tiny": (64, 32, 10, ["--n_layer=2", "--d_model=32", "--n_head=2", "--d_head=16", "--d_inner=64", "--mem_len=32"],
             300),
    "A": (128, 64, 21, ["--n_layer=4", "--d_model=256", "--n_head=4", "--d_head=64", "--d_inner=1024",
                        "--mem_len=64"], 30),
}


def command(module, *args):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    tic = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{module} failed:\n{result.stderr[-3000:]}")
    return result, time.perf_counter() - tic


def make_records(work, seq_len, reuse_len, num_predict, sp_path):
    save_dir = os.path.join(work, f"records{seq_len}")
    text = os.path.join(work, f"text{seq_len}")
    os.makedirs(text, exist_ok=True)
    with open(os.path.join(ROOT, "sample_corpus", "austen_emma.txt")) as f:
        lines = f.read().splitlines()[:300]
    with open(os.path.join(text, "emma.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    command("xlnet_data.create", f"--input_glob={text}/*.txt", f"--sp_path={sp_path}", f"--save_dir={save_dir}",
            "--bsz_per_host=8", "--num_core_per_host=1", f"--seq_len={seq_len}", f"--reuse_len={reuse_len}",
            "--bi_data", f"--num_predict={num_predict}", "--num_workers=1")
    return save_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,A")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dry_run_steps", type=int, default=5)
    parser.add_argument("--sp_path", default=SPM, help="the SentencePiece model of the records (default: ../shared's)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_dry_run")
    print("| shape | steps | dry run: first step (s) | dry run: per step (s) | projected (s) | real run (s) | "
          "projected / real |")
    print("|---|---|---|---|---|---|---|")
    try:
        for name in args.shapes.split(","):
            seq_len, reuse_len, num_predict, flags, steps = SHAPES[name]
            records = make_records(work, seq_len, reuse_len, num_predict, args.sp_path)
            for round_ in range(args.rounds):
                model_dir = os.path.join(work, f"model_{name}_{round_}")
                run = [f"--record_info_dir={records}", f"--model_dir={model_dir}", *flags, f"--train_steps={steps}",
                       f"--iterations={max(steps // 10, 1)}"]
                dry, _ = command("xlnet_data.train_gpu", *run, "--dry_run", f"--dry_run_steps={args.dry_run_steps}")
                projected = float(re.search(r"projected: .* \(([\d,.]+) s\)", dry.stdout)[1].replace(",", ""))
                first, per_step = re.search(r"the first step ([\d.]+) s after start .* then ([\d.e+-]+) s per step",
                                            dry.stdout).groups()
                assert not os.path.exists(model_dir), "the dry run wrote to its model_dir"
                _, real = command("xlnet_data.train_gpu", *run)
                print(f"| {name} | {steps} | {first} | {per_step} | {projected:.1f} | {real:.1f} | "
                      f"{projected / real:.2f} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
