"""Resident memory against the corpus's size (issue 45): create, and train_gpu's cache input, at two sizes.

    python benchmarks/bench_create_memory.py [--sizes_mb=10,100] [--core=0] [--code=DIR --label=base]

For each size, a corpus of that many MB (sample_corpus/ repeated into 8 files), then, each in a fresh process
pinned to `--core` (the machine may be shared: the figures are per process), its peak resident memory
(/usr/bin/time's maximum RSS, the page cache apart but mapped pages counted while mapped) and CPU time:

  create 2 passes   create --num_passes=2 (the passes read the task's token cache), records written
  create 1, memory  create --num_passes=1: the task encoded in memory for its one unit (the in-memory path)
  create 1, cache   create --num_passes=1 --keep_cache: the same unit from its mapped token cache
  cache input       the records of a --nowrite_records save_dir made from the token cache by the input
                    pipeline's generator (dataformat/examples/generated.py's GeneratedStream, what train_gpu's
                    and dump's cache input run; without TensorFlow, whose own memory does not grow with the corpus)

With `--code=DIR` (a checkout of another commit, e.g. `git archive d6719e9 | tar -x -C DIR`) the rows of its code
(PYTHONPATH=DIR; the two runs with --num_passes=1 apart, which an older create may not tell apart).
Prints the rows, then the growth in bytes a token between the
smallest and largest size, and tokens/s (the corpus's tokens over the process's CPU time).
Output: Markdown lines for BENCHMARKS.md.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_cache import CONFIGS, SP_PATH, make_corpus  # noqa: E402
from run_all import cpu_name  # noqa: E402

GENERATE = """
import sys
from xlnet_data.dataformat.examples import generated
units = generated.find_cache_units(sys.argv[1])
stream = generated.GeneratedStream(units, repeat=False)
print("records", sum(len(lengths) for _, _, lengths in stream.chunks()))
"""


def run(code_root, core, args):
    """(peak RSS bytes, CPU seconds (user + system: a shared core's neighbours do not count), stderr) of
    `python args` in a fresh process pinned to `core`."""
    cmd = ["/usr/bin/time", "-f", "TIME %M %U %S", "taskset", "-c", str(core), sys.executable, *args]
    result = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(code_root), TF_CPP_MIN_LOG_LEVEL="3"),
                            capture_output=True, text=True, cwd=code_root)
    found = re.findall(r"TIME (\d+) ([\d.]+) ([\d.]+)", result.stderr)
    if result.returncode or not found:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
    rss_kb, user, system = found[-1]
    return int(rss_kb) * 1024, float(user) + float(system), result.stderr


def tokens_of(stderr):
    return int(re.search(r"done: \d+ unit\(s\), (\d+) tokens", stderr).group(1))


def create(code_root, core, corpus, save_dir, *extra):
    return run(code_root, core, ["-m", "xlnet_data.create", f"--input_glob={corpus}", f"--sp_path={SP_PATH}",
                                 f"--save_dir={save_dir}", "--num_workers=1", "--overwrite", *CONFIGS[128], *extra])


def rows_for(code_root, core, corpus, work, one_pass):
    rows = {}
    rss, seconds, err = create(code_root, core, corpus, f"{work}/two", "--num_passes=2")
    tokens = tokens_of(err) // 2  # the summary counts each pass's tokens
    rows["create 2 passes"] = (rss, seconds, tokens)
    if one_pass:
        rss, seconds, err = create(code_root, core, corpus, f"{work}/one", "--num_passes=1")
        rows["create 1, memory"] = (rss, seconds, tokens)
        rss, seconds, err = create(code_root, core, corpus, f"{work}/one_cache", "--num_passes=1", "--keep_cache")
        rows["create 1, cache"] = (rss, seconds, tokens)
    create(code_root, core, corpus, f"{work}/cached", "--num_passes=1", "--nowrite_records")
    rss, seconds, _ = run(code_root, core, ["-c", GENERATE, f"{work}/cached"])
    rows["cache input"] = (rss, seconds, tokens)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes_mb", default="10,100")
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--code", help="another checkout to measure instead of this one")
    parser.add_argument("--label", default="this", help="the code's name in the rows")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes_mb.split(",")]
    code_root = Path(args.code).resolve() if args.code else ROOT
    print(f"CPU: {cpu_name()}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; pinned to core {args.core}")
    print("| code | MB of text | tokens | what | peak RSS (MB) | CPU (s) | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            corpus = make_corpus(Path(tmp, f"corpus{size}"), size, num_files=8)
            work, name = Path(tmp, f"run{size}"), args.label
            for what, (rss, seconds, tokens) in rows_for(code_root, args.core, corpus, work, not args.code).items():
                table[name, size, what] = (rss, tokens)
                print(f"| {name} | {size} | {tokens} | {what} | {rss / 1e6:.0f} | {seconds:.1f} | "
                      f"{tokens / seconds:,.0f} |", flush=True)
    small, large = sizes[0], sizes[-1]
    for (name, size, what), (rss, tokens) in sorted(table.items()):
        if size == large and (name, small, what) in table:
            rss0, tokens0 = table[name, small, what]
            print(f"{name}, {what}: {(rss - rss0) / (tokens - tokens0):.2f} bytes a token of growth from {small} "
                  f"to {large} MB")


if __name__ == "__main__":
    main()
