"""create never loses work: bad input is reported with file and line, outputs are atomic, re-runs resume."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, SAMPLE_CORPUS, read_save_dir, run_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_golden import assert_same_records


def _said(stderr):
    """The lines of stderr but absl's INFO log lines (create's plan line, since issue 45: progress, not the error)."""
    return [line for line in stderr.strip().splitlines() if not re.match(r"I\d{4} ", line)]

SMALL = ["--seq_len=32", "--reuse_len=16", "--bsz_per_host=2", "--num_core_per_host=1", "--num_predict=6",
         "--num_workers=1"]


def create(tmp_path, spm, input_glob, *extra):
    return run_module("xlnet_data.create", f"--input_glob={input_glob}", f"--sp_path={spm}",
                      f"--save_dir={tmp_path / 'out'}", *SMALL, *extra)


def outputs(tmp_path):
    tfrecords = tmp_path / "out" / "tfrecords"
    return sorted(os.listdir(tfrecords)) if tfrecords.exists() else []


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


SENTENCES = "".join(f"Sentence number {i} tells a short story.\n" for i in range(200))


@pytest.mark.slow
def test_invalid_utf8_is_replaced_and_counted_or_fatal_with_strict(tmp_path, sample_spm):
    write(tmp_path / "in" / "a.txt", SENTENCES.encode() + b"bad \xff\xfe bytes\n" + SENTENCES.encode())
    result = create(tmp_path, sample_spm, tmp_path / "in" / "*.txt")
    assert result.returncode == 0, result.stderr
    assert "a.txt:201: 1 line(s) not valid UTF-8" in result.stderr
    assert "1 invalid UTF-8 lines replaced" in result.stderr
    assert any(name.endswith(".tfrecords") for name in outputs(tmp_path))

    strict = create(tmp_path / "strict", sample_spm, tmp_path / "in" / "*.txt", "--strict")
    assert strict.returncode == 2
    assert len(_said(strict.stderr)) == 1
    assert "a.txt:201: not valid UTF-8" in strict.stderr and "Traceback" not in strict.stderr
    assert outputs(tmp_path / "strict") == []


def test_a_very_long_line_is_kept_and_warned_once_per_file(tmp_path, sample_spm):
    long_line = "word " * 30000
    write(tmp_path / "in" / "a.txt", SENTENCES + long_line + "\n" + long_line + "\n" + SENTENCES)
    result = create(tmp_path, sample_spm, tmp_path / "in" / "*.txt")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("a.txt:201: a line of 149999 characters") == 1
    assert result.stderr.count("a line of") == 1


@pytest.mark.parametrize("line, message", [
    ("12 x3 4", "a.txt:3: 'x3' is not an integer id"),
    ("12 1000 4", "a.txt:3: id 1000 is outside the SentencePiece vocabulary [0, 1000)"),
    ("-1", "a.txt:3: id -1 is outside"),
])
def test_bad_ids_stop_with_file_and_line(tmp_path, sample_spm, line, message):
    write(tmp_path / "in" / "a.txt", "5 6 7\n8 9\n" + line + "\n" + "10 11 12\n" * 300)
    result = create(tmp_path, sample_spm, tmp_path / "in" / "*.txt", "--nofrom_raw_text")
    assert result.returncode == 2
    assert len(_said(result.stderr)) == 1 and message in result.stderr, result.stderr
    assert outputs(tmp_path) == []


def test_empty_and_blank_only_files_are_skipped_and_counted(tmp_path, sample_spm):
    write(tmp_path / "in" / "a.txt", SENTENCES * 3)
    write(tmp_path / "in" / "b_empty.txt", "")
    write(tmp_path / "in" / "c_blank.txt", "\n\n  \n")
    result = create(tmp_path, sample_spm, tmp_path / "in" / "*.txt", "--nouse_eod")  # the original crashes here
    assert result.returncode == 0, result.stderr
    assert "c_blank.txt: no tokens" in result.stderr and "b_empty.txt: no tokens" in result.stderr
    assert "2 files without tokens skipped" in result.stderr
    assert len(outputs(tmp_path)) == 2


def test_a_corpus_too_small_for_one_batch_writes_nothing_and_says_so(tmp_path, sample_spm):
    write(tmp_path / "in" / "a.txt", "Just one short sentence.\n")
    result = create(tmp_path, sample_spm, tmp_path / "in" / "*.txt")
    assert result.returncode == 0
    assert "too few for one batch" in result.stderr and "tokens" in result.stderr
    assert outputs(tmp_path) == []


@pytest.mark.slow
def test_a_glob_matching_a_directory_or_dangling_link_stops(tmp_path, sample_spm):
    write(tmp_path / "in" / "a.txt", SENTENCES)
    (tmp_path / "in" / "dir.txt").mkdir()
    result = create(tmp_path, sample_spm, tmp_path / "in" / "*.txt")
    assert result.returncode == 2 and "dir.txt is not a file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    os.rmdir(tmp_path / "in" / "dir.txt")
    os.symlink(tmp_path / "missing", tmp_path / "in" / "link.txt")
    result = create(tmp_path, sample_spm, tmp_path / "in" / "*.txt")
    assert result.returncode == 2 and "link.txt is not a file" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_rerun_skips_complete_units_overwrite_redoes_and_other_flags_are_refused(tmp_path, sample_spm):
    glob = SAMPLE_CORPUS / "austen_emma.txt"
    first = create(tmp_path, sample_spm, glob, "--num_passes=2")
    assert first.returncode == 0, first.stderr
    info = next((tmp_path / "out" / "tfrecords").glob("record_info-train-0-1.*"))
    mtime = info.stat().st_mtime_ns
    again = create(tmp_path, sample_spm, glob, "--num_passes=3")
    assert again.returncode == 0
    assert again.stderr.count("is complete already") == 2 and "done: 1 unit(s)" in again.stderr
    assert info.stat().st_mtime_ns == mtime
    redo = create(tmp_path, sample_spm, glob, "--num_passes=2", "--overwrite")
    assert "done: 2 unit(s)" in redo.stderr and info.stat().st_mtime_ns != mtime
    other = create(tmp_path, sample_spm, glob, "--num_passes=2", "--mask_alpha=3")
    assert other.returncode == 2 and "holds data made with other flags" in other.stderr
    assert "mask_alpha 6 there, 3 here" in other.stderr


def _stopped(pid):
    """Stopped, or ended (a zombie never stops: the wait for it would never end)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in "tTZ"


def kill_between_units(process, tfrecords, timeout=600):
    """SIGKILLs `process` (create, one worker: it runs the units itself) while it is held still (SIGSTOP) with a
    unit complete and the next one open under its temporary name: between the first unit and the last,
    however fast the machine. Each look is taken with the process stopped, so it cannot move on meanwhile."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        process.send_signal(signal.SIGSTOP)
        while not _stopped(process.pid):
            time.sleep(0.001)
        with contextlib.suppress(OSError):
            opened = [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{process.pid}/fd")]
            if list(tfrecords.glob("record_info-*")) and any(".tmp-" in path and "tfrecords" in path
                                                             for path in opened):
                process.send_signal(signal.SIGKILL)
                process.wait()
                return
        process.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("create was never seen writing a unit after its first")


@pytest.mark.slow
def test_sigkill_leaves_nothing_training_would_read_and_a_rerun_completes_it(tmp_path, sample_spm):
    corpus = tmp_path / "in"
    books = sorted(SAMPLE_CORPUS.glob("*.txt"))
    for i in range(2):  # small: the kill lands between units by holding the run still, not by its length (three
        # books a file: a unit still writes for tens of ms, longer than the 20 ms kill_between_units lets it run)
        write(corpus / f"part{i}.txt", "".join(p.read_text() for p in books[3 * i:3 * i + 3]))
    args = [f"--input_glob={corpus}/*.txt", f"--sp_path={sample_spm}", "--seq_len=64", "--reuse_len=32",
            "--bsz_per_host=4", "--num_predict=10", "--use_tpu=False", "--num_passes=4", "--num_workers=1"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed = subprocess.Popen([sys.executable, "-m", "xlnet_data.create", *args, f"--save_dir={tmp_path}/killed"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tfrecords = tmp_path / "killed" / "tfrecords"
    kill_between_units(killed, tfrecords)
    infos = sorted(tfrecords.glob("record_info-*"))
    assert 1 <= len(infos) < 4, "the kill should land between the first and the last unit"
    for info in infos:  # what training reads is complete: every record_info names a whole file
        for name in json.loads(info.read_text())["filenames"]:
            assert os.path.exists(name)
    final_records = [p for p in tfrecords.iterdir() if p.name.endswith(".tfrecords") and ".tmp-" not in p.name]
    assert len(final_records) == len(infos)  # in-progress output only exists under a temporary name

    assert len(list((tmp_path / "killed" / "token_cache").glob("tokens-0.*"))) == 2  # kept for the re-run

    rerun = run_module("xlnet_data.create", *args, f"--save_dir={tmp_path}/killed")
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stderr.count("is complete already") == len(infos)
    assert "task 0: token cache found" in rerun.stderr and "into its token cache" not in rerun.stderr  # not encoded again
    whole = run_module("xlnet_data.create", *args, f"--save_dir={tmp_path}/whole")
    assert whole.returncode == 0
    assert whole.stderr.count("into its token cache") == 1  # one encoding for the four passes
    assert_same_records(tmp_path / "whole", tmp_path / "killed")
    for save_dir in ("killed", "whole"):  # a completed run leaves no cache behind
        assert not (tmp_path / save_dir / "token_cache").exists()


# ---- fuzz: random bytes and line structures never crash create and never give off-schema records ----

line_strategy = st.one_of(
    st.text(max_size=60), st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.lists(st.integers(-5, 1100), max_size=12).map(lambda ids: " ".join(map(str, ids))),
    st.sampled_from(["", " ", "\t", "<eop>", "1,000, 2,", "Ünïcödé café", "\r", "\x00", "\u2028", "東京"]))
file_strategy = st.one_of(st.binary(max_size=400), st.lists(line_strategy, max_size=80).map(
    lambda lines: "\n".join(lines).encode("utf-8", errors="surrogatepass")))


@pytest.mark.slow  # 25 create runs
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(file_strategy, min_size=1, max_size=3), from_raw_text=st.booleans(), use_eod=st.booleans(),
       bi_data=st.booleans())
def test_fuzzed_input_never_crashes_or_breaks_the_schema(tmp_path_factory, sample_spm, files, from_raw_text,
                                                          use_eod, bi_data):
    from xlnet_data import CreateConfig, create_records
    from xlnet_data.datagen.corpus import InputError

    tmp = tmp_path_factory.mktemp("fuzz")
    for i, data in enumerate(files):
        try:
            data = data.decode("utf-8", errors="surrogatepass").encode("utf-8", errors="replace") \
                if isinstance(data, bytes) and b"\xed" in data else data
        except UnicodeDecodeError:
            pass
        write(tmp / "in" / f"f{i}.txt", data * 8)
    config = CreateConfig(input_glob=str(tmp / "in" / "*.txt"), sp_path=sample_spm, save_dir=str(tmp / "out"),
                          seq_len=16, reuse_len=8, bsz_per_host=2, num_core_per_host=1, use_tpu=False,
                          num_predict=5, from_raw_text=from_raw_text, use_eod=use_eod, bi_data=bi_data).validate()
    from xlnet_data.datagen.plan import CreateError
    try:
        create_records(config, num_workers=1)
    except InputError as err:
        assert any(str(tmp / "in" / f"f{i}.txt") in str(err) for i in range(len(files))), err  # names the file
        return
    except CreateError as err:  # files without a byte, or without a token: an empty corpus is an error
        assert str(err).startswith("the corpus is empty: "), err
        return
    for examples in read_save_dir(tmp / "out", seq_len=16).values():
        for ex in examples:
            assert ex["input"].min() >= 0 and ex["input"].max() < 1000
            assert ex["target"].min() >= 0 and ex["target"].max() < 1000
            assert set(np.unique(ex["seg_id"])) <= {0, 1, 2} and ex["label"][0] in (0, 1)
            assert ex["is_masked"].sum() == 5 and set(np.unique(ex["is_masked"])) <= {0, 1}
