"""Faults of training and of reading records (issue 14): signals, exact resume, damaged records, contradicting
JSONs, a full model_dir, a closed pipe. Each asserts the exit status, the one-line message (with the path), the
files left, and where a run can be repeated, that the result equals an uninterrupted run bit for bit."""

import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, SAMPLE_CORPUS, command_env, fork_server, run_module, two_logical_cpus
from test_train import TINY_SHAPE, _create, tiny_config

from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import record_reader, validation
from xlnet_data.dataformat.save_dir import SaveDirError
from xlnet_data.pretrain import inputs as ip
from xlnet_data.pretrain import training as T

RECORDS_NAME = "train-0-0.bsz-8.seqlen-64.reuse-32.uncased.bi.alpha-6.beta-1.fnp-10"


@pytest.fixture(scope="module")
def small_records(sample_spm, tmp_path_factory):
    """A save_dir from the first 40 lines of one book: 17 steps of 8 rows (bi_data) of 64 tokens."""
    text_dir = tmp_path_factory.mktemp("small_text")
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:40]
    (text_dir / "emma.txt").write_text("\n".join(lines) + "\n")
    return Path(_create(sample_spm, tmp_path_factory.mktemp("records") / "small", text_dir / "*.txt"))


def _records_file(save_dir):
    return Path(save_dir) / "tfrecords" / f"{RECORDS_NAME}.tfrecords"


def _offsets(path):
    return [offset for _, offset, _ in record_reader.read_records(str(path), skip_data=True)]


def _copy(save_dir, tmp_path, name="copy"):
    target = tmp_path / name
    shutil.copytree(save_dir, target)
    return target


def _train_args(record_dir, model_dir, *more):
    """train_gpu's flags for these tests' runs: one layer (what they check, exit statuses, one-line errors, files
    left, a resume equal to a run, is the same at any depth; a run's CPU: about 15% less than on two)."""
    return (f"--record_info_dir={record_dir}", f"--model_dir={model_dir}", *TINY_SHAPE, "--n_layer=1", "--mem_len=16",
            "--dropout=0.1", "--dropatt=0.1", "--learning_rate=1e-3", *more)


def _train_gpu(record_dir, model_dir, *more, cwd=None):
    """train_gpu with _train_args, run to its end as a process forked from the module's one TensorFlow import
    (conftest.ForkServer): its flags, exit status, one-line errors and stderr are the command's own."""
    return fork_server().run("xlnet_data.train_gpu", *_train_args(record_dir, model_dir, *more), cwd=cwd)


def _train_config(record_dir, model_dir, **flags):
    """The TrainConfig train_gpu builds from _train_args(record_dir, model_dir, --train_steps=...): `flags` as
    TrainConfig fields. For the runs of these tests that need no process of their own (each a TensorFlow start-up
    and a trace less); that the command builds the same is checked where it matters (run_config.json, and a run
    stopped in one resumed in the other that equals an uninterrupted run)."""
    cfg = tiny_config(record_dir, model_dir, **{"n_layer": 1, "mem_len": 16, "warmup_steps": 0, "iterations": 1000,
                                               **flags})
    return T.dataclasses.replace(cfg, run=T.dataclasses.replace(cfg.run, dropout=0.1, dropatt=0.1))


def _lines(stderr, prefix):
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def _one_line(result, program, status):
    """The one `program: ...` line of a run that exited with `status`, without a traceback."""
    assert result.returncode == status, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = _lines(result.stderr, f"{program}: ")
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def _checkpoint_tensors(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def _no_temporary_files(folder):
    names = os.listdir(folder) if os.path.isdir(folder) else []
    assert not [n for n in names if ".tmp" in n or "tempstate" in n], names


# ----- exact resume --------------------------------------------------------------------------------

def _run_check(name, *args, **env):
    """Runs check_<name>(*args) of this module in a fresh Python (for environment variables TensorFlow reads as it
    is imported)."""
    script = ("import os, sys; sys.path.insert(0, sys.argv[1]); import test_train_faults; "
              "getattr(test_train_faults, 'check_' + sys.argv[2])(*sys.argv[3:]); print('check OK', flush=True); "
              "os._exit(0)")  # checked: skip the teardown, where freeing the runs' input iterators waits for their threads
    env = command_env(**env)
    result = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), name, *map(str, args)],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "check OK" in result.stdout, result.stderr[-5000:]


@pytest.mark.slow
def test_a_step_repeats_bit_for_bit(small_records, tmp_path):
    """What an exact resume rests on: the same step on the same weights gives the same gradients to the last
    bit. The mistake it guards: Grappler's arithmetic optimizer left on (sum_in_graph_order), which turns chains
    of adds into AddNs whose order follows the thread schedule. Three layers, where that shows most: with it on,
    on the shared 2-core machine, 55 and 93 of these 150 repeats differed (101 of 300, 118 and 158 of 200 in a
    script); on two layers, as this test had, only 4 of 500, 6 of 300, 10 of 200 (and 3 of 500 the day before),
    too few to be caught every time. Without oneDNN's kernels (as here) the schedule shows through more often."""
    _run_check("step_repeats", small_records, tmp_path, 150, TF_ENABLE_ONEDNN_OPTS="0")


def check_step_repeats(records, model_dir, repeats):
    repeats = int(repeats)
    cfg = tiny_config(records, model_dir, mem_len=16, n_layer=3)  # see the test's docstring
    cfg = T.dataclasses.replace(cfg, run=T.dataclasses.replace(cfg.run, dropout=0.0, dropatt=0.0))
    with T.sum_in_graph_order():  # as train() does
        trainer = T.Trainer(cfg, T.make_strategy("one_device"))
        features = next(iter(ip.make_dataset(cfg.record_info_dir, cfg.data)))
        mems = trainer.initial_mems()
        first = [grad.numpy() for grad in trainer.loss_and_grads(features, mems)[1]]
        differing = 0
        for _ in range(repeats):
            grads = trainer.loss_and_grads(features, mems)[1]
            differing += any(not np.array_equal(grad.numpy(), expected) for grad, expected in zip(grads, first))
    assert differing == 0, f"{differing} of {repeats} repeats differ"


@pytest.mark.slow
def test_20_plus_20_steps_equal_40_straight_bit_for_bit(small_records, tmp_path):
    """mem_len > 0, bi_data, dropout: memories, positions (the 17 steps of records wrap around at 17 and 34, on each
    side of the checkpoint), dropout state. Two layers (the other resumes here run one): a resume that restored each
    layer's memories into another layer fails only here."""
    changes = dict(train_steps=40, save_steps=20, mem_len=32, iterations=20)
    whole_cfg = tiny_config(small_records, tmp_path / "whole", **changes)
    whole_cfg = T.dataclasses.replace(whole_cfg, run=T.dataclasses.replace(whole_cfg.run, dropout=0.1, dropatt=0.1))
    cfg = T.dataclasses.replace(whole_cfg, model_dir=str(tmp_path / "pieces"))
    whole = T.train(whole_cfg)
    first = T.train(cfg, stop_after=23)  # killed 3 steps after the checkpoint of step 20
    second = T.train(cfg)
    assert (first.step, second.first_step, second.step) == (23, 20, 40)
    assert first.losses[:20] + second.losses == whole.losses, (first.losses, second.losses, whole.losses)
    assert first.losses[20:] == whole.losses[20:23]
    assert [source.position for source in second.sources] == [40]
    ours, theirs = _checkpoint_tensors(cfg.model_dir), _checkpoint_tensors(whole_cfg.model_dir)
    assert ours.keys() == theirs.keys() and "train_state/source_0/mems/replica_0/layer_1" in ours
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def check_mirrored_resume(records, model_dir):
    """Two replicas (each with its own memories and dropout stream): 2 straight steps, checkpointed at each, and a
    run resumed from the checkpoint of step 1 (a copy of that model_dir, as a run stopped after step 1 left it)
    takes step 2 as they did."""
    two_logical_cpus()

    def run(folder):
        cfg = tiny_config(records, os.path.join(model_dir, folder), train_steps=2, save_steps=1, mem_len=32,
                          strategy="mirrored", devices=("/cpu:0", "/cpu:1"), n_layer=1)
        cfg = T.dataclasses.replace(cfg, run=T.dataclasses.replace(cfg.run, dropout=0.1))
        return cfg, T.train(cfg)

    whole_cfg, whole = run("whole")
    _as_stopped_after_the_first_step(whole_cfg.model_dir, os.path.join(model_dir, "pieces"))
    cfg, second = run("pieces")
    assert (second.first_step, second.step) == (1, 2)
    assert whole.losses[1:] == second.losses, (whole.losses, second.losses)
    ours, theirs = _checkpoint_tensors(cfg.model_dir), _checkpoint_tensors(whole_cfg.model_dir)
    # One layer: what this adds to the one-device resume (which keeps two layers, their order) is the replicas'.
    assert "train_state/source_0/mems/replica_1/layer_0" in ours and ours.keys() == theirs.keys()
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def _as_stopped_after_the_first_step(model_dir, target):
    """A copy of model_dir without its checkpoints after model.ckpt-1: what a run killed after step 1 leaves (its
    checkpoint of step 1 is the one a longer run wrote, at the same step, from the same state)."""
    shutil.copytree(model_dir, target, ignore=lambda _, names: [n for n in names if n.startswith("model.ckpt-")
                                                                and not n.startswith("model.ckpt-1.")])
    Path(target, "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1"\n'
                                          'all_model_checkpoint_paths: "model.ckpt-1"\n')


@pytest.mark.slow
def test_two_replicas_resume_exactly_too(small_records, tmp_path):
    # In a fresh TensorFlow (two logical CPUs), forked from the test process's one import.
    result = fork_server().run("test_train_faults", small_records, tmp_path, function="check_mirrored_resume")
    assert result.returncode == 0, result.stderr[-5000:]


def test_resuming_with_another_seed_is_refused(small_records, tmp_path):
    cfg = tiny_config(small_records, tmp_path / "model", train_steps=2, mem_len=0, n_layer=1)
    T.train(cfg)
    with pytest.raises(ConfigError, match=r"--seed=1, but .*model.ckpt-2 was trained with --seed=0 .*resume with "
                                            r"--seed=0, or use a new --model_dir"):
        T.train(T.dataclasses.replace(cfg, seed=1, train_steps=4))


# ----- where a model_dir's paths resolve from --------------------------------------------------------

@pytest.mark.slow
def test_a_relative_model_dir_resumes_and_so_does_its_folder_moved_as_a_whole(small_records, tmp_path, monkeypatch):
    """The README's `--model_dir=models/austen`, run again, resumes (the `checkpoint` file's relative entries were
    once joined to model_dir twice: models/m/models/m/model.ckpt-2); so does the same command run in the folder
    holding model_dir after that folder moved. The first run is the library's, in this process (the command
    passes model_dir to it as given); the resume is the command's."""
    first = tmp_path / "first"
    first.mkdir()
    with monkeypatch.context() as here:
        here.chdir(first)
        T.train(_train_config(small_records, "models/m", train_steps=2))
    moved = tmp_path / "moved"
    first.rename(moved)
    resumed = _train_gpu(small_records, "models/m", "--train_steps=3", cwd=moved)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from models/m/model.ckpt-2 (step 2)" in resumed.stderr
    assert (moved / "models/m/checkpoint").read_text().splitlines() == [
        'model_checkpoint_path: "model.ckpt-3"', 'all_model_checkpoint_paths: "model.ckpt-2"',
        'all_model_checkpoint_paths: "model.ckpt-3"']


def test_an_absolute_checkpoint_entry_of_a_moved_model_dir_is_found_in_it(tmp_path):
    """The original's Saver lists checkpoints by absolute path: after a move they are read from model_dir."""
    from xlnet_data.pretrain import checkpoints
    old, new = tmp_path / "old", tmp_path / "new"
    checkpoints.save(str(old / "model.ckpt-7"), {"w": tf.ones([2])})
    (old / "checkpoint").write_text(f'model_checkpoint_path: "{old}/model.ckpt-7"\n'
                                    f'all_model_checkpoint_paths: "{old}/model.ckpt-7"\n')
    old.rename(new)
    assert checkpoints.listed(str(new)) == [f"{new}/model.ckpt-7"] and checkpoints.latest(str(new)) == f"{new}/model.ckpt-7"
    np.testing.assert_array_equal(checkpoints.read(checkpoints.latest(str(new)), {"w": (2,)})["w"], [1, 1])


# ----- a model_dir knows what it was trained from ----------------------------------------------------

def _made_otherwise(save_dir, tmp_path, name, *, model_sha256=None, input_sha256=None, keep_accents=None):
    """A copy of save_dir whose record_infos (and corpus_info.json) say its records were made otherwise: with
    another SentencePiece model (of the same size), from other inputs, or keeping accents. Training reads no
    more of how records were made than this."""
    copy = _copy(save_dir, tmp_path, name)
    for info_path in (copy / "tfrecords").glob("record_info-*.json"):
        info = json.loads(info_path.read_text())
        if model_sha256:
            info["made_from"]["model_sha256"] = model_sha256
        if input_sha256:
            info["made_from"]["files"][0]["sha256"] = input_sha256
        if keep_accents is not None:
            info["create_settings"]["keep_accents"] = keep_accents
        info_path.write_text(json.dumps(info))
    if keep_accents is not None:
        corpus_info = copy / "corpus_info.json"
        corpus_info.write_text(json.dumps({**json.loads(corpus_info.read_text()), "keep_accents": keep_accents}))
    return copy


@pytest.fixture(scope="module")
def trained_one_step(small_records, tmp_path_factory):
    """A model_dir of one step on small_records (no memory: cheap)."""
    cfg = tiny_config(small_records, tmp_path_factory.mktemp("one_step") / "model", train_steps=1, mem_len=0,
                      n_layer=1)
    T.train(cfg)
    return cfg


def test_resuming_on_records_of_another_model_or_normalisation_is_refused(small_records, trained_one_step, tmp_path):
    run_config = Path(trained_one_step.model_dir) / "run_config.json"
    before = run_config.read_text()
    other_model = _made_otherwise(small_records, tmp_path, "model_b", model_sha256="b" * 64)
    accents = _made_otherwise(small_records, tmp_path, "accents", keep_accents=True)
    for records, fragment in ((other_model, rf"another SentencePiece model \(sha256 [0-9a-f]{{64}}; these records': "
                                            rf"{'b' * 64}\)"), (accents, r"keep_accents=false \(these records: true\)")):
        cfg = T.dataclasses.replace(trained_one_step, record_info_dir=str(records / "tfrecords"), train_steps=2)
        with pytest.raises(ConfigError, match=rf"^--model_dir={cfg.model_dir} was trained on records of {fragment} "
                                              rf"\({run_config}\): .* or train these in a new --model_dir$"):
            T.train(cfg)
        assert run_config.read_text() == before
    # An --init_checkpoint of ours is refused the same way (run_config.json beside it), before model_dir is made.
    init = f"{trained_one_step.model_dir}/model.ckpt-1"
    cfg = T.dataclasses.replace(trained_one_step, record_info_dir=str(other_model / "tfrecords"),
                                model_dir=str(tmp_path / "new"), init_checkpoint=init)
    with pytest.raises(ConfigError, match=rf"^--init_checkpoint={init} was trained on records of another SentencePiece "
                                          rf"model .* \({run_config}\): its embeddings are of other pieces"):
        T.train(cfg)
    assert not (tmp_path / "new").exists()


def test_an_init_checkpoint_that_is_not_one_is_refused_in_one_line_before_model_dir_is_made(trained_one_step,
                                                                                             tmp_path):
    export = tmp_path / "hf"  # what export_hf writes, as far as the check looks
    export.mkdir()
    for name in ("config.json", "model.safetensors"):
        (export / name).write_text("{}")
    (tmp_path / "empty").mkdir()
    for init, fragment in ((export / "model.safetensors", rf"is a file of the Transformers directory {export}: give the "
                                                          rf"directory, --init_checkpoint={export}$"),
                           (tmp_path / "empty", r"cannot be read as a checkpoint \(.*\); give a TensorFlow checkpoint"),
                           (tmp_path / "nowhere" / "model.ckpt-5", r"cannot be read as a checkpoint \(.*\); give")):
        cfg = T.dataclasses.replace(trained_one_step, model_dir=str(tmp_path / "new"), init_checkpoint=str(init))
        with pytest.raises(ConfigError, match=rf"^--init_checkpoint={init} {fragment}"):
            T.train(cfg)
        assert not (tmp_path / "new").exists()


def test_a_mix_of_sources_made_with_two_sentencepiece_models_is_refused(small_records, tmp_path):
    other = _made_otherwise(small_records, tmp_path, "model_b", model_sha256="b" * 64)
    cfg = tiny_config(f"{small_records},{other}", tmp_path / "model", mix_sampling_factor=1.0, train_steps=1,
                      mem_len=0, n_layer=1)
    named = rf"{small_records}/tfrecords \(sha256 [0-9a-f]{{12}}…\), {other}/tfrecords \(sha256 bbbbbbbbbbbb…\)"
    with pytest.raises(ConfigError, match=r"^--record_info_dir's sources were made with different SentencePiece "
                                          rf"models: {named}; an id would be other pieces in each"):
        T.train(cfg)
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_a_mixed_run_resumed_with_a_source_swapped_or_reordered_is_refused_and_a_moved_one_resumes(small_records,
                                                                                                  tmp_path):
    a, b = small_records, _made_otherwise(small_records, tmp_path, "b", input_sha256="c" * 64)
    c = _made_otherwise(small_records, tmp_path, "c", input_sha256="d" * 64)

    def cfg(*dirs, steps):
        return tiny_config(",".join(map(str, dirs)), tmp_path / "model", mix_sampling_factor=1.0, train_steps=steps,
                           mem_len=0, n_layer=1)
    T.train(cfg(a, b, steps=2))
    checkpoint = tmp_path / "model" / "model.ckpt-2"
    with pytest.raises(ConfigError, match=rf"source 2 \({c}/tfrecords\) holds other records than the one {checkpoint} "
                                          rf"was trained on in that place \(its source 2 was {b}/tfrecords, of other "
                                          r"records: give the record dirs that run read\)"):
        T.train(cfg(a, c, steps=3))
    with pytest.raises(ConfigError, match=rf"source 1 \({b}/tfrecords\) .* \(the same sources in another order: give "
                                          rf"them as that run did \({a}/tfrecords,{b}/tfrecords\)\)"):
        T.train(cfg(b, a, steps=3))
    moved = _copy(b, tmp_path, "b_moved")  # the same records elsewhere: the same source
    resumed = T.train(cfg(a, moved, steps=3))
    assert (resumed.first_step, resumed.step) == (2, 3)


def test_missing_passes_are_refused_by_train_and_said_by_dump(sample_spm, small_records, tmp_path):
    """--num_passes beyond the records' passes, and a save_dir of a create --num_passes=4 killed after 2 units (as
    it leaves it: units complete or absent), are refused by train_gpu; dump says the save_dir is incomplete."""
    from xlnet_data.dataformat import selection
    text = tmp_path / "emma.txt"
    text.write_text("\n".join((SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:40]) + "\n")
    whole = Path(_create(sample_spm, tmp_path / "four", text, "--num_passes=4"))
    killed = _copy(whole, tmp_path, "killed")
    for pass_id in (2, 3):
        for path in (killed / "tfrecords").glob(f"*train-0-{pass_id}.*"):
            path.unlink()
    info = killed / "tfrecords"
    incomplete = (f"{info} is incomplete: the create run that wrote it was to make 4 passes (--num_passes=4) and task 0 "
                  "lacks pass(es) 2, 3 (killed, or still running?): run that create command again to finish it "
                  "(complete units are kept); passes 0-1 are complete (train_gpu --num_passes=2 reads only those)")
    with pytest.raises(SaveDirError) as refused:
        T.check_records(tiny_config(killed, tmp_path / "m"))
    assert str(refused.value) == incomplete
    T.check_records(tiny_config(killed, tmp_path / "m", data_num_passes=2))  # the complete passes are read
    with pytest.raises(SaveDirError, match=rf"^--num_passes=6, but {whole}/tfrecords holds fewer passes \(task 0 lacks "
                                           r"pass\(es\) 4, 5\): make them with create --num_passes=6 \(it adds the "
                                           r"missing units\); passes 0-3 are complete"):
        T.check_records(tiny_config(whole, tmp_path / "m", data_num_passes=6))
    with pytest.raises(SaveDirError, match=rf"^--num_passes=2, but {small_records}/tfrecords holds fewer passes"):
        T.check_records(tiny_config(small_records, tmp_path / "m", data_num_passes=2))  # of create without passes
    assert selection.select(selection.SelectionConfig(paths=(str(killed),))).warnings == [incomplete]
    assert selection.select(selection.SelectionConfig(paths=(str(whole),))).warnings == []
    # A records file gone, its record_info there: dump says the unit's records are missing (train_gpu refuses it).
    gone = _copy(whole, tmp_path, "gone")
    (lost,) = (gone / "tfrecords").glob("train-0-3.*.tfrecords")
    lost.unlink()
    assert selection.select(selection.SelectionConfig(paths=(str(gone),))).warnings == [
        f"{lost} (or {lost}.gz), listed in {gone}/tfrecords/record_info-{lost.name[:-len('.tfrecords')]}.json, is "
        "missing: this unit's records are gone, the others are read without them; re-create it"]


# ----- signals ----------------------------------------------------------------------------------------

def _popen_train(*args):
    env = command_env()
    return subprocess.Popen([sys.executable, "-m", "xlnet_data.train_gpu", *map(str, args)], env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def _wait_until_caught(process, signum, timeout=120):
    """Returns once `process` handles `signum` itself (Linux: its SigCgt mask in /proc/PID/status)."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        with open(f"/proc/{process.pid}/status") as status:
            caught = int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16)
        if caught >> (signum - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError(f"the process never set a handler for signal {signum}")


def _signal_at_step(args, log, signum, step):
    """Starts train_gpu `args` (forked by the fork server, its stderr to `log`), sends `signum` once the log shows `step`;
    returns the finished run's (status, stderr)."""
    process = fork_server().start("xlnet_data.train_gpu", args, log)
    deadline = time.monotonic() + 300
    while f"] step {step} |" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)  # the run goes on meanwhile: any step from 4 to 11 is what the test takes
    process.send_signal(signum)
    process.wait(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, "", log.read_text())


TWELVE_STEPS = ["--train_steps=12", "--iterations=1"]


@pytest.fixture(scope="module")
def twelve_steps(small_records, tmp_path_factory):
    """The model_dir of an uninterrupted run of TWELVE_STEPS."""
    model_dir = tmp_path_factory.mktemp("whole")
    T.train(_train_config(small_records, model_dir, train_steps=12, iterations=1))
    return model_dir


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.slow
def test_a_signal_saves_a_checkpoint_and_the_rerun_equals_an_uninterrupted_run(small_records, twelve_steps, tmp_path,
                                                                                signum, status, caplog):
    steps = TWELVE_STEPS
    model_dir = tmp_path / "stopped"
    stopped = _signal_at_step(_train_args(small_records, model_dir, *steps), tmp_path / "stderr",
                              signum, 4)
    line = _one_line(stopped, "train", status)
    at = int(line.split(" at step ")[1].split(":")[0])
    assert 4 <= at < 12, line
    assert line == (f"train: stopped by {signal.Signals(signum).name} at step {at}: saved {model_dir}/model.ckpt-{at}; "
                    "run the same command to resume")
    names = sorted(n for n in os.listdir(model_dir) if not n.startswith("events."))
    assert names == [".train.lock", "checkpoint", f"model.ckpt-{at}.data-00000-of-00001", f"model.ckpt-{at}.index",
                     "run_config.json", "xlnet_config.json"]
    # The command's settings are those the uninterrupted run and the resume below train with.
    assert (model_dir / "run_config.json").read_text() == (twelve_steps / "run_config.json").read_text()

    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        resumed = T.train(_train_config(small_records, model_dir, train_steps=12, iterations=1))  # the same command, run again
    assert (resumed.first_step, resumed.step) == (at, 12)
    assert f"resumed from {model_dir}/model.ckpt-{at} (step {at})" in caplog.text
    ours, theirs = _checkpoint_tensors(model_dir), _checkpoint_tensors(twelve_steps)
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)
    _no_temporary_files(model_dir)


def test_a_signal_before_the_first_step_is_one_line_and_saves_nothing(small_records, tmp_path):
    model_dir = tmp_path / "model"
    process = _popen_train(*_train_args(small_records, model_dir, "--train_steps=5"))
    _wait_until_caught(process, signal.SIGTERM)  # the command's handler is set: it is importing TensorFlow
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    line = _one_line(subprocess.CompletedProcess(process.args, process.returncode, "", stderr), "train", 143)
    assert line in ("train: stopped by SIGTERM; no checkpoint written since the last one",
                    "train: stopped by SIGTERM at step 0: no step since the last checkpoint, nothing to save; run "
                    "the same command to resume"), line
    assert not os.path.isdir(model_dir) or not [n for n in os.listdir(model_dir) if n.startswith("model.ckpt")]


# ----- damaged records --------------------------------------------------------------------------------

def _damage(save_dir, tmp_path, how):
    """A copy of save_dir whose records file is damaged `how`; (copy, file, record index, byte offset)."""
    copy = _copy(save_dir, tmp_path, how)
    path = _records_file(copy)
    data = bytearray(path.read_bytes())
    offsets = _offsets(path)
    if how == "cut_at_a_record_boundary":
        index, data = 128, data[:offsets[128]]
    elif how == "cut_inside_a_record":
        index, data = 100, data[:offsets[100] + 50]
    elif how == "bit_flip_in_a_length":
        index = 90
        data[offsets[90] + 2] ^= 0x10
    else:  # bit flip in a record's data: only the full CRC check, as the records are read, sees it
        index = 60
        data[offsets[60] + 30] ^= 0x10
    path.write_bytes(bytes(data))
    return copy, path, index, offsets[index]


@pytest.mark.parametrize("how, fragment", [
    ("cut_at_a_record_boundary", "the file ends here, after 128 records, but {info} lists num_batch 17 x bsz_per_host "
                                 "8 = 136: it was cut short; re-create the unit"),
    ("cut_inside_a_record", "truncated record data (38 of {size} bytes)"),
    ("bit_flip_in_a_length", "corrupt record: length CRC mismatch"),
])
def test_damage_found_at_start_up_stops_train_and_dump_before_anything_is_written(small_records, tmp_path, how,
                                                                                  fragment):
    copy, path, index, offset = _damage(small_records, tmp_path, how)
    info = copy / "tfrecords" / f"record_info-{RECORDS_NAME}.json"
    offsets = _offsets(_records_file(small_records))  # the record's data and its CRC: the frame less 12 bytes
    size = offsets[index + 1] - offsets[index] - 12 if index + 1 < len(offsets) else None
    want = f"{path}: record {index} (byte {offset}): {fragment.format(info=info, size=size)}"
    model_dir = tmp_path / "model"
    line = _one_line(_train_gpu(copy, model_dir, "--train_steps=5"), "train", 2)
    assert line == f"train: error: {want}"
    assert not model_dir.exists()
    line = _one_line(run_module("xlnet_data.dump", copy, "--stats"), "dump", 2)
    assert line == f"dump: error: {want}"


@pytest.mark.slow
def test_a_bit_flip_met_while_training_is_one_line_after_a_checkpoint_of_the_steps_before(small_records, tmp_path):
    copy, path, index, offset = _damage(small_records, tmp_path, "bit_flip_in_data")
    from xlnet_data.pretrain.layout import DamagedRecordsError  # a UserError: train_gpu's one line is its message
    model_dir = tmp_path / "model"
    with pytest.raises(DamagedRecordsError) as stopped:
        T.train(_train_config(copy, model_dir, train_steps=20))
    # Record 60 is in the batch of step 8 (8 rows a step): 7 steps are trained and kept.
    assert str(stopped.value) == (f"{path}: record {index} (byte {offset}): corrupt record: data CRC mismatch "
                                  f"(training stopped at step 7; {model_dir}/model.ckpt-7 holds the steps before it)")
    assert sorted(n for n in os.listdir(model_dir) if n.startswith("model.ckpt")) == [
        "model.ckpt-7.data-00000-of-00001", "model.ckpt-7.index"]
    line = _one_line(run_module("xlnet_data.dump", copy, "--format=json"), "dump", 2)
    assert line == f"dump: error: {path}: record {index} (byte {offset}): corrupt record: data CRC mismatch"


def test_ids_beyond_the_models_vocabulary_name_the_record(small_records, tmp_path):
    """Records of a larger vocabulary than the model's n_token (library use, no corpus_info to compare with)."""
    from xlnet_data.pretrain.layout import DamagedRecordsError  # both trainers raise it
    copy = _copy(small_records, tmp_path)
    (copy / "corpus_info.json").unlink()  # with it, check_records refuses n_token=500 before training
    cfg = tiny_config(copy, tmp_path / "model", train_steps=3, mem_len=0, n_layer=1)
    cfg = T.dataclasses.replace(cfg, model=T.dataclasses.replace(cfg.model, n_token=500))
    with pytest.raises(DamagedRecordsError, match=rf"{_records_file(copy)}: record 0 \(byte 0\): feature "
                                                  r"'input' holds id \d+, outside the vocabulary \(size 500\) "
                                                  r"\(training stopped at step 0\)"):
        T.train(cfg)


def test_count_records_walks_the_frames_of_plain_and_gzip_files(small_records, tmp_path):
    path = _records_file(small_records)
    plain = path.read_bytes()
    gz = tmp_path / "r.tfrecords.gz"
    gz.write_bytes(gzip.compress(plain))
    assert record_reader.count_records(str(path)) == record_reader.count_records(str(gz)) == (136, len(plain))
    cut = tmp_path / "cut.tfrecords"
    cut.write_bytes(plain[:-5])
    with pytest.raises(record_reader.RecordError, match=r"record 135 \(byte \d+\): truncated record data"):
        record_reader.count_records(str(cut))


def test_a_file_with_more_records_than_its_record_info_lists_is_refused(small_records, tmp_path):
    copy = _copy(small_records, tmp_path)
    path = _records_file(copy)
    data = path.read_bytes()
    path.write_bytes(data + data[:_offsets(path)[1]])  # one record appended
    info = copy / "tfrecords" / f"record_info-{RECORDS_NAME}.json"
    with pytest.raises(record_reader.RecordError, match=rf"^{path}: record 136 \(byte {len(data)}\): a record more than "
                                                  rf"{info} lists num_batch 17 x bsz_per_host 8 = 136"):
        validation.check_record_files([str(path)])


# ----- corpus_info.json and record_info against each other and the records ---------------------------

@pytest.mark.parametrize("edit, fragment", [
    ({"vocab_size": 500}, "vocab_size=500 contradicts the records: {file}: record 0 (byte 0) holds id "),
    ({"num_core_per_host": 2}, "num_core_per_host=2 contradicts {info} (num_core_per_host=1 in its create_settings)"),
    ({"seq_len": 100}, "seq_len=100 contradicts {info} (seq_len=64 in its name)"),
    ({"keep_accents": True}, "keep_accents=True contradicts {info} (keep_accents=False in its create_settings)"),
    ({"bi_data": "yes"}, "bi_data='yes' is not true or false"),
    ("{\"vocab_size\": 1000,", " is not valid JSON ("),
])
def test_a_corpus_info_that_contradicts_the_records_is_one_line_naming_the_file_and_field(small_records, tmp_path,
                                                                                          edit, fragment):
    copy = _copy(small_records, tmp_path)
    corpus_info = copy / "corpus_info.json"
    if isinstance(edit, dict):
        corpus_info.write_text(json.dumps({**json.loads(corpus_info.read_text()), **edit}))
    else:
        corpus_info.write_text(edit)
    want = fragment.format(file=_records_file(copy), info=copy / "tfrecords" / f"record_info-{RECORDS_NAME}.json")
    model_dir = tmp_path / "model"
    train = _one_line(_train_gpu(copy, model_dir, "--train_steps=2"), "train", 2)
    dump = _one_line(run_module("xlnet_data.dump", copy, "--limit=1"), "dump", 2)
    for line, program in ((train, "train"), (dump, "dump")):
        assert line.startswith(f"{program}: error: {corpus_info}") and want in line, line
    assert not model_dir.exists()


@pytest.mark.parametrize("edit, fragment", [
    ({"num_batch": "17"}, "num_batch='17' is not a count of batches"),
    ({"num_batch": 18}, "lists num_batch 18 x bsz_per_host 8 = 144: it was cut short"),
])
def test_a_record_info_that_contradicts_its_records_is_one_line(small_records, tmp_path, edit, fragment):
    copy = _copy(small_records, tmp_path)
    info = copy / "tfrecords" / f"record_info-{RECORDS_NAME}.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), **edit}))
    with pytest.raises((SaveDirError, record_reader.RecordError), match=fragment.replace("(", r"\(")):
        validation.check_record_files([str(_records_file(copy))])
    line = _one_line(_train_gpu(copy, tmp_path / "m", "--train_steps=2"),
                     "train", 2)
    assert str(info) in line and fragment in line, line


# ----- a full model_dir -------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 400 KB tmpfs (the one-layer tiny model's checkpoint needs about 520 KB); skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (not root?): {made.stderr.decode().strip()}")
    yield mount
    # lazy: a run of this process that failed on the disk may hold its events file open until it is collected
    subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.mark.slow
def test_a_full_model_dir_is_one_line_naming_the_checkpoint_and_leaves_no_temporary_file(small_records, small_disk):
    """In this process: the error's line is the one train_gpu prints (cli.os_error_line; the next test runs the
    command)."""
    from xlnet_data import cli
    from xlnet_data.pretrain.checkpoints import CheckpointWriteError
    model_dir = small_disk / "model"
    with pytest.raises(CheckpointWriteError) as failed:
        T.train(_train_config(small_records, model_dir, train_steps=2))
    assert cli.os_error_line(failed.value) == f"cannot write checkpoint {model_dir}/model.ckpt-2: No space left on device"
    assert sorted(n for n in os.listdir(model_dir) if not n.startswith("events.")) == [
        ".train.lock", "run_config.json", "xlnet_config.json"]
    _no_temporary_files(model_dir)


def test_a_model_dir_full_from_the_start_is_one_line_naming_the_config(small_records, small_disk):
    filler = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk
        while os.write(filler, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(filler)
    model_dir = small_disk / "model"
    result = _train_gpu(small_records, model_dir, "--train_steps=2")
    line = _one_line(result, "train", 2)
    assert line == f"train: error: cannot write {model_dir}/xlnet_config.json: No space left on device"
    assert os.listdir(model_dir) == [".train.lock"]


# ----- dump into a closed pipe ------------------------------------------------------------------------

@pytest.mark.parametrize("view", [[], ["--format=json"]])
def test_dump_into_a_pipe_closed_early_exits_0_without_a_traceback(small_records, view):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    dump = subprocess.Popen([sys.executable, "-m", "xlnet_data.dump", str(small_records), *view], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = dump.stdout.readline()  # `dump ... | head -1`
    dump.stdout.close()
    stderr = dump.stderr.read().decode()
    assert dump.wait(timeout=120) == 0 and first
    assert "Traceback" not in stderr and "Error" not in stderr, stderr


# ----- records pulled away while they are read (issue 43) ------------------------------------------------------

@pytest.mark.slow
def test_a_records_file_gone_mid_run_ends_it_like_a_damaged_one_after_a_checkpoint(small_records, tmp_path,
                                                                                monkeypatch):
    """The file is deleted at step 3; the run reads it again when its 17 steps wrap around: it stops with one
    UserError naming the file, after a checkpoint of the steps before (it once died in TensorFlow's NotFoundError,
    its steps lost)."""
    from xlnet_data.common.errors import UserError
    copy = _copy(small_records, tmp_path)
    path = _records_file(copy)
    report = T.report

    def deleting_report(step, *args):
        if step == 3:
            path.unlink()
        return report(step, *args)

    monkeypatch.setattr(T, "report", deleting_report)
    cfg = tiny_config(copy, tmp_path / "model", train_steps=40, iterations=1, mem_len=0, n_layer=1)
    with pytest.raises(UserError) as stopped:
        T.train(cfg)
    assert str(path) in str(stopped.value)
    step = int(tf.train.load_checkpoint(str(tmp_path / "model")).get_tensor("global_step"))
    assert 3 <= step < 40 and f"model.ckpt-{step}" in str(stopped.value)


def _wait_for_reader(save_dir, process, program):
    lock = Path(save_dir) / ".read.lock"
    deadline = time.monotonic() + 300
    while not (lock.exists() and f"{program}: pid {process.pid} " in lock.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, f"{program} never took the readers' lock"
        time.sleep(0.05)


@pytest.fixture(scope="class")
def training_run(small_records, tmp_path_factory):
    """(records, model_dir, process) of a train_gpu run on a copy of small_records that trains on (100,000 steps, no
    checkpoint) while the tests below try what it must refuse: a second run on its model_dir, create --overwrite of
    the records it reads. Returned once it holds both locks, model_dir's and the records' readers' lock; ended with
    the class of those tests (so that it trains in the background of none other)."""
    folder = tmp_path_factory.mktemp("training_run")
    records, model_dir = _copy(small_records, folder, "records"), folder / "model"
    process = fork_server().start("xlnet_data.train_gpu", _train_args(records, model_dir, "--train_steps=100000",
                                                                          "--save_steps=100000"), folder / "stderr")
    try:
        _wait_for_reader(records, process, "train_gpu")
        lock = model_dir / ".train.lock"  # taken after the readers' lock
        deadline = time.monotonic() + 300
        while not (lock.exists() and f"pid {process.pid} " in lock.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, "the run never took model_dir's lock"
            time.sleep(0.05)
        yield records, model_dir, process
    finally:
        process.kill()
        process.wait()


class TestWhileATrainGpuRuns:
    """Refusals made while another train_gpu run trains on (the training_run fixture)."""

    @pytest.mark.slow
    def test_a_second_train_on_a_busy_model_dir_stops_at_once_naming_the_holder(self, training_run, small_records):
        _, model_dir, first = training_run
        # The records' twin, not the records the first run reads: their readers' lock names the latest reader, which
        # must stay the first run for the create test below.
        second = _train_gpu(small_records, model_dir, "--train_steps=2")
        line = _one_line(second, "train", 2)
        assert line.startswith(f"train: error: {model_dir} is in use by another train_gpu run (pid {first.pid} on "
                               f"{os.uname().nodename}, started "), line
        assert line.endswith("; wait for it to end, or use another --model_dir"), line
        assert first.poll() is None  # the first run trains on
        assert not [n for n in os.listdir(model_dir) if n.startswith("model.ckpt")]  # nothing written by the second

    @pytest.mark.slow
    def test_create_overwrite_is_refused_while_train_gpu_or_dump_reads_the_save_dir(self, training_run, sample_spm,
                                                                                    tmp_path):
        from test_train import RECORD_FLAGS
        records, _, train = training_run
        before = _records_file(records).read_bytes()
        text = tmp_path / "emma.txt"
        text.write_text("\n".join((SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:20]) + "\n")
        overwrite = (f"--input_glob={text}", f"--sp_path={sample_spm}", f"--save_dir={records}", *RECORD_FLAGS,
                     "--num_workers=1", "--overwrite")
        env = command_env()

        def refused_naming(program, reader):
            line = _one_line(run_module("xlnet_data.create", *overwrite), "create", 2)
            assert f"{program}: pid {reader.pid} " in line, line
            assert reader.poll() is None  # the reader reads on
            assert _records_file(records).read_bytes() == before

        refused_naming("train_gpu", train)
        # dump besides: the readers' lock names the latest reader
        dump = subprocess.Popen([sys.executable, "-m", "xlnet_data.dump", str(records)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # unread: it blocks, reading on
        try:
            _wait_for_reader(records, dump, "dump")
            refused_naming("dump", dump)
        finally:
            dump.kill()
            dump.communicate()
