"""prepare: raw documents → create's input format. Sentence splitting on the hand-checked cases of
tests/data/sentences.jsonl, every format and compression, bad input, shards, and create on the output."""

import bz2
import dataclasses
import gzip
import json
import lzma
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, read_save_dir, run_module

pytest.importorskip("sentencex", reason="prepare's sentence splitter is absent: pip install -e '.[prepare]'")

from xlnet_data.datagen.prepare import PrepareConfig, PrepareError, prepare
from xlnet_data.datagen.prepare.sentences import format_document, split_sentences

CASES = [json.loads(line) for line in (Path(__file__).parent / "data" / "sentences.jsonl").read_text("utf-8").splitlines()]
# Hand-checked cases prepare gets wrong (see BENCHMARKS.md "prepare"), by test id; strict: fixing one fails the
# test, so that this list is updated. Cases whose "checks" begin with "held-out:" were written after the rules
# of languages.py, to measure them on text they were not fitted to.
KNOWN_MISSES = {
    "vi: temperature with a decimal comma": "`độ C.` is taken for an initial (sentencex's Vietnamese rules)",
    "zh: held-out: quotation with a question and a new sentence": "cut after the closing quote before 她问",
    "zh: held-out: full-width parentheses after a full stop": "no cut after `。）`",
    "hi: held-out: ई.पू. (BC)": "ई.पू. written without a space is not among the abbreviations",
    "th: held-out: Latin acronym between sentences": "a space after a Latin word is never a Thai sentence end; a "
                                                     "space after ที่ is taken for one",
}


def case_id(case):
    return f"{case['language']}: {case['checks']}"


@pytest.mark.parametrize("case", [
    pytest.param(case, id=case_id(case),
                 marks=[pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[case_id(case)])]
                 if case_id(case) in KNOWN_MISSES else [])
    for case in CASES])
def test_hand_checked_sentences(case):
    assert split_sentences(case["text"], case["language"]) == case["sentences"]


def test_every_language_of_the_issue_has_25_hand_checked_cases():
    count = {language: sum(case["language"] == language for case in CASES) for language in {c["language"] for c in CASES}}
    assert all(count.get(language, 0) >= 25 for language in ("en", "fr", "de", "es", "zh", "ja", "th", "hi", "vi")), count
    assert len({case_id(case) for case in CASES}) == len(CASES)
    assert set(KNOWN_MISSES) <= {case_id(case) for case in CASES}


def test_french_titles_are_not_sentence_ends():  # issue 22, as tried from outside
    assert split_sentences("M. Dupont est arrivé à 17 h.", "fr") == ["M. Dupont est arrivé à 17 h."]
    assert split_sentences("Il a vu M. Martin. Puis MM. Durand et Leroy.", "fr") == [
        "Il a vu M. Martin.", "Puis MM. Durand et Leroy."]


def test_thai_is_split_at_the_spaces_between_sentences():
    assert split_sentences("วันนี้อากาศดีมาก เราจะไปเที่ยวทะเลกัน เพราะว่าเป็นวันหยุด", "th") == [
        "วันนี้อากาศดีมาก", "เราจะไปเที่ยวทะเลกัน เพราะว่าเป็นวันหยุด"]
    assert split_sentences("วันนี้อากาศดีมาก เราจะไปเที่ยวทะเลกัน", "en") == ["วันนี้อากาศดีมาก เราจะไปเที่ยวทะเลกัน"]


def test_document_block_whitespace_and_eop():
    block = format_document(["  Dr. Smith\tcame  home.\u00a0He slept. ", "", "\u3000", "Next  day.\nHe woke."], "en")
    assert block.text == "Dr. Smith came home.\nHe slept.<eop>\nNext day.\nHe woke.\n\n"
    assert (block.paragraphs, block.sentences) == (2, 4)
    assert block.characters == sum(map(len, ["Dr. Smith came home.", "He slept.", "Next day.", "He woke."]))
    assert format_document(["", "  \t"], "en") is None
    assert format_document([], "en") is None


# Documents as paragraphs of known sentences; the raw forms below join the sentences with spaces and the
# paragraphs with line breaks, and prepare must give back exactly EXPECTED.
DOCUMENTS = [
    [["Dr. Smith paid $3.50 for the book.", "He read it at 5 p.m. on Monday."],
     ["It was written by J. R. R. Tolkien.", '"Is it good?" asked his wife.', "He said yes."]],
    [["The second document has one paragraph.", "It has three sentences.", "Really!"]],
    [["\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002", "\u6211\u4eec\u53bb\u516c\u56ed\u5427\uff01"]],
]
EXPECTED = "".join("<eop>\n".join("\n".join(p) for p in doc) + "\n\n" for doc in DOCUMENTS)


def raw_text(doc, paragraph_sep="\n"):
    return paragraph_sep.join(" ".join(p) for p in doc)


def write_compressed(path, data, compression):
    if compression == "gz":
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    elif compression == "bz2":
        path = path.with_name(path.name + ".bz2")
        path.write_bytes(bz2.compress(data))
    elif compression == "xz":
        path = path.with_name(path.name + ".xz")
        path.write_bytes(lzma.compress(data))
    elif compression == "zst":
        zstandard = pytest.importorskip("zstandard", reason="zstd input needs zstandard (the prepare extra)")
        path = path.with_name(path.name + ".zst")
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        path.write_bytes(data)
    return path


def make_input(directory, fmt, compression):
    """The DOCUMENTS (plus an empty and a repeated one) in `fmt`; returns (glob, extra config fields)."""
    directory.mkdir(parents=True, exist_ok=True)
    texts = [raw_text(DOCUMENTS[0]), "", raw_text(DOCUMENTS[1]), raw_text(DOCUMENTS[0]), raw_text(DOCUMENTS[2])]
    if fmt == "jsonl":
        lines = [json.dumps({"id": i, "body": t}, ensure_ascii=i % 2 == 0) for i, t in enumerate(texts)]
        write_compressed(directory / "docs.jsonl", ("\n".join(lines) + "\n").encode(), compression)
        return str(directory / "docs.jsonl*"), {"text_key": "body"}
    if fmt == "parquet":
        pa = pytest.importorskip("pyarrow", reason="Parquet input needs pyarrow (the prepare extra)")
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": texts[:3], "n": [1, 2, 3]}), directory / "a.parquet", row_group_size=2)
        pq.write_table(pa.table({"text": texts[3:] + [None], "n": [4, 5, 6]}), directory / "b.parquet")
        return str(directory / "*.parquet"), {}
    if fmt == "text":  # blank_line layout: a blank line ends a document, each line a paragraph
        data = "\n\n\n".join(raw_text(doc) if doc else "" for doc in [DOCUMENTS[0], DOCUMENTS[1], DOCUMENTS[0],
                                                                    DOCUMENTS[2]]) + "\n"
        write_compressed(directory / "docs.txt", data.encode(), compression)
        return str(directory / "docs.txt*"), {}
    if fmt in ("file", "file_wrapped"):  # one document per file
        for i, doc in enumerate([DOCUMENTS[0], [], DOCUMENTS[1], DOCUMENTS[0], DOCUMENTS[2]]):
            if fmt == "file":
                data = "\n\n".join(" ".join(p) for p in doc)
            else:  # hard-wrapped: each sentence on its own line, a blank line between paragraphs
                data = "\n\n".join("\n".join(p) for p in doc)
            write_compressed(directory / f"doc{i}.txt", data.encode(), compression)
        return str(directory / "doc*.txt*"), {"text_layout": fmt}
    raise AssertionError(fmt)


def shards_text(output_dir):
    return "".join(p.read_text("utf-8") for p in sorted(Path(output_dir).glob("shard-*.txt")))


@pytest.mark.parametrize("fmt, compression", [
    (fmt, compression) for fmt in ("jsonl", "text", "file", "file_wrapped") for compression in
    (None, "gz", "bz2", "xz", "zst")] + [("parquet", None)])  # Parquet is compressed inside
def test_every_format_and_compression_gives_the_expected_text(tmp_path, fmt, compression):
    pattern, extra = make_input(tmp_path / "in", fmt, compression)
    summary = prepare(PrepareConfig(pattern, str(tmp_path / "out"), **extra))
    assert shards_text(tmp_path / "out") == EXPECTED
    assert (summary.documents, summary.duplicates_dropped) == (3, 1)
    assert summary.empty_dropped == (2 if fmt == "parquet" else 1 if fmt in ("jsonl", "file", "file_wrapped") else 0)
    assert summary.sentences == sum(len(p) for doc in DOCUMENTS for p in doc)
    assert summary.paragraphs == sum(len(doc) for doc in DOCUMENTS)
    assert not [p for p in os.listdir(tmp_path / "out") if ".tmp-" in p]


def generated_documents(count, seed=0):
    """`count` documents of known sentences (abbreviations, decimals, questions: none of them a boundary trap)."""
    docs = []
    for d in range(seed, seed + count):
        paragraphs = []
        for p in range(1 + d % 3):
            paragraphs.append([f"Document {d} paragraph {p} begins as Dr. Brown weighs {d + p * 0.5:.1f} kilograms.",
                               f"Is sentence two of paragraph {p} in document {d} a question?",
                               f"It ends with the number {d * 7 + p}."][:1 + (d + p) % 3])
        docs.append(paragraphs)
    return docs


def expected_text(docs):
    return "".join("<eop>\n".join("\n".join(p) for p in doc) + "\n\n" for doc in docs)


def write_jsonl(path, docs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": raw_text(doc)}) + "\n" for doc in docs), encoding="utf-8")


def test_shards_are_of_similar_size_and_independent_of_workers(tmp_path, monkeypatch):
    from xlnet_data.datagen.prepare import shards
    monkeypatch.setattr(shards, "INDEX_CHUNK_ROWS", 7)  # the index in several chunks (num_workers=1: in this process)
    docs = generated_documents(80)
    for i in range(4):
        write_jsonl(tmp_path / "in" / f"part{i}.jsonl", docs[i * 20:(i + 1) * 20])
    pattern = str(tmp_path / "in" / "*.jsonl")
    prepare(PrepareConfig(pattern, str(tmp_path / "one"), num_shards=1, num_workers=1))
    summary = prepare(PrepareConfig(pattern, str(tmp_path / "three"), num_shards=3, num_workers=2))
    assert shards_text(tmp_path / "one") == shards_text(tmp_path / "three") == expected_text(docs)
    sizes = [os.path.getsize(p) for p in summary.shards]
    largest_document = max(len(expected_text([doc]).encode()) for doc in docs)
    assert len(sizes) == 3 and max(sizes) - min(sizes) <= largest_document, sizes
    assert all(Path(p).read_text().endswith("\n\n") for p in summary.shards)  # cut at document ends
    again = prepare(PrepareConfig(pattern, str(tmp_path / "three_again"), num_shards=3, num_workers=1))
    assert [Path(p).read_bytes() for p in again.shards] == [Path(p).read_bytes() for p in summary.shards]


def test_the_held_out_documents_are_the_same_for_any_shards_workers_and_files(tmp_path):
    """--dev_fraction sets whole documents aside by the hash of their text: the same ones for 1 and 8 shards, 1
    and 2 workers, and however the documents lie in the input files; none of them is in the train shards."""
    docs = generated_documents(80)
    for i in range(4):
        write_jsonl(tmp_path / "in" / f"part{i}.jsonl", docs[i * 20:(i + 1) * 20])
    write_jsonl(tmp_path / "other" / "all.jsonl", docs[::-1])  # one file, the documents in the reverse order
    blocks = {expected_text([doc]) for doc in docs}

    def split(pattern, out, **flags):
        summary = prepare(PrepareConfig(str(tmp_path / pattern), str(tmp_path / out), **flags))
        dev = shards_text(tmp_path / out / "dev")
        return summary, set(_blocks(dev)), set(_blocks(shards_text(tmp_path / out)))

    one, held, train = split("in/*.jsonl", "one", num_shards=1, num_workers=1, dev_fraction=0.2)
    eight, held_8, train_8 = split("in/*.jsonl", "eight", num_shards=8, num_workers=2, dev_fraction=0.2, dev_shards=2)
    _, held_files, train_files = split("other/*.jsonl", "files", num_shards=3, dev_fraction=0.2)
    assert one.dev_documents == eight.dev_documents == len(held) == 16 and len(eight.dev_shards) == 2
    assert held == held_8 == held_files and train == train_8 == train_files
    assert not held & train and held | train == blocks and one.documents == 80
    _, five, _ = split("in/*.jsonl", "five", dev_documents=5)  # a count: the five smallest hashes, among them
    assert len(five) == 5 and five < held
    with pytest.raises(PrepareError, match="leaves no document to train on"):
        prepare(PrepareConfig(str(tmp_path / "in/*.jsonl"), str(tmp_path / "all"), dev_documents=80))


def _blocks(text):
    """The documents of shards' text (each ends with a blank line)."""
    return [block + "\n\n" for block in text.split("\n\n") if block]


def test_duplicates_across_files_keep_the_first_and_nodedup_keeps_all(tmp_path):
    docs = generated_documents(6)
    write_jsonl(tmp_path / "in" / "a.jsonl", docs[:4])
    # b repeats docs 1 and 3, one of them with other whitespace: still the same document
    (tmp_path / "in" / "b.jsonl").write_text(
        json.dumps({"text": "  " + raw_text(docs[3]).replace(" ", "   \t")}) + "\n" +
        "".join(json.dumps({"text": raw_text(doc)}) + "\n" for doc in [docs[4], docs[1], docs[5]]))
    pattern = str(tmp_path / "in" / "*.jsonl")
    summary = prepare(PrepareConfig(pattern, str(tmp_path / "dedup"), num_workers=2))
    assert shards_text(tmp_path / "dedup") == expected_text(docs)
    assert (summary.documents_read, summary.documents, summary.duplicates_dropped) == (8, 6, 2)
    summary = prepare(PrepareConfig(pattern, str(tmp_path / "all"), dedup=False))
    assert shards_text(tmp_path / "all") == expected_text(docs[:4] + [docs[3], docs[4], docs[1], docs[5]])
    assert summary.duplicates_dropped == 0


def test_earlier_shards_are_kept_unless_overwrite(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", generated_documents(10))
    pattern = str(tmp_path / "in" / "*.jsonl")
    prepare(PrepareConfig(pattern, str(tmp_path / "out"), num_shards=3))
    with pytest.raises(PrepareError, match="already holds 3 shard file.*--overwrite"):
        prepare(PrepareConfig(pattern, str(tmp_path / "out"), num_shards=2))
    prepare(PrepareConfig(pattern, str(tmp_path / "out"), num_shards=2, overwrite=True))
    assert sorted(os.listdir(tmp_path / "out")) == ["shard-00000-of-00002.txt", "shard-00001-of-00002.txt"]
    assert shards_text(tmp_path / "out") == expected_text(generated_documents(10))
    with pytest.raises(PrepareError, match="no file matches .* but the shards of an earlier run"):  # not input
        prepare(PrepareConfig(str(tmp_path / "out" / "*.txt"), str(tmp_path / "out"), overwrite=True))


def test_progress_line_counts_files_and_input_bytes(tmp_path):
    import io

    from xlnet_data.datagen.prepare.shards import _PrepareProgress, _run_workers
    docs = generated_documents(300)
    for i in range(3):
        write_jsonl(tmp_path / "in" / f"part{i}.jsonl", docs[i * 100:(i + 1) * 100])
    files = sorted((tmp_path / "in").glob("*.jsonl"))
    sizes = [p.stat().st_size for p in files]
    config = PrepareConfig(str(tmp_path / "in" / "*"), str(tmp_path / "out"), num_workers=2)
    jobs = [(str(p), size, str(tmp_path / f"part{i}"), config) for i, (p, size) in enumerate(zip(files, sizes))]
    stream = io.StringIO()  # not a terminal: a log line every log_every seconds; 0: at every update
    results = _run_workers(config, jobs, _PrepareProgress(sum(sizes), stream=stream, log_every=0.0))
    assert [len(r.index) for r in results] == [100, 100, 100]
    last = stream.getvalue().strip().splitlines()[-1]
    assert last.startswith("files 3/3 | input ") and "| 100% |" in last, last


def test_more_shards_than_documents_leaves_empty_shards_and_says_so(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", generated_documents(2))
    result = run_module("xlnet_data.prepare", f"--input_glob={tmp_path / 'in' / '*.jsonl'}",
                        f"--output_dir={tmp_path / 'out'}", "--num_shards=4")
    assert result.returncode == 0, result.stderr
    empty = sum(1 for p in (tmp_path / "out").glob("shard-*.txt") if p.stat().st_size == 0)
    assert empty >= 2 and "done: 2 documents" in result.stderr and f"4 shard(s) ({empty} of them empty)" in result.stderr
    assert shards_text(tmp_path / "out") == expected_text(generated_documents(2))


def bad_parquet(directory):
    pa = pytest.importorskip("pyarrow", reason="Parquet input needs pyarrow (the prepare extra)")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["A document."], "id": [1]}), directory / "bad.parquet")
    return "bad.parquet", []


def bad_number_column(directory):
    pa = pytest.importorskip("pyarrow", reason="Parquet input needs pyarrow (the prepare extra)")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": [1, 2]}), directory / "bad.parquet")
    return "bad.parquet", []


def bad_file(name, data):
    def make(directory):
        (directory / name).write_bytes(data)
        return name, []
    return make


GOOD_LINE = b'{"text": "A good document. Two sentences."}\n'
try:
    import zstandard
    ZSTD_GOOD_LINES = zstandard.ZstdCompressor().compress(GOOD_LINE * 1000)
except ImportError:  # the prepare extra brings zstandard
    ZSTD_GOOD_LINES = b""


@pytest.mark.parametrize("make, fragments", [
    (bad_file("bad.jsonl", GOOD_LINE * 2 + b'{"text": "unterminated}\n'), ["bad.jsonl:3: invalid JSON", "column"]),
    (bad_file("bad.jsonl", GOOD_LINE + b'{"body": "x", "id": 2}\n'), ["bad.jsonl:2: no field 'text'", "body, id",
                                                                       "--text_key"]),
    (bad_file("bad.jsonl", b'{"text": 42}\n'), ["bad.jsonl:1: field 'text' holds int, not a string"]),
    (bad_file("bad.jsonl", GOOD_LINE + b'["a", "list"]\n'), ["bad.jsonl:2: a JSON object was expected, not list"]),
    (bad_file("bad.txt", b"Good line.\nBad \xff byte.\n"), ["bad.txt:2: not valid UTF-8", "0xff"]),
    (bad_file("bad.jsonl", GOOD_LINE + b'{"text": "half \\ud83d of an emoji"}\n'), ["bad.jsonl:2: field 'text' holds "
                                                                                "an unpaired surrogate (\\ud83d)"]),
    (bad_file("bad.jsonl.gz", gzip.compress(GOOD_LINE * 1000)[:-40]), ["bad.jsonl.gz:", "truncated"]),
    (bad_file("bad.jsonl.bz2", bz2.compress(GOOD_LINE * 1000)[:-40]), ["bad.jsonl.bz2:", "truncated"]),
    (bad_file("bad.txt.xz", lzma.compress(GOOD_LINE * 1000)[:-40]), ["bad.txt.xz:", "truncated"]),
    (bad_file("bad.jsonl.zst", ZSTD_GOOD_LINES[:-40]), ["bad.jsonl.zst:", "truncated"]),
    (bad_file("bad.txt.xz", b"\xfd7zXZ\x00 damaged"), ["bad.txt.xz:1: cannot read the file"]),
    (bad_file("bad.txt.zst", ZSTD_GOOD_LINES[:4] + b"\xff" * 8 + ZSTD_GOOD_LINES[12:]), ["bad.txt.zst:",
                                                                                           "cannot read the file"]),
    (bad_file("bad.jsonl", GOOD_LINE + b'{"text": ' + b"[" * 100000 + b"]" * 100000 + b"}\n"),
     ["bad.jsonl:2: JSON nested too deeply"]),
    (bad_file("bad.parquet.gz", b"x"), ["bad.parquet.gz: a Parquet file is compressed inside"]),
    (bad_file("bad.parquet", b"not parquet"), ["bad.parquet: not a readable Parquet file"]),
    (bad_parquet, ["bad.parquet: no column 'text' (columns: body, id)", "--text_key"]),
    (bad_number_column, ["bad.parquet: column 'text' holds int64, not strings"]),
])
def test_bad_input_is_one_line_naming_file_and_line_and_nothing_is_written(tmp_path, make, fragments):
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a_good.jsonl", generated_documents(50))  # read in parallel with the bad one
    name, _ = make(tmp_path / "in")
    result = run_module("xlnet_data.prepare", f"--input_glob={tmp_path / 'in' / '*'}",
                        f"--output_dir={tmp_path / 'out'}", "--num_workers=2", "--num_shards=2")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare: error: "), result.stderr
    assert str(tmp_path / "in" / name) in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_flag_errors_are_one_line(tmp_path):
    result = run_module("xlnet_data.prepare", f"--input_glob={tmp_path / 'nothing' / '*.jsonl'}",
                        f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 2 and result.stderr.strip() == (
        f"prepare: error: no file matches --input_glob={tmp_path / 'nothing' / '*.jsonl'}")
    result = run_module("xlnet_data.prepare", f"--input_glob={tmp_path}/*")
    assert result.returncode == 2 and "--output_dir is required" in result.stderr
    result = run_module("xlnet_data", "prepare", "--help")
    assert "--text_layout" in result.stdout and "--num_shards" in result.stdout and result.returncode == 0


@pytest.mark.slow
def test_create_gives_the_same_records_as_from_the_hand_made_input(tmp_path, sample_spm):
    """prepare and create as library calls, in this process (the commands' exits are other tests'): the same numba
    code loaded once for both creates, no interpreter started three times."""
    from xlnet_data.datagen.config import CreateConfig
    from xlnet_data.datagen.job import create_records
    docs = generated_documents(40)
    write_jsonl(tmp_path / "raw" / "corpus.jsonl", docs)
    (tmp_path / "hand").mkdir()
    (tmp_path / "hand" / "corpus.txt").write_text(expected_text(docs), encoding="utf-8")
    prepare(PrepareConfig(str(tmp_path / "raw" / "*.jsonl"), str(tmp_path / "prepared"), num_workers=1))
    assert shards_text(tmp_path / "prepared") == expected_text(docs)
    records = {}
    for name, pattern in (("hand", "hand/*.txt"), ("prepared", "prepared/*.txt")):
        config = CreateConfig(input_glob=str(tmp_path / pattern), sp_path=str(sample_spm),
                              save_dir=str(tmp_path / (name + "_records")), seq_len=32, reuse_len=16, bsz_per_host=2,
                              num_core_per_host=1, num_predict=5)
        create_records(config.validate(), num_workers=1)
        records[name] = read_save_dir(tmp_path / (name + "_records"), seq_len=32)
    assert records["hand"] and sum(len(v) for v in records["hand"].values()) > 10
    assert list(records["hand"]) == list(records["prepared"])
    for name, examples in records["hand"].items():
        assert len(examples) == len(records["prepared"][name])
        for mine, theirs in zip(examples, records["prepared"][name]):
            assert mine.keys() == theirs.keys()
            assert all((mine[k] == theirs[k]).all() for k in mine)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_prepare_with_one_line_and_leaves_no_temporary(tmp_path, signum):
    docs = generated_documents(20000)
    for i in range(4):
        write_jsonl(tmp_path / "in" / f"part{i}.jsonl", docs[i * 5000:(i + 1) * 5000])
    out = tmp_path / "out"
    args = [f"--input_glob={tmp_path / 'in' / '*.jsonl'}", f"--output_dir={out}", "--num_workers=2"]
    process = subprocess.Popen([sys.executable, "-m", "xlnet_data.prepare", *args], stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None and not list(out.glob(".tmp-prepare-*/part-*")):
        time.sleep(0.01)
    assert process.poll() is None, "prepare ended before it could be stopped: " + process.stderr.read()
    os.killpg(process.pid, signum)  # as Ctrl-C does (SIGINT), or `kill -- -PGID`
    try:
        stderr = process.communicate(timeout=60)[1]
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signum
    assert "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if "error" in line] == [
        f"prepare: error: stopped by {signal.Signals(signum).name}; no shard is half-written, but the run is "
        "incomplete: run the same command again with --overwrite"]
    assert not out.exists() or os.listdir(out) == [], "a stopped first run leaves nothing behind"
    rerun = run_module("xlnet_data.prepare", *args, "--overwrite")
    assert rerun.returncode == 0, rerun.stderr
    assert shards_text(out) == expected_text(docs)


# Issue 27: compressed input read to its end, real paths, control characters, line breaks, long paragraphs.

@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", "zst"])
def test_a_truncated_compressed_file_is_refused_and_the_whole_one_read(tmp_path, compression):
    pattern, extra = make_input(tmp_path / "in", "jsonl", compression)
    (path,) = (tmp_path / "in").glob("docs.jsonl*")
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) * 2 // 3])
    with pytest.raises(PrepareError, match=f"^{path}:[0-9]+: the compressed file is truncated"):
        prepare(PrepareConfig(pattern, str(tmp_path / "out"), **extra))
    assert not (tmp_path / "out").exists()
    path.write_bytes(whole)  # the file downloaded again: the same command gives the uninterrupted output
    prepare(PrepareConfig(pattern, str(tmp_path / "out"), **extra))
    assert shards_text(tmp_path / "out") == EXPECTED


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", "zst"])
def test_compression_is_told_by_content_not_name(tmp_path, compression):
    from xlnet_data.common import fileio
    data = ("\n".join(raw_text(doc) for doc in DOCUMENTS) + "\n").encode()
    path = write_compressed(tmp_path / "docs.txt", data, compression)
    misnamed = path.rename(tmp_path / "docs.txt")  # compressed, named as plain text
    plain_named_compressed = tmp_path / f"plain.txt.{compression}"
    plain_named_compressed.write_bytes(data)
    for each in (misnamed, plain_named_compressed):
        with fileio.open_decompressed(str(each)) as (f, raw, found):
            assert f.read() == data and found == (None if each == plain_named_compressed else found)
    with fileio.open_decompressed(str(misnamed)) as (f, raw, found):
        assert found == {"gz": "gzip", "bz2": "bzip2", "xz": "xz", "zst": "zstd"}[compression]
    summary = prepare(PrepareConfig(str(tmp_path / "*"), str(tmp_path / "out"), text_layout="file", dedup=False))
    assert summary.documents == 2 and shards_text(tmp_path / "out").count("Tolkien") == 2


def test_zstd_frames_are_read_across_and_to_their_end():
    zstandard = pytest.importorskip("zstandard")
    import io

    from xlnet_data.common import fileio
    frames = [zstandard.ZstdCompressor().compress(bytes([65 + i]) * (70000 * i + 5)) for i in range(3)]
    reader = io.BufferedReader(fileio._ZstdReader(io.BytesIO(b"".join(frames))))
    assert reader.read() == b"".join(bytes([65 + i]) * (70000 * i + 5) for i in range(3))
    reader = io.BufferedReader(fileio._ZstdReader(io.BytesIO(b"".join(frames)[:-3])))
    with pytest.raises(EOFError):
        reader.read()


def test_overwrite_with_an_absolute_glob_and_a_relative_output_dir_does_not_read_its_shards(tmp_path, monkeypatch):
    docs = generated_documents(12)
    write_jsonl(tmp_path / "data" / "corpus.jsonl", docs)
    (tmp_path / "data" / "notes.txt").write_text("A plain note. It is a document too.\n", encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    pattern = str(tmp_path / "data" / "*")  # absolute; the shards go to data/ (relative) too
    first = prepare(PrepareConfig(pattern, "data", num_shards=2))
    text = shards_text(tmp_path / "data")
    assert text == expected_text(docs) + "A plain note.\nIt is a document too.\n\n" and first.files == 2
    for output_dir in ("data", "link", str(tmp_path / "data")):
        again = prepare(PrepareConfig(pattern, output_dir, num_shards=2, overwrite=True))
        assert again.files == 2 and shards_text(tmp_path / "data") == text
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        "corpus.jsonl", "notes.txt", "shard-00000-of-00002.txt", "shard-00001-of-00002.txt"]
    with pytest.raises(PrepareError, match="no file matches .* but the shards of an earlier run in data"):
        prepare(PrepareConfig(str(tmp_path / "data" / "shard-*"), "data", num_shards=2, overwrite=True))


# Characters every format treats alike: line breaks (\r\n, \r, \n, U+2028, U+2029) end a paragraph; the other
# characters str.splitlines() knows are spaces; control characters are dropped.
CONTROL_TEXT = ("First\u0000 para\u001bgraph. It\u0007 has\x0cthree\x0bsentences\x1cand\x85spaces. Really!\r\n"
                "Second\u0002 one.\rThird one.\u2028Fourth one.\u2029Fifth\x7f one.\x9b")
CONTROL_EXPECTED = ("First paragraph.\nIt has three sentences and spaces.\nReally!<eop>\nSecond one.<eop>\n"
                    "Third one.<eop>\nFourth one.<eop>\nFifth one.\n\n")


@pytest.mark.parametrize("fmt", ["jsonl", "text", "parquet"])
def test_line_breaks_and_control_characters_are_the_same_in_every_format(tmp_path, fmt):
    (tmp_path / "in").mkdir()
    if fmt == "jsonl":
        (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"text": CONTROL_TEXT}) + "\n", encoding="utf-8")
    elif fmt == "text":
        (tmp_path / "in" / "a.txt").write_bytes(CONTROL_TEXT.encode())
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": [CONTROL_TEXT]}), tmp_path / "in" / "a.parquet")
    extra = {"text_layout": "file"} if fmt == "text" else {}
    prepare(PrepareConfig(str(tmp_path / "in" / "*"), str(tmp_path / "out"), **extra))
    assert shards_text(tmp_path / "out") == CONTROL_EXPECTED


def test_a_carriage_return_only_file_is_read_as_lines(tmp_path):
    (tmp_path / "in").mkdir()
    text = "\n\n".join(raw_text(doc) for doc in DOCUMENTS) + "\n"
    (tmp_path / "in" / "unix.txt").write_text(text, encoding="utf-8")
    prepare(PrepareConfig(str(tmp_path / "in" / "unix.txt"), str(tmp_path / "unix")))
    for name, newline in (("mac.txt", "\r"), ("dos.txt", "\r\n")):
        (tmp_path / "in" / name).write_bytes(text.replace("\n", newline).encode())
        prepare(PrepareConfig(str(tmp_path / "in" / name), str(tmp_path / name)))
        assert shards_text(tmp_path / name) == shards_text(tmp_path / "unix") == EXPECTED


def long_paragraph(sentences):
    return " ".join(f"Sentence {i} was said by Dr. Brown at 3.5 p.m. on Jan. {i % 28 + 1} in the U.S. and so on."
                    if i % 3 else f"Was sentence {i} a question?" for i in range(sentences))


def test_a_long_paragraph_is_split_in_windows_as_a_whole_one_is(monkeypatch):
    from xlnet_data.datagen.prepare import sentences
    cases = [("en", long_paragraph(400)), ("zh", "".join(f"这是第{i}个句子。你好吗？" for i in range(800))),
             ("en", '"' + long_paragraph(100) + '" he said. ' + long_paragraph(60))]
    windowed = [split_sentences(text, language) for language, text in cases]
    monkeypatch.setattr(sentences, "PIECE", 10**9)
    assert windowed == [split_sentences(text, language) for language, text in cases]
    assert len(windowed[0]) == 400 and max(map(len, cases[0][1].split(". "))) < sentences.MARGIN


def test_a_long_paragraph_without_sentence_ends_is_one_sentence_split_in_bounded_windows(monkeypatch):
    from xlnet_data.datagen.prepare import sentences
    calls, whole = [], sentences.sentencex.segment

    def segment(language, text):
        calls.append(len(text))
        return whole(language, text)
    monkeypatch.setattr(sentences.sentencex, "segment", segment)
    words = " ".join(f"word{i}" for i in range(5000))
    assert split_sentences(words, "en") == [words] and split_sentences("x" * 9000, "en") == ["x" * 9000]
    assert len(calls) > 10 and max(calls) <= sentences.PIECE
    thai = ["วันนี้อากาศดีมาก", "เราจะไปเที่ยวทะเลกัน เพราะว่าเป็นวันหยุด", "ราคา 350 บาท ต่อคน"]
    text = " ".join(thai[i % 3] for i in range(300))  # 14,000 characters, no sentence mark: Thai's rule decides
    windowed = split_sentences(text, "th")
    monkeypatch.setattr(sentences, "PIECE", 10**9)
    assert windowed == split_sentences(text, "th") and len(windowed) > 100


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_a_long_paragraph_is_answered_at_once(tmp_path, signum):
    # 3 million characters of Chinese in one paragraph (about 1.5 s of splitting, so that the signal comes in the
    # middle of it): hours for sentencex in one call, whose end a signal would wait for
    sentences = [f"这是第{i % 100000}个句子。" for i in range(300000)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "long.jsonl").write_text(json.dumps({"text": "".join(sentences)}) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    args = [f"--input_glob={tmp_path / 'in' / '*'}", f"--output_dir={out}", "--language=zh", "--num_workers=1"]
    process = subprocess.Popen([sys.executable, "-m", "xlnet_data.prepare", *args], stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None and not list(out.glob(".tmp-prepare-*/part-*")):
        time.sleep(0.01)
    time.sleep(0.1)  # inside the paragraph
    assert process.poll() is None, "prepare ended before it could be stopped: " + process.stderr.read()
    os.killpg(process.pid, signum)
    try:
        stderr = process.communicate(timeout=10)[1]  # a liveness bound, not a speed figure: unbounded before windows
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signum and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if "error" in line] == [
        f"prepare: error: stopped by {signal.Signals(signum).name}; no shard is half-written, but the run is "
        "incomplete: run the same command again with --overwrite"]
    assert not out.exists()
    prepare(PrepareConfig(str(tmp_path / "in" / "*"), str(out), language="zh"))
    assert shards_text(out) == "\n".join(sentences) + "\n\n"


def test_create_reads_zstd_told_by_content_and_refuses_a_truncated_one(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    from xlnet_data.datagen.corpus import InputError, check_first_block
    data = expected_text(generated_documents(200)).encode()
    whole = zstandard.ZstdCompressor().compress(data)
    (tmp_path / "corpus.txt").write_bytes(whole)  # misnamed: zstd under a plain-text name
    check_first_block(str(tmp_path / "corpus.txt"))
    (tmp_path / "cut.txt.zst").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(InputError, match=f"^{tmp_path / 'cut.txt.zst'}: damaged zstd data .*end-of-stream"):
        check_first_block(str(tmp_path / "cut.txt.zst"))


def test_a_folder_of_one_document_files_read_by_blank_line_is_told_to_use_file(tmp_path):
    """12 articles, one a file, with blank lines between their paragraphs (as a Wikipedia export): blank_line, the
    default, makes 36 documents of them and says so; file makes 12 and says nothing."""
    for i in range(12):
        (tmp_path / f"article{i:02d}.txt").write_text(
            f"Article {i} begins here.\n\nIts second paragraph, number {i}.\n\nA last one, {i} again.\n")
    out = tmp_path / "out"
    summary = prepare(PrepareConfig(str(tmp_path / "*.txt"), str(out), num_workers=1))
    assert (summary.text_files, summary.text_documents) == (12, 36)
    warning = summary.layout_warning("blank_line")
    assert warning.startswith("--text_layout=blank_line cut the 12 text files into 36 documents (3 a file")
    assert "--text_layout=file" in warning
    summary = prepare(PrepareConfig(str(tmp_path / "*.txt"), str(out), text_layout="file", num_workers=1,
                                    overwrite=True))
    assert summary.documents == 12 and summary.layout_warning("file") is None
    # A few large files of many documents each (the input format itself) are not warned about
    assert dataclasses.replace(summary, text_files=3, text_documents=3000).layout_warning("blank_line") is None
