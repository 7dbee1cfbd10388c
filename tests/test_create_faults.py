"""create under faults: a busy save_dir, signals, a full disk, long lines, compressed and binary input.

Each test checks the exit status, the one-line message (with the path), what is left in save_dir and,
where the run can be repeated, that the re-run's records equal an uninterrupted run's.
"""

import bz2
import contextlib
import gzip
import lzma
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import SAMPLE_CORPUS, command_env, record_infos, run_module

ARGS = ["--seq_len=64", "--reuse_len=32", "--bsz_per_host=4", "--num_predict=10", "--use_tpu=False"]
ENV = command_env()


def create_args(spm, input_glob, save_dir, *extra):
    return [f"--input_glob={input_glob}", f"--sp_path={spm}", f"--save_dir={save_dir}", *ARGS, *extra]


def start_create(args):
    return subprocess.Popen([sys.executable, "-m", "xlnet_data.create", *map(str, args)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if ": error: " in line]


def listing(save_dir):
    """Every file under save_dir, relative."""
    return sorted(os.path.relpath(os.path.join(d, f), save_dir) for d, _, files in os.walk(save_dir) for f in files)


def assert_same_records(expected_dir, actual_dir):
    """The same records files, byte for byte (one writer: equal records are equal bytes), and record_infos
    (the same num_batch and file names; they hold their save_dir's path)."""
    names = sorted(os.listdir(os.path.join(expected_dir, "tfrecords")))
    assert sorted(os.listdir(os.path.join(actual_dir, "tfrecords"))) == names
    for name in (n for n in names if n.endswith(".tfrecords")):
        with open(os.path.join(expected_dir, "tfrecords", name), "rb") as want, \
                open(os.path.join(actual_dir, "tfrecords", name), "rb") as got:
            assert got.read() == want.read(), name
    assert record_infos(actual_dir) == record_infos(expected_dir)


def temporaries(save_dir):
    return [name for name in listing(save_dir) if ".tmp-" in name]


def children(pid):
    """Live (not zombie) child processes of `pid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            if fields[1] == str(pid) and fields[0] != "Z":
                found.append(int(entry))
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """Two copies of sample_corpus: a few seconds of work per unit, so that a signal lands mid-run."""
    corpus = tmp_path_factory.mktemp("big")
    text = "".join(p.read_text() for p in sorted(SAMPLE_CORPUS.glob("*.txt")))
    for i in range(2):
        (corpus / f"part{i}.txt").write_text(text)
    return corpus


def wait_for_temporary(save_dir, process, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if any(name.endswith(".tfrecords") for name in temporaries(save_dir)):
            return
        time.sleep(0.02)
    raise AssertionError("create never started writing a unit")


def writing_worker(process, timeout=120):
    """The pid of a worker of `process` that has a temporary file open (it is writing a unit)."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        for pid in children(process.pid):
            with contextlib.suppress(OSError):
                if any(".tmp-" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")):
                    return pid
        time.sleep(0.01)
    raise AssertionError("no worker of create was seen writing a unit")


@pytest.fixture(scope="module")
def whole_run(big_corpus, sample_spm, tmp_path_factory):
    """An uninterrupted run on big_corpus: what every interrupted-then-repeated run must equal."""
    save_dir = tmp_path_factory.mktemp("whole") / "out"
    result = run_module("xlnet_data.create", *create_args(sample_spm, big_corpus / "*.txt", save_dir,
                                                          "--num_passes=3", "--num_workers=2"))
    assert result.returncode == 0, result.stderr
    return save_dir


# ---- one run per save_dir ----

@pytest.mark.slow
def test_a_second_create_on_a_busy_save_dir_is_refused_naming_the_holder(tmp_path, big_corpus, sample_spm, whole_run):
    save_dir = tmp_path / "out"
    first = start_create(create_args(sample_spm, big_corpus / "*.txt", save_dir, "--num_passes=3", "--num_workers=2"))
    wait_for_temporary(save_dir, first)
    # Held still while the second run starts (it holds its lock): a fast first run could finish before.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = run_module("xlnet_data.create", *create_args(sample_spm, SAMPLE_CORPUS / "austen_emma.txt", save_dir,
                                                              "--span_unit=word", "--num_workers=1"))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2
    assert error_lines(second.stderr) == second.stderr.strip().splitlines()[-1:]
    message = error_lines(second.stderr)[0]
    assert f"{save_dir} is in use by another create run (pid {first.pid} on {os.uname().nodename}, started " in message
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert_same_records(whole_run, save_dir)  # the refused run wrote nothing into it
    assert temporaries(save_dir) == []


@pytest.mark.slow
def test_the_lock_dies_with_its_process_and_a_rerun_removes_the_dead_runs_temporaries(tmp_path, big_corpus,
                                                                                    sample_spm, whole_run):
    save_dir = tmp_path / "out"
    args = create_args(sample_spm, big_corpus / "*.txt", save_dir, "--num_passes=3", "--num_workers=1")
    killed = start_create(args)
    wait_for_temporary(save_dir, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    left = temporaries(save_dir)
    assert left, "SIGKILL leaves the unit being written as a temporary file"
    rerun = run_module("xlnet_data.create", *args)
    assert rerun.returncode == 0, rerun.stderr
    assert f"removed {len(left)} temporary file(s) left by an interrupted run" in rerun.stderr
    assert f"the last create run here (pid {killed.pid}) did not end; its peak resident memory was " in rerun.stderr
    assert temporaries(save_dir) == [] and not (save_dir / ".create.peak.json").exists()
    assert_same_records(whole_run, save_dir)


@pytest.mark.slow
def test_a_run_killed_mid_encode_is_told_of_by_the_next_which_makes_the_same_records(tmp_path, big_corpus, sample_spm,
                                                                                   whole_run):
    """SIGKILL (what the kernel's out-of-memory killer sends) while the token cache is being written: the re-run
    says the killed run's last recorded peak memory, encodes again and makes the uninterrupted run's records."""
    save_dir = tmp_path / "out"
    args = create_args(sample_spm, big_corpus / "*.txt", save_dir, "--num_passes=3", "--num_workers=1")
    killed = start_create(args)
    deadline = time.time() + 120
    while not ((save_dir / ".create.peak.json").exists()
               and any(name.startswith("token_cache/") for name in temporaries(save_dir))):
        assert time.time() < deadline and killed.poll() is None, "create never started encoding"
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert not any(name.endswith(".json") for name in os.listdir(save_dir / "tfrecords"))  # no unit complete
    rerun = run_module("xlnet_data.create", *args)
    assert rerun.returncode == 0, rerun.stderr
    assert f"the last create run here (pid {killed.pid}) did not end; its peak resident memory was " in rerun.stderr
    assert temporaries(save_dir) == [] and not (save_dir / ".create.peak.json").exists()
    assert_same_records(whole_run, save_dir)


@pytest.mark.slow
def test_temporaries_that_are_not_a_save_dir_output_are_left_alone(tmp_path, sample_spm):
    save_dir = tmp_path / "out"
    (save_dir / "tfrecords").mkdir(parents=True)
    (save_dir / "tfrecords" / ".tmp-0123abcd-notes.txt").write_text("mine")
    (save_dir / ".tmp-zz-corpus_info.json").write_text("not ours: no 8 hex digits")
    result = run_module("xlnet_data.create", *create_args(sample_spm, SAMPLE_CORPUS / "austen_emma.txt", save_dir,
                                                          "--num_workers=1"))
    assert result.returncode == 0, result.stderr
    assert temporaries(save_dir) == [".tmp-zz-corpus_info.json", "tfrecords/.tmp-0123abcd-notes.txt"]


# ---- signals ----

@pytest.mark.slow
@pytest.mark.parametrize("signum, whom", [(signal.SIGINT, "group"), (signal.SIGTERM, "main"),
                                          (signal.SIGTERM, "group"), (signal.SIGINT, "main")])
def test_a_signal_stops_create_with_one_line_and_its_workers_and_a_rerun_finishes_it(tmp_path, big_corpus,
                                                                                  sample_spm, whole_run, signum, whom):
    save_dir = tmp_path / "out"
    args = create_args(sample_spm, big_corpus / "*.txt", save_dir, "--num_passes=3", "--num_workers=2")
    process = start_create(args)
    wait_for_temporary(save_dir, process)
    workers = children(process.pid)
    assert len(workers) >= 2
    if whom == "group":  # Ctrl-C in a terminal, or `kill -- -PGID`
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    try:
        stderr = process.communicate(timeout=60)[1]
    finally:
        if process.returncode is None:  # a hang: no stray processes after it
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signum
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    name = signal.Signals(signum).name
    assert error_lines(stderr) == [f"create: error: stopped by {name}; complete units are kept and nothing is "
                                   "half-written: run the same command again to do the rest"]
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.05)
    assert not [pid for pid in workers if alive(pid)], "no worker outlives create"
    assert temporaries(save_dir) == []
    infos = [name for name in listing(save_dir) if "record_info-" in name]
    records = [name for name in listing(save_dir) if name.endswith(".tfrecords")]
    assert len(records) == len(infos) < 3  # each records file complete, with its record_info
    rerun = run_module("xlnet_data.create", *args)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_records(whole_run, save_dir)


@pytest.mark.slow
def test_sigkill_to_create_alone_takes_its_workers_with_it(tmp_path, big_corpus, sample_spm, whole_run):
    save_dir = tmp_path / "out"
    args = create_args(sample_spm, big_corpus / "*.txt", save_dir, "--num_passes=3", "--num_workers=2")
    process = start_create(args)
    wait_for_temporary(save_dir, process)
    workers = children(process.pid)
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.05)
    assert not [pid for pid in workers if alive(pid)], "the workers stop when their parent dies"
    assert temporaries(save_dir) == [], "the workers' SIGTERM (PR_SET_PDEATHSIG) removes their temporary files"
    rerun = run_module("xlnet_data.create", *args)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_records(whole_run, save_dir)


@pytest.mark.slow
def test_a_worker_killed_mid_run_stops_create_with_one_line_and_a_rerun_finishes_it(tmp_path, big_corpus, sample_spm,
                                                                                    whole_run):
    save_dir = tmp_path / "out"
    args = create_args(sample_spm, big_corpus / "*.txt", save_dir, "--num_passes=3", "--num_workers=2")
    process = start_create(args)
    victim = writing_worker(process)
    os.kill(victim, signal.SIGSTOP)  # frozen mid-unit: it cannot finish before the kill
    os.kill(victim, signal.SIGKILL)  # as the OOM killer would
    try:
        stderr = process.communicate(timeout=60)[1]
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 2, stderr
    assert error_lines(stderr) == [f"create: error: a worker process (pid {victim}) was killed by SIGKILL in the middle "
                                   "of its work (out of memory? see `dmesg`); what is complete is kept: run the same "
                                   "command again to do the rest"]
    assert "Traceback" not in stderr
    assert temporaries(save_dir) == [], "the run removes the dead worker's temporary file"
    rerun = run_module("xlnet_data.create", *args)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_records(whole_run, save_dir)


def test_a_signal_stops_dump_with_one_line(whole_run):
    process = subprocess.Popen([sys.executable, "-m", "xlnet_data.dump", str(whole_run)], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    # It prints once its handler is set; unread, its output of some 70,000 examples fills the pipe and holds
    # it there, mid-run, however fast the machine.
    assert process.stdout.readline().startswith("# files:"), "dump printed nothing"
    os.killpg(process.pid, signal.SIGINT)
    try:
        stderr = process.communicate(timeout=30)[1]
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130
    assert stderr.strip().splitlines()[-1:] == ["dump: error: stopped by SIGINT"] and "Traceback" not in stderr, stderr


# ---- a full disk ----

@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (mounting needs root; skipped where it is refused)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.slow
def test_a_full_disk_names_the_file_leaves_no_temporary_and_a_rerun_completes(tmp_path, small_disk, sample_spm):
    save_dir = small_disk / "out"
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (4 * 2**20 - 96 * 1024))  # ~96 KiB left: corpus_info fits, a unit does not
    args = create_args(sample_spm, SAMPLE_CORPUS / "austen_emma.txt", save_dir, "--num_passes=2", "--num_workers=2")
    full = run_module("xlnet_data.create", *args)
    assert full.returncode == 2
    assert "Traceback" not in full.stderr
    [line] = error_lines(full.stderr)
    # The first file that does not fit: the task's token cache (the encode stage: its data, or the index written
    # after it) or a unit's records.
    in_cache = line.startswith(f"create: error: {save_dir}/token_cache/tokens-0.") and line.endswith(
        (".bin: No space left on device", ".json: No space left on device"))
    in_records = (line.startswith(f"create: error: {save_dir}/tfrecords/train-0-")
                  and line.endswith(".tfrecords: No space left on device"))
    # Or, since issue 45, the plan's refusal before anything is encoded (its disk estimate is above what is left).
    planned = line.startswith("create: error: the token cache and records would take ") and "nothing written" in line
    assert in_cache or in_records or planned, line
    assert temporaries(save_dir) == []
    assert not [name for name in listing(save_dir) if name.endswith(".tfrecords")]

    filler.unlink()
    rerun = run_module("xlnet_data.create", *args)
    assert rerun.returncode == 0, rerun.stderr
    whole = run_module("xlnet_data.create", *create_args(sample_spm, SAMPLE_CORPUS / "austen_emma.txt",
                                                         tmp_path / "whole", "--num_passes=2", "--num_workers=1"))
    assert whole.returncode == 0
    assert_same_records(tmp_path / "whole", save_dir)


@pytest.mark.slow
def test_an_unwritable_save_dir_is_one_line_naming_it(tmp_path, sample_spm):
    if os.geteuid() == 0:
        target = tmp_path / "file"  # root writes everywhere: use a save_dir below a plain file instead
        target.write_text("")
        save_dir, reason = target / "out", "Not a directory"
    else:
        target = tmp_path / "ro"
        target.mkdir(mode=0o500)
        save_dir, reason = target / "out", "Permission denied"
    result = run_module("xlnet_data.create", *create_args(sample_spm, SAMPLE_CORPUS / "austen_emma.txt", save_dir,
                                                          "--num_workers=1"))
    assert result.returncode == 2
    assert error_lines(result.stderr) == [f"create: error: {save_dir}: {reason}"]
    assert "Traceback" not in result.stderr


# ---- compressed and binary input ----

@pytest.mark.slow
def test_gzip_bzip2_and_xz_corpora_give_the_records_of_the_text(tmp_path, sample_spm):
    texts = [p.read_bytes() for p in sorted(SAMPLE_CORPUS.glob("*.txt"))][:4]
    names = ["a.txt", "b.txt", "c.txt", "d.txt"]
    packings = [("a.txt.gz", gzip.compress), ("b.txt.bz2", bz2.compress), ("c.txt.xz", lzma.compress),
                ("d.txt", gzip.compress)]  # the last misnamed: a format is told by its first bytes, not its name
    for folder in ("plain", "packed"):
        (tmp_path / folder).mkdir()
    for name, (packed_name, compress), text in zip(names, packings, texts):
        (tmp_path / "plain" / name).write_bytes(text)
        (tmp_path / "packed" / packed_name).write_bytes(compress(text))
    runs = {}
    for folder in ("plain", "packed"):  # one task per file, so that each file's records are compared
        runs[folder] = run_module("xlnet_data.create", *create_args(sample_spm, tmp_path / folder / "*",
                                                                    tmp_path / f"out_{folder}", "--num_task=4",
                                                                    "--num_workers=1"))
        assert runs[folder].returncode == 0, runs[folder].stderr
    assert "0 invalid UTF-8 lines replaced" in runs["packed"].stderr
    assert len(listing(tmp_path / "out_packed" / "tfrecords")) == 8
    assert_same_records(tmp_path / "out_plain", tmp_path / "out_packed")


PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00\x1f\xf3\xffa"
       + bytes(range(256)) * 20)


@pytest.mark.slow
@pytest.mark.parametrize("name, data, message", [
    ("image.png", PNG, "image.png:3: a NUL byte: this is not a text file"),  # after the signature's line breaks
    ("random.bin", bytes((i * 7919 + 13) % 128 + 128 for i in range(5000)),
     "random.bin:1: 77% of the bytes from here are not UTF-8: this is not a text file"),
    ("text_then_nul.txt", b"A sentence.\nAnother one.\n\x00\x01\x02\n", "text_then_nul.txt:3: a NUL byte"),
])
def test_a_binary_file_is_refused_naming_it_unless_allowed(tmp_path, sample_spm, name, data, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text((SAMPLE_CORPUS / "austen_emma.txt").read_text())
    (tmp_path / "in" / name).write_bytes(data)
    result = run_module("xlnet_data.create", *create_args(sample_spm, tmp_path / "in" / "*", tmp_path / "out",
                                                          "--num_workers=1"))
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert line.startswith(f"create: error: {tmp_path / 'in' / name}") and message in line, line
    assert "--allow_binary" in line
    assert not (tmp_path / "out").exists()
    allowed = run_module("xlnet_data.create", *create_args(sample_spm, tmp_path / "in" / "*", tmp_path / "out",
                                                           "--num_workers=1", "--allow_binary"))
    assert allowed.returncode == 0, allowed.stderr


def test_a_damaged_gzip_file_is_one_line_naming_it(tmp_path, sample_spm):
    (tmp_path / "in").mkdir()
    packed = gzip.compress((SAMPLE_CORPUS / "austen_emma.txt").read_bytes())
    (tmp_path / "in" / "cut.txt.gz").write_bytes(packed[:len(packed) // 2])
    result = run_module("xlnet_data.create", *create_args(sample_spm, tmp_path / "in" / "*", tmp_path / "out",
                                                          "--num_workers=1"))
    assert result.returncode == 2
    assert error_lines(result.stderr) == [f"create: error: {tmp_path / 'in' / 'cut.txt.gz'}: damaged gzip data "
                                          "(Compressed file ended before the end-of-stream marker was reached); "
                                          "re-download or re-compress it"]
    assert temporaries(tmp_path / "out") == [] and not [n for n in listing(tmp_path / "out") if "tfrecords" in n]


def test_spm_train_on_a_full_disk_names_the_file_and_leaves_nothing(small_disk):
    (small_disk / "filler").write_bytes(b"\0" * (4 * 2**20 - 100 * 1024))  # the model (~240 KB) does not fit
    prefix = small_disk / "spm" / "sample"
    result = run_module("xlnet_data.spm_train", f"--input={SAMPLE_CORPUS / 'austen_emma.txt'}",
                        f"--model_prefix={prefix}", "--vocab_size=1000", "--num_threads=1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert line in (f"spm_train: error: {prefix}.model: No space left on device",
                    f"spm_train: error: {prefix}.vocab: No space left on device")
    assert os.listdir(small_disk / "spm") == []  # no model, no vocab, no temporary file


# ----- splits of two SentencePiece models (issue 43) ---------------------------------------------------

def _in_process_create(spm, text, save_dir, split, overwrite=False):
    from xlnet_data.datagen.config import CreateConfig
    from xlnet_data.datagen.job import create_records
    config = CreateConfig(input_glob=str(text), sp_path=str(spm), save_dir=str(save_dir), bsz_per_host=4,
                          num_core_per_host=1, seq_len=64, reuse_len=32, num_predict=10, split=split)
    return create_records(config.validate(), overwrite=overwrite, num_workers=1)


def test_a_split_made_with_another_sentencepiece_model_is_refused_and_the_save_dir_left_as_it_was(tmp_path,
                                                                                                  sample_spm,
                                                                                                  other_spm):
    """create --split=dev (with or without --overwrite) with another model than the save_dir's train units once left
    a save_dir of two models, which train_gpu and dump then refused whole; now create refuses it before writing."""
    from xlnet_data.common.errors import UserError
    from xlnet_data.dataformat import provenance
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()
    for split, part in (("train", lines[:60]), ("dev", lines[60:90])):
        (tmp_path / f"{split}.txt").write_text("\n".join(part) + "\n")
    save_dir = tmp_path / "out"
    _in_process_create(sample_spm, tmp_path / "train.txt", save_dir, "train")
    only_train = {name: (save_dir / name).read_bytes() for name in listing(save_dir)}
    with pytest.raises(UserError):
        _in_process_create(other_spm, tmp_path / "dev.txt", save_dir, "dev")
    assert {name: (save_dir / name).read_bytes() for name in listing(save_dir)} == only_train
    _in_process_create(sample_spm, tmp_path / "dev.txt", save_dir, "dev")
    both = {name: (save_dir / name).read_bytes() for name in listing(save_dir)}
    for split, text in (("dev", "dev.txt"), ("train", "train.txt")):  # the other split's units are another model's
        with pytest.raises(UserError) as refused:
            _in_process_create(other_spm, tmp_path / text, save_dir, split, overwrite=True)
        assert provenance.sha256_of(str(sample_spm)) in str(refused.value)  # the save_dir's model, named
        assert {name: (save_dir / name).read_bytes() for name in listing(save_dir)} == both
    _in_process_create(sample_spm, tmp_path / "dev.txt", save_dir, "dev", overwrite=True)  # the same model: redone
