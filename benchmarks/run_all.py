"""The headline table of BENCHMARKS.md in one command, every figure next to its yardstick from the same run.

    python benchmarks/run_all.py                                   # the figures BENCHMARKS.md quotes
    python benchmarks/run_all.py --size_mb=1 --repeat=1 --rss_mb=10 --rounds=1 --steps=5   # a quick check

Runs, one after the other, each pinned to one core (taskset -c CORE):
  bench_create.py --parts=throughput,passes,rss --original=ORIGINAL: create's steady-state tokens/s against
    SentencePiece encoding alone and against the original data_utils.py; a further pass against
    SentencePiece alone; the peak RSS per token;
  bench_train.py step --shapes=issue --original=ORIGINAL: train_gpu's step against the original's graph
    (../shared/tools/original_train_step.py), same shape and initial weights (that script pins to core 0);
and prints Markdown for BENCHMARKS.md: the commit (and whether the tree had uncommitted changes), the CPU,
the date, the load average before and after, this command, the headline table, then each script's report.
ORIGINAL defaults to ../shared/xlnet_original (zihangdai/xlnet, unchanged).
"""

import argparse
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORIGINAL = ROOT.parent / "shared" / "xlnet_original"


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(script, *args):
    """A benchmark script's report (its stdout); its stderr passes through."""
    command = [sys.executable, str(ROOT / "benchmarks" / script), *map(str, args)]
    print(f"$ {shlex.join(command)}", file=sys.stderr, flush=True)
    result = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3"))
    if result.returncode != 0:
        raise SystemExit(f"run_all: error: {script} failed (exit status {result.returncode})")
    return result.stdout


def find(pattern, text, default="(not in the report)"):
    match = re.search(pattern, text, re.MULTILINE)
    return match.group(1) if match else default


def headline(create_report, step_report):
    rows = []
    for seq_len in (128, 512):
        cells = find(rf"^\| seq_len {seq_len} \|(.*)\|$", create_report, "").split("|")
        if len(cells) == 5:
            ours, encode, ratio, original, speedup = (cell.strip() for cell in cells[:5])
            rows.append((f"create, one pass, seq_len {seq_len}: tokens/s", ours.split(" (")[0],
                         f"SentencePiece alone {encode.split(' (')[0]}", f"**{ratio}**", "≥ 0.6"))
            rows.append((f"create, one pass, seq_len {seq_len}: tokens/s", ours.split(" (")[0],
                         f"the original data_utils.py {original.split(' (')[0]}", f"**{speedup}**", ""))
    further = find(r"a further pass / SentencePiece alone: ([0-9.]+)", create_report)
    pass_ns = find(r"a further pass .*?: (\d+ ns/token)", create_report)
    encode_ns = find(r"SentencePiece alone (\d+ ns/token)", create_report)
    rows.append(("create, a further pass (seq_len 512, 5 passes)", pass_ns, f"SentencePiece alone {encode_ns}",
                 f"**{further}**", "≤ 0.4"))
    rows.append(("create, peak RSS growth (one file, seq_len 128)",
                 find(r"growth ([0-9.]+ bytes/token)", create_report), "", "", "≤ 6 bytes/token"))
    cpu_ms = r"\s+CPU\s+(\S+ \(\S+\))"  # bench_train step's lines: CPU ms, median (min-max), then wall ms, ratios
    original_ms = find(r"^\s+original" + cpu_ms, step_report)
    hf_ms = find(r"^\s+Hugging Face XLNetLMHeadModel" + cpu_ms, step_report)
    for ours, ms, ratio, hf_ratio in re.findall(r"^\s+(train_gpu \S+)" + cpu_ms + r".*?([0-9.]+x) original"
                                                r"(?:\s+([0-9.]+x) Hugging)?", step_report, re.MULTILINE):
        rows.append((f"train_gpu step, issue shape, CPU ms/step ({ours})", ms, f"the original's graph {original_ms}",
                     f"**{ratio}**", "≤ 0.7x"))
        if hf_ratio:
            rows.append((f"train_gpu step, issue shape, CPU ms/step ({ours})", ms,
                         f"Hugging Face's PyTorch XLNetLMHeadModel {hf_ms}", f"**{hf_ratio}**", "≤ 0.9x"))
    table = ["| figure | ours | yardstick, same run | ratio | goal |", "|---|---|---|---|---|"]
    return table + [f"| {' | '.join(row)} |" for row in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_mb", type=float, default=8, help="create: the smaller corpus (the larger is twice)")
    parser.add_argument("--original_mb", type=float, default=0.5, help="create: the original's smaller corpus")
    parser.add_argument("--rss_mb", type=float, default=100, help="create: the corpus of the peak-RSS run")
    parser.add_argument("--repeat", type=int, default=5, help="create: pairs of runs per figure (median)")
    parser.add_argument("--rounds", type=int, default=3, help="step: alternating runs of each implementation")
    parser.add_argument("--steps", type=int, default=20, help="step: timed steps per run")
    parser.add_argument("--core", default="0", help="the core every figure is pinned to (taskset -c)")
    parser.add_argument("--original", default=str(ORIGINAL), help="a checkout of zihangdai/xlnet")
    args = parser.parse_args()

    commit = git("rev-parse", "--short", "HEAD")
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    load_before = load_average()
    create_report = run("bench_create.py", f"--size_mb={args.size_mb:g}", f"--original_mb={args.original_mb:g}",
                        f"--rss_mb={args.rss_mb:g}", f"--repeat={args.repeat}", f"--core={args.core}",
                        "--parts=throughput,passes,rss", f"--original={args.original}")
    step_report = run("bench_train.py", "step", "--shapes=issue", f"--original={args.original}",
                      f"--rounds={args.rounds}", f"--steps={args.steps}")
    command = shlex.join(["python", "benchmarks/run_all.py", *sys.argv[1:]])
    print("\n".join([
        f"Commit {commit}{dirty}; {cpu_name()}, {os.cpu_count()} CPUs; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average {load_before} before, "
        f"{load_average()} after. Command:", "", f"    {command}", "",
        *headline(create_report, step_report), "",
        "<details><summary>the scripts' reports</summary>", "", "```", create_report.rstrip(), "",
        step_report.rstrip(), "```", "", "</details>"]))


if __name__ == "__main__":
    main()
