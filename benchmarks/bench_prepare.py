"""Sentence splitters compared, and prepare's throughput per core next to create's, on the same text.

    python benchmarks/bench_prepare.py [--size_mb=10] [--repeat=5] [--parts=splitters,throughput,scaling,long]

splitters: prepare's own splitting (sentencex, the inside of quotations split on its own, and the rules of
languages.py), the same without the rules of languages.py, and every candidate that is importable
(sentencex alone; blingfire, pysbd, syntok, sentence-splitter; pythainlp's CRF splitter, on Thai only;
a one-line regex as the floor) split the hand-checked cases of tests/data/sentences.jsonl: the cases
each gets exactly right, per language of issue 22 (the other languages together), and apart the
"held-out" cases (written after the rules of languages.py); its speed in MB/s on one core (the process
pinned to CPU 0) over the paragraphs of ../shared/data/corpus_en (median of --repeat runs; pysbd,
which is slow, on the first 300 paragraphs).

long: one paragraph of 1, 2, 4 and 8 MB (English words of the books, Chinese sentences of 9 characters,
the Thai cases of the hand-checked set over and over) in a JSON-lines file, `prepare --num_workers=1`
pinned to one core: seconds (CPU time) and seconds per MB, against sentencex.segment alone on the
whole paragraph in this process (0.25 to 1 MB of Chinese: its time grows with the square of the
length).

throughput: raw JSON-lines corpora (plain and gzip) of `size_mb` and 2 x `size_mb` are built from the
paragraphs of the same books, cut into documents of 12 paragraphs, each with a title line of its own
(so that none is a duplicate). `prepare --num_workers=1` runs on them pinned to one core (taskset -c 0),
then `create --num_workers=1`, pinned the same way, runs on prepare's output with the seed blog's flags
(seq_len 128) and the paper's shape (seq_len 512). Both rates are steady-state MB/s of the same text
(the bytes prepare writes and create reads): the difference of MB over the difference of seconds
between the two sizes, so that start-up cancels; the sizes alternate; median (lowest-highest) of
--repeat pairs.

scaling: the same steady-state MB/s of prepare on the plain corpora (4 files), one worker pinned to one
core against two workers on two cores. Output is a Markdown report (also for BENCHMARKS.md).
"""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_create import CONFIGS, ROOT, SHARED, run_create, steady, timed

CASES = ROOT / "tests" / "data" / "sentences.jsonl"
PARAGRAPHS_PER_DOCUMENT = 12
ISSUE_LANGUAGES = ("en", "fr", "de", "es", "zh", "ja", "th", "hi", "vi")


def book_paragraphs(source):
    """The paragraphs of the input-format books in `source`: sentences joined by spaces, cut at <eop>."""
    paragraphs = []
    for path in sorted(Path(source).glob("*.txt")):
        for block in path.read_text(encoding="utf-8").split("<eop>"):
            text = " ".join(line.strip() for line in block.splitlines() if line.strip())
            if text:
                paragraphs.append(text)
    return paragraphs


def candidates():
    """{name: (split(language, text) -> sentences, the languages it is measured on or None for all)} of the
    splitters that are installed."""
    found = {}
    sys.path.insert(0, str(ROOT))  # this checkout's xlnet_data, not an installed one
    try:
        import sentencex

        from xlnet_data.datagen.prepare import languages
        from xlnet_data.datagen.prepare.sentences import split_sentences
        found["prepare (sentencex + quotations + languages.py)"] = (
            lambda language, text: split_sentences(text, language), None)

        def without_rules(language, text):
            refine = languages.refine
            languages.refine = lambda language, text, cuts: sorted(c for c in cuts if 0 < c < len(text))
            try:
                return split_sentences(text, language)
            finally:
                languages.refine = refine
        found["prepare without languages.py (sentencex + quotations)"] = (without_rules, None)
        found["sentencex"] = (lambda language, text: list(sentencex.segment(language, text)), None)
    except ImportError:
        pass
    try:
        import blingfire
        found["blingfire"] = (lambda language, text: blingfire.text_to_sentences(text).split("\n"), None)
    except ImportError:
        pass
    try:
        import pysbd
        segmenters = {}

        def pysbd_split(language, text):
            if language not in segmenters:
                try:
                    segmenters[language] = pysbd.Segmenter(language=language, clean=False)
                except ValueError:  # a language pysbd lacks: its English rules
                    segmenters[language] = pysbd.Segmenter(language="en", clean=False)
            return segmenters[language].segment(text)
        found["pysbd"] = (pysbd_split, None)
    except ImportError:
        pass
    try:
        import syntok.segmenter as syntok
        found["syntok"] = (lambda language, text: ["".join(t.spacing + t.value for t in sentence)
                                                   for paragraph in syntok.analyze(text) for sentence in paragraph],
                           None)
    except ImportError:
        pass
    try:
        from sentence_splitter import SentenceSplitter
        splitters = {}

        def moses_split(language, text):
            if language not in splitters:
                try:
                    splitters[language] = SentenceSplitter(language=language)
                except Exception:  # a language it has no prefix list for: English's
                    splitters[language] = SentenceSplitter(language="en")
            return splitters[language].split(text)
        found["sentence-splitter"] = (moses_split, None)
    except ImportError:
        pass
    try:
        from pythainlp.tokenize import sent_tokenize
        found["pythainlp crfcut (Thai only)"] = (lambda language, text: sent_tokenize(text, engine="crfcut"), {"th"})
    except ImportError:
        pass
    floor = re.compile(r"(?<=[.!?\u3002\uff01\uff1f\u0964\u0965])\s+")
    found["regex [.!?。！？।॥] + space"] = (lambda language, text: floor.split(text), None)
    return found


def splitters(args, report):
    cases = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines()]
    columns = [*ISSUE_LANGUAGES, "other", "held-out"]

    def column(case):
        return case["language"] if case["language"] in ISSUE_LANGUAGES else "other"
    count = {name: sum(column(c) == name for c in cases) for name in columns}
    count["held-out"] = sum(c["checks"].startswith("held-out") for c in cases)
    paragraphs = book_paragraphs(args.source)
    thai = [c["text"] for c in cases if c["language"] == "th"] * 40
    os.sched_setaffinity(0, {0})
    report += [f"hand-checked cases: {len(cases)} ({count['held-out']} of them held-out); speed on "
               f"{sum(len(p.encode()) for p in paragraphs) / 1e6:.1f} MB of English paragraphs and "
               f"{sum(len(p.encode()) for p in thai) / 1e6:.2f} MB of Thai ones (the Thai cases, 40 times), one core",
               "", "| splitter | cases right | " + " | ".join(columns) + " | MB/s en | MB/s th |",
               "|---|---|" + "---|" * len(columns) + "---|---|"]
    for name, (split, only) in candidates().items():
        right = {name: 0 for name in columns}
        measured = [c for c in cases if only is None or c["language"] in only]
        for case in measured:
            got = [s.strip() for s in split(case["language"], case["text"]) if s.strip()]
            right[column(case)] += got == case["sentences"]
            right["held-out"] += got == case["sentences"] and case["checks"].startswith("held-out")
        rates = {}
        for language, sample in (("en", paragraphs[:300] if name == "pysbd" else paragraphs), ("th", thai)):
            if only is not None and language not in only:
                continue
            megabytes = sum(len(p.encode()) for p in sample) / 1e6
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                for paragraph in sample:
                    split(language, paragraph)
                times.append(time.perf_counter() - start)
            rates[language] = f"{megabytes / statistics.median(times):.2f}"
        total = sum(right[name] for name in columns[:-1])
        held = sum(c["checks"].startswith("held-out") for c in measured)
        cells = " | ".join(f"{right[name]}/{count[name]}" if only is None or name in only else "-"
                           for name in columns[:-1])
        report.append(f"| {name} | {total}/{len(measured)} ({100 * total / len(measured):.0f}%) | {cells} | "
                      f"{right['held-out']}/{held} | {rates.get('en', '-')} | {rates.get('th', '-')} |")
    report.append("")


def long_paragraph(args, report):
    """prepare on one paragraph of growing size: CPU seconds per MB stay flat (windows of sentences.PIECE)."""
    import sentencex
    words = " ".join(book_paragraphs(args.source))
    chinese = "".join(f"这是第{i % 1000:03d}个句子。" for i in range(400_000))  # 9 characters, 27 bytes
    thai = " ".join(json.loads(line)["text"] for line in CASES.read_text(encoding="utf-8").splitlines()
                    if json.loads(line)["language"] == "th")
    work = Path(tempfile.mkdtemp(prefix="bench_prepare_long_"))
    rows = ["| text | MB | prepare CPU s | CPU s per MB |", "|---|---|---|---|"]
    for language, source in (("en", words), ("zh", chinese), ("th", thai)):
        for size_mb in (1, 2, 4, 8):
            repeats = size_mb * 10**6 // len(source.encode()) + 1
            text = " ".join([source] * repeats).encode()[:size_mb * 10**6].decode("utf-8", errors="ignore")
            directory = work / f"{language}{size_mb}"
            directory.mkdir()
            (directory / "one.jsonl").write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")
            cmd = [sys.executable, "-m", "xlnet_data.prepare", f"--input_glob={directory / 'one.jsonl'}",
                   f"--output_dir={directory / 'out'}", f"--language={language}", "--num_workers=1", "--overwrite"]
            seconds = statistics.median(timed(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), cores="0", clock="cpu")[0]
                                        for _ in range(args.repeat))
            rows.append(f"| {language} | {size_mb} | {seconds:.2f} | {seconds / size_mb:.2f} |")
    rows += ["", "| sentencex.segment alone, one call, Chinese | MB | s | s per MB |", "|---|---|---|---|"]
    os.sched_setaffinity(0, {0})
    for size_mb in (0.25, 0.5, 1):
        text = chinese.encode()[:int(size_mb * 10**6)].decode("utf-8", errors="ignore")
        start = time.process_time()
        sentencex.segment("zh", text)
        seconds = time.process_time() - start
        rows.append(f"| zh | {size_mb} | {seconds:.2f} | {seconds / size_mb:.2f} |")
    report += [f"one paragraph per file; prepare's CPU time (start-up included), median of {args.repeat}", "",
               *rows, ""]


def make_raw_corpus(directory, size_mb, paragraphs, compress, num_files=4):
    """`num_files` JSON-lines files (gzip with `compress`) of about size_mb / num_files MB of text each."""
    import gzip
    directory.mkdir(parents=True, exist_ok=True)
    per_file, n = size_mb * 1e6 / num_files, 0
    for i in range(num_files):
        lines, size = [], 0
        while size < per_file:
            start = n * PARAGRAPHS_PER_DOCUMENT % len(paragraphs)
            body = paragraphs[start:start + PARAGRAPHS_PER_DOCUMENT]
            text = "\n".join([f"Document {n}."] + body)
            lines.append(json.dumps({"id": n, "text": text}, ensure_ascii=False) + "\n")
            size += len(text.encode())
            n += 1
        data = "".join(lines).encode()
        name = directory / f"part{i}.jsonl"
        if compress:
            Path(f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=6))
        else:
            name.write_bytes(data)
    return str(directory / ("*.jsonl.gz" if compress else "*.jsonl"))


def run_prepare(input_glob, output_dir, workers=1, cores="0"):
    """(seconds, MB written) of one prepare run with `workers` processes pinned to `cores`."""
    cmd = [sys.executable, "-m", "xlnet_data.prepare", f"--input_glob={input_glob}", f"--output_dir={output_dir}",
           f"--num_workers={workers}", "--overwrite"]
    seconds, _, output = timed(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), cores=cores)
    megabytes = float(re.search(r"\(([\d.]+) MB\)", output).group(1))
    return seconds, megabytes


def throughput(args, report):
    paragraphs = book_paragraphs(args.source)
    work = Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    rows = ["| step (one core) | MB/s of text | ratio to create seq_len 128 | ratio to create seq_len 512 |",
            "|---|---|---|---|"]
    prepared = {}
    rates = {}
    for compress in (False, True):
        label = "prepare, JSON lines" + (" .gz" if compress else "")
        small = make_raw_corpus(work / f"raw_small_{compress}", args.size_mb, paragraphs, compress)
        large = make_raw_corpus(work / f"raw_large_{compress}", 2 * args.size_mb, paragraphs, compress)
        outputs = {small: work / f"prepared_small_{compress}", large: work / f"prepared_large_{compress}"}
        rates[label] = steady(lambda g, outputs=outputs: run_prepare(g, outputs[g]), small, large, args.repeat)
        prepared = {"small": outputs[small], "large": outputs[large]}
    sizes = {g: sum(p.stat().st_size for p in Path(d).glob("shard-*.txt")) / 1e6 for g, d in prepared.items()}
    globs = {g: str(Path(d) / "shard-*.txt") for g, d in prepared.items()}
    for name, flags in CONFIGS.items():
        def run_it(g, flags=flags):
            return run_create(g, work / "records", flags, args.sp_path)[0], sizes[next(k for k in globs if globs[k] == g)]
        rates[f"create, {name}"] = steady(run_it, globs["small"], globs["large"], args.repeat)
    create_128, create_512 = rates["create, seq_len 128"][0], rates["create, seq_len 512"][0]
    for label, rate in rates.items():
        rows.append(f"| {label} | {rate[0]:.1f} ({rate[1]:.1f}-{rate[2]:.1f}) | {rate[0] / create_128:.2f} | "
                    f"{rate[0] / create_512:.2f} |")
    report += [f"corpora: {args.size_mb:g} and {2 * args.size_mb:g} MB of text from {args.source}, documents of "
               f"{PARAGRAPHS_PER_DOCUMENT} paragraphs; median (lowest-highest) of {args.repeat} steady-state pairs; "
               f"{os.cpu_count()} CPUs", "", *rows, ""]


def scaling(args, report):
    """One worker on one core against two workers on two cores, on the 4-file plain corpora, steady state."""
    paragraphs = book_paragraphs(args.source)
    work = Path(tempfile.mkdtemp(prefix="bench_prepare_scaling_"))
    small = make_raw_corpus(work / "raw_small", args.size_mb, paragraphs, False)
    large = make_raw_corpus(work / "raw_large", 2 * args.size_mb, paragraphs, False)
    rates = {}
    for workers, cores in ((1, "0"), (2, "0,1")):
        def run_it(g, workers=workers, cores=cores):
            return run_prepare(g, work / ("out_small" if g == small else "out_large"), workers, cores)
        rates[workers] = steady(run_it, small, large, args.repeat)
    report += [f"scaling (4 files, JSON lines, steady state): 1 worker on 1 core {rates[1][0]:.1f} MB/s "
               f"({rates[1][1]:.1f}-{rates[1][2]:.1f}), 2 workers on 2 cores {rates[2][0]:.1f} MB/s "
               f"({rates[2][1]:.1f}-{rates[2][2]:.1f}): {rates[2][0] / rates[1][0]:.2f}x", ""]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_mb", type=float, default=10, help="smaller corpus (MB of text); the larger is twice it")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--sp_path", default=str(SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"))
    parser.add_argument("--source", default=str(SHARED / "data" / "corpus_en"),
                        help="folder of input-format .txt books the paragraphs come from (or sample_corpus)")
    parser.add_argument("--parts", default="splitters,throughput,scaling,long", help="what to measure, comma-separated")
    args = parser.parse_args()
    report = []
    if "splitters" in args.parts.split(","):
        splitters(args, report)
    if "throughput" in args.parts.split(","):
        throughput(args, report)
    if "scaling" in args.parts.split(","):
        scaling(args, report)
    if "long" in args.parts.split(","):
        long_paragraph(args, report)
    print("\n".join(report))


if __name__ == "__main__":
    main()
