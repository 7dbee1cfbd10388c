"""Training, faults round three (issue 27): a diverging run stops without a checkpoint of it, a damaged newest
checkpoint is passed over for the newest readable one, a better checkpoint is not rotated out unsaid, and every
flag is checked before any work. In-process where the exit status is not the point."""

import json
import logging
import os

import numpy as np
import pytest
from conftest import SAMPLE_CORPUS, fork_server
from test_train import make_small_records, tiny_config
from test_train_faults import _checkpoint_tensors, _one_line, _train_args

from xlnet_data.common.errors import ConfigError
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import reporting, resume
from xlnet_data.pretrain import training as T


@pytest.fixture(scope="module")
def small_records(sample_spm, tmp_path_factory):
    return make_small_records(sample_spm, tmp_path_factory)


def _files(model_dir):
    return sorted(os.listdir(model_dir))


@pytest.mark.slow
def test_a_non_finite_loss_stops_training_naming_the_step_without_a_checkpoint_of_it(small_records, sample_spm,
                                                                                    tmp_path):
    cfg = tiny_config(small_records, tmp_path / "m", learning_rate=1e30, warmup_steps=0, train_steps=10,
                      save_steps=1, iterations=1, n_layer=1)
    with pytest.raises(reporting.DivergedError) as stopped:
        T.train(cfg)
    message = str(stopped.value)
    assert message.startswith("the loss is nan at step 2: training stopped, no checkpoint of it written (learning "
                              "rate 9e+29); the last checkpoint is "), message  # step 2's rate, decaying from 1e30
    assert message.endswith(f"{tmp_path / 'm' / 'model.ckpt-1'}: lower --learning_rate (or raise --warmup_steps) "
                            "and run again")
    assert [name for name in _files(tmp_path / "m") if name.startswith("model.ckpt")] == [
        "model.ckpt-1.data-00000-of-00001", "model.ckpt-1.index"]

    # The records' model is in run_config.json: export_hf refuses to ship another tokenizer.
    from xlnet_data.dataformat import provenance
    from xlnet_data.datagen import tokenizer
    run_config = tmp_path / "m" / "run_config.json"
    assert json.loads(run_config.read_text())["sp_model_sha256"] == [provenance.sha256_of(sample_spm)]
    other = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
        input_files=(str(SAMPLE_CORPUS / "austen_emma.txt"),), model_prefix=str(tmp_path / "other"), vocab_size=1000,
        num_threads=2))
    line = _one_line(fork_server().run("xlnet_data.export_hf", f"--model_dir={tmp_path / 'm'}", f"--sp_path={other}",
                                f"--output_dir={tmp_path / 'hf'}"), "export_hf", 2)
    assert line == (f"export_hf: error: --sp_path={other} is not the SentencePiece model of the records the model was "
                    f"trained on ({run_config} records its sha256): pass {sample_spm} (sp_path in "
                    f"{small_records}/corpus_info.json)")
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_max_loss_stops_a_diverging_run_through_the_command(small_records, tmp_path):
    model_dir = tmp_path / "m"
    result = fork_server().run("xlnet_data.train_gpu", *_train_args(small_records, model_dir, "--learning_rate=100",
                                                             "--train_steps=12", "--iterations=1", "--save_steps=1",
                                                             "--max_loss=20"))
    line = _one_line(result, "train", 2)
    assert line.startswith("train: error: the loss ") and " is above --max_loss=20 (diverging): training stopped" in line
    step = int(line.split(" at step ")[1].split()[0])
    last = f"model.ckpt-{step - 1}"
    assert f"the last checkpoint is {model_dir / last}: lower --learning_rate" in line
    assert not (model_dir / f"model.ckpt-{step}.index").exists() and (model_dir / f"{last}.index").exists()


@pytest.mark.parametrize("new_loss, said", [(100.0, True), (2.1, False)])
def test_rotating_out_a_clearly_better_checkpoint_is_said(tmp_path, caplog, new_loss, said):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-6"\n'
                                         'all_model_checkpoint_paths: "model.ckpt-3"\n'
                                         'all_model_checkpoint_paths: "model.ckpt-6"\n')
    cfg = T.dataclasses.replace(tiny_config(tmp_path, tmp_path), max_save=2)
    caplog.set_level(logging.WARNING, logger="xlnet_data")
    resume.say_if_a_better_checkpoint_goes(cfg, 9, new_loss, {"model.ckpt-3": 2.0, "model.ckpt-6": 50.0})
    warned = [record.getMessage() for record in caplog.records]
    assert warned == ([f"--max_save=2 deletes model.ckpt-3 (loss 2) for model.ckpt-9 (loss {new_loss:g}): the loss is "
                       "growing; --max_loss stops a diverging run, a larger --max_save keeps more"] if said else [])


@pytest.fixture(scope="module")
def six_steps(small_records, tmp_path_factory):
    """An uninterrupted run of 6 steps, a checkpoint every 2."""
    cfg = tiny_config(small_records, tmp_path_factory.mktemp("whole"), train_steps=6, save_steps=2, iterations=2,
                      n_layer=1)
    return cfg.model_dir, T.train(cfg).losses


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_passed_over_and_the_resumed_run_equals_an_uninterrupted_one(
        small_records, six_steps, tmp_path, caplog, damage):
    whole_dir, whole_losses = six_steps
    T.train(tiny_config(small_records, tmp_path / "pieces", train_steps=4, save_steps=2, iterations=2, n_layer=1))
    data = tmp_path / "pieces" / "model.ckpt-4.data-00000-of-00001"
    if damage == "deleted":
        data.unlink()
    else:
        with open(data, "r+b") as f:
            f.truncate(data.stat().st_size // 2)
    caplog.set_level(logging.WARNING, logger="xlnet_data")
    resumed = T.train(tiny_config(small_records, tmp_path / "pieces", train_steps=6, save_steps=2, iterations=2,
                                  n_layer=1))
    [line] = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert line.startswith(f"checkpoint {tmp_path / 'pieces' / 'model.ckpt-4'} cannot be read (")
    assert line.endswith(f"resuming from {tmp_path / 'pieces' / 'model.ckpt-2'}, the one before it")
    assert (resumed.first_step, resumed.step) == (2, 6)
    assert resumed.losses == whole_losses[2:]
    ours, theirs = _checkpoint_tensors(tmp_path / "pieces"), _checkpoint_tensors(whole_dir)
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


@pytest.mark.parametrize("flag, message", [
    ("--mem_len=-5", "--mem_len=-5 must be in [0, 65536]"),
    ("--devices=/cpu:0,/cpu:0", "--devices names /cpu:0 twice: each device holds one replica"),
    # Issue 43: a negative or NaN peak logged an MFU of -0.0% or nan%; 0GB turned the memory check off unsaid.
    ("--peak_tflops=-1", "--peak_tflops=-1.0 must be a positive number (a device's dense peak TFLOP/s)"),
    ("--peak_tflops=nan", "--peak_tflops=nan must be a positive number (a device's dense peak TFLOP/s)"),
    ("--device_memory=0GB", "--device_memory='0GB': give a size above 0 bytes, or off to plan for no device memory "
                            "(no check)"),
])
@pytest.mark.slow
def test_a_training_flag_out_of_range_is_one_line_before_any_work(small_records, tmp_path, flag, message):
    model_dir = tmp_path / "m"
    line = _one_line(fork_server().run("xlnet_data.train_gpu", *_train_args(small_records, model_dir, "--train_steps=2"),
                                flag), "train", 2)
    assert line == f"train: error: {message}"
    assert not model_dir.exists()


@pytest.mark.parametrize("changes, message", [
    (dict(learning_rate=float("nan")), "--learning_rate=nan must be a number >= 0"),
    (dict(clip=float("inf")), "--clip=inf must be a positive number"),
    (dict(min_lr_ratio=2.0), "--min_lr_ratio=2.0 must be in [0, 1]"),
    (dict(max_loss=-1.0), "--max_loss=-1.0 must be a positive number"),
    (dict(seed=-1), "--seed=-1 must be in [0, 2**63)"),
    (dict(train_steps=10**12), "--train_steps=1000000000000 must be at most"),
    (dict(devices=("gpu0",)), "--devices: 'gpu0' is not a device name"),
    (dict(peak_tflops=0.0), "--peak_tflops=0.0 must be a positive number"),
    (dict(peak_tflops=float("inf")), "--peak_tflops=inf must be a positive number"),
    (dict(device_memory=-5), "device_memory=-5 must be a number of bytes (0: no check)"),
])
def test_more_training_flags_out_of_range(small_records, tmp_path, changes, message):
    with pytest.raises(ConfigError) as refused:
        tiny_config(small_records, tmp_path, **changes)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("changes, message", [
    (dict(dropout=1.5), "--dropout=1.5 must be in [0, 1)"),
    (dict(dropatt=float("nan")), "--dropatt=nan must be in [0, 1)"),
    (dict(clamp_len=-2), "--clamp_len=-2 must be -1 (no clamping) or more"),
    (dict(init_std=0.0), "--init_std=0.0 must be a positive number"),
])
def test_run_config_ranges(changes, message):
    with pytest.raises(ValueError) as refused:
        C.RunConfig(**changes)
    assert str(refused.value) == message


@pytest.mark.parametrize("name", ["/cpu:0", "/gpu:1", "GPU:0", "cpu", "/gpu:*", "/device:GPU:0", "/device:XPU:3",
                                  "/job:worker/replica:0/task:1/device:GPU:0", "/job:w/gpu:0/task:0", "/Cpu:0",
                                  "gpu0", "/device:GPU", "/job:worker", "", "/cpu:0/gpu:0", "/cpu:x", "foo:1",
                                  "/replica:1", "/gpu:0:1", "/job:w/task:x/cpu:0"])
def test_device_names_are_read_as_tensorflow_reads_them(name):
    """TrainConfig checks --devices without TensorFlow (config.py loads none): as tf.DeviceSpec would."""
    import tensorflow as tf

    from xlnet_data.pretrain.config import is_device_name
    try:
        theirs = tf.DeviceSpec.from_string(name).device_type is not None
    except ValueError:
        theirs = False
    assert is_device_name(name) == theirs


def test_a_device_this_machine_lacks_is_one_line():
    with pytest.raises(ConfigError, match=r"--devices: /gpu:7 is not a device of this machine \(it has /cpu:0"):
        T.make_strategy("mirrored", ("/cpu:0", "/gpu:7"))


def test_run_config_names_the_model_of_every_record_dir(small_records, sample_spm):
    """run_config.json's sp_model_sha256 (export_hf's tokenizer check) from each of several comma-separated record
    dirs; read as one path, they named none and the check was off."""
    from xlnet_data.dataformat import provenance
    from xlnet_data.pretrain import resume
    tfrecords = os.path.join(small_records, "tfrecords")
    assert resume.records_models(f"{tfrecords},{tfrecords}") == [provenance.sha256_of(sample_spm)]
