"""The TF2 XLNet: equal to the original on the model goldens; checkpoints; the pieces."""

import dataclasses
import json
import math

import numpy as np
import pytest
import tensorflow as tf
from conftest import MODEL_CASES, SHARED, needs_shared

from xlnet_data.pretrain import checkpoints
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import inputs as ip
from xlnet_data.pretrain import model_ops as ops
from xlnet_data.pretrain import modeling as M

FEATURE_KEYS = ["input_k", "input_q", "seg_id", "perm_mask", "target", "target_mask", "target_mapping", "label"]

TINY = C.XLNetConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=24, ff_activation="gelu", untie_r=True,
                     n_token=100)
TINY_RUN = C.RunConfig(mem_len=12, reuse_len=8, bi_data=True, clamp_len=-1)


@pytest.fixture(autouse=True)
def _no_tensor_float_32():
    """Full float32 matmuls: on recent GPUs TF uses TF32 by default, far from 1e-5."""
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(before)


def _golden_model(case, **run_changes):
    directory = SHARED / "golden_model" / case
    run = dataclasses.replace(C.RunConfig.from_json(str(directory / "run_config.json")), **run_changes)
    model = M.build_model(str(directory / "xlnet_config.json"), run, checkpoint=str(directory / "model.ckpt"))
    return model, np.load(directory / "features.npz"), np.load(directory / "expected.npz")


def _synthetic_features(bsz, seq_len=16, reuse_len=8, num_predict=6, n_token=100, seed=0):
    """A batch as the input pipeline makes it, from random records (no files needed)."""
    rng = np.random.default_rng(seed)
    config = C.InputConfig(seq_len=seq_len, reuse_len=reuse_len, perm_size=reuse_len // 2, bsz_per_host=bsz,
                           num_predict=num_predict)
    parse = ip.make_parser(config, ip.random_permutation(seed, config.perm_size))
    examples = []
    for b in range(bsz):
        tokens = rng.integers(10, n_token, size=seq_len + 1)
        is_masked = np.zeros(seq_len, dtype=int)
        for lo, hi in ((0, reuse_len), (reuse_len, seq_len)):
            is_masked[rng.choice(np.arange(lo, hi), size=num_predict // 2, replace=False)] = 1
        seg = (np.arange(seq_len) >= seq_len * 3 // 4).astype(int)

        def ints(values):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

        record = tf.train.Example(features=tf.train.Features(feature={
            "input": ints(tokens[:-1]), "target": ints(tokens[1:]), "seg_id": ints(seg),
            "is_masked": ints(is_masked), "label": ints([1])})).SerializeToString()
        examples.append(parse(tf.constant(b, tf.int64), tf.constant(record)))
    return {key: tf.stack([example[key] for example in examples]) for key in examples[0]}


# ----- goldens -------------------------------------------------------------------------------------

# What the goldens were computed on is one CPU; matmul summation order differs between CPUs and the
# large weights of m3_sharp amplify it (../shared/README.md, "Tolerances across CPUs"): the stored
# values are met within a tolerance that holds on any CPU, the original run on this machine tightly.
STORED_MEMS_ATOL = {"m1_bi_untied": 1e-5, "m2_uni_tied": 1e-5, "m3_sharp": 5e-5}


def _assert_step_equals(out, want, step, mems_atol, what):
    np.testing.assert_allclose(out.total_loss.numpy(), want[f"total_loss_{step}"], rtol=1e-5, atol=0,
                               err_msg=f"{what} step {step}")
    np.testing.assert_allclose(out.token_loss.numpy(), want[f"token_loss_{step}"], rtol=0, atol=1e-4,
                               err_msg=f"{what} step {step}")
    for layer, mem in enumerate(out.new_mems):
        np.testing.assert_allclose(mem.numpy(), want[f"new_mems_{step}_{layer}"], rtol=0, atol=mems_atol,
                                   err_msg=f"{what} step {step} layer {layer}")


@needs_shared
@pytest.mark.parametrize("case", MODEL_CASES)
def test_two_chained_steps_equal_the_original(case, original_here):
    """Against the original graph run here (tight), and against the stored values (within CPU differences)."""
    model, features, expected = _golden_model(case)
    n_layer = model.config.n_layer
    mems = [features[f"mems_in_0_{layer}"] for layer in range(n_layer)]
    for step in range(2):
        out = model.plm_loss({key: features[f"{key}_{step}"] for key in FEATURE_KEYS}, mems)
        assert len(out.new_mems) == n_layer
        if original_here is not None:
            _assert_step_equals(out, original_here[case], step, 1e-5, "the original on this machine")
        _assert_step_equals(out, expected, step, STORED_MEMS_ATOL[case], "the stored values")
        if step == 0:  # the golden fed its own step-0 memories to step 1; we feed ours
            for layer in range(n_layer):
                np.testing.assert_allclose(features[f"mems_in_1_{layer}"], out.new_mems[layer], rtol=0,
                                           atol=STORED_MEMS_ATOL[case])
        mems = out.new_mems


@needs_shared
def test_m3_sharp_sees_a_swapped_segment_and_a_transposed_perm_mask():
    """What m3_sharp is for: on m1/m2 such mistakes move the loss by less than the tolerance."""
    model, features, expected = _golden_model("m3_sharp")
    batch = {key: features[f"{key}_0"] for key in FEATURE_KEYS}
    mems = [features[f"mems_in_0_{layer}"] for layer in range(model.config.n_layer)]
    seg_id = batch["seg_id"]
    swapped = np.where(seg_id == 0, 1, np.where(seg_id == 1, 0, seg_id)).astype(seg_id.dtype)
    for key, wrong in (("seg_id", swapped), ("perm_mask", batch["perm_mask"].transpose(0, 2, 1))):
        loss = model.plm_loss({**batch, key: wrong}, mems).total_loss.numpy()
        assert abs(loss - expected["total_loss_0"]) > 100 * 1e-5 * expected["total_loss_0"], key


@needs_shared
def test_pipeline_into_model_equals_the_original_end_to_end():
    model, features, expected = _golden_model("m1_bi_untied")
    config = C.InputConfig(seq_len=128, reuse_len=64, perm_size=64, bsz_per_host=8, num_predict=21, bi_data=True,
                           uncased=True)
    dataset = ip.make_dataset(str(SHARED / "golden" / "g1_blog" / "expected" / "tfrecords"), config,
                              permutation=ip.fixed_permutation(features["perm_rows_0"], features["perm_rows_1"]))
    mems = model.initial_mems(config.bsz_per_core)
    for step, batch in enumerate(dataset.take(2)):
        out = model.plm_loss(batch, mems)
        np.testing.assert_allclose(out.total_loss.numpy(), expected[f"total_loss_{step}"], rtol=1e-5)
        mems = out.new_mems


@needs_shared
def test_golden_checkpoint_into_the_wrong_config_names_the_variables():
    directory = SHARED / "golden_model" / "m1_bi_untied"
    config = dataclasses.replace(C.XLNetConfig.from_json(str(directory / "xlnet_config.json")), untie_r=False)
    model = M.XLNet(config, C.RunConfig(), seed=0)
    with pytest.raises(checkpoints.CheckpointMismatchError, match=r"model/transformer/r_w_bias: expected shape \[2, 8\], "
                                                        r"found \[2, 2, 8\]"):
        checkpoints.load(str(directory / "model.ckpt"), model.weights)


# ----- checkpoints ---------------------------------------------------------------------------------

def _write_raw_checkpoint(path, tensors):
    names = list(tensors)
    tf.raw_ops.SaveV2(prefix=str(path), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[name]) for name in names])


def test_checkpoint_with_a_missing_or_misshaped_variable_is_refused_by_name(tmp_path):
    model = M.XLNet(TINY, TINY_RUN, seed=0)
    tensors = {name: var.numpy() for name, var in model.weights.items()}
    del tensors["model/transformer/layer_1/rel_attn/q/kernel"]
    _write_raw_checkpoint(tmp_path / "missing.ckpt", tensors)
    with pytest.raises(checkpoints.CheckpointMismatchError,
                       match=r"model/transformer/layer_1/rel_attn/q/kernel: missing \(expected shape \[16, 2, 8\]\)"):
        checkpoints.load(str(tmp_path / "missing.ckpt"), model.weights)

    tensors = {name: var.numpy() for name, var in model.weights.items()}
    tensors["model/lm_loss/bias"] = np.zeros(99, np.float32)
    tensors["global_step"] = np.int64(5)  # extra variables are fine
    _write_raw_checkpoint(tmp_path / "shape.ckpt", tensors)
    before = model.weights["model/transformer/mask_emb/mask_emb"].numpy()
    with pytest.raises(checkpoints.CheckpointMismatchError, match=r"model/lm_loss/bias: expected shape \[100\], found \[99\]"):
        checkpoints.load(str(tmp_path / "shape.ckpt"), model.weights)
    # Refused as a whole: nothing was assigned.
    np.testing.assert_array_equal(model.weights["model/transformer/mask_emb/mask_emb"].numpy(), before)


def test_save_and_load_in_both_formats(tmp_path):
    features = _synthetic_features(bsz=4)
    model = M.XLNet(TINY, TINY_RUN, seed=1)
    want = model.plm_loss(features, model.initial_mems(4)).total_loss.numpy()

    # Original names: loadable by prefix or by directory, and listed as the original lists them.
    checkpoints.save(str(tmp_path / "orig" / "model.ckpt"), model.weights)
    names = dict(tf.train.list_variables(str(tmp_path / "orig")))
    assert names == {name: list(shape) for name, shape in M.variable_shapes(TINY).items()}
    for source in (tmp_path / "orig", tmp_path / "orig" / "model.ckpt"):
        other = M.build_model(TINY, TINY_RUN, checkpoint=str(source), seed=2)
        assert other.plm_loss(features, other.initial_mems(4)).total_loss.numpy() == want

    # tf.train.Checkpoint: the model is a tf.Module.
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "tf2" / "ckpt"))
    other = M.XLNet(TINY, TINY_RUN, seed=3)
    tf.train.Checkpoint(model=other).read(path).assert_consumed()
    assert other.plm_loss(features, other.initial_mems(4)).total_loss.numpy() == want


def test_configs_from_json(tmp_path):
    TINY.to_json(str(tmp_path / "xlnet_config.json"))
    assert C.XLNetConfig.from_json(str(tmp_path / "xlnet_config.json")) == TINY
    (tmp_path / "bad.json").write_text(json.dumps({"n_layer": 2, "d_model": 4}))
    with pytest.raises(ValueError, match="missing n_head"):
        C.XLNetConfig.from_json(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="ff_activation"):
        dataclasses.replace(TINY, ff_activation="swish")
    (tmp_path / "run.json").write_text(json.dumps({"mem_len": 5, "seq_len": 64, "same_length": True}))
    assert C.RunConfig.from_json(str(tmp_path / "run.json")) == C.RunConfig(mem_len=5, same_length=True)


# ----- the pieces ----------------------------------------------------------------------------------

def test_relative_positional_encoding_is_the_sinusoid_of_the_distances():
    qlen, klen, d_model = 5, 9, 8
    inv_freq = 1 / 10000 ** (np.arange(0, d_model, 2.0) / d_model)

    def sinusoid(pos):
        angles = np.outer(pos, inv_freq)
        return np.concatenate([np.sin(angles), np.cos(angles)], -1)

    forward = np.arange(klen, -qlen, -1.0)
    pos_emb = ops.relative_positional_encoding(qlen, klen, d_model, -1, "bi", True, tf.float32).numpy()
    assert pos_emb.shape == (klen + qlen, 2, d_model)
    np.testing.assert_allclose(pos_emb[:, 0], sinusoid(forward), atol=1e-6)
    np.testing.assert_allclose(pos_emb[:, 1], sinusoid(-forward), atol=1e-6)

    clamped = ops.relative_positional_encoding(qlen, klen, d_model, 3, "uni", False, tf.float32).numpy()
    assert clamped.shape == (klen + 1, 1, d_model)
    np.testing.assert_allclose(clamped[:, 0], sinusoid(np.clip(np.arange(klen, -1, -1.0), -3, 3)), atol=1e-6)


def test_rel_shift_aligns_relative_positions_with_keys():
    qlen, mlen = 4, 3
    klen = qlen + mlen
    x = np.random.default_rng(0).normal(size=(2, 3, qlen, klen + qlen)).astype(np.float32)
    shifted = ops.rel_shift(tf.constant(x), klen).numpy()
    # Query i sits at mlen + i; key j at j; their distance mlen + i - j is column qlen - i + j (pos_seq = klen - r).
    want = np.stack([x[:, :, i, qlen - i: qlen - i + klen] for i in range(qlen)], axis=2)
    np.testing.assert_array_equal(shifted, want)


def test_rel_shift_of_some_rows_is_those_rows_of_the_rel_shift():
    qlen, klen = 5, 8
    x = np.random.default_rng(1).normal(size=(2, 3, qlen, klen + qlen)).astype(np.float32)
    positions = np.array([[4, 0, 2], [1, 1, 3]], dtype=np.int32)
    queries = np.stack([x[b][:, positions[b]] for b in range(2)])  # the scores of the queries at positions
    rows = ops.rel_shift_rows(tf.constant(queries), tf.constant(positions), klen).numpy()
    full = ops.rel_shift(tf.constant(x), klen).numpy()
    np.testing.assert_array_equal(rows, np.stack([full[b][:, positions[b]] for b in range(2)]))


@pytest.mark.parametrize("same_length", [False, True])
def test_causal_mask(same_length):
    qlen, mlen = 4, 2
    mask = ops.causal_mask(qlen, mlen, tf.float32, same_length).numpy()
    want = np.zeros((qlen, mlen + qlen))
    for i in range(qlen):
        want[i, mlen + i + 1:] = 1  # no future
        if same_length:
            want[i, :i] = 1  # the original's quirk: the first qlen columns, from the left
    np.testing.assert_array_equal(mask, want)


def test_gelu_is_the_tanh_approximation_and_its_gradient_that_functions_derivative():
    x = np.linspace(-4, 4, 41)
    tanh = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
    want = 0.5 * x * (1 + tanh)
    slope = 0.5 * (1 + tanh) + 0.5 * x * (1 - tanh ** 2) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)
    upstream = np.linspace(0.5, 2, 41)
    inputs = tf.constant(x, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = ops.gelu(inputs)
    np.testing.assert_allclose(out.numpy(), want, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(out, inputs, output_gradients=tf.constant(upstream, tf.float32)).numpy(),
                               upstream * slope, atol=1e-6)


def test_lm_loss_is_the_cross_entropy_of_the_tied_head_and_its_gradients_those_of_softmax_minus_one_hot():
    rng = np.random.RandomState(0)
    hidden, table = rng.randn(6, 8).astype(np.float32), rng.randn(50, 8).astype(np.float32)
    bias = rng.randn(50).astype(np.float32)
    hidden[5] = table[0] * 20  # row 5's label probability underflows float32: the loss must stay exact
    labels = np.array([3, 7, 0, 49, 12, 1], np.int32)
    weights = rng.rand(6).astype(np.float32)
    x = [tf.constant(hidden), tf.constant(table), tf.constant(bias)]
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = ops.lm_loss(*x, tf.constant(labels))
        weighted = tf.reduce_sum(loss * weights)
    d_hidden, d_table, d_bias = tape.gradient(weighted, x)
    logits = hidden.astype(np.float64) @ table.T.astype(np.float64) + bias
    top = logits.max(axis=1, keepdims=True)
    logsumexp = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    np.testing.assert_allclose(loss.numpy(), logsumexp - logits[np.arange(6), labels], rtol=1e-5, atol=1e-5)
    assert loss.numpy()[5] > 100
    d_logits = np.exp(logits - logsumexp[:, None])
    d_logits[np.arange(6), labels] -= 1
    d_logits *= weights[:, None]
    np.testing.assert_allclose(d_hidden.numpy(), d_logits @ table, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_table.numpy(), d_logits.T @ hidden, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(d_bias.numpy(), d_logits.sum(axis=0), rtol=1e-5, atol=1e-6)


def test_memory_keeps_the_last_mem_len_of_the_reused_positions():
    prev = tf.reshape(tf.range(6.0), [6, 1, 1])
    curr = tf.reshape(tf.range(100.0, 110.0), [10, 1, 1])
    new = ops.cache_mem(curr, prev, mem_len=8, reuse_len=4)[:, 0, 0].numpy()
    np.testing.assert_array_equal(new, [2, 3, 4, 5, 100, 101, 102, 103])
    assert ops.cache_mem(curr, None, mem_len=3, reuse_len=0)[:, 0, 0].numpy().tolist() == [107, 108, 109]
    assert ops.cache_mem(curr, prev, mem_len=0, reuse_len=4) is None


def test_tied_biases_and_no_memory():
    model = M.XLNet(dataclasses.replace(TINY, untie_r=False, ff_activation="relu"),
                    C.RunConfig(mem_len=0, bi_data=False, attn_type="uni", same_length=True, clamp_len=4), seed=0)
    assert model.weights["model/transformer/r_w_bias"].shape == (2, 8)
    out = model.plm_loss(_synthetic_features(bsz=3), mems=None)
    assert out.new_mems is None and out.token_loss.shape == (3, 6)
    assert np.isfinite(out.total_loss.numpy())


def test_training_step_has_gradients_for_every_variable_and_dropout_acts():
    run = dataclasses.replace(TINY_RUN, dropout=0.1, dropatt=0.1)
    model = M.XLNet(TINY, run, seed=0)
    features = _synthetic_features(bsz=4)

    @tf.function
    def step(features, mems):
        with tf.GradientTape() as tape:
            out = model.plm_loss(features, mems, training=True)
        return out, tape.gradient(out.total_loss, model.trainable_variables)

    mems = model.initial_mems(4)
    out, grads = step(features, mems)
    assert len(model.trainable_variables) == len(M.variable_shapes(TINY))
    for var, grad in zip(model.trainable_variables, grads):
        assert grad is not None and np.isfinite(tf.convert_to_tensor(grad).numpy()).all(), var.name
    assert [m.shape for m in out.new_mems] == [(12, 4, 16)] * 2
    # Memories are cut from the graph (the original's stop_gradient).
    with tf.GradientTape() as tape:
        new_mems = model.plm_loss(features, mems).new_mems
    assert all(g is None for g in tape.gradient(tf.reduce_sum(new_mems[1]), model.trainable_variables))
    # Dropout only acts in training.
    evaluation = model.plm_loss(features, mems).total_loss.numpy()
    assert model.plm_loss(features, mems).total_loss.numpy() == evaluation
    assert out.total_loss.numpy() != evaluation
    out2, _ = step(features, out.new_mems)
    assert np.isfinite(out2.total_loss.numpy())


def test_bi_data_needs_an_even_batch():
    model = M.XLNet(TINY, TINY_RUN, seed=0)
    with pytest.raises(ValueError, match="even batch"):
        model.plm_loss(_synthetic_features(bsz=3), model.initial_mems(3))


def test_bfloat16_is_close_to_float32():
    run = dataclasses.replace(TINY_RUN, init_std=0.3)
    model32 = M.XLNet(TINY, run, seed=0)
    model16 = M.XLNet(TINY, dataclasses.replace(run, use_bfloat16=True), seed=1)
    for name, var in model32.weights.items():
        model16.weights[name].assign(var)
    features = _synthetic_features(bsz=4)
    out32 = model32.plm_loss(features, model32.initial_mems(4))
    out16 = model16.plm_loss(features, model16.initial_mems(4))
    assert out16.total_loss.dtype == tf.float32 and out16.new_mems[0].dtype == tf.bfloat16
    assert abs(out16.total_loss.numpy() - out32.total_loss.numpy()) > 0  # it really computed in bfloat16
    np.testing.assert_allclose(out16.total_loss.numpy(), out32.total_loss.numpy(), rtol=2e-2)
    np.testing.assert_allclose(out16.token_loss.numpy(), out32.token_loss.numpy(), rtol=5e-2, atol=5e-2)
