"""create --runner=beam: Beam's DirectRunner writes the local runner's records; a failed unit is redone alone."""

import dataclasses
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


@pytest.mark.slow
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


@pytest.mark.slow
@needs_beam
@needs_shared
def test_direct_runner_writes_the_local_runners_records(local_dir, tmp_path):
    create(tmp_path, "--runner=beam", "--beam_runner=DirectRunner")
    assert len(os.listdir(tmp_path / "tfrecords")) == 8  # 4 units: tfrecords + record_info each
    assert_same_records(local_dir, tmp_path)
    corpus_info = (tmp_path / "corpus_info.json").read_text()
    assert json.loads(corpus_info) == json.loads((local_dir / "corpus_info.json").read_text())


@pytest.mark.slow
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


@needs_shared
def test_the_plan_encodes_in_memory_a_task_with_one_unit_to_run_and_no_cache(tmp_path):
    """TaskPlan.in_memory: one unit to run, records written, no --keep_cache, no complete cache of the task."""
    import sentencepiece as spm

    from xlnet_data.datagen import encode
    from xlnet_data.datagen.plan import make_plan

    one_pass = dataclasses.replace(g2_config(tmp_path), num_passes=None)
    in_memory = {task.task: task.in_memory for task in make_plan(one_pass).tasks.values()}
    assert in_memory == {0: True, 1: True}
    assert not any(task.in_memory for task in make_plan(one_pass, keep_cache=True).tasks.values())
    assert not any(task.in_memory for task in make_plan(dataclasses.replace(one_pass, write_records=False)).tasks.values())
    assert not any(task.in_memory for task in make_plan(g2_config(tmp_path)).tasks.values())  # two passes
    task = make_plan(one_pass).tasks[1]
    encode.encode_task(one_pass.save_dir, encode.EncodeSettings.of(one_pass), 1, task.files, task.cache_key,
                       spm.SentencePieceProcessor(model_file=one_pass.sp_path))
    assert {task.task: task.in_memory for task in make_plan(one_pass).tasks.values()} == {0: True, 1: False}


def spy_on_encoding(monkeypatch):
    """{"memory": tasks encoded in memory, "cache": tasks given to the encode stage, "written": names of the token
    cache files written}, filled as the runners (in this process) go."""
    from xlnet_data.common import fileio
    from xlnet_data.datagen import encode
    seen = {"memory": [], "cache": [], "written": []}
    in_memory, into_cache, atomic_write = encode.encode_in_memory, encode.encode_task, fileio.atomic_write

    def spy_in_memory(settings, task, *args, **kwargs):
        seen["memory"].append(task)
        return in_memory(settings, task, *args, **kwargs)

    def spy_into_cache(save_dir, settings, task, *args, **kwargs):
        seen["cache"].append(task)
        return into_cache(save_dir, settings, task, *args, **kwargs)

    def spy_atomic_write(path):
        if f"{os.sep}token_cache{os.sep}" in path:
            seen["written"].append(os.path.basename(path))
        return atomic_write(path)

    monkeypatch.setattr(encode, "encode_in_memory", spy_in_memory)
    monkeypatch.setattr(encode, "encode_task", spy_into_cache)
    monkeypatch.setattr(fileio, "atomic_write", spy_atomic_write)
    return seen


@needs_beam
@needs_shared
@pytest.mark.parametrize("runner", ["local", "beam"])
def test_both_runners_follow_the_plans_in_memory_decision(local_dir, tmp_path, monkeypatch, runner):
    """Task 0 with one unit left to run (its pass 1 made by an earlier run) is encoded in memory, task 1 (two
    units) into its token cache: no cache file of task 0 is ever written, by either runner, and the records
    are the local runner's of a run of all four units."""
    from xlnet_data import create_records
    from xlnet_data.datagen.plan import make_plan

    config = g2_config(tmp_path)
    create_records(dataclasses.replace(config, task=0, pass_id=1, num_passes=None), num_workers=1)
    plan = make_plan(config)
    assert [(unit.task, unit.pass_id) for unit in plan.units] == [(0, 0), (1, 0), (1, 1)]
    assert plan.tasks[0].in_memory and not plan.tasks[1].in_memory
    seen = spy_on_encoding(monkeypatch)
    if runner == "beam":
        results = create_records(config, beam_args=[f"--runner={IN_PROCESS_RUNNER}"]).units
    else:
        results = create_records(config, num_workers=1).units
    assert [(r.unit.task, r.unit.pass_id) for r in results] == [(0, 0), (1, 0), (1, 1)]
    assert seen["memory"] == [0] and seen["cache"] == [1]
    assert sorted(name.split(".")[0] for name in seen["written"]) == ["tokens-1", "tokens-1"]  # its .bin and .json
    assert not (tmp_path / "token_cache").exists()
    assert_same_records(local_dir, tmp_path)
