"""create --runner=beam on a real Dask cluster (Beam's DaskRunner) and on Beam's DirectRunner in multi_processing mode.

Each cluster is a `distributed.LocalCluster` of two worker processes on 127.0.0.1, started and closed by
the test. The launcher runs as a subprocess in the golden case's folder with the golden's relative paths,
while the workers run in this process's working directory: the paths must reach them absolute.
"""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import GOLDEN, ROOT, command_env, golden_flags, needs_shared, run_module
from test_beam import CASE, g2_flags
from test_golden import CASES, assert_same_corpus_info, assert_same_records

needs_dask = pytest.mark.skipif(
    importlib.util.find_spec("apache_beam") is None or importlib.util.find_spec("distributed") is None,
    reason="apache_beam and distributed are not installed (the `beam` and `dask` extras)")

pytestmark = pytest.mark.slow  # a two-worker Dask cluster per module fixture
LAUNCH_TIMEOUT_S = 300
KILL_CASES = os.environ.get("XLNET_DASK_KILL_CASES", "g2_multitask").split(",")  # golden cases to kill workers in


def local_cluster():
    """Two single-threaded worker processes, each under a nanny that restarts it if it dies; loopback only."""
    from distributed import LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", silence_logs=40)
    assert_workers_import_this_package(cluster)
    return cluster


def assert_workers_import_this_package(cluster):
    """Workers get this process's sys.path (they are spawned); they must run the code under test."""
    from distributed import Client

    import xlnet_data
    with Client(cluster) as client:
        seen = client.run(lambda: __import__("xlnet_data").__file__)
    assert set(seen.values()) == {xlnet_data.__file__}, seen


def dask_flags(cluster):
    return ["--runner=beam", "--beam_runner=DaskRunner", f"--beam_options=--dask_client_address={cluster.scheduler_address}"]


def summary(result):
    """create's summary line without its time (a warning about the text's accents may follow it)."""
    line = next((line for line in result.stderr.strip().splitlines()[::-1] if line.startswith("done: ")), "")
    assert line, result.stderr
    return line.rsplit(",", 1)[0]


def test_local_paths_are_made_absolute_and_remote_ones_kept(tmp_path, monkeypatch):
    from xlnet_data.datagen.config import CreateConfig
    monkeypatch.chdir(tmp_path)
    config = CreateConfig(input_glob="in/*.txt", sp_path="../m.model", save_dir="gs://bucket/out").with_absolute_paths()
    assert (config.input_glob, config.sp_path, config.save_dir) == (
        str(tmp_path / "in" / "*.txt"), str(tmp_path.parent / "m.model"), "gs://bucket/out")
    assert CreateConfig(sp_path="").with_absolute_paths().sp_path == ""


@pytest.mark.skipif(importlib.util.find_spec("apache_beam") is None, reason="apache_beam is not installed")
def test_dask_runner_without_dask_says_how_to_install_it(tmp_path):
    code = ("import sys; sys.modules['distributed'] = None; from xlnet_data.create import run; "
            f"sys.argv = ['create', '--runner=beam', '--beam_runner=DaskRunner', '--save_dir={tmp_path / 'out'}']; run()")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "create: error: --beam_runner=DaskRunner needs Dask: pip install 'xlnet-data[beam,dask]'"), result.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def cluster():
    cluster = local_cluster()
    yield cluster
    cluster.close(timeout=30)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The local runner's save_dir and summary for g2's four units: what the other runners must reproduce."""
    save_dir = tmp_path_factory.mktemp("local")
    result = run_module("xlnet_data.create", *g2_flags(), f"--save_dir={save_dir}", "--num_workers=1", cwd=CASE,
                        timeout=LAUNCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    return save_dir, summary(result)


@needs_dask
@needs_shared
@pytest.mark.parametrize("case", CASES)
def test_golden_case_on_a_two_worker_dask_cluster(cluster, case, tmp_path):
    case_dir = GOLDEN / case
    result = run_module("xlnet_data.create", *golden_flags(case_dir), *dask_flags(cluster),
                        # resolved: the relative path is followed from the real case folder (../shared may be a link)
                        f"--save_dir={os.path.relpath(tmp_path.resolve(), case_dir.resolve())}", cwd=case_dir,
                        timeout=LAUNCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert summary(result).startswith("done: ")
    assert_same_records(case_dir / "expected", tmp_path)
    assert_same_corpus_info(case_dir / "expected", tmp_path)


@needs_dask
@needs_shared
def test_dask_runner_writes_the_local_runners_records_and_summary(cluster, local_run, tmp_path):
    """Four units spread over the two workers; the counts come back from record_info (DaskRunner has no metrics)."""
    local_dir, local_summary = local_run
    result = run_module("xlnet_data.create", *g2_flags(), *dask_flags(cluster), f"--save_dir={tmp_path}", cwd=CASE,
                        timeout=LAUNCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert summary(result) == local_summary
    assert_same_records(local_dir, tmp_path)
    assert_same_corpus_info(local_dir, tmp_path)


@needs_dask
def test_dask_runner_keeps_the_accents(cluster, tmp_path):
    """create --keep_accents reaches the workers: their records are the local runner's, marks kept."""
    from test_languages import _write, assert_keep_accents_reached_the_records, beam_and_local_runs

    from xlnet_data.datagen import beam_runner, tokenizer
    corpus = _write(tmp_path / "corpus", ["th", "vi"])
    model = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
        input_files=tuple(map(str, sorted(corpus.glob("*.txt")))), model_prefix=str(tmp_path / "spm" / "m"),
        vocab_size=500, hard_vocab_limit=False, character_coverage=1.0, keep_accents=True, num_threads=2))
    args = beam_runner.pipeline_args("DaskRunner", f"--dask_client_address={cluster.scheduler_address}")
    assert_keep_accents_reached_the_records(*beam_and_local_runs(model, corpus, tmp_path, args))


@needs_dask
@needs_shared
def test_direct_runner_in_multi_processing_mode(local_run, tmp_path):
    """Beam's DirectRunner with elements pickled to two worker processes of their own."""
    local_dir, local_summary = local_run
    options = "--beam_options=--direct_running_mode=multi_processing --direct_num_workers=2"
    result = run_module("xlnet_data.create", *g2_flags(), "--runner=beam", "--beam_runner=DirectRunner", options,
                        f"--save_dir={tmp_path}", cwd=CASE, timeout=LAUNCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert summary(result) == local_summary
    assert_same_records(local_dir, tmp_path)


def stall_first_unit(marker):
    """Run on every worker: the first unit of the cluster to write records (whichever worker runs it) writes
    half a record to its temporary file, leaves its process id in `marker` and waits to be killed; every
    other unit, and every unit of a restarted worker, is written as usual."""
    from xlnet_data.datagen import units
    write_unit_records = units.write_unit_records

    def stall_once(settings, rows, is_start, np_mt, py_mt, out, on_records=None):
        try:
            claim = os.open(marker + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return write_unit_records(settings, rows, is_start, np_mt, py_mt, out, on_records)
        os.close(claim)
        out.write(b"half a record")
        out.flush()
        with open(marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(marker + ".tmp", marker)
        time.sleep(LAUNCH_TIMEOUT_S)
        raise RuntimeError("this worker was to be killed")

    stall_once.unpatched = write_unit_records
    units.write_unit_records = stall_once


def unstall():
    from xlnet_data.datagen import units
    units.write_unit_records = getattr(units.write_unit_records, "unpatched", units.write_unit_records)


def set_allowed_failures(client, allowed_failures):
    """How many deaths of its workers a task survives before the scheduler gives it up (Dask's default: 3)."""
    def set_on(dask_scheduler):
        dask_scheduler.allowed_failures = allowed_failures
    client.run_on_scheduler(set_on)


def launch_and_kill_a_worker_mid_unit(cluster, flags, save_dir, cwd, marker, allowed_failures):
    """Starts create on the cluster, kills the worker that is writing a unit, returns the finished launch."""
    from distributed import Client
    with Client(cluster) as client:
        client.run(stall_first_unit, str(marker))
        set_allowed_failures(client, allowed_failures)
        env = command_env()
        launch = subprocess.Popen([sys.executable, "-m", "xlnet_data.create", *flags, *dask_flags(cluster),
                                   f"--save_dir={save_dir}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + LAUNCH_TIMEOUT_S
            while not marker.exists():
                assert launch.poll() is None, launch.communicate()
                assert time.monotonic() < deadline, "no unit started writing"
                time.sleep(0.1)
            os.kill(int(marker.read_text()), signal.SIGKILL)
            stdout, stderr = launch.communicate(timeout=LAUNCH_TIMEOUT_S)
        finally:
            if launch.poll() is None:
                launch.kill()
                launch.communicate()
            set_allowed_failures(client, 3)
            client.run(unstall)
    return subprocess.CompletedProcess(launch.args, launch.returncode, stdout, stderr)


def left_temporaries(save_dir):
    from xlnet_data.common import fileio
    return sorted(name for name in os.listdir(save_dir / "tfrecords") if fileio.TMP_MARK in name)


def kill_case_flags(case):
    """The case's flags for all its tasks and two passes: at least two units to share out."""
    return [f for f in golden_flags(GOLDEN / case) if not f.startswith(("--task=", "--pass_id=", "--num_passes="))] + [
        "--num_passes=2"]


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory):
    """{case: the local runner's save_dir with kill_case_flags}"""
    runs = {}

    def of(case):
        if case not in runs:
            runs[case] = tmp_path_factory.mktemp(f"local-{case}")
            result = run_module("xlnet_data.create", *kill_case_flags(case), f"--save_dir={runs[case]}",
                                "--num_workers=1", cwd=GOLDEN / case, timeout=LAUNCH_TIMEOUT_S)
            assert result.returncode == 0, result.stderr
        return runs[case]

    return of


@needs_dask
@needs_shared
@pytest.mark.parametrize("case", KILL_CASES)
def test_a_worker_killed_mid_unit_is_replaced_and_the_unit_redone(cluster, local_runs, case, tmp_path):
    result = launch_and_kill_a_worker_mid_unit(cluster, kill_case_flags(case), tmp_path / "out", GOLDEN / case,
                                               tmp_path / "stalled", allowed_failures=3)
    assert result.returncode == 0, result.stderr
    assert summary(result).startswith("done: ")
    assert_same_records(local_runs(case), tmp_path / "out")
    # The killed worker's half-written file, under its temporary name, which no reader takes for records.
    assert len(left_temporaries(tmp_path / "out")) == 1


@needs_dask
@needs_shared
@pytest.mark.parametrize("case", KILL_CASES)
def test_a_unit_whose_worker_dies_too_often_stops_the_run_and_a_rerun_completes_it(cluster, local_runs, case,
                                                                                  tmp_path):
    flags = kill_case_flags(case)
    result = launch_and_kill_a_worker_mid_unit(cluster, flags, tmp_path / "out", GOLDEN / case, tmp_path / "stalled",
                                               allowed_failures=0)  # the first death of its worker fails the unit
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("create: error: the Beam pipeline failed: ") and "run the same command again" in last
    assert "Traceback" not in result.stderr
    rerun = run_module("xlnet_data.create", *flags, *dask_flags(cluster), f"--save_dir={tmp_path / 'out'}",
                       cwd=GOLDEN / case, timeout=LAUNCH_TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stderr
    assert summary(rerun).startswith("done: ")
    assert_same_records(local_runs(case), tmp_path / "out")
