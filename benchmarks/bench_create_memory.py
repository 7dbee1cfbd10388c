"""Resident memory against the corpus's size (issue 45): create, and the trainers' cache input, at two sizes.

    python benchmarks/bench_create_memory.py [--sizes_mb=100,1000] [--core=0] [--corpus=shared|sample]
                                             [--pairs=1 --pair_sizes_mb=100] [--code=DIR --label=base]

For each size, a corpus of that many MB in 8 files: ../shared's seven books (data/corpus_en) repeated, each repeat
with its lines in another seeded order (--corpus=shared, the default where ../shared is), or sample_corpus/
repeated as it is (--corpus=sample). Then, each in a fresh process pinned to `--core` (the machine may be shared:
the figures are per process), its peak resident memory two ways, and its CPU time:

  maxrss    /usr/bin/time's maximum RSS (the kernel's high-water mark, read at exit; it misses the mapped pages
            that a unit drops with madvise before the mark is next updated)
  sampled   VmRSS read every 20 ms: the mapped token cache's pages counted while mapped (page cache the kernel
            may reclaim: a cgroup's limit drops them, it does not kill for them)

  create 2 passes   create --num_passes=2 --keep_cache (the passes read the task's mapped token cache), records
                    written
  cache input       the records of a --nowrite_records save_dir (the same cache, its pass 0) made from the token
                    cache by the input pipeline's generator (dataformat/examples/generated.py's GeneratedStream,
                    what train_gpu's, train_torch's (pretrain_torch/data.py) and dump's cache input run; without
                    TensorFlow or PyTorch, whose own memory does not grow with the corpus)
  create 1, memory  create --num_passes=1: the task encoded in memory for its one unit (the in-memory path)
  create 1, cache   create --num_passes=1 --keep_cache: the same unit from its mapped token cache

The last two (the speed of the mapped cache against the in-memory path) at the smallest size only, or at each of
--pair_sizes_mb, --pairs times, alternating (each pair's ratio of tokens/s and their median printed).
With `--code=DIR` (a checkout of another commit, e.g. `git archive d6719e9 | tar -x -C DIR`) the rows of its code
(PYTHONPATH=DIR; the two runs with --num_passes=1 apart, which an older create may not tell apart).
Prints the rows, then the growth in bytes a token between the smallest and largest size, and tokens/s (the
corpus's tokens over the process's CPU time). Output: Markdown lines for BENCHMARKS.md.
"""

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_cache import CONFIGS, SP_PATH, make_corpus  # noqa: E402
from run_all import cpu_name  # noqa: E402

SHARED_BOOKS = ROOT.parent / "shared" / "data" / "corpus_en"
NUM_FILES = 8

GENERATE = """
import sys
from xlnet_data.dataformat.examples import generated
units = generated.find_cache_units(sys.argv[1])
stream = generated.GeneratedStream(units, repeat=False)
print("records", sum(len(lengths) for _, _, lengths in stream.chunks()))
"""


def shuffled_corpus(directory, size_mb, num_files):
    """`num_files` files of size_mb / num_files MB: the shared books one after another, again and again, each
    time with its lines in another order (seeded) and a blank line after it (a document each)."""
    directory.mkdir(parents=True, exist_ok=True)
    books = [[line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
             for path in sorted(SHARED_BOOKS.glob("*.txt"))]
    rng, per_file = random.Random(0), int(size_mb * 1e6 / num_files)
    for i in range(num_files):
        with open(directory / f"part{i}.txt", "w", encoding="utf-8") as f:
            written = 0
            while written < per_file:
                for lines in books:
                    rng.shuffle(lines)
                    written += f.write("\n".join(lines) + "\n\n")
                    if written >= per_file:
                        break
    return str(directory / "*.txt")


def _sampled_peak(process, peak):
    """Reads the process's VmRSS every 20 ms into peak[0] while it runs."""
    while process.poll() is None:
        try:
            with open(f"/proc/{process.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.02)


def run(code_root, core, args):
    """(maxrss bytes, sampled peak RSS bytes, CPU seconds (user + system: a shared core's neighbours do not
    count), stderr) of `python args` in a fresh process pinned to `core`."""
    cmd = ["/usr/bin/time", "-f", "TIME %M %U %S", "taskset", "-c", str(core), sys.executable, *args]
    process = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(code_root), TF_CPP_MIN_LOG_LEVEL="3"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=code_root)
    peak = [0]
    # /usr/bin/time's child is the pinned Python: sample it, not time itself
    sampler = threading.Thread(target=_sampled_peak, args=(_Child(process), peak), daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    sampler.join()
    found = re.findall(r"TIME (\d+) ([\d.]+) ([\d.]+)", stderr)
    if process.returncode or not found:
        raise SystemExit(f"{' '.join(args)} failed:\n{stderr[-3000:]}")
    rss_kb, user, system = found[-1]
    return int(rss_kb) * 1024, peak[0], float(user) + float(system), stderr


class _Child:
    """The process that /usr/bin/time runs (taskset execs Python in place), found once it is there."""

    def __init__(self, process):
        self.process, self._pid = process, None

    def poll(self):
        return self.process.poll()

    @property
    def pid(self):
        if self._pid is None:
            try:
                with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as f:
                    self._pid = int(f.read().split()[0])
            except (OSError, IndexError):
                return self.process.pid
        return self._pid


def tokens_of(stderr):
    return int(re.search(r"done: \d+ unit\(s\), (\d+) tokens", stderr).group(1))


def create(code_root, core, corpus, save_dir, *extra):
    return run(code_root, core, ["-m", "xlnet_data.create", f"--input_glob={corpus}", f"--sp_path={SP_PATH}",
                                 f"--save_dir={save_dir}", "--num_workers=1", "--overwrite", *CONFIGS[128], *extra])


def rows_for(code_root, core, corpus, work, pairs):
    rows = {}
    rss, sampled, seconds, err = create(code_root, core, corpus, f"{work}/two", "--num_passes=2", "--keep_cache")
    tokens = tokens_of(err) // 2  # the summary counts each pass's tokens
    rows["create 2 passes"] = (rss, sampled, seconds, tokens)
    # the same save_dir's pass 0 cache-backed (its cache found, not encoded again); its records removed
    create(code_root, core, corpus, f"{work}/two", "--num_passes=1", "--nowrite_records", "--keep_cache")
    rss, sampled, seconds, _ = run(code_root, core, ["-c", GENERATE, f"{work}/two"])
    rows["cache input"] = (rss, sampled, seconds, tokens)
    shutil.rmtree(f"{work}/two")
    for pair in range(pairs):  # alternating, so that both see the same load
        for what, extra in (("create 1, memory", ()), ("create 1, cache", ("--keep_cache",))):
            rss, sampled, seconds, err = create(code_root, core, corpus, f"{work}/one", "--num_passes=1", *extra)
            rows[what + (f" #{pair + 1}" if pairs > 1 else "")] = (rss, sampled, seconds, tokens)
            shutil.rmtree(f"{work}/one")
    return rows


def pair_ratios(rows):
    """The cache's tokens/s over the in-memory path's, pair by pair (rows_for's `create 1` rows)."""
    memory = sorted(what for what in rows if what.startswith("create 1, memory"))
    return [rows[what][2] / rows[what.replace("memory", "cache")][2] for what in memory]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes_mb", default="100,1000")
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--corpus", choices=("shared", "sample"), default="shared" if SHARED_BOOKS.is_dir() else "sample")
    parser.add_argument("--pairs", type=int, default=1, help="alternating pairs of create --num_passes=1 in "
                        "memory and through the cache, at each of --pair_sizes_mb")
    parser.add_argument("--pair_sizes_mb", default="", help="the sizes with the pairs (default: the smallest)")
    parser.add_argument("--code", help="another checkout to measure instead of this one")
    parser.add_argument("--label", default="this", help="the code's name in the rows")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes_mb.split(",")]
    pair_sizes = [int(size) for size in args.pair_sizes_mb.split(",")] if args.pair_sizes_mb else sizes[:1]
    code_root = Path(args.code).resolve() if args.code else ROOT
    print(f"CPU: {cpu_name()}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; pinned to core {args.core}; "
          f"corpus: {args.corpus}")
    print("| code | MB of text | tokens | what | maxrss (MB) | sampled (MB) | CPU (s) | tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    table = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            corpus = (shuffled_corpus(Path(tmp, "corpus"), size, NUM_FILES) if args.corpus == "shared" else
                      make_corpus(Path(tmp, "corpus"), size, num_files=NUM_FILES))
            work, name = Path(tmp, "run"), args.label
            pairs = 0 if args.code else args.pairs if size in pair_sizes else 0
            rows = rows_for(code_root, args.core, corpus, work, pairs)
            for what, (rss, sampled, seconds, tokens) in rows.items():
                table[name, size, what] = (rss, sampled, tokens)
                print(f"| {name} | {size} | {tokens} | {what} | {rss / 1e6:.0f} | {sampled / 1e6:.0f} | {seconds:.1f} | "
                      f"{tokens / seconds:,.0f} |", flush=True)
            if pairs:
                ratios = pair_ratios(rows)
                print(f"{size} MB: the mapped cache's tokens/s over the in-memory path's, pair by pair: "
                      f"{', '.join(f'{ratio:.3f}' for ratio in ratios)}; median {statistics.median(ratios):.3f}; "
                      f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    small, large = sizes[0], sizes[-1]
    for (name, size, what), (rss, sampled, tokens) in sorted(table.items()):
        if size == large != small and (name, small, what) in table:  # one size: no growth
            rss0, sampled0, tokens0 = table[name, small, what]
            print(f"{name}, {what}: {(rss - rss0) / (tokens - tokens0):.2f} bytes a token of growth (maxrss), "
                  f"{(sampled - sampled0) / (tokens - tokens0):.2f} (sampled) from {small} to {large} MB")
    print(f"load at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
