"""create --word_boundaries: the segmenters compared, create's cost on Chinese, the spans, the token cache's bytes.

    python benchmarks/bench_words.py segmenters [--zh_text=FILE] [--rounds=3]
    python benchmarks/bench_words.py create --zh_text=FILE [--lines=20000] [--rounds=3]
    python benchmarks/bench_words.py cache [--before_root=DIR]

segmenters: each candidate's word starts against the hand-cut sentences of tests/data/words (boundary F1) and
  its speed on one core (this process pinned, CPU time, best of --rounds; blocks of 10,000 characters) on Chinese
  text (--zh_text, else the test sentences repeated) and on the Japanese and Thai test sentences repeated to
  ~200k characters.
create: create's one pass on --lines (and half as many) lines of a Chinese text in XLNet's input format (one
  sentence per line; repeated where it is shorter), with --word_boundaries=zh and without (the default
  --span_unit=piece), alternated --rounds times in this run,
  each in a subprocess pinned to core 0 (CPU time, user + system); the per-line cost is the difference of the
  two sizes (start-up cancelled), the ratio flag / no flag its headline. SentencePiece's batch encode of the same
  lines, in this process on the same core, is the yardstick. A SentencePiece model (8,000 pieces, --keep_accents)
  is trained on the text first. Also the spans of the records (seq_len 128, num_predict 21): the share of pieces
  that can start a span and of masked spans that are fill-up single pieces, without the flag and with it.
cache: the token cache's bytes a token (the two files) of `create --nowrite_records` on the seven books of
  ../shared/data/corpus_en with XLNet's model; --before_root: the same with another checkout (the commit
  before format 2, unpacked with `git archive`).
Output: Markdown for BENCHMARKS.md.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_long_line import add_create_run_flags, median_create_times  # noqa: E402
from run_all import cpu_name, load_average  # noqa: E402

from xlnet_data.dataformat import words  # noqa: E402

WORDS = ROOT / "tests" / "data" / "words"
FLAGS = ["--seq_len=128", "--reuse_len=64", "--bsz_per_host=8", "--num_core_per_host=1", "--use_tpu=False",
         "--bi_data=True", "--num_predict=21", "--keep_accents", "--num_workers=1"]


def reference(language):
    return [line.split() for line in (WORDS / f"{language}.txt").read_text(encoding="utf-8").splitlines()]


def candidates():
    """(language, name, cut) of every segmenter measured; words.load_segmenter's are marked (chosen)."""
    import jieba
    import rjieba
    from pythainlp.tokenize import word_tokenize
    from sudachipy import Dictionary, SplitMode
    jieba.setLogLevel(60)
    def cut_by(function):  # a list of words -> load_segmenter's kind: a bool a character
        return lambda text: words.char_word_starts(text, function(text))
    found = [("zh", "jieba's dictionary and no-HMM route, compiled: zh_words.py (chosen)", words.load_segmenter("zh")),
             ("zh", "rjieba, no HMM", cut_by(lambda text: rjieba.cut(text, False))),
             ("zh", "rjieba, HMM", cut_by(lambda text: rjieba.cut(text, True))),
             ("zh", "jieba (Python)", cut_by(jieba.lcut)),
             ("ja", "fugashi + unidic-lite (chosen)", words.load_segmenter("ja"))]
    for mode in ("A", "C"):
        tokenizer = Dictionary().create(getattr(SplitMode, mode))
        found.append(("ja", f"sudachipy {mode}", cut_by(lambda text, t=tokenizer: [m.surface() for m in t.tokenize(text)])))
    return found + [("th", "nlpo3 + PyThaiNLP's words (chosen)", words.load_segmenter("th")),
                    ("th", "pythainlp newmm (Python)", cut_by(lambda text: word_tokenize(text, engine="newmm")))]


def cpu_seconds(function, rounds):
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        function()
        best = min(best, time.process_time() - start)
    return best


def segmenters(args):
    os.sched_setaffinity(0, {0})
    texts = {language: "\n".join("".join(line) for line in reference(language)) for language in ("zh", "ja", "th")}
    if args.zh_text:
        texts["zh"] = Path(args.zh_text).read_text(encoding="utf-8")[:400_000]
    texts = {language: (text * (200_000 // len(text) + 1))[:400_000] for language, text in texts.items()}
    print(f"CPU: {cpu_name()}; load average {load_average()} (a shared machine)\n")
    print("| language | segmenter | F1 of word starts vs tests/data/words | M characters/s, one core |\n|---|---|---|---|")
    for language, name, cut in candidates():
        cut(texts[language][:1000])  # dictionaries loaded
        f1 = words.boundary_f1(cut, reference(language))
        text = texts[language]
        blocks = [text[i:i + 10_000] for i in range(0, len(text), 10_000)]  # sudachipy takes at most 49,149 bytes
        seconds = cpu_seconds(lambda cut=cut, blocks=blocks: [cut(block) for block in blocks], args.rounds)
        print(f"| {language} | {name} | {f1:.3f} | {len(texts[language]) / seconds / 1e6:.2f} |")


def span_figures(save_dir, sp_path, boundaries):
    """(share of pieces that can start a span, share of masked spans that are fill-up single pieces) of the
    records of a save_dir, by `boundaries`' word starts (the original's rule for `spaces`)."""
    import sentencepiece as spm

    from xlnet_data.dataformat import record_reader, vocab
    from xlnet_data.dataformat.inspection import masked_runs
    sp = spm.SentencePieceProcessor(model_file=sp_path)
    table = vocab.start_piece_table(sp)
    starts_of = (lambda ids: table[ids]) if boundaries == "spaces" else words.WordStarts.of(sp, boundaries)
    pieces = can_start = spans = fill_up = 0
    for path in sorted(Path(save_dir, "tfrecords").glob("*.tfrecords")):
        for index, features in record_reader.read_numbered_examples(str(path), 128):
            if index % 8 >= 4:  # the forward rows are enough
                continue
            ids, mask = np.asarray(features["input"]), np.asarray(features["is_masked"], dtype=bool)
            for low, high in ((0, 64), (64, 128)):
                starts, text = starts_of(ids[low:high]), ids[low:high] > vocab.EOP_ID
                pieces, can_start = pieces + int(text.sum()), can_start + int((starts & text).sum())
                runs = masked_runs(mask[low:high])
                spans += len(runs)
                fill_up += sum(1 for b, e in runs if e - b == 1 and not starts[b])
    return can_start / pieces, fill_up / spans


def create_cost(args):
    from xlnet_data.datagen import tokenizer
    lines = Path(args.zh_text).read_text(encoding="utf-8").splitlines()
    lines = (lines * (args.lines // len(lines) + 1))[:args.lines]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, count in (("small", len(lines) // 2), ("large", len(lines))):
            (tmp / name).mkdir()
            (tmp / name / "zh.txt").write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
        args.sp_path = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
            input_files=(str(tmp / "large" / "zh.txt"),), model_prefix=str(tmp / "zh"), vocab_size=args.vocab_size,
            keep_accents=True, num_threads=2))
        times = {(size, flag): [] for size in ("small", "large") for flag in ("spaces", "zh")}
        order = list(times)
        for r in range(args.rounds):
            random.Random(r).shuffle(order)
            for size, flag in order:
                _, cpu = median_create_times(args, str(tmp / size / "*.txt"), str(tmp / f"{size}-{flag}-{r}"),
                                             [*FLAGS, f"--word_boundaries={flag}"])
                times[size, flag].append(cpu)
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=args.sp_path)
        os.sched_setaffinity(0, {0})
        text = [line for line in lines if line.strip()]
        encode = statistics.median([cpu_seconds(lambda: sp.encode(text), 1) for _ in range(args.rounds)])
        tokens = sum(map(len, sp.encode(text)))
        spans = {flag: span_figures(tmp / f"large-{flag}-0-0", args.sp_path, flag) for flag in ("spaces", "zh")}
    med = {key: statistics.median(value) for key, value in times.items()}
    marginal = {flag: med["large", flag] - med["small", flag] for flag in ("spaces", "zh")}
    half = tokens / 2  # the large corpus's second half
    print(f"CPU: {cpu_name()}; load average {load_average()} (a shared machine); {len(lines)} lines, "
          f"{tokens} tokens ({args.vocab_size} pieces)\n")
    print("| create, one pass, one core | CPU s: half / all of the lines (median of "
          f"{args.rounds}) | M tokens/s, start-up cancelled |\n|---|---|---|")
    for flag in ("spaces", "zh"):
        print(f"| --word_boundaries={flag} | {med['small', flag]:.2f} / {med['large', flag]:.2f} | "
              f"{half / marginal[flag] / 1e6:.3f} |")
    print(f"| yardstick: SentencePiece's batch encode alone | {encode:.2f} (all) | {tokens / encode / 1e6:.3f} |")
    print(f"\ntime with the flag / without: **{marginal['zh'] / marginal['spaces']:.2f}x** (goal ≤ 1.5x)\n")
    print("| records (seq_len 128, num_predict 21), forward rows | pieces that can start a span | masked spans that "
          "are fill-up single pieces |\n|---|---|---|")
    for flag, (start_share, fill_up) in spans.items():
        print(f"| --word_boundaries={flag} | {100 * start_share:.1f}% | {100 * fill_up:.1f}% |")


def cache_bytes(args):
    books = ROOT.parent / "shared" / "data" / "corpus_en" / "*.txt"
    print(f"CPU: {cpu_name()}\n\n| checkout | tokens | token cache bytes (bin + index) | bytes a token |\n|---|---|---|---|")
    for root in [r for r in (args.before_root, str(ROOT)) if r]:
        with tempfile.TemporaryDirectory() as tmp:
            run = subprocess.run([sys.executable, "-m", "xlnet_data.create", f"--input_glob={books}",
                                  f"--sp_path={args.sp_path}", f"--save_dir={tmp}/s", "--nowrite_records", *FLAGS],
                                 cwd=root, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"}, capture_output=True,
                                 text=True)
            if run.returncode:
                sys.exit(run.stderr[-2000:])
            (index,) = Path(tmp, "s", "token_cache").glob("*.json")
            tokens = sum(shard["tokens"] for shard in json.loads(index.read_text())["shards"])
            size = index.stat().st_size + index.with_suffix(".bin").stat().st_size
            print(f"| {root} | {tokens} | {size} | **{size / tokens:.3f}** |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["segmenters", "create", "cache"])
    parser.add_argument("--zh_text")
    parser.add_argument("--lines", type=int, default=70000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab_size", type=int, default=8000, help="create: the pieces of the model trained on the text")
    parser.add_argument("--before_root")
    add_create_run_flags(parser)
    args = parser.parse_args()
    {"segmenters": segmenters, "create": create_cost, "cache": cache_bytes}[args.what](args)


if __name__ == "__main__":
    main()
