"""Pretraining (xlnet_data.pretrain.training, python -m xlnet_data.train_gpu): the loss falls, the mirrored step is the
single-device one averaged, runs resume, the goldens' first steps, one-line flag errors, source mixing."""

import dataclasses
import glob
import json
import logging
import os
import re
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    ROOT,
    SAMPLE_CORPUS,
    SHARED,
    fork_server,
    needs_shared,
    run_module,
    run_modules_forked,
    two_logical_cpus,
)

from xlnet_data.common.errors import ConfigError
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import costs, distribution, sources
from xlnet_data.pretrain import inputs as ip
from xlnet_data.pretrain import modeling as M
from xlnet_data.pretrain import optimization as O
from xlnet_data.pretrain import training as T

TINY_SHAPE = ["--n_layer=2", "--d_model=32", "--n_head=2", "--d_head=16", "--d_inner=64", "--ff_activation=gelu",
              "--untie_r"]
RECORD_FLAGS = ["--bsz_per_host=8", "--num_core_per_host=1", "--seq_len=64", "--reuse_len=32", "--bi_data",
                "--num_predict=10", "--uncased"]


def _create(sample_spm, save_dir, input_glob, *more):
    result = run_module("xlnet_data.create", f"--input_glob={input_glob}", f"--sp_path={sample_spm}",
                        f"--save_dir={save_dir}", *RECORD_FLAGS, "--num_workers=1", *more)
    assert result.returncode == 0, result.stderr
    return str(save_dir)


@pytest.fixture(scope="module")
def records(sample_spm, tmp_path_factory):
    """A save_dir of create over sample_corpus/ (about 1,470 steps of 8 rows of 64 tokens)."""
    return _create(sample_spm, tmp_path_factory.mktemp("records") / "big", SAMPLE_CORPUS / "*.txt")


def make_small_records(sample_spm, tmp_path_factory):
    """A save_dir from the first 40 lines of one book: 17 steps of 8 rows (bi_data) of 64 tokens."""
    text_dir = tmp_path_factory.mktemp("small_text")
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:40]
    (text_dir / "emma.txt").write_text("\n".join(lines) + "\n")
    return _create(sample_spm, tmp_path_factory.mktemp("records") / "small", text_dir / "*.txt")


@pytest.fixture(scope="module")
def small_records(sample_spm, tmp_path_factory):
    return make_small_records(sample_spm, tmp_path_factory)


def tiny_config(record_dir, model_dir, **changes):
    """A TrainConfig for the records above and a tiny model (what the CLI builds from TINY_SHAPE; n_layer=1 where
    nothing checked depends on the depth)."""
    record_dirs = ",".join(os.path.join(d, "tfrecords") for d in str(record_dir).split(","))
    model = C.XLNetConfig(n_layer=changes.pop("n_layer", 2), d_model=32, n_head=2, d_head=16, d_inner=64,
                          ff_activation="gelu", untie_r=True, n_token=1000)
    run = C.RunConfig(mem_len=changes.pop("mem_len", 32), reuse_len=32, bi_data=True)
    data = C.InputConfig(seq_len=64, reuse_len=32, perm_size=32, bsz_per_host=8, num_predict=10, uncased=True,
                         num_passes=changes.pop("data_num_passes", None))
    defaults = dict(learning_rate=1e-3, warmup_steps=10, train_steps=20, iterations=10, strategy="one_device")
    return C.TrainConfig(record_info_dir=record_dirs, model_dir=str(model_dir), model=model, run=run, data=data,
                         **{**defaults, **changes})


def _weights(model):
    return {name: var.numpy() for name, var in model.weights.items()}


# ----- the loss falls (the CLI, as bin/demo runs it) ---------------------------------------------

@pytest.fixture(scope="module")
def cli_runs(records, small_records, tmp_path_factory):
    """{name: (finished train_gpu process, its model_dir)} of the slow tests' command-line runs, run one after the other
    in one process's forked children (conftest.run_modules_forked: one TensorFlow import for both)."""
    base = tmp_path_factory.mktemp("cli_runs")
    runs = {
        "trained": [f"--record_info_dir={records}", f"--model_dir={base / 'trained'}", *TINY_SHAPE, "--mem_len=32",
                    "--learning_rate=1e-3", "--warmup_steps=10", "--train_steps=200", "--iterations=20",
                    "--save_steps=100", "--max_save=1"],
        "dry_run": [f"--record_info_dir={small_records}", f"--model_dir={base / 'dry_run'}", *TINY_SHAPE,
                    "--mem_len=32", "--dry_run", "--dry_run_steps=2", "--dry_run_seconds=0", "--train_steps=1000",
                    "--device_memory=16GB"],
    }
    results = run_modules_forked([("xlnet_data.train_gpu", args) for args in runs.values()])
    return {name: (result, base / name) for name, result in zip(runs, results)}


@pytest.mark.slow
def test_cli_trains_a_tiny_model_and_the_loss_falls(cli_runs):
    result, model_dir = cli_runs["trained"]
    assert result.returncode == 0, result.stderr
    logged = re.findall(r"step (\d+) \| loss ([\d.]+) \| pplx ([\d.]+) \| bpt ([\d.]+) \| gnorm ([\d.]+) \| "
                        r"lr ([\d.e+-]+) \| (\d+) tok/s", result.stderr)
    assert [int(line[0]) for line in logged] == list(range(20, 201, 20)), result.stderr
    losses = [float(line[1]) for line in logged]
    # Mean of the last 20 steps well below the mean of the first 20 (about 6.8 -> 5.4 here).
    assert losses[-1] < losses[0] - 0.8, losses
    assert float(logged[0][2]) == pytest.approx(np.exp(losses[0]), rel=1e-3)
    assert float(logged[0][3]) == pytest.approx(losses[0] / np.log(2), rel=1e-3)

    # Checkpoints by the original's names (the last one kept), xlnet_config.json, TensorBoard scalars.
    assert sorted(os.listdir(model_dir)) == sorted(
        [".train.lock", "checkpoint", "xlnet_config.json", "run_config.json", "model.ckpt-200.index",
         "model.ckpt-200.data-00000-of-00001",
         os.path.basename(glob.glob(str(model_dir / "events.out.tfevents.*"))[0])])
    reader = tf.train.load_checkpoint(str(model_dir))
    assert reader.get_tensor("global_step") == 200
    assert reader.has_tensor("model/transformer/layer_1/ff/layer_2/kernel/adam_v")
    config = C.XLNetConfig.from_json(str(model_dir / "xlnet_config.json"))
    assert (config.n_layer, config.d_model, config.n_token) == (2, 32, 1000)
    M.build_model(config, C.RunConfig(), checkpoint=str(model_dir))
    tags = {}
    for event in tf.compat.v1.train.summary_iterator(glob.glob(str(model_dir / "events.out.tfevents.*"))[0]):
        for value in event.summary.value:
            tags.setdefault(value.tag, []).append(event.step)
    assert set(tags) == {"loss", "perplexity", "bits_per_token", "gnorm", "learning_rate", "tokens_per_second",
                         "sequences_per_second", "model_tflops_per_second", "seconds_left"}  # no MFU on a CPU
    assert tags["loss"] == list(range(20, 201, 20))


# ----- several devices ----------------------------------------------------------------------------

def check_mirrored_equals_single_device(records, model_dir, steps=3):
    """In a fresh TensorFlow (a forked child): two replicas == each replica's rows on one device, averaged. Returns
    the run, for the child to keep until it leaves with os._exit."""
    two_logical_cpus()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    # Learning rate 0: the weights stay, so later steps compare too (with their memories).
    cfg = tiny_config(records, model_dir, learning_rate=0.0, train_steps=steps, iterations=1, strategy="mirrored")
    # One layer: what is checked is how the rows, losses and gradients are shared out and averaged, not the model.
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layer=1))
    result = T.train(cfg, strategy=strategy)
    trainer = result.trainer
    single = M.build_model(cfg.model, cfg.run)
    for name, value in _weights(trainer.model).items():
        single.weights[name].assign(value)

    # The records' rows: forward 0-3, then their reverses 4-7; replica r gets forward 2r, 2r+1 and their reverses.
    shares = [[0, 1, 4, 5], [2, 3, 6, 7]]
    batches = iter(ip.make_dataset(cfg.record_info_dir, cfg.data))
    first = iter(strategy.distribute_datasets_from_function(
        lambda context: T.replica_batches(cfg.record_info_dir, cfg, 2, input_context=context)))
    mems = [single.initial_mems(4) for _ in shares]
    for step in range(steps):
        batch = next(batches)
        losses, grads = [], []
        for r, rows in enumerate(shares):
            features = {key: tf.gather(value, rows) for key, value in batch.items()}
            with tf.GradientTape() as tape:
                out = single.plm_loss(features, mems[r], training=True)
            gradients = tape.gradient(out.total_loss, list(single.weights.values()))
            grads.append([tf.convert_to_tensor(g) for g in gradients])
            losses.append(out.total_loss.numpy())
            mems[r] = out.new_mems
        np.testing.assert_allclose(result.losses[step], np.mean(losses), rtol=0, atol=1e-5, err_msg=f"step {step}")
        if step == 0:
            distributed = next(first)
            local = strategy.experimental_local_results(distributed["input_k"])
            for r, rows in enumerate(shares):
                np.testing.assert_array_equal(local[r].numpy(), tf.gather(batch["input_k"], rows).numpy())
            loss, mirrored_grads, _ = trainer.loss_and_grads(distributed, trainer.initial_mems())
            np.testing.assert_allclose(loss.numpy(), np.mean(losses), rtol=0, atol=1e-5)
            for name, got, *per_replica in zip(single.weights, mirrored_grads, *grads):
                np.testing.assert_allclose(got.numpy(), np.mean(per_replica, axis=0), rtol=0, atol=1e-5,
                                           err_msg=name)
    return result


@pytest.mark.slow
def test_two_replicas_equal_each_replicas_share_on_one_device_averaged(records, tmp_path):
    # In a fresh TensorFlow (two logical CPUs), forked from the test process's one import.
    result = fork_server().run("test_train", records, tmp_path / "model", function="check_mirrored_equals_single_device")
    assert result.returncode == 0, result.stderr[-5000:]


@pytest.mark.parametrize("num_core, replicas, bi_data, want", [
    (1, 2, True, [[0, 1, 4, 5], [2, 3, 6, 7]]),
    (2, 1, True, [[0, 1, 4, 5, 2, 3, 6, 7]]),  # cores' blocks [f0 f1 b0 b1], [f2 f3 b2 b3]
    (2, 4, True, [[0, 2], [1, 3], [4, 6], [5, 7]]),
    (2, 2, True, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (1, 4, False, [[0, 1], [2, 3], [4, 5], [6, 7]]),
])
def test_a_step_is_split_so_each_replica_has_forward_rows_then_their_backward_rows(num_core, replicas, bi_data, want):
    host = tf.reshape(tf.range(8), [num_core, 8 // num_core])  # row ids in the records' layout
    got = sources.split_host_batch(host[..., None], replicas, bi_data)[..., 0].numpy()
    assert got.tolist() == want


@pytest.mark.parametrize("replicas, pipelines", [(2, 1), (4, 1), (4, 2)])
def test_replica_batches_are_the_rows_of_the_records_batches(small_records, tmp_path, replicas, pipelines):
    """Each replica's batch is, row for row, its share of make_dataset's seeded batch (replica_batches splits
    the serialized records and their permutations, then parses), also resumed and with several pipelines."""
    cfg = dataclasses.replace(tiny_config(small_records, tmp_path), seed=5)
    shares = sources.split_host_batch(tf.reshape(tf.range(8), [1, 8]), replicas, True).numpy()
    local = replicas // pipelines
    for pipeline in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=replicas)
        got = iter(T.replica_batches(cfg.record_info_dir, cfg, replicas, start_step=1, input_context=context))
        for batch in ip.make_dataset(cfg.record_info_dir, cfg.data, seed=cfg.seed, start=8).take(2):
            for rows in shares[pipeline * local:(pipeline + 1) * local]:
                replica = next(got)
                assert set(replica) == set(batch)
                for key, value in batch.items():
                    np.testing.assert_array_equal(replica[key].numpy(), tf.gather(value, rows).numpy(), err_msg=key)


def test_a_batch_that_cannot_be_split_is_refused(records, tmp_path):
    cfg = tiny_config(records, tmp_path)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, bsz_per_host=3))
    with pytest.raises(ConfigError, match=r"--train_batch_size=3 cannot be split over 1 replica\(s\): it must be "
                                            r"a multiple of 2 \(each replica needs forward and backward rows\)"):
        T.Trainer(cfg, tf.distribute.OneDeviceStrategy("/cpu:0"))


# ----- resume, init_checkpoint, the goldens -------------------------------------------------------

@pytest.fixture(scope="module")
def interrupted(records, tmp_path_factory):
    """(n, an uninterrupted run of 2n steps, its config, the config of the same run in another model_dir, (that run
    stopped 3 steps after its checkpoint of step n, the latest checkpoint then), the stopped run resumed), n = 4,
    without memories (tests/test_train_faults.py: with them, bit for bit, and from a signal)."""
    n, mem_len, base = 4, 0, tmp_path_factory.mktemp("interrupted")
    whole_cfg = tiny_config(records, base / "whole", train_steps=2 * n, save_steps=n, mem_len=mem_len)
    whole = T.train(whole_cfg)
    cfg = tiny_config(records, base / "pieces", train_steps=2 * n, save_steps=n, mem_len=mem_len)
    first = T.train(cfg, stop_after=n + 3)  # killed 3 steps after the checkpoint of step n
    return n, whole, whole_cfg, cfg, (first, tf.train.latest_checkpoint(cfg.model_dir)), T.train(cfg)


@pytest.mark.slow
def test_an_interrupted_run_resumes_where_its_checkpoint_was(interrupted, records, tmp_path):
    n, whole, _, cfg, (first, latest_when_stopped), second = interrupted
    assert first.step == n + 3 and latest_when_stopped.endswith(f"model.ckpt-{n}")
    assert (second.first_step, second.step, len(second.losses)) == (n, 2 * n, n)
    np.testing.assert_array_equal(first.losses, whole.losses[:n + 3])
    np.testing.assert_array_equal(second.losses, whole.losses[n:])
    for name, value in _weights(second.trainer.model).items():
        np.testing.assert_array_equal(value, whole.trainer.model.weights[name].numpy(), err_msg=name)

    # Our checkpoints initialise other runs (by the original's names), as the original's do.
    other = T.train(tiny_config(records, tmp_path / "other", train_steps=1, learning_rate=0.0,
                                init_checkpoint=cfg.model_dir, mem_len=0))
    for name, value in _weights(other.trainer.model).items():
        np.testing.assert_array_equal(value, second.trainer.model.weights[name].numpy())


@pytest.mark.slow
def test_a_model_dir_of_another_model_is_refused(interrupted, tmp_path):
    _, _, whole_cfg, _, _, _ = interrupted
    cfg = dataclasses.replace(whole_cfg, model_dir=str(tmp_path / "model"))  # a copy: the refusal must change nothing
    shutil.copytree(whole_cfg.model_dir, cfg.model_dir)
    with pytest.raises(ConfigError, match=r"holds another model: d_inner=64 \(here 48\)"):
        T.train(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, d_inner=48)))


# Model golden -> (create golden whose records it read, InputConfig fields beyond run_config.json).
GOLDEN_INPUTS = {
    "m1_bi_untied": ("g1_blog", dict(bsz_per_host=8, bi_data=True, uncased=True, num_predict=21)),
    "m2_uni_tied": ("g2_multitask", dict(bsz_per_host=4, bi_data=False, uncased=True, num_predict=10)),
    "m3_sharp": ("g5_seq512", dict(bsz_per_host=4, bi_data=True, uncased=False, num_predict=85)),
}


def _golden_train_config(case, model_dir, **changes):
    """A run from a model golden's TF1 checkpoint on the records it was made from, and its golden arrays."""
    golden = SHARED / "golden_model" / case
    create_case, fields = GOLDEN_INPUTS[case]
    run = C.RunConfig.from_json(str(golden / "run_config.json"))
    run_json = json.loads((golden / "run_config.json").read_text())
    data = C.InputConfig(seq_len=run_json["seq_len"], reuse_len=run.reuse_len, perm_size=run_json["perm_size"],
                         **fields)
    cfg = C.TrainConfig(record_info_dir=str(SHARED / "golden" / create_case / "expected" / "tfrecords"),
                        model_dir=str(model_dir), model=C.XLNetConfig.from_json(str(golden / "xlnet_config.json")),
                        run=run, data=data, init_checkpoint=str(golden / "model.ckpt"), strategy="one_device",
                        **changes)
    return cfg, np.load(golden / "features.npz"), np.load(golden / "expected.npz")


@pytest.fixture(scope="module")
def golden_runs(tmp_path_factory):
    """golden_runs(case, jit_compile) -> (the losses, whether XLA compiled the step, the golden arrays) of a run of 3
    steps from a model golden's TF1 checkpoint at learning rate 1e-3 after a warm-up of one step, made once for the
    tests that read it. The warm-up's rate at step 0 is 0, so the second step is taken with the golden weights and
    the first step's memories (the golden's second step), and the third after an update (Adam's, clipped)."""
    runs = {}

    def run(case, jit_compile):
        if (case, jit_compile) not in runs:
            model_dir = tmp_path_factory.mktemp(f"{case}_{jit_compile}")
            cfg, features, expected = _golden_train_config(case, model_dir, learning_rate=1e-3, warmup_steps=1,
                                                           train_steps=3, jit_compile=jit_compile)
            result = T.train(cfg, permutation=ip.fixed_permutation(features["perm_rows_0"], features["perm_rows_1"]))
            runs[case, jit_compile] = result.losses, result.trainer.uses_xla, expected
        return runs[case, jit_compile]
    return run


@needs_shared
@pytest.mark.parametrize("case", sorted(GOLDEN_INPUTS))
@pytest.mark.slow
def test_training_from_the_golden_tf1_checkpoint_starts_at_the_golden_loss(case, golden_runs):
    losses, _, expected = golden_runs(case, "off")
    # A rate of 0 at step 0 keeps the golden weights, so the second step (with the first's memories) matches too.
    np.testing.assert_allclose(losses[:2], [expected["total_loss_0"], expected["total_loss_1"]], rtol=1e-5)


@needs_shared
@pytest.mark.parametrize("case", sorted(GOLDEN_INPUTS))
@pytest.mark.slow
def test_the_xla_compiled_step_gives_the_plain_steps_losses(case, golden_runs):
    losses, uses_xla = {}, {}
    for jit_compile in ("off", "on"):
        losses[jit_compile], uses_xla[jit_compile], expected = golden_runs(case, jit_compile)
    assert uses_xla == {"off": False, "on": True}
    # Three steps (the second and third see the first's gradients in Adam's moments, the third an update), same losses.
    np.testing.assert_allclose(losses["on"], losses["off"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(losses["on"][0], expected["total_loss_0"], rtol=1e-5)
    assert losses["on"][2] < losses["on"][0]


@pytest.mark.slow
def test_jit_compile_auto_is_off_on_the_cpu_and_falls_back_when_xla_cannot_compile(records, tmp_path, caplog):
    cfg = tiny_config(records, tmp_path, train_steps=2, n_layer=1)  # the choice and fallback of XLA, at any depth
    strategy = T.make_strategy("one_device", ("/cpu:0",))
    assert not T.Trainer(cfg, strategy).uses_xla
    assert T.Trainer(dataclasses.replace(cfg, jit_compile="on"), strategy).uses_xla

    # auto where XLA would be used (a GPU), with an op it cannot compile: the step runs uncompiled.
    def with_a_python_op(trainer):
        plm_loss = trainer.model.plm_loss

        def plm_loss_with_a_python_op(features, mems, training=False, **options):
            out = plm_loss(features, mems, training=training, **options)
            side = tf.numpy_function(lambda x: x, [out.total_loss], tf.float32)  # XLA has no kernel for it
            return out._replace(total_loss=out.total_loss + 0 * tf.stop_gradient(side))

        trainer.model.plm_loss = plm_loss_with_a_python_op
        return trainer

    trainer = with_a_python_op(T.Trainer(cfg, strategy))
    trainer.uses_xla = True
    trainer._build_step()
    batch = next(iter(T.replica_batches(cfg.record_info_dir, cfg, 1)))
    with caplog.at_level(logging.WARNING, logger="xlnet_data"):
        loss, _, _, _ = trainer.train_step(batch, trainer.initial_mems())
    assert np.isfinite(float(loss)) and not trainer.uses_xla
    assert "XLA cannot compile the step, running it uncompiled" in caplog.text
    # "on" never falls back.
    strict = with_a_python_op(T.Trainer(dataclasses.replace(cfg, jit_compile="on"), strategy))
    with pytest.raises(tf.errors.InvalidArgumentError):
        strict.train_step(batch, strict.initial_mems())


@pytest.mark.slow
def test_bfloat16_on_the_cpu_gives_finite_and_falling_losses(records, tmp_path):
    # One layer: every layer computes in the same dtype; the falling loss is the embeddings' and softmax's too.
    cfg = tiny_config(records, tmp_path, train_steps=80, iterations=20, warmup_steps=10, n_layer=1)
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, use_bfloat16=True))
    result = T.train(cfg)
    assert result.trainer.model.compute_dtype == tf.bfloat16
    assert all(w.dtype == tf.float32 for w in result.trainer.variables)  # float32 weights
    losses = np.array(result.losses)
    assert np.isfinite(losses).all() and losses.dtype == np.float64
    assert losses[-20:].mean() < losses[:20].mean() - 0.5, losses


@needs_shared
@pytest.mark.parametrize("case", sorted(GOLDEN_INPUTS))
def test_replica_batches_give_the_golden_features(case, tmp_path):
    cfg, features, _ = _golden_train_config(case, tmp_path)
    permutation = ip.fixed_permutation(features["perm_rows_0"], features["perm_rows_1"])
    for step, batch in enumerate(T.replica_batches(cfg.record_info_dir, cfg, 1, permutation=permutation).take(2)):
        for key, value in batch.items():
            np.testing.assert_array_equal(value.numpy(), features[f"{key}_{step}"], err_msg=f"{key}_{step}")


# ----- flag errors: one line ----------------------------------------------------------------------

def _one_error_line(result):
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    # TensorFlow's C++ start-up lines (when it was imported) are not ours.
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not re.match(r"(WARNING: All log messages|[IWE]\d{4} )", line)]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("flags, fragments", [
    (["--seq_len=128"], ["--seq_len=128 contradicts the records: seq_len=64 in {records}/corpus_info.json"]),
    (["--train_batch_size=16"], ["--train_batch_size=16 contradicts the records: bsz_per_host=8 in {records}/"]),
    (["--nobi_data"], ["--bi_data=False contradicts the records: bi_data=True in {records}/"]),
    (["--n_token=32000"], ["--n_token=32000 contradicts the records: vocab_size=1000 in {records}/"]),
    (["--keep_accents"], ["--keep_accents=True contradicts the records: keep_accents=False in {records}/"]),
    (["--record_info_dir=/nonexistent/records"], ["--record_info_dir: no records", "/nonexistent/records"]),
    (["--perm_size=5"], ["perm_size (5) must divide reuse_len (32)"]),
    (["--gradient_accumulation_steps=3"], ["--gradient_accumulation_steps=3 cannot split each replica's 8 rows into "
                                           "micro-batches: it must divide 4"]),
    (["--no_such_flag=1"], ["no_such_flag"]),
    # the original's flags that we cannot honour
    (["--use_tpu=True"], ["--use_tpu=True: train_gpu does not switch to TPU ops", "--strategy=tpu"]),
    (["--num_hosts=2"], ["--num_hosts=2: the original's train_gpu.py reads the records as one host",
                         "--strategy=multi_worker"]),
    (["--summary_type=max"], ["summary_type", "last"]),
])
def test_cli_flag_errors_are_one_line(records, tmp_path, flags, fragments):
    result = fork_server().run("xlnet_data.train_gpu", f"--record_info_dir={records}", f"--model_dir={tmp_path}", *flags)
    line = _one_error_line(result)
    assert line.startswith("train: error:")
    for fragment in fragments:
        assert fragment.format(records=records) in line


def test_cli_without_corpus_info_needs_the_data_flags(records, tmp_path):
    (tmp_path / "bare").mkdir()
    os.symlink(os.path.join(records, "tfrecords"), tmp_path / "bare" / "tfrecords")
    result = fork_server().run("xlnet_data.train_gpu", f"--record_info_dir={tmp_path / 'bare'}",
                        f"--model_dir={tmp_path / 'model'}")
    assert _one_error_line(result) == ("train: error: --train_batch_size, --seq_len, --reuse_len needed: no "
                                       f"corpus_info.json next to {tmp_path / 'bare' / 'tfrecords'} to read them from")


def test_cli_xlnet_config_that_contradicts_the_records_is_one_line(records, tmp_path):
    tiny = C.XLNetConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, ff_activation="gelu", untie_r=True,
                         n_token=32000)
    tiny.to_json(str(tmp_path / "xlnet_config.json"))
    result = fork_server().run("xlnet_data.train_gpu", f"--record_info_dir={records}", f"--model_dir={tmp_path / 'm'}",
                        f"--xlnet_config={tmp_path / 'xlnet_config.json'}")
    assert "the records' vocab_size" in _one_error_line(result)


# ----- the plan: --device_memory, --dry_run (costs.py: test_costs.py) -----------------------------

def _plan_cli(records, model_dir, *flags):
    return fork_server().run("xlnet_data.train_gpu", f"--record_info_dir={records}", f"--model_dir={model_dir}", *TINY_SHAPE,
                      "--mem_len=32", *flags)


def test_a_run_that_cannot_fit_the_device_memory_stops_in_one_line_before_any_step(small_records, tmp_path):
    cfg = tiny_config(small_records, tmp_path)
    shape = costs.step_shape(cfg, 1)
    fits_with_k2 = costs.memory_plan(cfg.model, dataclasses.replace(shape, micro_batches=2)).total
    assert fits_with_k2 < costs.memory_plan(cfg.model, shape).total
    result = _plan_cli(small_records, tmp_path / "model", f"--device_memory={fits_with_k2}", "--train_steps=5")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]  # not oneDNN's "round-off errors"
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.fullmatch(r"train: error: this run needs an estimated [\d.]+ MB per replica, --device_memory has "
                        r"[\d.]+ MB: it fits with --gradient_accumulation_steps=2 \(estimated [\d.]+ MB\)",
                        errors[0]), errors[0]
    assert not re.search(r"step \d+ \|", result.stderr)
    assert not (tmp_path / "model").exists()  # refused before the model_dir was made, let alone a step


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_a_projection_and_writes_nothing(cli_runs, small_records, tmp_path):
    result, model_dir = cli_runs["dry_run"]
    assert result.returncode == 0, result.stderr
    cfg = tiny_config(small_records, tmp_path)
    plan = re.search(r"plan: ([\d,]+) parameters; ([\d.e+-]+) TFLOP per step \(model FLOPs\); ([\d,]+) tokens per "
                     r"step .* peak memory ([\d.]+) MB per replica \(weights .*\) of 16.00 GB", result.stderr)
    assert plan, result.stderr
    assert int(plan[1].replace(",", "")) == costs.param_count(cfg.model)
    assert float(plan[2]) == pytest.approx(costs.train_flops(cfg.model, costs.step_shape(cfg, 1)) / 1e12, rel=1e-3)
    assert int(plan[3].replace(",", "")) == 8 * 64
    projected = re.search(r"projected: 1,000 steps \(from step 0 to --train_steps=1000\) in \S+ \(([\d,]+) s\), "
                          r"512,000 tokens", result.stdout)
    step = re.search(r"then ([\d.e+-]+) s per step \(mean of 2\)", result.stdout)
    first = re.search(r"the first step ([\d.]+) s after start", result.stdout)
    assert projected and step and first, result.stdout
    assert float(projected[1].replace(",", "")) == pytest.approx(float(first[1]) + 999 * float(step[1]), rel=0.02,
                                                                  abs=1)
    assert not model_dir.exists()


# ----- the schedule and the optimizer -------------------------------------------------------------

def test_learning_rate_warms_up_then_decays_to_min_lr_ratio(records, tmp_path):
    base = tiny_config(records, tmp_path, learning_rate=1.0, warmup_steps=10, train_steps=110, min_lr_ratio=0.1)
    lr = lambda cfg, step: float(O.learning_rate(step, cfg))
    assert [lr(base, s) for s in (0, 5, 10)] == pytest.approx([0.0, 0.5, 1.0])
    assert [lr(base, s) for s in (60, 110, 500)] == pytest.approx([0.55, 0.1, 0.1])
    cos = dataclasses.replace(base, decay_method="cos")
    assert [lr(cos, s) for s in (5, 10, 60, 110)] == pytest.approx([0.5, 1.0, 0.55, 0.1])
    assert lr(cos, 35) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi / 4)))


def test_weight_decay_spares_layer_norm_and_biases_but_not_the_attention_biases():
    decayed = [name for name in M.variable_shapes(C.XLNetConfig(1, 4, 1, 4, 8, "relu", True, 10))
               if O.uses_weight_decay(name)]
    assert decayed == ["model/transformer/word_embedding/lookup_table", "model/transformer/mask_emb/mask_emb",
                       "model/transformer/r_w_bias", "model/transformer/r_r_bias", "model/transformer/r_s_bias",
                       "model/transformer/seg_embed"] + [f"model/transformer/layer_0/rel_attn/{p}/kernel"
                                                         for p in "qkvro"] + [
                          "model/transformer/layer_0/ff/layer_1/kernel", "model/transformer/layer_0/ff/layer_2/kernel"]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_optimizer_is_the_originals_adam(records, tmp_path, weight_decay):
    cfg = tiny_config(records, tmp_path, learning_rate=0.01, warmup_steps=0, weight_decay=weight_decay,
                      adam_epsilon=1e-6)
    weights = {"a/kernel": tf.Variable([1.0, -2.0]), "a/LayerNorm/gamma": tf.Variable([0.5, 3.0])}
    optimizer = O.AdamWeightDecay(weights, cfg)
    want = {name: var.numpy().astype(np.float64) for name, var in weights.items()}
    m = {name: 0.0 for name in weights}
    v = {name: 0.0 for name in weights}
    rng = np.random.default_rng(0)
    for t in range(1, 4):
        grads = [rng.normal(size=2).astype(np.float32) for _ in weights]
        lr = float(O.learning_rate(t - 1, cfg))
        optimizer.apply(tf.distribute.get_strategy(), [tf.constant(g) for g in grads])
        for (name, w), g in zip(want.items(), grads):
            m[name] = 0.9 * m[name] + 0.1 * g
            v[name] = 0.999 * v[name] + 0.001 * g * g
            if weight_decay == 0:  # tf.train.AdamOptimizer
                step = lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m[name] / (np.sqrt(v[name]) + 1e-6)
            else:  # AdamWeightDecayOptimizer: no bias correction, no decay of LayerNorm
                decay = weight_decay * w if "LayerNorm" not in name else 0
                step = lr * (m[name] / (np.sqrt(v[name]) + 1e-6) + decay)
            want[name] = w - step
    assert int(optimizer.step.numpy()) == 3
    for name, var in weights.items():
        np.testing.assert_allclose(var.numpy(), want[name], rtol=1e-5, err_msg=name)


# ----- several sources ----------------------------------------------------------------------------

def test_mixing_draws_sources_by_tokens_to_the_alpha():
    tokens = [2_000_000, 20_000]
    np.testing.assert_allclose(T.sampling_probs(tokens, 1.0), [100 / 101, 1 / 101])
    np.testing.assert_allclose(T.sampling_probs(tokens, 0.0), [0.5, 0.5])
    probs = T.sampling_probs(tokens, 0.5)
    np.testing.assert_allclose(probs, [10 / 11, 1 / 11])
    np.testing.assert_allclose(T.sampling_probs(tokens, 60.0), [1, 1e-120], rtol=1e-9)  # 2e6 ** 60 overflows
    np.testing.assert_array_equal(T.sampling_probs(tokens, 1e308), [1, 0])  # the flag's largest
    for seed in range(5):
        schedule = T.mixing_schedule(probs, 1000, seed)
        shares = np.bincount(schedule, minlength=2) / 1000
        assert np.all(np.abs(shares - probs) < 0.03), (seed, shares)
    np.testing.assert_array_equal(T.mixing_schedule(probs, 1000, 7), T.mixing_schedule(probs, 1000, 7))
    line = T.mixture_line(np.bincount(T.mixing_schedule(probs, 1000, 0)), probs, ["big", "small"])
    assert re.fullmatch(r"mixture: big \d+\.\d% \(expected 90\.9%\), small \d+\.\d% \(expected 9\.1%\)", line)


@pytest.mark.slow
def test_a_mixed_run_feeds_each_sources_memory_only_from_that_source(records, small_records, tmp_path, caplog):
    steps = 24
    # mem_len = 2 * reuse_len and learning rate 0: layer 0's memory is then exactly the embeddings of the
    # memory parts of the source's last two batches, its own stream consecutively.
    cfg = tiny_config(f"{records},{small_records}", tmp_path, mix_sampling_factor=0.5, learning_rate=0.0,
                      train_steps=steps, iterations=steps, mem_len=64, seed=3)
    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        result = T.train(cfg)
    counts = [source.steps for source in result.sources]
    assert sum(counts) == steps and min(counts) >= 2, counts
    assert any(f"mixture: {cfg.sources[0]} {100 * counts[0] / steps:.1f}%" in message
               for message in caplog.messages), caplog.messages
    embedding = result.trainer.model.weights["model/transformer/word_embedding/lookup_table"]
    for source, count in zip(result.sources, counts):
        batches = list(T.replica_batches(source.name, cfg, 1).take(count))
        tokens = np.concatenate([batch["input_k"].numpy()[:, :32] for batch in batches[-2:]], axis=1)  # [bsz, 64]
        want = tf.gather(embedding, tokens.T).numpy()  # time-major [64, bsz, d_model]
        np.testing.assert_allclose(source.mems[0].numpy(), want, atol=1e-6, err_msg=source.name)


def test_one_cpu_device_reads_the_batches_the_distributed_iterator_gives(small_records, tmp_path):
    """On one CPU device the loop reads its dataset with a plain iterator (a distributed one slowed every step of
    TensorFlow's Eigen kernels 2x): the batches must be the distributed iterator's (the CLI tests train on them)."""
    cfg = dataclasses.replace(tiny_config(small_records, tmp_path), seed=3)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

    def dataset_fn(context):
        return T.replica_batches(cfg.record_info_dir, cfg, 1, start_step=2, input_context=context)

    plain = distribution.batch_iterator(strategy, dataset_fn)
    distributed = iter(strategy.distribute_datasets_from_function(dataset_fn))
    assert not isinstance(plain, tf.distribute.DistributedIterator)
    for _ in range(2):
        ours, theirs = next(plain), next(distributed)
        assert set(ours) == set(theirs)
        for key, value in theirs.items():
            np.testing.assert_array_equal(ours[key].numpy(), value.numpy(), err_msg=key)


# ----- the benchmark ------------------------------------------------------------------------------

@pytest.mark.slow
def test_benchmark_runs_small_on_cpu(monkeypatch, capsys):
    """benchmarks/bench_train.py's gpu mode on the tiny shape, its main() in this process: what can break is the
    script against the library (its flags, the Trainer and costs it calls), not a process (a subprocess paid
    TensorFlow's start-up again)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_train
    monkeypatch.setattr(sys, "argv", ["bench_train.py", "gpu", "--small", "--steps=3", "--strategy=one_device"])
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        bench_train.main()
    finally:  # the script sets TF32 for the whole process
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    out = capsys.readouterr().out
    assert re.search(r"median step [\d.]+ ms, [\d,]+ tokens/s", out), out
