"""Throughput and memory of `create`, measured in one run against its yardsticks.

    python benchmarks/bench_create.py [--size_mb=10] [--rss_mb=100] [--original=DIR] [--parts=...] [--core=0]

For each configuration (seq_len 128, the seed blog's flags; seq_len 512, the paper's shape) it runs
`create` in a subprocess pinned to one core (taskset -c CORE) on corpora of `size_mb` and 2 x `size_mb`, and
reports the steady-state tokens/s: the difference of tokens over the difference of seconds, so that
start-up (imports, model loading, compiled-code cache) cancels. The yardstick is SentencePiece
encoding alone (read, strip, encode in batches), measured the same way on the same corpora; with
`--original` (a checkout of zihangdai/xlnet, see ../shared/README.md) the original data_utils.py is
measured the same way on smaller corpora.

`passes`: the marginal cost of a pass over the first one, for the original README's production
command scaled down to one core (seq_len 512, reuse 256, 16 rows, 4 TPU cores, bi_data): `create`
with --num_passes=1 and with --num_passes=5 on both corpora, SentencePiece alone on both in the same
round; a further pass costs ((t5 - t1) on the large corpus - (t5 - t1) on the small one) / 4 seconds
for the difference in tokens, so start-up and any fixed cost of a unit cancel; reported per token
and as a fraction of SentencePiece's seconds per token.

`rss`: the peak RSS of one `create` on an `rss_mb` corpus, as bytes per token over a tiny run's RSS
(one pass: the task encoded in memory; and again with --keep_cache, through the token cache), and
the size of the token cache on disk per token.
`scaling`: the steady-state speed-up from one worker on one core to two workers on two cores, on two
tasks of one pass, and on one task of four passes. Each figure is the median of `--repeat` runs.
Output is a Markdown report (also for BENCHMARKS.md). The corpora are made from `--source`
(default: sample_corpus/, not ../shared).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CONFIGS = {
    "seq_len 128": ["--seq_len=128", "--reuse_len=64", "--bsz_per_host=8", "--num_core_per_host=1",
                    "--bi_data=True", "--mask_alpha=6", "--mask_beta=1", "--num_predict=21"],
    "seq_len 512": ["--seq_len=512", "--reuse_len=256", "--bsz_per_host=8", "--num_core_per_host=1",
                    "--bi_data=True", "--mask_alpha=6", "--mask_beta=1", "--num_predict=85"],
}


MULTI_PASS = ["--seq_len=512", "--reuse_len=256", "--bsz_per_host=16", "--num_core_per_host=4", "--use_tpu=True",
              "--bi_data=True", "--mask_alpha=6", "--mask_beta=1", "--num_predict=85"]
NUM_PASSES = 5


def make_corpus(directory, size_mb, source_files, num_files=4):
    """`num_files` files of about size_mb / num_files MB each, made of the source books repeated."""
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(Path(p).read_text(encoding="utf-8") for p in source_files)
    per_file = int(size_mb * 1e6 / num_files)
    for i in range(num_files):
        repeats = max(1, round(per_file / len(text.encode("utf-8"))))
        (directory / f"part{i}.txt").write_text(text * repeats if per_file >= len(text) else
                                               text[:per_file].rsplit("\n", 1)[0] + "\n", encoding="utf-8")
    return str(directory / "*.txt")


CLOCK = {"name": "cpu"}  # --clock: what `seconds` means for the one-core figures
CORE = {"one": "0"}  # --core: the core of the one-core figures


def timed(cmd, env=None, cores=None, clock=None):
    """(seconds, peak RSS in bytes, stdout+stderr) of one command, pinned to `cores` (taskset's list; None:
    --core).

    seconds: the command's CPU time (user + system, its reaped children included) with the "cpu" clock,
    its user time alone with "user", else wall time. On a shared machine the wall time of a pinned process
    counts its neighbours' time slices too; its CPU time does not. On a VM whose free memory goes back to
    the host (free page reporting), a first touch of such memory costs system time that depends on what
    ran before: "user" leaves that out (and the kernel's real work for the process too, such as copying
    its writes to the page cache).
    """
    cores = CORE["one"] if cores is None else cores
    if cores:
        cmd = ["taskset", "-c", cores, *cmd]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if (clock or CLOCK["name"]) == "cpu":
        seconds = usage.ru_utime + usage.ru_stime
    elif (clock or CLOCK["name"]) == "user":
        seconds = usage.ru_utime
    if status != 0:
        raise SystemExit(f"failed ({status}): {' '.join(cmd)}\n{output[-3000:]}")
    return seconds, usage.ru_maxrss * 1024, output


def text_settings(sp_path):
    """create's uncased and keep_accents for a model: as spm_train trained it (PREFIX.text.json beside it, which a
    user's create checks too), else none: create's defaults (XLNet's model has no such file)."""
    settings = Path(sp_path).with_suffix(".text.json")
    trained = json.loads(settings.read_text()) if settings.exists() else {}
    return {name: trained[name] for name in ("uncased", "keep_accents") if name in trained}


def text_flags(sp_path):
    return [f"--{'' if value else 'no'}{name}" for name, value in text_settings(sp_path).items()]


def run_create(input_glob, save_dir, flags, sp_path, workers=1, extra=(), cores=None, clock=None):
    cmd = [sys.executable, "-m", "xlnet_data.create", f"--input_glob={input_glob}", f"--sp_path={sp_path}",
           f"--save_dir={save_dir}", f"--num_workers={workers}", "--overwrite", *text_flags(sp_path), *flags, *extra]
    seconds, rss, output = timed(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), cores=cores, clock=clock)
    tokens = int(re.search(r"done: \d+ unit\(s\), (\d+) tokens", output).group(1))
    passes = next((int(f.split("=")[1]) for f in extra if f.startswith("--num_passes=")), 1)
    return seconds, rss, tokens // passes  # every pass of a task counts the task's tokens: the corpus's tokens


def run_encode_only(input_glob, sp_path):
    seconds, _, output = timed([sys.executable, __file__, "--encode_only", input_glob, sp_path])
    return seconds, int(output.strip().splitlines()[-1])


def run_original(reference, input_glob, save_dir, flags, sp_path):
    cmd = [sys.executable, str(SHARED / "tools" / "run_original.py"), f"--input_glob={input_glob}",
           f"--sp_path={sp_path}", f"--save_dir={save_dir}", *flags]
    env = dict(os.environ, XLNET_REF=reference, TF_CPP_MIN_LOG_LEVEL="3")
    seconds, _, output = timed(cmd, env=env)
    # The original logs no token count; ours, run on the same corpus, gives it.
    return seconds


def encode_only(input_glob, sp_path):
    """The yardstick: SentencePiece alone over the corpus lines (stripped), in batches, single-threaded."""
    import glob

    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=sp_path)
    tokens = 0
    for path in sorted(glob.glob(input_glob)):
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        for i in range(0, len(lines), 20000):
            tokens += sum(map(len, sp.encode([line for line in lines[i:i + 20000] if line], num_threads=1)))
    print(tokens)


def steady(run, small, large, repeat):
    """Steady-state rate: (tokens large - tokens small) / (seconds large - seconds small), so that start-up
    cancels. `run(corpus) -> (seconds, tokens)`; the two sizes alternate, so that drift of a shared machine
    hits both; returns (median, lowest, highest) over the `repeat` pairs."""
    rates = []
    for _ in range(repeat):
        (t1, n1), (t2, n2) = run(small), run(large)
        rates.append((n2 - n1) / (t2 - t1))
    return statistics.median(rates), min(rates), max(rates)


def _rate(stats):
    return f"{stats[0]:,.0f} ({stats[1]:,.0f}-{stats[2]:,.0f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_mb", type=float, default=10, help="smaller corpus size; the larger is twice it")
    parser.add_argument("--rss_mb", type=float, default=100, help="corpus size for the peak-RSS run (0: skip)")
    parser.add_argument("--original", help="checkout of zihangdai/xlnet to measure side by side")
    parser.add_argument("--original_mb", type=float, default=0.5, help="smaller corpus size for the original")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--sp_path", default=str(SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"))
    parser.add_argument("--source", default=str(ROOT / "sample_corpus"),
                        help="folder of .txt books the corpora are built from")
    parser.add_argument("--parts", default="throughput,passes,rss,scaling", help="what to measure, comma-separated")
    parser.add_argument("--clock", choices=("cpu", "user", "wall"), default="cpu",
                        help="seconds of the one-core figures: CPU time (default; robust on a shared machine), user "
                             "time alone (see timed()), or wall")
    parser.add_argument("--core", default="0", help="the core the one-core figures are pinned to (taskset -c)")
    parser.add_argument("--encode_only", nargs=2, metavar=("GLOB", "SP_PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.encode_only:
        return encode_only(*args.encode_only)
    CLOCK["name"] = args.clock
    CORE["one"] = args.core

    books = sorted(Path(args.source).glob("*.txt"))
    if not books:
        raise SystemExit(f"no .txt books in {args.source}; pass --source=sample_corpus")
    work = Path(tempfile.mkdtemp(prefix="bench_create_"))
    small = make_corpus(work / "small", args.size_mb, books)
    large = make_corpus(work / "large", 2 * args.size_mb, books)
    out = work / "out"
    report = [f"corpora: {args.size_mb:g} MB and {2 * args.size_mb:g} MB from {args.source}; "
              f"median of {args.repeat}; one core (taskset -c {args.core}) unless said, {args.clock} time; "
              f"scaling in wall time; {os.cpu_count()} CPUs", ""]

    parts = args.parts.split(",")
    if "throughput" in parts:
        report += throughput(args, work, small, large, out, books)
    if "passes" in parts:
        report += marginal_pass(args, small, large, out)
    if "rss" in parts:
        report += peak_rss(args, work, out, books)
    if "scaling" in parts:
        report += scaling(args, small, large, out)
    print("\n".join(report))


def throughput(args, work, small, large, out, books):
    encode = steady(lambda g: run_encode_only(g, args.sp_path), small, large, args.repeat)
    report = ["| configuration | create tokens/s | SentencePiece-only tokens/s | ratio | original tokens/s | speed-up |",
              "|---|---|---|---|---|---|"]
    for name, flags in CONFIGS.items():
        rate = steady(lambda g, flags=flags: run_create(g, out, flags, args.sp_path)[::2], small, large, args.repeat)
        original, speedup = "", ""
        if args.original:
            o_small = make_corpus(work / "o_small", args.original_mb, books)
            o_large = make_corpus(work / "o_large", 2 * args.original_mb, books)
            tokens = {g: run_create(g, out, flags, args.sp_path)[2] for g in (o_small, o_large)}
            def run_it(g, flags=flags, tokens=tokens):
                return run_original(args.original, g, work / "o_out", flags, args.sp_path), tokens[g]
            o_rate = steady(run_it, o_small, o_large, args.repeat)
            original, speedup = _rate(o_rate), f"{rate[0] / o_rate[0]:.1f}x"
        ratio = rate[0] / encode[0]
        report.append(f"| {name} | {_rate(rate)} | {_rate(encode)} | {ratio:.2f} | {original} | {speedup} |")
    return report + ["", "(median, then lowest-highest, of the per-pair steady-state rates)"]


def marginal_pass(args, small, large, out):
    """Seconds per token of a further pass against SentencePiece's, start-up cancelled (see the docstring)."""
    ratios, pass_costs, encode_costs, first_ratios = [], [], [], []
    for _ in range(args.repeat):
        runs = {}
        for corpus in (small, large):  # alternating, so that drift of a shared machine hits every figure
            runs[corpus] = (run_encode_only(corpus, args.sp_path),
                            run_create(corpus, out, MULTI_PASS, args.sp_path, extra=["--num_passes=1"]),
                            run_create(corpus, out, MULTI_PASS, args.sp_path, extra=[f"--num_passes={NUM_PASSES}"]))
        (sp_s, sp_n_s), (one_s, _, n_s), (all_s, _, _) = runs[small]
        (sp_l, sp_n_l), (one_l, _, n_l), (all_l, _, _) = runs[large]
        encode_cost = (sp_l - sp_s) / (sp_n_l - sp_n_s)
        pass_cost = ((all_l - one_l) - (all_s - one_s)) / (NUM_PASSES - 1) / (n_l - n_s)
        encode_costs.append(encode_cost)
        pass_costs.append(pass_cost)
        ratios.append(pass_cost / encode_cost)
        first_ratios.append(encode_cost / ((one_l - one_s) / (n_l - n_s)))
    return ["", f"a further pass ({' '.join(MULTI_PASS)}, {NUM_PASSES} passes): "
                f"{statistics.median(pass_costs) * 1e9:.0f} ns/token; SentencePiece alone "
                f"{statistics.median(encode_costs) * 1e9:.0f} ns/token; a further pass / SentencePiece alone: "
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}); "
                f"the first pass (encode stage + pass) at {statistics.median(first_ratios):.2f} of SentencePiece's "
                "speed"]


def peak_rss(args, work, out, books):
    flags = CONFIGS["seq_len 128"]
    tiny = make_corpus(work / "tiny", 0.2, books, num_files=1)
    base_rss = statistics.median(run_create(tiny, out, flags, args.sp_path)[1] for _ in range(args.repeat))
    big = make_corpus(work / "big", args.rss_mb, books, num_files=1)
    seconds, rss, tokens = run_create(big, out, flags, args.sp_path)  # one pass: encoded in memory
    _, cache_rss, _ = run_create(big, out, flags, args.sp_path, extra=["--keep_cache"])  # through the token cache
    cache = out / "token_cache"
    cache_bytes = sum(p.stat().st_size for p in cache.iterdir())
    shutil.rmtree(cache)
    return ["", f"peak RSS, one {args.rss_mb:g} MB file (seq_len 128): {rss / 2**20:,.0f} MiB for {tokens:,} "
                f"tokens; a 0.2 MB run: {base_rss / 2**20:,.0f} MiB; growth {(rss - base_rss) / tokens:.2f} "
                f"bytes/token ({seconds:.1f} s); with --keep_cache (the encode stage, then the pass from the cache) "
                f"{(cache_rss - base_rss) / tokens:.2f}; token cache on disk {cache_bytes / tokens:.3f} bytes/token"]


def scaling(args, small, large, out):
    """One worker on one core against two workers on two cores, steady state as above: two tasks of one
    pass, and one task of four passes (the encode stage, then the passes in parallel)."""
    report = [""]
    for name, extra in (("2 tasks", ["--num_task=2"]), ("1 task of 4 passes", ["--num_passes=4"])):
        rates = {}
        for workers, cores in ((1, args.core), (2, "0,1")):
            def run_it(g, workers=workers, cores=cores, extra=extra):
                return run_create(g, out, CONFIGS["seq_len 128"], args.sp_path, workers=workers, extra=extra,
                                  cores=cores, clock="wall")[::2]
            rates[workers] = steady(run_it, small, large, args.repeat)
        report.append(f"{name} (seq_len 128), steady state: 1 worker on 1 core {_rate(rates[1])} tokens/s, "
                      f"2 workers on 2 cores {_rate(rates[2])} tokens/s, speed-up {rates[2][0] / rates[1][0]:.2f}x")
    return report


if __name__ == "__main__":
    main()
