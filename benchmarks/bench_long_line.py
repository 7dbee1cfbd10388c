"""create on one line without sentence boundaries: seconds against the line's size (linear, or not).

    python benchmarks/bench_long_line.py [--sizes_mb=1,4,16,50] [--root=DIR] [--repeat=1]

Each corpus is one file holding a line of `size` MB of words from sample_corpus (newlines turned into
spaces: no sentence boundary anywhere in it) followed by a few ordinary lines; the yardstick is the
same words, 20 to a line. `create` runs in a subprocess pinned to one core (taskset -c 0), the seed
blog's flags, one worker; the figures are its wall time and its CPU time (user + system: on a shared
machine the wall time of a pinned process counts its neighbours' time slices too), medians of --repeat
runs, and CPU seconds per MB.
--root runs another checkout's create (e.g. an older commit, unpacked with `git archive`), for the
before/after comparison in BENCHMARKS.md.
"""

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--seq_len=128", "--reuse_len=64", "--bsz_per_host=8", "--num_core_per_host=1", "--use_tpu=False",
         "--bi_data=True", "--mask_alpha=6", "--mask_beta=1", "--num_predict=21", "--num_workers=1"]


def make_corpus(path, size_mb, one_line=True):
    words = " ".join(" ".join(p.read_text(encoding="utf-8").split()) for p in sorted((ROOT / "sample_corpus").glob("*.txt")))
    line = ((words + " ") * (size_mb * 2**20 // len(words) + 1))[:size_mb * 2**20]
    if not one_line:
        tokens = line.split()
        line = "\n".join(" ".join(tokens[i:i + 20]) for i in range(0, len(tokens), 20))
    path.write_text(line + "\nA short sentence after it.\nAnd another one.\n", encoding="utf-8")



def add_create_run_flags(parser):
    """The flags median_create_times reads: which checkout's create, the model, repeats and the time limit."""
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose create is run")
    parser.add_argument("--sp_path", default=str(ROOT.parent / "shared" / "data" / "spiece" / "xlnet_cased_spiece.model"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)


def median_create_times(args, input_glob, save_dir_prefix, flags):
    """Median wall and CPU seconds of args.repeat runs of create on core 0 (inf for a run past args.timeout)."""
    times, cpu_times = [], []
    for i in range(args.repeat):
        start, children = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            run = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "xlnet_data.create",
                                  f"--input_glob={input_glob}", f"--sp_path={args.sp_path}",
                                  f"--save_dir={save_dir_prefix}-{i}", *flags],
                                 cwd=args.root, env={"PYTHONPATH": args.root, "PATH": "/usr/bin:/bin"},
                                 capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            times.append(float("inf"))
            cpu_times.append(float("inf"))
            continue
        if run.returncode != 0:
            sys.exit(run.stderr[-2000:])
        times.append(time.time() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_times.append(after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime)
    return statistics.median(times), statistics.median(cpu_times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes_mb", default="1,4,16,50")
    add_create_run_flags(parser)
    args = parser.parse_args()
    print(f"root {args.root}\n\n| MB | corpus | wall s | CPU s | CPU s/MB |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for size, one_line in ((int(s), one) for s in args.sizes_mb.split(",") for one in (True, False)):
            corpus = Path(tmp) / f"{size}-{one_line}.txt"
            make_corpus(corpus, size, one_line)
            seconds, cpu = median_create_times(args, str(corpus), f"{tmp}/out{size}-{one_line}", FLAGS)
            kind = "one line" if one_line else "20 words a line"
            print(f"| {size} | {kind} | {seconds:.1f} | {cpu:.1f} | {cpu / size:.2f} |", flush=True)


if __name__ == "__main__":
    main()
