"""Our unigram encoder against SentencePiece, and create's one pass against SentencePiece alone, per core, by language.

    taskset -c 0 python benchmarks/bench_encoder.py [--rounds=5] [--size_mb=16] [--before_root=CHECKOUT]
        [--zh_text=GLOB --zh_sp_path=MODEL] [--ja_text=GLOB --ja_sp_path=MODEL]

Every text is real prose of its language with a model made for that language: English, the seven books of
../shared/data/corpus_en with XLNet's cased model (`--en_sp_path`); Chinese and Japanese, the novels and models
that benchmarks/real_text.py makes (`--zh_text=/work/bench_text/zh/*.txt --zh_sp_path=/work/bench_text/zh.model`;
a language without its text is left out). Each text is normalised by create's preprocess_texts first, with the
model's uncased and keep_accents (its PREFIX.text.json, as spm_train wrote it; none: cased, accents removed), and
create runs with the same flags.

Timed, CPU time (time.process_time), all of them in turn in each round, after a warm-up round; medians:
- `sp`: SentencePiece's batch call, sp.encode(list_of_lines, num_threads=1): the yardstick;
- `sp own`: the same call timed in a process of its own that holds nothing but the lines and the model (a child
  process; its time of the call alone). The call makes a Python list a line, so its time includes Python's cyclic
  collector, whose full collections scan every object the process holds: in this process, which holds both
  encoders and each round's results, the call is slower (235 against 172.5 ns a token on Chinese with the collector
  on and off), so create is set against both, and `sp own` is the stricter yardstick;
- `today`: text.Encoder(sp, encoder="sentencepiece").encode_batch: SentencePiece's buffer call and the
  digit-comma rule (create's encoder before ours);
- `ours`: unigram.UnigramEncoder.encode_ids, and `ours+dc`: text.Encoder(sp, encoder="ours").encode_batch
  (with the digit-comma rule, as create calls it);
- create's one pass (`python -m xlnet_data.create`'s flags and library call, one task, one pass, one worker,
  seq_len 512, 32 rows) with --encoder=sentencepiece and --encoder=ours, and `--before_root`'s create with its own
  default, on the raw lines and on the first half of them: each checkout's create in a process of its own that
  runs it on each once a round; all less half is create's cost of the added tokens. Its ids per second are set
  against `sp`'s and `sp own`'s, the yardsticks the issue checks create by (SentencePiece alone on the
  normalised lines), round by round: the median ratio and the lowest and highest.
  Timed in one process, create's start-up (imports, the compiled code's cache, the model's parse: ~2 CPU s
  that spread by +-0.3 s from one process to the next on this VM) is in no run; each run still maps fresh
  memory and faults it in on first touch, as create in a process of its own does.
"""

import argparse
import contextlib
import glob
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_create  # noqa: E402
from run_all import cpu_name, git, load_average  # noqa: E402

SHARED = ROOT.parent / "shared"
XLNET_MODEL = SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"


def text_settings(sp_path):
    """(uncased, keep_accents) of a model: as spm_train trained it, else XLNet's cased model's (False, False)."""
    trained = {"uncased": False, "keep_accents": False, **bench_create.text_settings(sp_path)}
    return trained["uncased"], trained["keep_accents"]


def corpora(texts, size_mb):
    """{language: (raw lines, normalised lines, model)} of the (language, glob, model) `texts` given, each text
    repeated to `size_mb` MB or more."""
    from xlnet_data.datagen.text import preprocess_texts
    found = {}
    for language, pattern, sp_path in texts:
        lines = [line for path in sorted(glob.glob(pattern))
                 for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        if lines:
            lines *= math.ceil(size_mb * 1e6 / sum(len(line.encode("utf-8")) + 1 for line in lines))
            found[language] = (lines, preprocess_texts(lines, *text_settings(sp_path)), sp_path)
    return found


def timed(calls, rounds):
    """{name: [CPU seconds a round]} of `calls`, run in turn `rounds` times after one warm-up round. A call that
    returns a number gives its own seconds (a child process's)."""
    seconds = {name: [] for name in calls}
    for round_number in range(rounds + 1):
        for name, call in calls.items():
            start = time.process_time()
            took = call()
            if round_number:
                seconds[name].append(took if isinstance(took, float) else time.process_time() - start)
    return seconds


# The yardstick's child: the lines (one a line of the file, UTF-8) encoded once, the call's CPU seconds printed.
SP_CHILD = """import sys, time, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
lines = open(sys.argv[2], encoding="utf-8").read().split("\\n")[:-1]
start = time.process_time()
sp.encode(lines, num_threads=1)
print(time.process_time() - start)
"""


def sp_own_process(sp_path, lines_path):
    """CPU seconds of SentencePiece's batch call on the lines of `lines_path`, in a process of its own."""
    out = subprocess.run([sys.executable, "-c", SP_CHILD, sp_path, lines_path], check=True, capture_output=True,
                         text=True)
    return float(out.stdout)


def create_flags(save_dir, sp_path, encoder):
    """create's flags but --input_glob: one task, one pass, one worker, the model's text settings."""
    flags = [f"--save_dir={save_dir}", f"--sp_path={sp_path}", "--bsz_per_host=32", "--seq_len=512",
             "--reuse_len=256", "--num_predict=85", "--num_passes=1", "--num_workers=1"]
    uncased, keep_accents = text_settings(sp_path)
    flags += [f"--{'' if uncased else 'no'}uncased", f"--{'' if keep_accents else 'no'}keep_accents"]
    return flags + ([f"--encoder={encoder}"] if encoder else [])


# create's one pass run again and again in one process (a checkout's own package on PYTHONPATH): its flags are
# parsed as `python -m xlnet_data.create` parses them, glibc set as create.main sets it; each line read names a
# corpus, the run's CPU seconds are written back. Timed in one process, create's start-up (imports, the compiled
# code's cache, the model's parse: ~2 s of CPU that spread by +-0.3 s a process on this VM) is not in any run;
# what a run allocates is still mapped fresh and faulted in on first touch, as in a process of its own.
CREATE_CHILD = """import dataclasses, gc, logging, sys, time
from absl import flags
from xlnet_data import cli, create
from xlnet_data.common import memory
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records
create.define_flags()
flags.FLAGS(["create", *sys.argv[1:]])
logging.disable(logging.WARNING)
memory.release_large_blocks_promptly()
config = cli.config_from_flags(CreateConfig)
for corpus in sys.stdin:
    gc.collect()
    memory.return_freed_heap()
    start = time.process_time()
    create_records(dataclasses.replace(config, input_glob=corpus.strip()).validate(), overwrite=True, num_workers=1)
    print(time.process_time() - start, flush=True)
"""


class CreateProcess:
    """create's one pass, in a process of its own that runs it on each corpus asked for (CREATE_CHILD)."""

    def __init__(self, flags, root, stderr_path):
        self.stderr_path = stderr_path  # the progress lines, and what went wrong
        with open(stderr_path, "w") as stderr:
            self.process = subprocess.Popen([sys.executable, "-c", CREATE_CHILD, *flags], cwd=root, text=True,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                            env={**os.environ, "PYTHONPATH": str(root)})

    def seconds(self, corpus):
        """CPU seconds of one pass over `corpus` (a path) in the child."""
        self.process.stdin.write(f"{corpus}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            last = Path(self.stderr_path).read_text().strip().splitlines()[-1:]
            raise RuntimeError(f"create's child process stopped (exit status {self.process.wait()}): {last}")
        return float(line)

    def close(self):
        self.process.stdin.close()
        self.process.wait()


@contextlib.contextmanager
def create_runs(lines, sp_path, folder, before_root, encoders):
    """{name: call} of create's one pass, on all `lines` and on their first half (`ENCODER all`, `ENCODER half`),
    with each of `encoders` in this checkout and (`before_root`, `before`) another checkout's create with its
    default encoder: a CreateProcess each, closed on leaving."""
    corpora = {}
    for size, part in (("all", lines), ("half", lines[:len(lines) // 2])):
        corpora[size] = Path(folder) / f"{size}.txt"
        corpora[size].write_text("\n".join(part) + "\n", encoding="utf-8")
    checkouts = {encoder: (ROOT, encoder) for encoder in encoders}
    if before_root:
        checkouts["before"] = (before_root, None)
    children = {name: CreateProcess(create_flags(f"{folder}/out", sp_path, encoder), root, f"{folder}/{name}.err")
                for name, (root, encoder) in checkouts.items()}
    try:
        yield {f"{name} {size}": lambda child=child, corpus=corpus: child.seconds(corpus)
               for name, child in children.items() for size, corpus in corpora.items()}
    finally:
        for child in children.values():
            child.close()


def spread(values):
    """`median (lowest-highest)` of `values`."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--en_text", default=str(SHARED / "data" / "corpus_en" / "*.txt"), help="English text (a glob)")
    parser.add_argument("--en_sp_path", default=str(XLNET_MODEL), help="its model (default: XLNet's cased model)")
    for language, name in (("zh", "Chinese"), ("ja", "Japanese")):
        parser.add_argument(f"--{language}_text", help=f"{name} text, a sentence a line (a glob; e.g. "
                            f"/work/bench_text/{language}/*.txt, benchmarks/real_text.py's); left out without it")
        parser.add_argument(f"--{language}_sp_path", help=f"a model trained on {name} (spm_train; real_text.py's)")
    parser.add_argument("--size_mb", type=float, default=16, help="each text repeated to this many MB (UTF-8) or "
                        "more, so that create's all and half differ by enough work to stand above one run's noise")
    parser.add_argument("--create_encoders", default="ours",
                        help="create's --encoder values to time its one pass with (comma-separated: ours, sentencepiece)")
    parser.add_argument("--before_root", help="another checkout (e.g. `git worktree add /tmp/before 592e2cd`, the "
                        "commit before our encoder) whose create's one pass is timed too, with its default encoder")
    args = parser.parse_args()
    import sentencepiece as spm

    from xlnet_data.datagen.text import Encoder
    from xlnet_data.datagen.unigram import UnigramEncoder
    texts = [(name, getattr(args, f"{language}_text"), getattr(args, f"{language}_sp_path"))
             for language, name in (("en", "English"), ("zh", "Chinese"), ("ja", "Japanese"))]
    for name, text, sp_path in texts:
        if text and not sp_path:
            parser.error(f"{name}: a text without its model; pass the model that spm_train made from such text")
    print(f"bench_encoder at {git('rev-parse', '--short', 'HEAD')}, CPU: {cpu_name()}, load average "
          f"{load_average()}, sentencepiece {spm.__version__}, {args.rounds} rounds")
    for name, (raw, lines, sp_path) in corpora([text for text in texts if text[1]], args.size_mb).items():
        sp = spm.SentencePieceProcessor(model_file=sp_path)
        ours = UnigramEncoder(Path(sp_path).read_bytes())
        today, ours_dc = Encoder(sp, 1, "sentencepiece"), Encoder(sp, 1, "ours")
        tokens = int(ours.encode_ids(lines)[0].size)
        with tempfile.TemporaryDirectory() as folder:
            lines_path = Path(folder) / "lines.txt"
            lines_path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            with create_runs(raw, sp_path, folder, args.before_root, args.create_encoders.split(",")) as creates:
                rounds = timed({"sp": lambda lines=lines, sp=sp: sp.encode(lines, num_threads=1),
                                "sp own": lambda sp_path=sp_path, path=lines_path: sp_own_process(sp_path, path),
                                "today": lambda lines=lines, today=today: today.encode_batch(lines),
                                "ours": lambda lines=lines, ours=ours: ours.encode_ids(lines),
                                "ours+dc": lambda lines=lines, ours_dc=ours_dc: ours_dc.encode_batch(lines),
                                **creates}, args.rounds)
        t = {k: statistics.median(v) for k, v in rounds.items()}
        mb = sum(map(len, lines)) / 1e6
        print(f"{name} ({Path(sp_path).name}): {len(lines)} lines, {mb:.1f}M characters, {tokens} tokens; M tokens/s: "
              + ", ".join(f"{k} {tokens / t[k] / 1e6:.2f}" for k in ("sp", "sp own", "today", "ours", "ours+dc"))
              + f"; ours / sp {t['sp'] / t['ours']:.2f}x, ours+dc / today {t['today'] / t['ours+dc']:.2f}x")
        added = tokens - int(ours.encode_ids(lines[:len(lines) // 2])[0].size)
        # per round: the yardstick's seconds a token over create's (all - half) seconds an added token
        ratios = {(run, yardstick): [sp_s / tokens * added / (all_s - half_s) for sp_s, all_s, half_s in
                                     zip(rounds[yardstick], rounds[f"{run} all"], rounds[f"{run} half"])]
                  for run in ("sentencepiece", "ours", "before") if f"{run} all" in rounds
                  for yardstick in ("sp", "sp own")}
        runs = list(dict.fromkeys(run for run, _ in ratios))
        rates = ", ".join(f"{run} {added / (t[f'{run} all'] - t[f'{run} half']) / 1e6:.2f}" for run in runs)
        against = {yardstick: ", ".join(f"{run} {spread(ratios[run, yardstick])}" for run in runs)
                   for yardstick in ("sp", "sp own")}
        print("  create's one pass, CPU s: " + ", ".join(f"{k} {t[k]:.3f}" for k in creates)
              + f"; per token (all - half, medians), M tokens/s: {rates}; against sp's batch call alone, per round, "
              f"median (lowest-highest): {against['sp']}; against it in its own process: {against['sp own']}"
              + (f"; ours / before {statistics.median(ratios['ours', 'sp']) / statistics.median(ratios['before', 'sp']):.2f}x"
                 if ("before", "sp") in ratios else ""))

if __name__ == "__main__":
    main()
