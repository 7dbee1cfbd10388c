"""Our unigram encoder against SentencePiece and today's Encoder, and create's one pass with each, per core.

    taskset -c 0 python benchmarks/bench_encoder.py [--rounds=5] [--sp_path=...] [--zh_text=FILE] [--repeat=N]
        [--before_root=CHECKOUT]

Text: English, the seven books of ../shared/data/corpus_en; Chinese and Japanese, the running text of the
Simplified Chinese and Japanese manual pages (Debian's manpages-zh and manpages-ja, under /usr/share/man:
`apt-get install manpages-zh manpages-ja`; troff request lines dropped, font escapes removed, the lines with a
character beyond ASCII kept). Each corpus is normalised by create's preprocess_texts (cased) first.

Timed, CPU time (time.process_time) in this process, in alternating rounds, medians:
- `sp`: SentencePiece's batch call, sp.encode(list_of_lines, num_threads=1): the yardstick;
- `today`: text.Encoder(sp, encoder="sentencepiece").encode_batch: SentencePiece's buffer call and the
  digit-comma rule (create's encoder before ours);
- `ours`: unigram.UnigramEncoder.encode_ids, and `ours+dc`: text.Encoder(sp, encoder="ours").encode_batch
  (with the digit-comma rule, as create calls it);
- create's one pass (`python -m xlnet_data.create`, cased, one task, one pass, one worker: a child process,
  its CPU time) with --encoder=sentencepiece and --encoder=ours, and `--before_root`'s create with its own
  default, on the raw lines and on the first half of them: the difference of the two cancels what does not
  grow with the text (start-up, compiled code loading). Its ids per second are set against `sp`'s, the
  yardstick the issue checks create by (SentencePiece alone on the normalised lines, in this process).
"""

import argparse
import glob
import gzip
import os
import re
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
from run_all import cpu_name, git, load_average  # noqa: E402

SHARED = ROOT.parent / "shared"
_TROFF_ESCAPES = re.compile(r"\\f[BIRP]|\\f\(..|\\-|\\\(..|\\&|\\e")


def man_page_lines(language):
    """The running text of the manual pages of a language, lines with a character beyond ASCII."""
    lines = []
    for path in sorted(glob.glob(f"/usr/share/man/{language}/man*/*.gz")):
        try:
            text = gzip.open(path).read().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            if not line.startswith((".", "'")):
                line = _TROFF_ESCAPES.sub("", line).strip()
                if line and not line.isascii():
                    lines.append(line)
    return lines


def corpora(zh_text=None, repeat=1):
    from xlnet_data.datagen.text import preprocess_texts
    books = []
    for path in sorted((SHARED / "data" / "corpus_en").glob("*.txt")):
        books += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    chinese = Path(zh_text).read_text(encoding="utf-8").splitlines() if zh_text else man_page_lines("zh_CN")
    found = {"English": books, "Chinese": chinese, "Japanese": man_page_lines("ja")}
    return {name: (lines * repeat, preprocess_texts(lines * repeat, False)) for name, lines in found.items() if lines}


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


def create_command(root, corpus, save_dir, sp_path, encoder):
    """create's command line: one task, one pass, one worker, in the checkout `root` (its own package)."""
    command = [sys.executable, "-m", "xlnet_data.create", f"--input_glob={corpus}", f"--save_dir={save_dir}",
               f"--sp_path={sp_path}", "--bsz_per_host=32", "--seq_len=512", "--reuse_len=256", "--num_predict=85",
               "--nouncased", "--num_passes=1", "--num_workers=1"]
    return command + ([f"--encoder={encoder}"] if encoder else [])


def child_cpu(command, root, save_dir):
    """CPU seconds (user + system) of `command` run in `root` (start-up included: all - half cancels it)."""
    shutil.rmtree(save_dir, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(root)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def create_passes(lines, sp_path, folder, before_root, rounds):
    """{name: median CPU s} of create's one pass, on all `lines` and on their first half, with each encoder
    of this checkout and (`before_root`) another checkout's create with its default encoder."""
    corpora = {}
    for size, part in (("all", lines), ("half", lines[:len(lines) // 2])):
        corpora[size] = Path(folder) / f"{size}.txt"
        corpora[size].write_text("\n".join(part) + "\n", encoding="utf-8")
    runs = {f"{encoder} {size}": (ROOT, create_command(ROOT, corpus, f"{folder}/out", sp_path, encoder))
            for encoder in ("sentencepiece", "ours") for size, corpus in corpora.items()}
    if before_root:
        runs.update({f"before {size}": (before_root, create_command(before_root, corpus, f"{folder}/out", sp_path, None))
                     for size, corpus in corpora.items()})
    return timed({name: lambda root=root, command=command: child_cpu(command, root, f"{folder}/out")
                  for name, (root, command) in runs.items()}, rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sp_path", default=str(SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"))
    parser.add_argument("--zh_text", help="Chinese text, a line each, instead of the man pages (e.g. made by "
                        "benchmarks/zh_dictionary_text.py)")
    parser.add_argument("--repeat", type=int, default=1, help="each corpus this many times over: more tokens "
                        "between create's all and half, so that their difference stands above one run's noise")
    parser.add_argument("--before_root", help="another checkout (e.g. `git worktree add /tmp/before 592e2cd`, the "
                        "commit before our encoder) whose create's one pass is timed too, with its default encoder")
    args = parser.parse_args()
    import sentencepiece as spm

    from xlnet_data.datagen.text import Encoder
    from xlnet_data.datagen.unigram import UnigramEncoder
    sp = spm.SentencePieceProcessor(model_file=args.sp_path)
    ours = UnigramEncoder(Path(args.sp_path).read_bytes())
    today, ours_dc = Encoder(sp, 1, "sentencepiece"), Encoder(sp, 1, "ours")
    print(f"bench_encoder at {git('rev-parse', '--short', 'HEAD')}, CPU: {cpu_name()}, load average "
          f"{load_average()}, sentencepiece {spm.__version__}, {args.rounds} rounds")
    for name, (raw, lines) in corpora(args.zh_text, args.repeat).items():
        tokens = int(ours.encode_ids(lines)[0].size)
        t = timed({"sp": lambda lines=lines: sp.encode(lines, num_threads=1),
                   "today": lambda lines=lines: today.encode_batch(lines),
                   "ours": lambda lines=lines: ours.encode_ids(lines),
                   "ours+dc": lambda lines=lines: ours_dc.encode_batch(lines)}, args.rounds)
        mb = sum(map(len, lines)) / 1e6
        print(f"{name}: {len(lines)} lines, {mb:.1f}M characters, {tokens} tokens; M tokens/s: "
              + ", ".join(f"{k} {tokens / v / 1e6:.2f}" for k, v in t.items())
              + f"; ours / sp {t['sp'] / t['ours']:.2f}x, ours+dc / today {t['today'] / t['ours+dc']:.2f}x")
        with tempfile.TemporaryDirectory() as folder:
            c = create_passes(raw, args.sp_path, folder, args.before_root, max(3, args.rounds // 2))
        half_tokens = int(ours.encode_ids(lines[:len(lines) // 2])[0].size)
        per_token = {run: (c[f"{run} all"] - c[f"{run} half"]) / (tokens - half_tokens)
                     for run in ("sentencepiece", "ours", "before") if f"{run} all" in c}
        sp_per_token = t["sp"] / tokens
        rates = ", ".join(f"{run} {1e-6 / v:.2f}" for run, v in per_token.items())
        against_sp = ", ".join(f"{run} {sp_per_token / v:.2f}" for run, v in per_token.items())
        print("  create's one pass, CPU s: " + ", ".join(f"{k} {v:.3f}" for k, v in c.items())
              + f"; per token (all - half), M tokens/s: {rates}; against sp's batch call alone: {against_sp}"
              + (f"; ours / before {per_token['before'] / per_token['ours']:.2f}x" if "before" in per_token else ""))


if __name__ == "__main__":
    main()
