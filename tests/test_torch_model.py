"""The PyTorch XLNet (pretrain_torch/modeling.py) and the TensorFlow-free checkpoint reader (tf_checkpoint.py):
equal to the original on the model goldens, to Transformers' XLNetLMHeadModel in float64, loadable by it; the
same with and without recomputation; no TensorFlow on its import path."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import MODEL_CASES, ROOT, SHARED, needs_shared

from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import hf
from xlnet_data.pretrain_torch import modeling as TM
from xlnet_data.pretrain_torch import tf_checkpoint

transformers = pytest.importorskip("transformers")
from transformers.models.xlnet import modeling_xlnet  # noqa: E402 (after the importorskip)

FEATURE_KEYS = ["input_k", "input_q", "seg_id", "perm_mask", "target", "target_mask", "target_mapping"]
# What the goldens' stored values were computed on is another CPU (../shared/README.md, "Tolerances across
# CPUs"): the stored values are met loosely, the original run on this machine tightly.
STORED_ATOL = {"m1_bi_untied": 1e-5, "m2_uni_tied": 1e-5, "m3_sharp": 5e-5}
ORIGINAL_ATOL = {"m1_bi_untied": 1e-5, "m2_uni_tied": 1e-5, "m3_sharp": 3e-5}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _golden(case):
    directory = SHARED / "golden_model" / case
    config = C.XLNetConfig.from_json(str(directory / "xlnet_config.json"))
    run = C.RunConfig.from_json(str(directory / "run_config.json"))
    return directory, config, run, np.load(directory / "features.npz")


def _batch(features, step, dtype=torch.float32):
    return {key: torch.from_numpy(features[f"{key}_{step}"]).to(dtype if features[f"{key}_{step}"].dtype.kind == "f"
                                                                 else torch.int64) for key in FEATURE_KEYS}


@pytest.fixture(scope="module")
def golden_models():
    """{case: (our module with the golden checkpoint read by tf_checkpoint, run config, features)}."""
    if not SHARED.is_dir():
        pytest.skip("../shared (the model goldens) is absent")
    out = {}
    for case in MODEL_CASES:
        directory, config, run, features = _golden(case)
        model = TM.XLNet(config, run).eval()
        tf_checkpoint.load_original(model, str(directory / "model.ckpt"))
        out[case] = (model, run, features)
    return out


def _two_steps(model, features, dtype=torch.float32):
    mems = [torch.from_numpy(features[f"mems_in_0_{layer}"]).to(dtype) for layer in range(model.config.n_layer)]
    outs = []
    with torch.no_grad():
        for step in range(2):
            out = model(_batch(features, step, dtype), mems)
            outs.append(out)
            mems = out.new_mems  # step 1 is fed step 0's memories, as the goldens were made
    return outs


# ----- the goldens ---------------------------------------------------------------------------------------

@needs_shared
@pytest.mark.parametrize("case", MODEL_CASES)
def test_two_chained_steps_equal_the_original(case, golden_models, original_here):
    model, _, features = golden_models[case]
    expected = np.load(SHARED / "golden_model" / case / "expected.npz")
    wants = [(expected, STORED_ATOL[case], "the stored values")]
    if original_here is not None:
        wants.append((original_here[case], ORIGINAL_ATOL[case], "the original on this machine"))
    for step, out in enumerate(_two_steps(model, features)):
        assert len(out.new_mems) == model.config.n_layer
        for want, atol, what in wants:
            np.testing.assert_allclose(out.loss.item(), want[f"total_loss_{step}"], rtol=1e-5, err_msg=what)
            np.testing.assert_allclose(out.token_loss.numpy(), want[f"token_loss_{step}"], rtol=0, atol=atol,
                                       err_msg=f"{what} step {step}")
            for layer, mem in enumerate(out.new_mems):
                assert mem.shape == want[f"new_mems_{step}_{layer}"].shape
                np.testing.assert_allclose(mem.numpy(), want[f"new_mems_{step}_{layer}"], rtol=0, atol=atol,
                                           err_msg=f"{what} step {step} layer {layer}")


@needs_shared
def test_m3_sharp_sees_a_transposed_perm_mask_and_flipped_segments(golden_models):
    """What m3_sharp is for: either mistake moves its loss far beyond the tolerance."""
    model, _, features = golden_models["m3_sharp"]
    expected = np.load(SHARED / "golden_model" / "m3_sharp" / "expected.npz")["total_loss_0"]
    batch = _batch(features, 0)
    mems = [torch.from_numpy(features[f"mems_in_0_{layer}"]) for layer in range(model.config.n_layer)]
    seg_id = batch["seg_id"]
    flipped = torch.where(seg_id == 0, 1, torch.where(seg_id == 1, 0, seg_id))
    with torch.no_grad():  # the loss of the right features: test_two_chained_steps_equal_the_original
        for key, wrong in (("seg_id", flipped), ("perm_mask", batch["perm_mask"].transpose(1, 2))):
            loss = model({**batch, key: wrong}, mems).loss.item()
            assert abs(loss - expected) > 100 * 1e-5 * expected, key


@needs_shared
@pytest.mark.parametrize("case", MODEL_CASES)
@pytest.mark.slow
def test_tf_free_reader_reads_the_golden_checkpoints_as_tensorflow_does(case):
    tf = pytest.importorskip("tensorflow")
    prefix = str(SHARED / "golden_model" / case / "model.ckpt")
    ours = tf_checkpoint.read(prefix)
    reader = tf.train.load_checkpoint(prefix)
    assert sorted(ours) == sorted(reader.get_variable_to_shape_map())
    for name, value in ours.items():
        want = reader.get_tensor(name)
        assert value.dtype == want.dtype and value.shape == want.shape, name
        np.testing.assert_array_equal(value, want, err_msg=name)


# ----- Transformers' XLNetLMHeadModel --------------------------------------------------------------

@pytest.fixture()
def hf_float64(monkeypatch):
    """Transformers' XLNet runs in float64 once its relative positions are in the model's dtype: its
    positional_embedding gets them and their frequencies as float32 (relative_positional_encoding's .float()), and
    the two-stream attention multiplies them with the float64 r without the cast its one-stream path has
    (r.type(self.r.dtype)). Patched here only: the same sinusoids, computed in float64."""

    def positional_embedding(pos_seq, inv_freq, bsz=None):
        d_model = 2 * inv_freq.shape[0]
        inv_freq = 1 / torch.pow(10000, torch.arange(0, d_model, 2.0, dtype=torch.float64) / d_model)
        sinusoid = pos_seq.double()[:, None] * inv_freq
        pos_emb = torch.cat([torch.sin(sinusoid), torch.cos(sinusoid)], dim=-1)[:, None, :]
        return pos_emb if bsz is None else pos_emb.expand(-1, bsz, -1)

    monkeypatch.setattr(modeling_xlnet.XLNetModel, "positional_embedding", staticmethod(positional_embedding))


def _hf_model(model):
    hf_config = transformers.XLNetConfig(**hf.hf_config(model.config, model.run))
    other = transformers.XLNetLMHeadModel(hf_config).to(next(model.parameters()).dtype).eval()
    assert set(other.state_dict()) == set(model.state_dict())  # the same names, exactly
    other.load_state_dict(model.state_dict())
    return other


def _hf_steps(other, model, features_by_step, mems):
    """Transformers' token losses and memories for consecutive batches (memories carried)."""
    outs = []
    for batch in features_by_step:
        with torch.no_grad():
            result = other(input_ids=batch["input_k"], token_type_ids=batch["seg_id"], perm_mask=batch["perm_mask"],
                           target_mapping=batch["target_mapping"], mems=mems, use_mems=True)
        token_loss = F.cross_entropy(result.logits.flatten(0, 1), batch["target"].flatten(), reduction="none")
        outs.append((token_loss.view(batch["target"].shape), result.mems))
        mems = result.mems
    return outs


def _assert_equals_hf(model, batches, mems, atol=1e-9):
    other = _hf_model(model)
    theirs = _hf_steps(other, model, batches, mems)
    with torch.no_grad():
        for batch, (token_loss, their_mems) in zip(batches, theirs):
            out = model(batch, mems)
            np.testing.assert_allclose(out.token_loss.numpy(), token_loss.numpy(), rtol=0, atol=atol)
            assert len(out.new_mems) == len(their_mems)
            for mine, their in zip(out.new_mems, their_mems):
                assert mine.shape == their.shape
                np.testing.assert_allclose(mine.numpy(), their.numpy(), rtol=0, atol=atol)
            mems = out.new_mems


@needs_shared
@pytest.mark.parametrize("case", MODEL_CASES)
@pytest.mark.slow
def test_goldens_equal_transformers_in_float64(case, golden_models, hf_float64):
    model, _, features = golden_models[case]
    model = TM.XLNet(model.config, model.run).double().eval()
    model.load_state_dict(golden_models[case][0].state_dict())
    mems = [torch.from_numpy(features[f"mems_in_0_{layer}"]).double() for layer in range(model.config.n_layer)]
    _assert_equals_hf(model, [_batch(features, step, torch.float64) for step in range(2)], mems)


def random_features(bsz, seq_len, num_predict, n_token, generator, pad=1):
    """A batch of the pipeline's shapes: a random perm_mask and segments, target_mapping with one-hot rows at
    distinct positions and `pad` zero rows at the end (the original's padding)."""
    perm_mask = (torch.rand(bsz, seq_len, seq_len, generator=generator) < 0.5).double()
    target_mapping = torch.zeros(bsz, num_predict, seq_len, dtype=torch.float64)
    target_mask = torch.zeros(bsz, num_predict, dtype=torch.float64)
    for b in range(bsz):
        where = torch.randperm(seq_len, generator=generator)[:num_predict - pad]
        target_mapping[b, torch.arange(num_predict - pad), where] = 1
        target_mask[b, :num_predict - pad] = 1
    return {"input_k": torch.randint(0, n_token, (bsz, seq_len), generator=generator),
            "input_q": target_mapping.sum(1),
            "seg_id": torch.randint(0, 3, (bsz, seq_len), generator=generator),
            "perm_mask": perm_mask, "target_mapping": target_mapping, "target_mask": target_mask,
            "target": torch.randint(0, n_token, (bsz, num_predict), generator=generator)}


RANDOM_SHAPES = {
    # bi_data, memory longer than what a batch caches, clamping, two layers of untied biases, gelu
    "bi_data_mem_gt_reuse": (C.XLNetConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=24,
                                           ff_activation="gelu", untie_r=True, n_token=50),
                             C.RunConfig(mem_len=12, reuse_len=6, bi_data=True, clamp_len=5)),
    # memory shorter than the cached part, tied biases, relu
    "mem_lt_reuse_tied": (C.XLNetConfig(n_layer=2, d_model=12, n_head=3, d_head=4, d_inner=20,
                                        ff_activation="relu", untie_r=False, n_token=40),
                          C.RunConfig(mem_len=4, reuse_len=7, bi_data=False, clamp_len=-1)),
}
# attn_type uni with same_length: the query stream by the original's scatter. Transformers cannot run it with a
# perm_mask (its in-place `attn_mask += data_mask` does not broadcast over the batch): compared with our TF2 model.
UNI = (C.XLNetConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=24, ff_activation="gelu", untie_r=True,
                     n_token=50),
       C.RunConfig(mem_len=8, reuse_len=5, bi_data=True, clamp_len=3, attn_type="uni", same_length=True))


@pytest.mark.parametrize("name", RANDOM_SHAPES)
def test_random_shapes_equal_transformers_in_float64(name, hf_float64):
    config, run = RANDOM_SHAPES[name]
    generator = torch.Generator().manual_seed(1)
    model = TM.XLNet(config, dataclasses.replace(run, init_std=0.5)).double().eval()  # sharp weights
    TM.init_weights(model, model.run, generator)
    bsz, seq_len = 4, 10
    batches = [random_features(bsz, seq_len, 5, config.n_token, generator) for _ in range(2)]
    mems = [torch.randn(run.mem_len, bsz, config.d_model, generator=generator, dtype=torch.float64)
            for _ in range(config.n_layer)]
    _assert_equals_hf(model, batches, mems)


def test_a_safetensors_save_loads_in_transformers_with_our_logits(tmp_path):
    """Tied attention biases (one parameter in our module) are written once per layer, as Transformers keeps them."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    config, run = RANDOM_SHAPES["mem_lt_reuse_tied"]
    model = TM.XLNet(config, run).eval()
    TM.init_weights(model, run, torch.Generator().manual_seed(2))
    tensors = {name: value.clone() for name, value in model.state_dict().items() if name != "lm_loss.weight"}
    safetensors_torch.save_file(tensors, str(tmp_path / hf.WEIGHTS_FILE), metadata={"format": "pt"})
    (tmp_path / hf.CONFIG_FILE).write_text(json.dumps(hf.hf_config(config, hf.fine_tuning_run(run))))
    other = transformers.XLNetLMHeadModel.from_pretrained(str(tmp_path)).eval()
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, config.n_token, (2, 9), generator=generator)
    seg_id = torch.randint(0, 2, (2, 9), generator=generator)
    with torch.no_grad():
        theirs = other(input_ids=input_ids, token_type_ids=seg_id).logits
        ours = model.logits(model.transformer_output(input_ids, seg_id=seg_id)[0])
    assert theirs.shape == (2, 9, config.n_token)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-5)


# ----- recomputation, dropout, initialisation -------------------------------------------------------------

def test_recomputation_gives_the_same_loss_and_gradients_with_dropout():
    config, run = RANDOM_SHAPES["bi_data_mem_gt_reuse"]
    run = dataclasses.replace(run, dropout=0.1, dropatt=0.1)
    generator = torch.Generator().manual_seed(4)
    batch = {key: value.float() if value.is_floating_point() else value
             for key, value in random_features(4, 10, 5, config.n_token, generator).items()}
    mems = [torch.randn(run.mem_len, 4, config.d_model, generator=generator) for _ in range(config.n_layer)]
    results = []
    for recompute in (False, True):
        model = TM.XLNet(config, run, recompute=recompute).train()
        TM.init_weights(model, run, torch.Generator().manual_seed(5))
        torch.manual_seed(6)  # the same dropout masks
        out = model(batch, mems)
        out.loss.backward()
        results.append((out.loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    (loss, grads), (loss_r, grads_r) = results
    assert abs(loss_r - loss) <= 1e-6 * abs(loss)
    for name, grad in grads.items():
        assert grad.norm() > 0, name
        assert (grads_r[name] - grad).norm() <= 1e-6 * grad.norm(), name
    # Dropout is on: without the same seed the loss moves.
    model = TM.XLNet(config, run).train()
    TM.init_weights(model, run, torch.Generator().manual_seed(5))
    torch.manual_seed(7)
    assert model(batch, mems).loss.item() != loss


def test_init_weights_draws_train_gpus_initialisers():
    config = C.XLNetConfig(n_layer=2, d_model=64, n_head=4, d_head=16, d_inner=128, untie_r=False, n_token=3000)
    run = C.RunConfig(init_std=0.05)
    model = TM.XLNet(config, run)
    TM.init_weights(model, run, torch.Generator().manual_seed(0))
    state = model.state_dict()
    assert abs(state["transformer.word_embedding.weight"].std().item() - 0.05) < 0.002
    assert torch.equal(state["transformer.layer.0.ff.layer_norm.weight"], torch.ones(64))
    assert torch.equal(state["lm_loss.bias"], torch.zeros(3000))
    assert state["transformer.mask_emb"].abs().max() <= (6 / 65) ** 0.5
    assert torch.equal(state["transformer.layer.0.rel_attn.r_w_bias"], state["transformer.layer.1.rel_attn.r_w_bias"])
    assert model.lm_loss.weight is model.transformer.word_embedding.weight
    uniform = dataclasses.replace(run, init="uniform", init_range=0.3)
    TM.init_weights(model, uniform, torch.Generator().manual_seed(0))
    q = model.transformer.layer[1].rel_attn.q
    assert q.abs().max() <= 0.3 and q.abs().max() > 0.29


# ----- TensorFlow checkpoints without TensorFlow ------------------------------------------------------

@pytest.fixture(scope="module")
def train_gpu_checkpoint(tmp_path_factory):
    """A checkpoint that train_gpu's writer (pretrain/checkpoints.save) wrote, of a tiny TF2 XLNet, with an
    optimizer slot, global_step and a string tensor beside the weights; and the TF2 model."""
    tf = pytest.importorskip("tensorflow")
    from xlnet_data.pretrain import checkpoints
    from xlnet_data.pretrain import modeling as M
    config, run = RANDOM_SHAPES["bi_data_mem_gt_reuse"]
    model = M.XLNet(config, dataclasses.replace(run, init_std=0.3), seed=0)
    directory = tmp_path_factory.mktemp("train_gpu")
    tensors = {**model.weights, "global_step": tf.constant(7, tf.int64),
               "model/lm_loss/bias/adam_m": tf.ones([config.n_token], tf.float32),
               # train_gpu's string state (train_state/source_0/made_from...): a 2-byte varint length among them
               "train_state/source_0/made_from": tf.constant([b"records/a.tfrecords", b"", b"x" * 300])}
    checkpoints.save(str(directory / "model.ckpt-7"), tensors)
    return tf, model, directory


def test_tf_free_reader_reads_train_gpus_checkpoint_as_tensorflow_does(train_gpu_checkpoint):
    tf, _, directory = train_gpu_checkpoint
    ours = tf_checkpoint.read(str(directory))  # the model_dir: its `checkpoint` file names model.ckpt-7
    reader = tf.train.load_checkpoint(str(directory / "model.ckpt-7"))
    assert sorted(ours) == sorted(reader.get_variable_to_shape_map())
    for name, value in ours.items():
        want = reader.get_tensor(name)
        assert value.dtype == want.dtype, name
        np.testing.assert_array_equal(value, want, err_msg=name)
    assert ours["global_step"] == 7


def _assert_equals_tf2(model, tf_model, tf, seed):
    """Two batches (memories carried) through our module and the TF2 model (pretrain/modeling.py) in float32."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    batches = [{key: value.float() if value.is_floating_point() else value
                for key, value in random_features(4, 10, 5, config.n_token, generator).items()} for _ in range(2)]
    mems, tf_mems = model.initial_mems(4), tf_model.initial_mems(4)
    with torch.no_grad():
        for batch in batches:
            out = model(batch, mems)
            tf_batch = {key: value.numpy() if value.is_floating_point() else value.numpy().astype(np.int32)
                        for key, value in batch.items()}  # the pipeline's int32
            want = tf_model.plm_loss(tf_batch, tf_mems)
            np.testing.assert_allclose(out.token_loss.numpy(), want.token_loss.numpy(), rtol=0, atol=2e-5)
            for mine, theirs in zip(out.new_mems, want.new_mems):
                np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=0, atol=2e-5)
            mems, tf_mems = out.new_mems, want.new_mems


def test_train_gpus_checkpoint_in_our_module_gives_the_tf2_models_loss(train_gpu_checkpoint):
    tf, tf_model, directory = train_gpu_checkpoint
    model = TM.XLNet(tf_model.config, tf_model.run).eval()
    assert tf_checkpoint.load_original(model, str(directory)) == str(directory / "model.ckpt-7")
    _assert_equals_tf2(model, tf_model, tf, seed=8)


def test_uni_attention_equals_the_tf2_model(train_gpu_checkpoint):
    tf = train_gpu_checkpoint[0]
    from xlnet_data.pretrain import modeling as M
    config, run = UNI
    tf_model = M.XLNet(config, dataclasses.replace(run, init_std=0.3), seed=1)
    model = TM.XLNet(config, run).eval()
    weights = {name: var.numpy() for name, var in tf_model.weights.items()}
    model.load_state_dict(tf_checkpoint.original_state_dict(weights, model, "the TF2 model"))
    _assert_equals_tf2(model, tf_model, tf, seed=9)


def test_a_damaged_or_misfitting_checkpoint_is_one_line_naming_it(train_gpu_checkpoint, tmp_path):
    _, tf_model, directory = train_gpu_checkpoint
    for name in ("model.ckpt-7.index", "model.ckpt-7.data-00000-of-00001"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    prefix = str(tmp_path / "model.ckpt-7")
    data = tmp_path / "model.ckpt-7.data-00000-of-00001"
    good = data.read_bytes()
    data.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    with pytest.raises(tf_checkpoint.TFCheckpointError, match=r"fails its CRC32C in .*model\.ckpt-7"):
        tf_checkpoint.read(prefix)
    data.write_bytes(good[:len(good) // 2])
    with pytest.raises(tf_checkpoint.TFCheckpointError, match="runs past the end of .*cut short"):
        tf_checkpoint.read(prefix)
    with pytest.raises(tf_checkpoint.TFCheckpointError, match="cannot read checkpoint .*nowhere.*No such file"):
        tf_checkpoint.read(str(tmp_path / "nowhere"))
    data.write_bytes(good)
    tied = TM.XLNet(dataclasses.replace(tf_model.config, untie_r=False), tf_model.run)
    with pytest.raises(tf_checkpoint.TFCheckpointError,
                       match=r"model/transformer/r_w_bias: expected shape \[2, 8\], found \[2, 2, 8\]"):
        tf_checkpoint.load_original(tied, prefix)


def test_importing_the_model_and_the_reader_imports_no_tensorflow():
    code = ("import sys, xlnet_data.pretrain_torch.modeling, xlnet_data.pretrain_torch.tf_checkpoint; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@needs_shared
def test_bfloat16_autocast_keeps_the_loss_and_memories_in_float32(golden_models):
    """Under autocast the matmuls run in bfloat16, the softmax, the layer norms and the loss in float32: m1's loss
    within bfloat16's rounding of float32's, and float32 memories."""
    model, _, features = golden_models["m1_bi_untied"]
    want = _two_steps(model, features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _two_steps(model, features)
    for out, ref in zip(got, want):
        assert out.token_loss.dtype == torch.float32 and out.new_mems[0].dtype == torch.float32
        np.testing.assert_allclose(out.token_loss.numpy(), ref.token_loss.numpy(), rtol=0, atol=0.05)
        assert 0 < abs(out.loss.item() - ref.loss.item()) < 0.01  # bfloat16 did run
