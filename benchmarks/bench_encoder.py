"""Our unigram encoder against SentencePiece and today's Encoder, and create's one pass with each, per core.

    taskset -c 0 python benchmarks/bench_encoder.py [--rounds=5] [--sp_path=...]

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
- create's one pass (job.create_records of one task, one pass, in memory, one worker in this process) with
  --encoder=sentencepiece and --encoder=ours, on all the lines and on half of them: the difference of the
  two cancels what does not grow with the text (start-up, compiled code loading).
"""

import argparse
import glob
import gzip
import re
import statistics
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


def corpora(zh_text=None):
    from xlnet_data.datagen.text import preprocess_texts
    books = []
    for path in sorted((SHARED / "data" / "corpus_en").glob("*.txt")):
        books += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    chinese = Path(zh_text).read_text(encoding="utf-8").splitlines() if zh_text else man_page_lines("zh_CN")
    found = {"English": books, "Chinese": chinese, "Japanese": man_page_lines("ja")}
    return {name: preprocess_texts(lines, False) for name, lines in found.items() if lines}


def timed(calls, rounds):
    """{name: median CPU seconds} of `calls`, run in turn `rounds` times after one warm-up round."""
    seconds = {name: [] for name in calls}
    for round_number in range(rounds + 1):
        for name, call in calls.items():
            start = time.process_time()
            call()
            if round_number:
                seconds[name].append(time.process_time() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def create_pass(lines, sp_path, encoder, folder):
    from xlnet_data.datagen.config import CreateConfig
    from xlnet_data.datagen.job import create_records
    corpus = Path(folder) / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = CreateConfig(input_glob=str(corpus), sp_path=sp_path, save_dir=f"{folder}/out-{encoder}",
                          use_tpu=False, bsz_per_host=32, seq_len=512, reuse_len=256, num_predict=85,
                          uncased=False, encoder=encoder).validate()
    return lambda: create_records(config, overwrite=True, num_workers=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sp_path", default=str(SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"))
    parser.add_argument("--zh_text", help="Chinese text, a line each, instead of the man pages (e.g. made by "
                        "benchmarks/zh_dictionary_text.py)")
    args = parser.parse_args()
    import sentencepiece as spm

    from xlnet_data.datagen.text import Encoder
    from xlnet_data.datagen.unigram import UnigramEncoder
    sp = spm.SentencePieceProcessor(model_file=args.sp_path)
    ours = UnigramEncoder(Path(args.sp_path).read_bytes())
    today, ours_dc = Encoder(sp, 1, "sentencepiece"), Encoder(sp, 1, "ours")
    print(f"bench_encoder at {git('rev-parse', '--short', 'HEAD')}, CPU: {cpu_name()}, load average "
          f"{load_average()}, sentencepiece {spm.__version__}, {args.rounds} rounds")
    for name, lines in corpora(args.zh_text).items():
        tokens = int(ours.encode_ids(lines)[0].size)
        t = timed({"sp": lambda lines=lines: sp.encode(lines, num_threads=1),
                   "today": lambda lines=lines: today.encode_batch(lines),
                   "ours": lambda lines=lines: ours.encode_ids(lines),
                   "ours+dc": lambda lines=lines: ours_dc.encode_batch(lines)}, args.rounds)
        mb = sum(map(len, lines)) / 1e6
        print(f"{name}: {len(lines)} lines, {mb:.1f}M characters, {tokens} tokens; M tokens/s: "
              + ", ".join(f"{k} {tokens / v / 1e6:.2f}" for k, v in t.items())
              + f"; ours / sp {t['sp'] / t['ours']:.2f}x, ours+dc / today {t['today'] / t['ours+dc']:.2f}x")
        with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as half:
            calls = {f"{encoder} {size}": create_pass(part, args.sp_path, encoder, folder)
                     for encoder in ("sentencepiece", "ours")
                     for size, part, folder in (("all", lines, whole), ("half", lines[:len(lines) // 2], half))}
            c = timed(calls, max(3, args.rounds // 2))
        half_tokens = int(ours.encode_ids(lines[:len(lines) // 2])[0].size)
        per_token = {encoder: (c[f"{encoder} all"] - c[f"{encoder} half"]) / (tokens - half_tokens)
                     for encoder in ("sentencepiece", "ours")}
        sp_per_token = t["sp"] / tokens
        print("  create's one pass, CPU s: " + ", ".join(f"{k} {v:.3f}" for k, v in c.items())
              + f"; per token (all - half): --encoder=ours {per_token['sentencepiece'] / per_token['ours']:.2f}x "
              f"--encoder=sentencepiece; against sp's batch call alone: sentencepiece "
              f"{sp_per_token / per_token['sentencepiece']:.2f}, ours {sp_per_token / per_token['ours']:.2f}")

if __name__ == "__main__":
    main()
