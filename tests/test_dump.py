"""Tests of `python -m xlnet_data.dump` and its pure functions (the reader: test_records.py).

Records are parsed independently with TensorFlow (tf.data + tf.train.Example) and
compared with what the dump shows. The CLI runs in subprocesses (it does not import
TensorFlow, so each run costs well under a second).
"""

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import G1, ROOT, SHARED, g1_file

from xlnet_data.dataformat import inspection, selection, settings
from xlnet_data.dataformat.records import FEATURES
from xlnet_data.dataformat.stats import compute_stats, format_stats
from xlnet_data.dataformat.vocab import CLS_ID, EOD_ID, EOP_ID, SEP_ID, is_start_piece

SPM = SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"

needs_shared = pytest.mark.skipif(
    not (G1 / "expected").is_dir() or not SPM.is_file(),
    reason=f"shared test data not found at {SHARED} (golden/g1_blog and data/spiece are needed)")


def run_cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1", PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "xlnet_data.dump", *map(str, args)], cwd=cwd or ROOT,
                          env=env, capture_output=True, text=True, encoding="utf-8", timeout=120)


def tf_count_until_error(tf, path):
    """How many records TensorFlow reads before it reports data loss (the bad record's index)."""
    n = 0
    try:
        for _ in tf.data.TFRecordDataset(str(path), compression_type="GZIP" if str(path).endswith(".gz") else ""):
            n += 1
    except tf.errors.DataLossError:
        return n
    raise AssertionError(f"TensorFlow read all of {path}")


@pytest.fixture(scope="module")
def sp():
    if not SPM.is_file():
        pytest.skip(f"SentencePiece model not found at {SPM}")
    from xlnet_data.dataformat.vocab import load_sentencepiece
    return load_sentencepiece(str(SPM))


# ---------------------------------------------------------------- pure functions


def _synthetic(reuse=4, a=(20, 21, 22), b=(30, 31), after_a=23, after_b=32, label=0):
    """An example laid out as the spec says: mem + A + <sep> + B + <sep> + <cls>."""
    mem = list(range(10, 10 + reuse))
    inp = mem + list(a) + [SEP_ID] + list(b) + [SEP_ID, CLS_ID]
    tgt = mem[1:] + [a[0]] + list(a[1:]) + [after_a] + [b[0]] + list(b[1:]) + [after_b] + [CLS_ID, CLS_ID]
    seg = [0] * (reuse + len(a) + 1) + [1] * (len(b) + 1) + [2]
    mask = [0] * len(inp)
    return {"input": inp, "target": tgt, "seg_id": seg, "is_masked": mask, "label": [label]}


def test_decode_example_structure_and_target_check():
    ex = _synthetic()
    assert len(ex["input"]) == 12
    d = inspection.decode_example(ex, reuse_len=4)
    assert (d.len_a, d.len_b, d.label) == (3, 2, 0)
    assert d.parts == {"memory": (0, 4), "a": (4, 7), "b": (8, 10)}
    assert d.layout_ok and d.problems == []
    check = d.target_check
    # positions 0..9 minus A's last (6) and B's last (9): 8 checked, all ok
    assert (check.checked, check.ok, check.num_violations) == (8, 8, 0)
    assert check.cls_ok and (check.a_next, check.b_next) == (23, 32)

    bad = _synthetic()
    bad["target"][2] = 99                       # inside the memory
    bad["target"][7] = 99                       # A's <sep>: its target must be B's first piece
    d = inspection.decode_example(bad, reuse_len=4)
    assert d.target_check.num_violations == 2
    assert [v[:2] for v in d.target_check.violations] == [(2, 99), (7, 99)]

    broken = _synthetic()
    broken["seg_id"][5] = 1
    d = inspection.decode_example(broken, reuse_len=4)
    assert not d.layout_ok and "seg_id" in d.problems[0]
    broken = _synthetic()
    broken["input"][-1] = 17
    assert "<cls>" in inspection.decode_example(broken, reuse_len=4).problems[0]


def test_backward_rows_and_runs():
    # bsz 8, 2 cores: each core's 2 forward rows are followed by their reversed copies
    assert [inspection.is_backward_row(i, 8, 2, True) for i in range(16)] == [False, False, True, True] * 4
    assert [inspection.is_backward_row(i, 8, 1, True) for i in range(8)] == [False] * 4 + [True] * 4
    assert not any(inspection.is_backward_row(i, 8, 1, False) for i in range(8))
    assert inspection.masked_runs([1, 1, 0, 1, 0, 0, 1]) == [(0, 2), (3, 4), (6, 7)]
    assert inspection.masked_runs([0, 0]) == []


def test_render_pieces_marks_masked():
    pieces = ["▁Alice", "▁was", "▁beg", "inning", "<eop>"]
    assert inspection.render_pieces(pieces, [0, 0, 1, 1, 0]) == "Alice was ⟦▁beg⟧⟦inning⟧<eop>"
    # Markers that the text's brackets cannot be mistaken for (`[rɐˈsjijə[],]` with plain ones), nor its own ⟦⟧.
    brackets = ["▁[", "rɐˈsjijə", "[", "]", ",", "]"]
    assert inspection.render_pieces(brackets, [0, 0, 0, 1, 0, 0]) == "[rɐˈsjijə[⟦]⟧,]"
    assert inspection.render_pieces(["▁⟦a⟧", "b"], [0, 1]) == "⟦a⟧««b»»"
    coloured = inspection.render_pieces(pieces, [1, 0, 0, 0, 0], color=True)
    assert "\x1b[" in coloured and "⟦▁Alice⟧" in coloured


def test_compute_stats_words_and_cuts():
    # ids: 100 = word start, 101 = continuation piece
    table = np.zeros(200, dtype=bool)
    table[[100, SEP_ID, CLS_ID]] = True
    ex = _synthetic(reuse=4, a=(100, 101, 100), b=(100, 101))
    ex["input"][:4] = [100, 101, 100, 100]
    ex["target"][:4] = ex["input"][1:5]
    # memory: span [1,2) = one continuation piece (cuts a word, 1 word);
    # second half: span [4,6) = "100 101" (one whole word); span [8,9) = "100" then 101 follows (cuts)
    ex["is_masked"] = [0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0]
    d = inspection.decode_example(ex, reuse_len=4)
    s = compute_stats([d], start_table=table, bsz_per_host=1)
    assert s["count"] == 1 and s["batches"] == 1
    assert s["span_pieces"] == {1: 2, 2: 1}
    assert s["span_words"] == {1: 3}
    assert s["spans_cutting_words"] == 2
    assert s["masked"] == {"min": 4, "mean": 4.0, "max": 4}
    # the same example as a backward row: spans are taken in reading order (flipped)
    d = inspection.decode_example(ex, reuse_len=4, reverse=True)
    s = compute_stats([d], start_table=table)
    # memory flipped = 100 100 [101] 100: the span is a continuation piece -> still cuts;
    # second half flipped = cls sep 101 [100] sep 100 [101 100]: "[100]" then sep: no cut;
    # "[101 100]" begins inside a word: cut, 2 words
    assert s["span_words"] == {1: 2, 2: 1}
    assert s["spans_cutting_words"] == 2
    assert "span length" in format_stats(s)


def test_settings_from_file_name_and_corpus_info(tmp_path):
    name = "train-1-1.bsz-4.seqlen-64.reuse-32.uncased.uni.alpha-6.beta-1.fnp-10.tfrecords.gz"
    assert settings.name_settings(name) == {
        "bsz_per_host": 4, "seq_len": 64, "reuse_len": 32, "bi_data": False, "mask_alpha": 6,
        "mask_beta": 1, "uncased": True, "num_predict": 10}
    save = tmp_path / "run" / "out"
    (save / "tfrecords").mkdir(parents=True)
    rec = save / "tfrecords" / name
    rec.write_bytes(b"")
    (save / "corpus_info.json").write_text(json.dumps(
        {"seq_len": 64, "reuse_len": 32, "bsz_per_host": 4, "num_core_per_host": 1, "bi_data": True,
         "sp_path": "models/sp.model", "input_glob": "in/*.txt"}))
    (tmp_path / "run" / "models").mkdir()
    (tmp_path / "run" / "models" / "sp.model").write_bytes(b"x")
    for arg in (save, save / "tfrecords", rec, str(save / "tfrecords" / "*.tfrecords*")):
        files, candidates = selection.resolve_inputs([str(arg)])
        assert files == [str(rec)]
        found = settings.records_settings(files, candidates, {"seq_len": None})
        assert found.corpus_info_path == str(save / "corpus_info.json")
        assert found.values["bi_data"] is True and found.sources["bi_data"] == "corpus_info.json"
        assert found.values["seq_len"] == 64 and found.sources["reuse_len"] == "corpus_info.json"
        assert any("disagrees" in w for w in found.warnings)           # the name says uni
    found = settings.records_settings(files, candidates, {"bi_data": False})
    assert found.values["bi_data"] is False and found.sources["bi_data"] == "flag"
    # sp_path is relative to where the original ran: the save_dir's parent here
    assert selection.resolve_sp_path("models/sp.model", str(save / "corpus_info.json"), cwd="/") == \
        str(tmp_path / "run" / "models" / "sp.model")
    with pytest.raises(selection.InspectionError, match="no such file"):
        selection.resolve_inputs([str(tmp_path / "nope")])


@needs_shared
def test_sp_path_of_golden_resolves():
    info = json.loads((G1 / "expected" / "corpus_info.json").read_text())
    found = selection.resolve_sp_path(info["sp_path"], str(G1 / "expected" / "corpus_info.json"),
                                 info["input_glob"], cwd="/")
    assert Path(found).resolve() == SPM.resolve()


# ---------------------------------------------------------------- the CLI on g1


@pytest.mark.slow
@needs_shared
def test_text_view_shows_alice_with_masks(g1, sp, tmp_path):
    res = run_cli(G1 / "expected", "--limit=8", "--color=never", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "alice" in out and "rabbit" in out          # g1 is uncased Alice in Wonderland
    assert "⟦▁" in out and "\x1b[" not in out
    assert "# 8 example(s) shown; all checks pass" in out
    first = out.split("#0 ", 1)[1].split("\n\n", 1)[0]
    label = g1[0]["label"][0]
    assert f"label {label} " in first.splitlines()[0]
    part_lines = [ln for ln in first.splitlines() if ln.lstrip().startswith(("memory", "A ", "B "))]
    assert len(part_lines) == 3
    shown = "".join(ln.split(" | ", 1)[1] for ln in part_lines)
    masked_pieces = [sp.id_to_piece(i) for i, m in zip(g1[0]["input"], g1[0]["is_masked"]) if m]
    assert len(masked_pieces) == 21
    assert shown.count("⟦") == 21 and all(f"⟦{p}⟧" in shown for p in masked_pieces)
    assert "124/124 next-token positions" in first
    # a backward row (bsz 8, 1 core: rows 4-7) is flipped back into reading order
    fifth = out.split("#5 ", 1)[1].split("\n\n", 1)[0]
    assert "backward" in fifth.splitlines()[0]


@pytest.mark.slow
@needs_shared
def test_json_view_round_trips_every_feature(g1, sp):
    res = run_cli(G1 / "expected", "--format=json")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == len(g1) == 1248
    for i, (line, theirs) in enumerate(zip(lines, g1)):
        obj = json.loads(line)
        assert obj["index"] == obj["record"] == i
        for name in FEATURES:
            assert obj[name] == theirs[name], (i, name)
        assert obj["input_pieces"] == [sp.id_to_piece(t) for t in theirs["input"]]
        assert obj["target_check"]["violations"] == [] and obj["problems"] == []
        assert obj["direction"] == ("backward" if i % 8 >= 4 else "forward")
    res = run_cli(g1_file(), "--format=json", "--skip=5", "--limit=3")
    assert [json.loads(ln)["index"] for ln in res.stdout.splitlines()] == [5, 6, 7]
    res = run_cli(g1_file(), "--format=json", "--example=1247")
    assert json.loads(res.stdout)["input"] == g1[1247]["input"]


def _independent_stats(records, reuse=64, bsz=8):
    """Counted here with plain Python, without the dump's helpers."""
    label1 = sum(r["label"][0] for r in records)
    masked = [sum(r["is_masked"]) for r in records]
    len_a = [r["seg_id"].count(0) - reuse - 1 for r in records]
    len_b = [r["seg_id"].count(1) - 1 for r in records]
    eop = sum(r["input"].count(EOP_ID) for r in records)
    eod = sum(r["input"].count(EOD_ID) for r in records)
    spans = 0
    for r in records:
        for half in (r["is_masked"][:reuse], r["is_masked"][reuse:]):
            spans += sum(1 for k, m in enumerate(half) if m and (k == 0 or not half[k - 1]))
    return dict(label1=label1, masked=masked, len_a=len_a, len_b=len_b, eop=eop, eod=eod, spans=spans)


@pytest.mark.slow
@needs_shared
def test_stats_agree_with_independent_count(g1):
    res = run_cli(G1 / "expected", "--stats", "--format=json")
    assert res.returncode == 0, res.stderr
    stats = json.loads(res.stdout)
    ref = _independent_stats(g1)
    assert stats["count"] == 1248
    assert stats["batches"] == 156 and stats["record_info_num_batch"] == 156
    assert stats["labels"]["1"] == ref["label1"] and stats["labels"]["0"] == 1248 - ref["label1"]
    assert stats["label1_share"] == pytest.approx(ref["label1"] / 1248)
    assert stats["masked"] == {"min": 21, "mean": 21.0, "max": 21}           # = num_predict
    assert stats["masked_memory"]["mean"] == 11 and stats["masked_ab"]["mean"] == 10   # 21 - 21//2, 21//2
    assert stats["len_a"]["mean"] == pytest.approx(np.mean(ref["len_a"]))
    assert stats["len_b"]["mean"] == pytest.approx(np.mean(ref["len_b"]))
    assert stats["eop"] == ref["eop"] and stats["eod"] == ref["eod"] == 0
    assert stats["spans"] == ref["spans"] == sum(stats["span_pieces"].values())
    assert sum(stats["span_words"].values()) == ref["spans"]
    assert stats["target_violations"] == 0 and stats["records_failing_checks"] == 0
    assert stats["target_positions_checked"] == 1248 * 124
    assert 0 < stats["cut_share"] < 0.5

    table = run_cli(G1 / "expected", "--stats", "--limit=16")
    assert table.returncode == 0, table.stderr
    assert "masked per example        min 21  mean 21.00  max 21" in table.stdout
    assert "records                   16" in table.stdout and "span length" in table.stdout


@needs_shared
def test_backward_rows_read_in_the_samplers_order(g1, sp):
    """The original samples spans on the flipped backward rows, so a multi-piece span starts at a
    word start in reading order; read the wrong way round, far fewer do."""
    start = [is_start_piece(sp.id_to_piece(i)) for i in range(sp.get_piece_size())]

    def share(flip):
        good = total = 0
        for idx, r in enumerate(g1):
            backward = idx % 8 >= 4
            for lo, hi in ((0, 64), (64, 128)):
                ids, m = r["input"][lo:hi], r["is_masked"][lo:hi]
                if backward == flip:
                    ids, m = ids[::-1], m[::-1]
                for b, e in inspection.masked_runs(m):
                    if e - b > 1:
                        total += 1
                        good += start[ids[b]]
        return good / total

    right, wrong = share(True), share(False)
    assert right > 0.97 and wrong < right - 0.05


# ---------------------------------------------------------------- corrupt input


def _assert_one_line_error(res, path, index):
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr)
    assert "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("dump: error:")]
    assert len(errors) == 1, res.stderr
    assert str(path) in errors[0] and f"record {index} " in errors[0], errors[0]
    return errors[0]


@pytest.mark.slow
@needs_shared
def test_corrupt_files_end_with_one_line_error(tf, tmp_path):
    data = gzip.decompress(g1_file().read_bytes())

    truncated = tmp_path / "truncated.tfrecords"
    truncated.write_bytes(data[:500_000])
    line = _assert_one_line_error(run_cli(truncated), truncated, tf_count_until_error(tf, truncated))
    assert "truncated" in line

    truncated_gz = tmp_path / "truncated.tfrecords.gz"
    truncated_gz.write_bytes(g1_file().read_bytes()[:90_000])
    line = _assert_one_line_error(run_cli(truncated_gz, "--stats"), truncated_gz,
                                  tf_count_until_error(tf, truncated_gz))
    assert "gzip stream is truncated" in line

    flipped = tmp_path / "flipped.tfrecords"
    corrupt = bytearray(data)
    corrupt[400_000] ^= 0x10
    flipped.write_bytes(bytes(corrupt))
    line = _assert_one_line_error(run_cli(flipped, "--format=json"), flipped, tf_count_until_error(tf, flipped))
    assert "CRC" in line

    noise = tmp_path / "noise.tfrecords"
    noise.write_bytes(random.Random(7).randbytes(5000))
    _assert_one_line_error(run_cli(noise), noise, 0)

    # a valid record, then one of another schema
    other = tmp_path / "other.tfrecords"
    first = next(iter(tf.data.TFRecordDataset(str(g1_file()), compression_type="GZIP"))).numpy()
    foreign = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x89PNG"])),
        "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))})).SerializeToString()
    with tf.io.TFRecordWriter(str(other)) as writer:
        writer.write(first)
        writer.write(foreign)
    line = _assert_one_line_error(run_cli(other, "--sp_path", SPM), other, 1)
    assert "missing input" in line and "unexpected class, image" in line


def test_help_and_plot_extra(tmp_path):
    res = run_cli("--help")          # the help on stdout, exit 0 (absl's 1 is turned into 0 by cli.run)
    assert res.returncode == 0 and "Traceback" not in res.stderr
    text = res.stdout + res.stderr
    for flag in ("format", "stats", "plot", "limit", "skip", "example", "sp_path", "corpus_info", "seq_len",
                 "reuse_len", "bsz_per_host", "num_core_per_host", "bi_data", "color", "strict", "verify_crc"):
        assert f"--{flag}:" in text or f"--[no]{flag}:" in text, flag     # each flag listed with its help
    assert "python -m xlnet_data.dump PATH" in res.stdout + res.stderr

    res = run_cli("--stats", f"--plot={tmp_path / 'h.png'}", tmp_path / "missing.tfrecords")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert res.returncode == 2 and res.stderr.startswith("dump: error: ") and "pip install matplotlib" in res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    else:
        assert res.returncode == 2 and res.stderr.startswith("dump: error: no such file")


@pytest.mark.slow
def test_a_save_dir_of_two_splits_with_their_own_passes_is_complete(sample_spm, tmp_path):
    """The README's save_dir: train with --num_passes=2, then --split=dev with --num_passes=1. Each split is
    its own create run: dump finds nothing missing (it said the dev split lacked pass 1, which would have halved
    the user's train data had they followed it); a train pass lost is still found."""
    from conftest import SAMPLE_CORPUS, run_module
    text = tmp_path / "emma.txt"
    text.write_text("\n".join((SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:40]) + "\n")
    flags = [f"--input_glob={text}", f"--sp_path={sample_spm}", f"--save_dir={tmp_path / 'proc'}", "--seq_len=64",
             "--reuse_len=32", "--bsz_per_host=4", "--num_core_per_host=1", "--num_predict=10", "--num_workers=1"]
    for split, passes in (("train", 2), ("dev", 1)):
        done = run_module("xlnet_data.create", *flags, f"--split={split}", f"--num_passes={passes}")
        assert done.returncode == 0, done.stderr
    for split in ("train", "dev"):
        assert not selection.select(selection.SelectionConfig(paths=(str(tmp_path / "proc"),), split=split)).warnings
    shown = run_cli(tmp_path / "proc", "--stats")
    assert shown.returncode == 0 and "lacks" not in shown.stderr + shown.stdout, shown.stderr
    for path in (tmp_path / "proc" / "tfrecords").glob("*train-0-1.*"):  # the train split's pass 1 lost
        path.unlink()
    (warning,) = selection.select(selection.SelectionConfig(paths=(str(tmp_path / "proc"),))).warnings
    assert "lacks pass(es) 1" in warning and "--num_passes=2" in warning
