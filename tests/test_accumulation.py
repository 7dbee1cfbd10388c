"""Gradient accumulation and recomputation (train_gpu --gradient_accumulation_steps=K, --recompute): a step of K
micro-batches, or of recomputed layers, is the one-pass step to float rounding (its loss, every gradient, the
memories it passes on, 8 logged losses), on two replicas reading a token cache with bi_data and memories; a run
resumed with another K continues the same run; a K that cannot split the rows is one line.

The shapes are the smallest that keep what the check is for (docs/testing.md): 16 rows of 16 tokens, so that K = 4
still leaves micro-batches of one forward and one backward row on each of two replicas, micro-batches that hold
different numbers of targets (an unweighted mean of their losses is another loss), and a resume 2 steps after a
checkpoint."""

import dataclasses
import logging

import numpy as np
import pytest
import tensorflow as tf
from conftest import SAMPLE_CORPUS, fork_server, two_logical_cpus
from test_modeling import TINY, _synthetic_features
from test_train import tiny_config

from xlnet_data.common.errors import ConfigError
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records
from xlnet_data.pretrain import accumulation as A
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import modeling as M
from xlnet_data.pretrain import training as T

BSZ = 16  # two replicas of 4 forward and 4 backward rows: K = 4 leaves micro-batches of 1 + 1 rows
SEQ_LEN, REUSE_LEN, NUM_PREDICT = 16, 8, 4
MODEL = C.XLNetConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=24, ff_activation="gelu", untie_r=True,
                      n_token=1000)


@pytest.fixture(scope="module")
def cache(sample_spm, tmp_path_factory):
    """A cache-backed save_dir (create --nowrite_records): bi_data, 16 rows of 16 tokens, 43 steps a pass."""
    text_dir = tmp_path_factory.mktemp("text")
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:60]
    (text_dir / "emma.txt").write_text("\n".join(lines) + "\n")
    config = CreateConfig(input_glob=str(text_dir / "*.txt"), sp_path=sample_spm,
                          save_dir=str(tmp_path_factory.mktemp("cache")), bsz_per_host=BSZ, num_core_per_host=1,
                          seq_len=SEQ_LEN, reuse_len=REUSE_LEN, bi_data=True, num_predict=NUM_PREDICT, uncased=True,
                          num_passes=2, write_records=False)
    create_records(config.validate(), num_workers=1)
    return config.save_dir


def config(save_dir, model_dir, steps=1, recompute=False, **changes):
    cfg = tiny_config(save_dir, model_dir, mem_len=REUSE_LEN, **changes)
    data = dataclasses.replace(cfg.data, seq_len=SEQ_LEN, reuse_len=REUSE_LEN, perm_size=REUSE_LEN, bsz_per_host=BSZ,
                               num_predict=NUM_PREDICT)
    return dataclasses.replace(cfg, model=MODEL, run=dataclasses.replace(cfg.run, reuse_len=REUSE_LEN), data=data,
                               gradient_accumulation_steps=steps, recompute=recompute)


@pytest.mark.slow
def test_micro_batches_and_recomputation_take_the_one_pass_steps(cache, tmp_path):
    # In a fresh TensorFlow (two logical CPUs), forked from the test process's one import.
    result = fork_server().run("test_accumulation", cache, tmp_path / "runs",
                               function="check_micro_batches_take_the_one_pass_steps")
    assert result.returncode == 0, result.stderr[-5000:]


def check_micro_batches_take_the_one_pass_steps(save_dir, model_dir):
    """In a process with two logical CPUs. Three runs of 8 steps (each run costs more to build than its steps): K = 1;
    K = 2, killed 2 steps after its checkpoint at step 4; that run resumed with K = 4 and recomputation. Returns the
    runs, for the forked child to keep until it leaves with os._exit: freeing them on return here (their token-cache
    iterators) waited 12 s and more with the CPU idle."""
    two_logical_cpus()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    reference = T.train(config(save_dir, f"{model_dir}/one_pass", train_steps=8, strategy="mirrored"),
                        strategy=strategy)
    cfg = config(save_dir, f"{model_dir}/micro", 2, train_steps=8, save_steps=4, strategy="mirrored")
    first = T.train(cfg, stop_after=6, strategy=strategy)
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append
    logging.getLogger("xlnet_data").addHandler(handler)
    second = T.train(dataclasses.replace(cfg, gradient_accumulation_steps=4, recompute=True), strategy=strategy)
    # The resume took K = 2's memories and positions (a warning would say it could not).
    assert (second.first_step, second.step) == (4, 8) and not warnings, [w.getMessage() for w in warnings]
    np.testing.assert_allclose(first.losses, reference.losses[:6], rtol=1e-4, atol=0)
    np.testing.assert_allclose(second.losses, reference.losses[4:], rtol=1e-4, atol=0)

    # One step on the reference's last weights and memories (real ones, after 8 steps): the loss, every gradient
    # and the memories passed on.
    features, mems = next(reference.sources[0].batches), reference.sources[0].mems
    want_loss, want_grads, want_mems = reference.trainer.loss_and_grads(features, mems)
    # Its micro-batches hold different numbers of targets: an unweighted mean of their losses is another loss.
    counts = {float(tf.reduce_sum(A.micro_rows(rows, k, 4, 2)))
              for rows in strategy.experimental_local_results(features["target_mask"]) for k in range(4)}
    assert len(counts) > 1, counts
    for run in (first, second):
        case = (run.trainer.cfg.gradient_accumulation_steps, run.trainer.cfg.recompute)
        for name, value in reference.trainer.model.weights.items():
            run.trainer.model.weights[name].assign(value)
        loss, grads, new_mems = run.trainer.loss_and_grads(features, mems)
        np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-6, atol=0, err_msg=str(case))
        for name, got, want in zip(reference.trainer.model.weights, grads, want_grads):
            assert np.abs(got - want).max() <= 1e-6 * np.linalg.norm(want), (case, name)
        for replica, (got, want) in enumerate(zip(run.trainer.replica_mems(new_mems),
                                                  run.trainer.replica_mems(want_mems))):
            for layer, (a, b) in enumerate(zip(got, want)):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6, err_msg=f"{case} {replica} {layer}")
    return reference, first, second


def test_a_recomputed_layer_draws_the_dropout_masks_of_its_forward_pass(monkeypatch):
    """With dropout, the recomputation must run the layer with the forward pass's masks (the generator has moved
    on by then): its gradients are those of the same layers kept (tf.recompute_grad a no-op)."""
    features = _synthetic_features(bsz=4)
    model = M.XLNet(TINY, C.RunConfig(mem_len=8, reuse_len=8, bi_data=True, dropout=0.3, dropatt=0.3), seed=1)
    mems = [tf.random.stateless_normal([8, 4, TINY.d_model], [0, layer]) for layer in range(TINY.n_layer)]
    start = model.dropout_rng.state.numpy()

    def gradients():
        with tf.GradientTape() as tape:
            loss = model.plm_loss(features, mems, training=True, recompute=True).total_loss
        return loss, tape.gradient(loss, list(model.weights.values()))

    loss, got = gradients()
    model.dropout_rng.state.assign(start)
    monkeypatch.setattr(tf, "recompute_grad", lambda f: f)
    want_loss, want = gradients()
    assert loss.numpy() == want_loss.numpy()
    for name, a, b in zip(model.weights, got, want):
        a, b = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy()
        assert np.abs(a - b).max() <= 1e-6 * np.linalg.norm(b), name


def test_a_k_that_cannot_split_the_rows_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^--gradient_accumulation_steps=0 must be positive$"):
        config("unused", tmp_path, 0)
    cfg = config("unused", tmp_path, 8)  # 16 rows, one replica: 8 forward rows and their 8 backward rows
    T.Trainer(cfg, tf.distribute.OneDeviceStrategy("/cpu:0"))
    with pytest.raises(ConfigError, match=r"^--gradient_accumulation_steps=3 cannot split each replica's 16 rows into "
                                          r"micro-batches: it must divide 8 \(with bi_data each micro-batch needs "
                                          r"forward rows and their backward rows\)$"):
        T.Trainer(dataclasses.replace(cfg, gradient_accumulation_steps=3), tf.distribute.OneDeviceStrategy("/cpu:0"))
