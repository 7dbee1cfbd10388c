"""create --runner=beam: Beam's DirectRunner writes the local runner's records; a failed unit is redone alone."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import GOLDEN, ROOT, XLNET_SPM, golden_flags, needs_shared, run_module
from test_create_cli import assert_one_line_error
from test_golden import assert_same_records

needs_beam = pytest.mark.skipif(importlib.util.find_spec("apache_beam") is None,
                                reason="apache_beam is not installed (the `beam` extra: pip install -e '.[beam]')")

CASE = GOLDEN / "g2_multitask"  # four files, two tasks; with two passes: four units
# The engine DirectRunner falls back to, named directly: DirectRunner first tries Prism (a binary it
# downloads), which may order the units otherwise; in this one they run in plan order, in this process.
IN_PROCESS_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def g2_flags():
    """g2's flags for every unit: both tasks, passes 0 and 1."""
    return [f for f in golden_flags(CASE) if not f.startswith(("--task=", "--pass_id="))] + ["--num_passes=2"]


def g2_config(save_dir, input_glob=str(CASE / "input" / "*.txt")):
    """g2_flags() as a CreateConfig, for runs in this process."""
    from xlnet_data.datagen.config import CreateConfig
    return CreateConfig(input_glob=input_glob, sp_path=str(XLNET_SPM), save_dir=str(save_dir), use_tpu=False,
                        bsz_per_host=4, num_core_per_host=1, seq_len=64, reuse_len=32, bi_data=False, num_predict=10,
                        num_task=2, num_passes=2).validate()


def run_in_process(config):
    """create_records on Beam, as `create --runner=beam`; returns (units planned, their results)."""
    from xlnet_data import create_records
    results = create_records(config, beam_args=[f"--runner={IN_PROCESS_RUNNER}"]).units
    return [r.unit for r in results], list(results)


def create(save_dir, *extra):
    result = run_module("xlnet_data.create", *g2_flags(), f"--save_dir={save_dir}", *extra, cwd=CASE)
    assert result.returncode == 0, result.stderr
    return result


def test_without_beam_runner_beam_says_how_to_install_it(tmp_path):
    code = ("import sys; sys.modules['apache_beam'] = None; from xlnet_data.create import run; "
            f"sys.argv = ['create', '--runner=beam', '--save_dir={tmp_path / 'out'}']; run()")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, "--runner=beam needs Apache Beam", "pip install 'xlnet-data[beam]'")
    assert not (tmp_path / "out").exists()


@needs_beam
@pytest.mark.parametrize("beam_flags, fragments", [
    (["--beam_runner=NoSuchRunner"], ["--beam_runner=NoSuchRunner", "Unexpected pipeline runner"]),
    (["--beam_runner=DataflowRunner", "--beam_options=--region=r"], ["Missing required option: project"]),
    (["--beam_options=--project='p"], ["No closing quotation"]),
])
def test_bad_beam_flags_stop_before_writing(tmp_path, beam_flags, fragments):
    result = run_module("xlnet_data.create", "--runner=beam", *beam_flags, f"--save_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert all(fragment in result.stderr.splitlines()[-1] for fragment in fragments), result.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory):
    """The local runner's output for g2's four units: what Beam must reproduce."""
    save_dir = tmp_path_factory.mktemp("local")
    create(save_dir, "--num_workers=1")
    return save_dir


@needs_beam
@needs_shared
def test_direct_runner_writes_the_local_runners_records(local_dir, tmp_path):
    create(tmp_path, "--runner=beam", "--beam_runner=DirectRunner")
    assert len(os.listdir(tmp_path / "tfrecords")) == 8  # 4 units: tfrecords + record_info each
    assert_same_records(local_dir, tmp_path)
    corpus_info = (tmp_path / "corpus_info.json").read_text()
    assert json.loads(corpus_info) == json.loads((local_dir / "corpus_info.json").read_text())


@needs_beam
@needs_shared
def test_failed_unit_leaves_nothing_and_a_rerun_does_only_the_missing_units(local_dir, tmp_path, monkeypatch):
    from xlnet_data.common import fileio
    from xlnet_data.datagen import units
    from xlnet_data.datagen.plan import CreateError

    config = g2_config(tmp_path)
    failing = units.Unit(task=1, pass_id=1)
    write_unit_records = units.write_unit_records

    def fail_midway(settings, rows, is_start, np_mt, py_mt, out, on_records=None):
        if "train-1-1." in out.name:  # out is the temporary file of task 1 pass 1's tfrecords
            out.write(b"half a record")
            raise RuntimeError("injected failure of task 1 pass 1")
        return write_unit_records(settings, rows, is_start, np_mt, py_mt, out, on_records)

    monkeypatch.setattr(units, "write_unit_records", fail_midway)
    with pytest.raises(CreateError, match="injected failure of task 1 pass 1.*run the same command again"):
        run_in_process(config)
    tfrecords = tmp_path / "tfrecords"
    left = sorted(os.listdir(tfrecords))
    assert not [name for name in left if fileio.TMP_MARK in name or "train-1-1." in name], left
    assert len(left) == 6  # the three units before it, complete
    mtimes = {name: (tfrecords / name).stat().st_mtime_ns for name in left}

    monkeypatch.setattr(units, "write_unit_records", write_unit_records)
    planned, results = run_in_process(config)
    assert planned == [failing] and [r.unit for r in results] == [failing]
    assert results[0].records == 580 and results[0].record_path.endswith(".tfrecords")
    assert {name: (tfrecords / name).stat().st_mtime_ns for name in left} == mtimes  # not rewritten
    assert_same_records(local_dir, tmp_path)


@needs_beam
@needs_shared
def test_remote_paths_go_through_tf_io_gfile(local_dir, tmp_path):
    """gs:// and the other tf.io.gfile schemes, here TensorFlow's in-memory ram:// (this process only)."""
    import tensorflow as tf
    remote = f"ram://{tmp_path.name}"
    for path in (CASE / "input").glob("*.txt"):
        tf.io.gfile.makedirs(f"{remote}/input")
        tf.io.gfile.copy(str(path), f"{remote}/input/{path.name}")
    config = g2_config(f"{remote}/out", input_glob=f"{remote}/input/*.txt")
    planned, results = run_in_process(config)
    assert len(planned) == len(results) == 4 and run_in_process(config) == ([], [])  # the re-run has nothing to do
    (tmp_path / "tfrecords").mkdir()
    for name in tf.io.gfile.listdir(f"{remote}/out/tfrecords"):
        tf.io.gfile.copy(f"{remote}/out/tfrecords/{name}", str(tmp_path / "tfrecords" / name))
    assert_same_records(local_dir, tmp_path)
