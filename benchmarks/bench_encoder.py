"""Our unigram encoder against SentencePiece, and create's one pass against SentencePiece alone, per core, by language.

    taskset -c 0 python benchmarks/bench_encoder.py [--rounds=5] [--size_mb=16] [--before_root=CHECKOUT]
        [--zh_text=GLOB --zh_sp_path=MODEL] [--ja_text=GLOB --ja_sp_path=MODEL]

Every text is real prose of its language with a model made for that language: English, the seven books of
../shared/data/corpus_en with XLNet's cased model (`--en_sp_path`); Chinese and Japanese, the novels and models
that benchmarks/real_text.py makes (`--zh_text=/work/bench_text/zh/*.txt --zh_sp_path=/work/bench_text/zh.model`;
a language without its text is left out). Each text is normalised by create's preprocess_texts first, with the
model's uncased and keep_accents (its PREFIX.text.json, as spm_train wrote it; none: cased, accents removed), and
create runs with the same flags.

Timed, CPU time (time.process_time) in this process, in alternating rounds, medians:
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
- create's one pass (`python -m xlnet_data.create`, one task, one pass, one worker, seq_len 512, 32 rows: a child
  process, its CPU time) with --encoder=sentencepiece and --encoder=ours, and `--before_root`'s create with its own
  default, on the raw lines and on the first half of them: the difference of the two cancels what does not
  grow with the text (start-up, compiled code loading). Its ids per second are set against `sp`'s, the
  yardstick the issue checks create by (SentencePiece alone on the normalised lines, in this process).
"""

import argparse
import glob
import math
import os
import resource
import shutil
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
    """{name: median CPU seconds} of `calls`, run in turn `rounds` times after one warm-up round. A call that
    returns a number gives its own seconds (a child process's)."""
    seconds = {name: [] for name in calls}
    for round_number in range(rounds + 1):
        for name, call in calls.items():
            start = time.process_time()
            took = call()
            if round_number:
                seconds[name].append(took if isinstance(took, float) else time.process_time() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


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


def create_command(root, corpus, save_dir, sp_path, encoder):
    """create's command line: one task, one pass, one worker, in the checkout `root` (its own package)."""
    command = [sys.executable, "-m", "xlnet_data.create", f"--input_glob={corpus}", f"--save_dir={save_dir}",
               f"--sp_path={sp_path}", "--bsz_per_host=32", "--seq_len=512", "--reuse_len=256", "--num_predict=85",
               "--num_passes=1", "--num_workers=1"]
    uncased, keep_accents = text_settings(sp_path)
    command += [f"--{'' if uncased else 'no'}uncased", f"--{'' if keep_accents else 'no'}keep_accents"]
    return command + ([f"--encoder={encoder}"] if encoder else [])


def child_cpu(command, root, save_dir):
    """CPU seconds (user + system) of `command` run in `root` (start-up included: all - half cancels it)."""
    shutil.rmtree(save_dir, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(root)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def create_passes(lines, sp_path, folder, before_root, rounds, encoders):
    """{name: median CPU s} of create's one pass, on all `lines` and on their first half, with each of `encoders`
    in this checkout and (`before_root`) another checkout's create with its default encoder."""
    corpora = {}
    for size, part in (("all", lines), ("half", lines[:len(lines) // 2])):
        corpora[size] = Path(folder) / f"{size}.txt"
        corpora[size].write_text("\n".join(part) + "\n", encoding="utf-8")
    runs = {f"{encoder} {size}": (ROOT, create_command(ROOT, corpus, f"{folder}/out", sp_path, encoder))
            for encoder in encoders for size, corpus in corpora.items()}
    if before_root:
        runs.update({f"before {size}": (before_root, create_command(before_root, corpus, f"{folder}/out", sp_path, None))
                     for size, corpus in corpora.items()})
    return timed({name: lambda root=root, command=command: child_cpu(command, root, f"{folder}/out")
                  for name, (root, command) in runs.items()}, rounds)


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
    parser.add_argument("--create_rounds", type=int, default=5, help="alternating rounds of create's runs (median)")
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
        lines_file = tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False)
        with lines_file:
            lines_file.write("".join(line + "\n" for line in lines))
        t = timed({"sp": lambda lines=lines, sp=sp: sp.encode(lines, num_threads=1),
                   "sp own": lambda sp_path=sp_path, path=lines_file.name: sp_own_process(sp_path, path),
                   "today": lambda lines=lines, today=today: today.encode_batch(lines),
                   "ours": lambda lines=lines, ours=ours: ours.encode_ids(lines),
                   "ours+dc": lambda lines=lines, ours_dc=ours_dc: ours_dc.encode_batch(lines)}, args.rounds)
        mb = sum(map(len, lines)) / 1e6
        print(f"{name} ({Path(sp_path).name}): {len(lines)} lines, {mb:.1f}M characters, {tokens} tokens; M tokens/s: "
              + ", ".join(f"{k} {tokens / v / 1e6:.2f}" for k, v in t.items())
              + f"; ours / sp {t['sp'] / t['ours']:.2f}x, ours+dc / today {t['today'] / t['ours+dc']:.2f}x")
        with tempfile.TemporaryDirectory() as folder:
            c = create_passes(raw, sp_path, folder, args.before_root, args.create_rounds,
                                  args.create_encoders.split(","))
        half_tokens = int(ours.encode_ids(lines[:len(lines) // 2])[0].size)
        per_token = {run: (c[f"{run} all"] - c[f"{run} half"]) / (tokens - half_tokens)
                     for run in ("sentencepiece", "ours", "before") if f"{run} all" in c}
        os.unlink(lines_file.name)
        rates = ", ".join(f"{run} {1e-6 / v:.2f}" for run, v in per_token.items())
        against = {yardstick: ", ".join(f"{run} {t[yardstick] / tokens / v:.2f}" for run, v in per_token.items())
                   for yardstick in ("sp", "sp own")}
        print("  create's one pass, CPU s: " + ", ".join(f"{k} {v:.3f}" for k, v in c.items())
              + f"; per token (all - half), M tokens/s: {rates}; against sp's batch call alone: {against['sp']}"
              + f"; against it in its own process: {against['sp own']}"
              + (f"; ours / before {per_token['before'] / per_token['ours']:.2f}x" if "before" in per_token else ""))


if __name__ == "__main__":
    main()
