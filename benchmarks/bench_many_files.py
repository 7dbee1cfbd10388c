"""create on many small files, one pass: seconds against the number of files (linear, or not).

    python benchmarks/bench_many_files.py [--counts=5000,10000,20000] [--root=DIR] [--repeat=1]

Each corpus is `count` files of LINES lines each (sentences of sample_corpus, about 900 tokens a file:
the encoded files a run of one pass holds in memory make a heap that grows with the count). `create`
runs in a subprocess pinned to one core (taskset -c 0), the seed blog's flags, one pass, one worker;
the figures are its wall time and its CPU time (user + system), medians of --repeat runs, and CPU
milliseconds per file. --root runs another checkout's create (e.g. the commit before, unpacked with
`git archive`), for the before/after comparison in BENCHMARKS.md.
"""

import argparse
import tempfile
from pathlib import Path

from bench_long_line import add_create_run_flags, median_create_times  # timed as bench_long_line times them

ROOT = Path(__file__).resolve().parents[1]
LINES = 30
FLAGS = ["--seq_len=128", "--reuse_len=64", "--bsz_per_host=8", "--num_core_per_host=1", "--use_tpu=False",
         "--bi_data=True", "--mask_alpha=6", "--mask_beta=1", "--num_predict=21", "--num_workers=1"]


def make_corpus(folder, count):
    lines = [line.strip() for p in sorted((ROOT / "sample_corpus").glob("*.txt"))
             for line in p.read_text(encoding="utf-8").splitlines() if len(line.split()) > 8]
    folder.mkdir()
    for i in range(count):
        (folder / f"doc{i:06d}.txt").write_text("\n".join(lines[(LINES * i + k) % len(lines)] for k in range(LINES)) + "\n",
                                                 encoding="utf-8")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="5000,10000,20000")
    add_create_run_flags(parser)
    args = parser.parse_args()
    print(f"root {args.root}\n\n| files | wall s | CPU s | CPU ms/file |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for count in map(int, args.counts.split(",")):
            corpus = Path(tmp) / f"c{count}"
            make_corpus(corpus, count)
            seconds, cpu = median_create_times(args, f"{corpus}/*.txt", f"{tmp}/out{count}", FLAGS)
            print(f"| {count} | {seconds:.1f} | {cpu:.1f} | {1000 * cpu / count:.2f} |", flush=True)


if __name__ == "__main__":
    main()
