"""Hugging Face Transformers export and import (export_hf, pretrain/hf.py, train_gpu --init_checkpoint=DIR).

Transformers' XLNetLMHeadModel loaded from an export gives our log-probabilities (goldens and a model trained
here), export -> import -> export is identical, XLNetTokenizer from an export encodes as create does, and
train_gpu continues from an export where the model left off. The comparisons with Transformers need the
`hf` extra (transformers, torch) and are skipped without it; the rest needs only safetensors.
"""

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    SAMPLE_CORPUS,
    SHARED,
    XLNET_SPM,
    needs_shared,
    run_module,
    run_module_forked,
    run_modules_forked,
)
from test_modeling import _no_tensor_float_32  # noqa: F401  (autouse: full float32 matmuls on GPUs too)

from xlnet_data.dataformat import hf_tokenizer
from xlnet_data.datagen.text import Encoder, preprocess_texts
from xlnet_data.pretrain import checkpoints, hf
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import inputs as ip
from xlnet_data.pretrain import modeling as M

_missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
needs_transformers = pytest.mark.skipif(
    bool(_missing), reason=f"{' and '.join(_missing)} not installed (the hf extra: pip install -e '.[hf]')")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("safetensors") is None,
                                reason="safetensors not installed (the hf extra: pip install -e '.[hf]')")

MODEL_CASES = ["m1_bi_untied", "m2_uni_tied", "m3_sharp"]
TINY_SHAPE = ["--n_layer=2", "--d_model=32", "--n_head=2", "--d_head=16", "--d_inner=64", "--ff_activation=gelu",
              "--untie_r", "--mem_len=32"]
RECORD_FLAGS = ["--bsz_per_host=8", "--num_core_per_host=1", "--seq_len=64", "--reuse_len=32", "--bi_data",
                "--num_predict=10", "--uncased", "--num_workers=1"]
TRAIN_STEPS = 80
LOSS_LINE = re.compile(r"step (\d+) \| loss ([\d.]+)")


def _ok(result):
    assert result.returncode == 0, result.stderr
    return result


def _losses(stderr):
    return [(int(step), float(loss)) for step, loss in LOSS_LINE.findall(stderr)]


# ----- a model trained here, and its export ---------------------------------------------------------

@pytest.fixture(scope="module")
def records(sample_spm, tmp_path_factory):
    """Records of the first 600 lines of one book (187 steps of 8 rows of 64 tokens), uncased."""
    text_dir = tmp_path_factory.mktemp("hf_text")
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:600]
    (text_dir / "emma.txt").write_text("\n".join(lines) + "\n")
    save_dir = tmp_path_factory.mktemp("hf_records") / "emma"
    _ok(run_module("xlnet_data.create", f"--input_glob={text_dir / 'emma.txt'}", f"--sp_path={sample_spm}",
                   f"--save_dir={save_dir}", *RECORD_FLAGS))
    return save_dir


@pytest.fixture(scope="module")
def trained(records, sample_spm, tmp_path_factory):
    """(model_dir trained TRAIN_STEPS steps by train_gpu, its export by export_hf, the logged losses)."""
    base = tmp_path_factory.mktemp("hf_trained")
    model_dir, export_dir = base / "model", base / "export"
    # Two processes' runs, one after the other, one TensorFlow import (conftest.run_modules_forked).
    result, export = map(_ok, run_modules_forked([
        ("xlnet_data.train_gpu", [f"--record_info_dir={records}", f"--model_dir={model_dir}", *TINY_SHAPE,
                                  "--learning_rate=1e-3", "--warmup_steps=10", f"--train_steps={TRAIN_STEPS}",
                                  "--iterations=10"]),
        # No --sp_path: the records' (run_config.json names them)
        ("xlnet_data.export_hf", [f"--model_dir={model_dir}", f"--output_dir={export_dir}"])]))
    (base / "export.log").write_text(export.stderr)
    return model_dir, export_dir, _losses(result.stderr)


def _batches(records, data, count, seed=0):
    """The first `count` batches train_gpu reads from the records (one replica), as numpy."""
    dataset = ip.make_dataset(os.path.join(records, "tfrecords"), data, seed=seed)
    return [{key: value.numpy() for key, value in batch.items()} for batch in dataset.take(count)]


def _ours(model, batches, mems):
    """Our token losses and memories of consecutive batches, each batch fed the previous one's memories."""
    losses, all_mems = [], []
    for features in batches:
        out = model.plm_loss(features, mems)
        mems = out.new_mems
        losses.append(out.token_loss.numpy())
        all_mems.append([mem.numpy() for mem in mems or []])
    return losses, all_mems


def _transformers(export_dir, batches, mems):
    """Transformers' XLNetLMHeadModel on the same batches: -log p(target) per prediction, and its memories."""
    import torch
    from transformers import XLNetLMHeadModel

    # As pretrained: the run's settings (config.json has fine-tuning's); the goldens' exports have none
    pretraining = hf.read_pretraining(str(export_dir)) or {}
    pretraining |= {"mem_len": pretraining.get("mem_len") or None, "reuse_len": pretraining.get("reuse_len") or None}
    model = XLNetLMHeadModel.from_pretrained(str(export_dir), **pretraining).eval()
    mems = None if mems is None else [torch.from_numpy(np.asarray(mem)) for mem in mems]
    losses, all_mems = [], []
    for features in batches:
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(features["input_k"]).long(),
                        token_type_ids=torch.from_numpy(features["seg_id"]).long(),
                        perm_mask=torch.from_numpy(features["perm_mask"]).float(),
                        target_mapping=torch.from_numpy(features["target_mapping"]).float(),
                        mems=mems, use_mems=True)
        log_probs = torch.log_softmax(out.logits, dim=-1)
        target = torch.from_numpy(features["target"]).long()
        losses.append(-log_probs.gather(-1, target[..., None])[..., 0].numpy())
        mems = out.mems if model.config.mem_len else None  # without mem_len, Transformers returns all states
        all_mems.append([mem.numpy() for mem in mems or []])
    return losses, all_mems


def _assert_same(ours, theirs, atol):
    for step, ((loss_a, mems_a), (loss_b, mems_b)) in enumerate(zip(zip(*ours), zip(*theirs))):
        np.testing.assert_allclose(loss_b, loss_a, rtol=0, atol=atol, err_msg=f"log-probs, batch {step}")
        for layer, (a, b) in enumerate(zip(mems_a, mems_b)):
            np.testing.assert_allclose(b, a, rtol=0, atol=atol, err_msg=f"memory of batch {step}, layer {layer}")


@needs_transformers
def test_trained_model_export_gives_our_log_probs(trained, records):
    model_dir, export_dir, _ = trained
    run = C.RunConfig.from_json(str(model_dir / "run_config.json"))
    model = M.build_model(str(model_dir / "xlnet_config.json"), run, checkpoint=str(model_dir))
    data = C.InputConfig(seq_len=64, reuse_len=32, perm_size=32, bsz_per_host=8, num_predict=10, uncased=True)
    batches = _batches(records, data, 3)
    mems = [mem.numpy() for mem in model.initial_mems(8)]
    ours = _ours(model, batches, mems)
    # The model is not uniform: a wrong memory or position would move these by far more than the tolerance.
    assert np.ptp(ours[0][0]) > 1.0
    _assert_same(ours, _transformers(export_dir, batches, mems), atol=1e-4)


ORIGINAL_CONFIG = C.XLNetConfig(n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=12, ff_activation="gelu",
                                untie_r=True, n_token=1000)


@pytest.fixture(scope="module")
def tf1_exports(sample_spm, tmp_path_factory):
    """export_hf's runs on TF1-style checkpoints with the original's names, one after the other in one process's
    forked children (one TensorFlow import): the model goldens' (where ../shared is) and `original`, a model of
    ORIGINAL_CONFIG saved here with --keep_accents. (the export's folder, the finished process, the saved model) by
    name."""
    out = tmp_path_factory.mktemp("tf1_exports")
    model = M.build_model(ORIGINAL_CONFIG, C.RunConfig(), seed=3)
    checkpoints.save(str(out / "ckpt" / "model.ckpt"), model.weights)
    ORIGINAL_CONFIG.to_json(str(out / "ckpt" / "xlnet_config.json"))
    runs = {"original": [f"--checkpoint={out / 'ckpt' / 'model.ckpt'}", f"--sp_path={sample_spm}",
                         f"--output_dir={out / 'original'}", "--keep_accents"]}
    if SHARED.is_dir():
        runs |= {case: [f"--checkpoint={SHARED / 'golden_model' / case / 'model.ckpt'}", f"--sp_path={XLNET_SPM}",
                        f"--output_dir={out / case}"] for case in MODEL_CASES}
    results = run_module_forked("xlnet_data.export_hf", list(runs.values()))
    return {name: (out / name, result, model) for name, result in zip(runs, results)}


@needs_shared
@needs_transformers
@pytest.mark.parametrize("case", MODEL_CASES)
@pytest.mark.slow
def test_golden_export_gives_the_originals_log_probs(case, tf1_exports):
    directory = SHARED / "golden_model" / case
    export_dir, result, _ = tf1_exports[case]
    _ok(result)
    features, expected = np.load(directory / "features.npz"), np.load(directory / "expected.npz")
    n_layer = C.XLNetConfig.from_json(str(directory / "xlnet_config.json")).n_layer
    keys = ["input_k", "seg_id", "perm_mask", "target_mapping", "target"]
    batches = [{key: features[f"{key}_{step}"] for key in keys} for step in range(2)]
    theirs = _transformers(export_dir, batches, [features[f"mems_in_0_{layer}"] for layer in range(n_layer)])
    golden = ([expected[f"token_loss_{step}"] for step in range(2)],
              [[expected[f"new_mems_{step}_{layer}"] for layer in range(n_layer)] for step in range(2)])
    _assert_same(golden, theirs, atol=1e-4)


# ----- export -> import -> export ------------------------------------------------------------------------

@pytest.mark.slow
def test_export_import_export_is_identical(trained, records, sample_spm, tmp_path):
    """Through train_gpu: import the export, one step at learning rate 0, export again: the same tensors."""
    _, export_dir, _ = trained
    model_dir, again = tmp_path / "imported", tmp_path / "again"
    for result in run_modules_forked([
            ("xlnet_data.train_gpu", [f"--record_info_dir={records}", f"--model_dir={model_dir}",
                                      f"--init_checkpoint={export_dir}", "--mem_len=32", "--learning_rate=0",
                                      "--train_steps=1", "--iterations=1"]),
            ("xlnet_data.export_hf", [f"--model_dir={model_dir}", f"--sp_path={sample_spm}", f"--output_dir={again}"])]):
        _ok(result)
    first, second = hf.read_tensors(str(export_dir)), hf.read_tensors(str(again))
    assert sorted(first) == sorted(second)
    for name in first:
        assert first[name].dtype == second[name].dtype == np.float32, name
        np.testing.assert_array_equal(second[name], first[name], err_msg=name)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "spiece.model"):
        assert (again / name).read_bytes() == (export_dir / name).read_bytes(), name


def test_tied_biases_copy_to_every_layer_and_back():
    config = C.XLNetConfig(n_layer=3, d_model=8, n_head=2, d_head=4, d_inner=12, ff_activation="relu", untie_r=False,
                           n_token=20)
    rng = np.random.default_rng(0)
    weights = {name: rng.normal(size=shape).astype(np.float32) for name, shape in M.variable_shapes(config).items()}
    tensors = hf.to_hf(weights, config)
    for layer in range(3):
        np.testing.assert_array_equal(tensors[f"transformer.layer.{layer}.rel_attn.r_w_bias"],
                                      weights["model/transformer/r_w_bias"])
        np.testing.assert_array_equal(tensors[f"transformer.layer.{layer}.rel_attn.seg_embed"],
                                      weights["model/transformer/seg_embed"][layer])
    np.testing.assert_array_equal(tensors["transformer.layer.1.ff.layer_1.weight"],
                                  weights["model/transformer/layer_1/ff/layer_1/kernel"].T)
    back = hf.from_hf(tensors, config, "here")
    assert set(back) == set(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    # Into an untied model, the copies become per-layer biases.
    untied = hf.from_hf(tensors, dataclasses.replace(config, untie_r=True), "here")
    assert untied["model/transformer/r_r_bias"].shape == (3, 2, 4)
    # Biases that differ between layers do not fit a tied model.
    tensors["transformer.layer.2.rel_attn.r_s_bias"] = tensors["transformer.layer.2.rel_attn.r_s_bias"] + 1
    with pytest.raises(hf.HFFormatError, match=r"^here: transformer\.layer\.2\.rel_attn\.r_s_bias differs from "
                                               r"transformer\.layer\.0\.rel_attn\.r_s_bias.*--untie_r$"):
        hf.from_hf(tensors, config, "here")


def test_a_misshapen_or_missing_tensor_is_named(trained):
    _, export_dir, _ = trained
    config, _ = hf.read_config(str(export_dir))
    tensors = hf.read_tensors(str(export_dir))
    bad = dict(tensors, **{"transformer.layer.1.ff.layer_2.weight": np.zeros((32, 65), np.float32)})
    with pytest.raises(hf.HFFormatError, match=r"^x: transformer\.layer\.1\.ff\.layer_2\.weight has shape \[32, 65\], "
                                               r"the model needs \[32, 64\]"):
        hf.from_hf(bad, config, "x")
    del tensors["transformer.mask_emb"]
    with pytest.raises(hf.HFFormatError, match=r"^x: no transformer\.mask_emb \(shape \[1, 1, 32\]\)"):
        hf.from_hf(tensors, config, "x")


def test_a_bare_xlnet_model_save_imports_with_a_zero_lm_bias(trained, tmp_path):
    """Transformers' XLNetModel saves its tensors without "transformer." and has no LM head."""
    _, export_dir, _ = trained
    from safetensors import numpy as st_numpy
    tensors = hf.read_tensors(str(export_dir))
    bare = {name.removeprefix("transformer."): value for name, value in tensors.items() if name != "lm_loss.bias"}
    st_numpy.save_file(bare, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(export_dir / "config.json", tmp_path / "config.json")
    config, _ = hf.read_config(str(tmp_path))
    weights = hf.load_weights(str(tmp_path), config)
    np.testing.assert_array_equal(weights["model/lm_loss/bias"], np.zeros(1000, np.float32))
    np.testing.assert_array_equal(weights["model/transformer/layer_1/rel_attn/k/kernel"],
                                  tensors["transformer.layer.1.rel_attn.k"])


def test_sharded_and_bfloat16_weights_are_read(trained, tmp_path):
    """Shards listed in model.safetensors.index.json; a bfloat16 tensor becomes float32."""
    _, export_dir, _ = trained
    from safetensors import numpy as st_numpy
    tensors = hf.read_tensors(str(export_dir))
    names = sorted(name for name in tensors if name != "transformer.mask_emb")
    shards = {"model-00001-of-00003.safetensors": names[:10], "model-00002-of-00003.safetensors": names[10:]}
    for shard, shard_names in shards.items():
        st_numpy.save_file({name: tensors[name] for name in shard_names}, str(tmp_path / shard))
    # mask_emb in bfloat16, written by hand in safetensors' layout (8-byte header size, JSON header, data):
    # small integers, which bfloat16 holds exactly (a float32's upper 16 bits).
    values = np.arange(32, dtype=np.float32) - 16
    header = json.dumps({"transformer.mask_emb": {"dtype": "BF16", "shape": [1, 1, 32], "data_offsets": [0, 64]}})
    (tmp_path / "model-00003-of-00003.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header.encode() + (values.view(np.uint32) >> 16).astype("<u2").tobytes())
    weight_map = {name: shard for shard, shard_names in shards.items() for name in shard_names}
    weight_map["transformer.mask_emb"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(export_dir / "config.json", tmp_path / "config.json")
    assert hf.is_hf_dir(str(tmp_path))
    config, _ = hf.read_config(str(tmp_path))
    weights = hf.load_weights(str(tmp_path), config)
    assert weights["model/transformer/mask_emb/mask_emb"].dtype == np.float32
    np.testing.assert_array_equal(weights["model/transformer/mask_emb/mask_emb"], values.reshape(1, 1, 32))
    np.testing.assert_array_equal(weights["model/transformer/layer_0/ff/layer_2/kernel"],
                                  tensors["transformer.layer.0.ff.layer_2.weight"].T)


# ----- importing into train_gpu ------------------------------------------------------------------------

@pytest.mark.slow
def test_import_continues_training_where_it_left_off(trained, records, tmp_path):
    """From the export, train_gpu takes the run's mem_len from its xlnet_pretraining.json (config.json has none) and
    logs the losses it logs from the checkpoint itself."""
    model_dir, export_dir, trained_losses = trained
    common = [f"--record_info_dir={records}", "--learning_rate=1e-4", "--train_steps=6", "--iterations=1"]
    # Two processes' runs, one TensorFlow import (conftest.run_module_forked)
    result, from_checkpoint = map(_ok, run_module_forked("xlnet_data.train_gpu", [
        [*common, f"--model_dir={tmp_path / 'imported'}", f"--init_checkpoint={export_dir}"],
        [*common, f"--model_dir={tmp_path / 'continued'}", f"--init_checkpoint={checkpoints.latest(str(model_dir))}",
         *TINY_SHAPE]]))
    assert "model initialised from the Transformers directory" in result.stderr
    assert f"from {export_dir}/xlnet_pretraining.json: mem_len=32, clamp_len=-1, same_length=False" in result.stderr
    losses = [loss for _, loss in _losses(result.stderr)]
    assert len(losses) == 6, result.stderr
    assert losses == [loss for _, loss in _losses(from_checkpoint.stderr)]
    # The first step's loss (before its update) is the trained model's on the first batch, zero memories.
    run = C.RunConfig.from_json(str(model_dir / "run_config.json"))
    model = M.build_model(str(model_dir / "xlnet_config.json"), run, checkpoint=str(model_dir))
    data = C.InputConfig(seq_len=64, reuse_len=32, perm_size=32, bsz_per_host=8, num_predict=10, uncased=True)
    first = model.plm_loss(_batches(records, data, 1)[0], model.initial_mems(8)).total_loss.numpy()
    assert losses[0] == pytest.approx(first, abs=1.5e-4)  # the log prints 4 decimals
    # And the level is where training left it (about 5.8 here), far below where it began (about 6.9).
    began, ended = trained_losses[0][1], trained_losses[-1][1]
    assert began - ended > 0.7, trained_losses
    assert abs(np.mean(losses) - ended) < 0.25 * (began - ended), (losses, trained_losses)
    # The shape came from the export's config.json.
    assert C.XLNetConfig.from_json(str(tmp_path / "imported" / "xlnet_config.json")) == \
        hf.read_config(str(export_dir))[0]


@needs_transformers
def test_export_is_ready_for_fine_tuning(trained, records, sample_spm):
    """config.json has fine-tuning's settings (the run's are in xlnet_pretraining.json): a classifier and the LM head
    give logits for one text; README.md is a model card that names the data, the tokenizer class and its measured
    agreement with create."""
    import torch
    from transformers import AutoTokenizer, XLNetForSequenceClassification, XLNetLMHeadModel

    _, export_dir, _ = trained
    config = json.loads((export_dir / "config.json").read_text())
    assert (config["bi_data"], config["mem_len"], config["reuse_len"], config["dropout"]) == (False, None, None, 0.1)
    assert config["use_mems_eval"] is False  # no memories returned (they would be the whole text's)
    assert json.loads((export_dir / "xlnet_pretraining.json").read_text()) == {
        "mem_len": 32, "reuse_len": 32, "bi_data": True, "clamp_len": -1, "same_length": False, "attn_type": "bi"}
    tokenizer = AutoTokenizer.from_pretrained(str(export_dir))
    batch = tokenizer(["She was very happy with the ball."], return_tensors="pt")
    length = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    with torch.no_grad():
        classifier = XLNetForSequenceClassification.from_pretrained(str(export_dir), num_labels=2).eval()
        assert classifier(**batch).logits.shape == (1, 2)
        logits = XLNetLMHeadModel.from_pretrained(str(export_dir)).eval()(**batch).logits
    assert logits.shape == (1, length, 1000) and torch.isfinite(logits).all()
    card = (export_dir / "README.md").read_text()
    log = (export_dir.parent / "export.log").read_text()
    agreement = re.search(r"the tokenizer gives create's ids on (\d+) of (\d+) lines", log)
    assert agreement and agreement[1] == agreement[2] and int(agreement[2]) > 500, log  # 600 lines, blank ones out
    assert agreement[0] in card and "`emma` (its `corpus_info.json`)" in card and "mem_len=32" in card
    # No path of this machine (pushed to the Hub, the card would publish them): file names only.
    assert "/" not in "".join(re.findall(r"`[^`]*`", card.split("## Use")[0])), card
    assert "from `emma.txt`" in card and f"with `{os.path.basename(sample_spm)}`" in card and "`model.ckpt-80`" in card
    # The corpus's tokens: each task's pass 0 of the train split (corpus_info.json's input_counts name only the
    # files with <unk> or marks lost).
    tokens = sum(json.loads(path.read_text())["create_counts"]["tokens"]
                 for path in (records / "tfrecords").glob("record_info-train-*-0.*.json"))
    assert tokens > 10000 and "made by xlnet-data create from `" in card and f" ({tokens:,} tokens) with " in card


def test_import_refuses_another_vocabulary_or_shape_in_one_line(trained, records, tmp_path):
    _, export_dir, _ = trained
    bigger = tmp_path / "bigger"
    shutil.copytree(export_dir, bigger)
    config = json.loads((bigger / "config.json").read_text())
    (bigger / "config.json").write_text(json.dumps({**config, "vocab_size": 1200}))
    os.remove(bigger / "spiece.model")  # no file to compare: the vocabulary size still tells

    other_spm = tmp_path / "other"
    shutil.copytree(export_dir, other_spm)
    pieces = bytearray((export_dir / "spiece.model").read_bytes())
    at = pieces.index(b"\x0a\x06" + "▁the".encode() + b"\x15")  # the piece's protobuf entry: renamed, same size
    pieces[at + 5:at + 8] = b"THE"
    (other_spm / "spiece.model").write_bytes(bytes(pieces))

    # A tokenizer that keeps accents, records made without --keep_accents: the model learnt other pieces.
    kept = tmp_path / "kept"
    shutil.copytree(export_dir, kept)
    (kept / "tokenizer.json").write_bytes(
        hf_tokenizer.tokenizer_files(str(export_dir / "spiece.model"), True, True)["tokenizer.json"])

    misshapen = tmp_path / "misshapen"
    shutil.copytree(export_dir, misshapen)
    from safetensors import numpy as st_numpy
    tensors = hf.read_tensors(str(misshapen))
    tensors["transformer.layer.0.rel_attn.q"] = np.zeros((32, 2, 8), np.float32)
    st_numpy.save_file(tensors, str(misshapen / "model.safetensors"), metadata={"format": "pt"})

    common = [f"--record_info_dir={records}", f"--model_dir={tmp_path / 'model'}", "--mem_len=32"]
    results = run_module_forked("xlnet_data.train_gpu", [
        [*common, f"--init_checkpoint={bigger}"], [*common, f"--init_checkpoint={other_spm}"],
        [*common, f"--init_checkpoint={kept}"], [*common, f"--init_checkpoint={export_dir}", "--n_head=4"],
        [*common, f"--init_checkpoint={misshapen}"]])
    assert [result.returncode for result in results] == [2] * 5, [result.stderr for result in results]
    last = [result.stderr.strip().splitlines()[-1] for result in results]
    assert last[0] == (
        f"train: error: the records' vocab_size ({records}/corpus_info.json)=1000 contradicts "
        f"--init_checkpoint={bigger} (config.json): n_token=1200")
    assert re.fullmatch(
        re.escape(f"train: error: --init_checkpoint={other_spm} has another vocabulary than the records (sp_path in "
                  f"{records}/corpus_info.json): piece ") + r"\d+" + re.escape(f" is '▁THE' in {other_spm}/spiece.model, "
                                                                               "'▁the' in ") + r".*\.model",
        last[1])
    assert last[2] == (
        f"train: error: --init_checkpoint={kept}: its tokenizer keeps accents (keep_accents=true), the records were "
        f"made with keep_accents=false ({records}/corpus_info.json): the model learnt other pieces than these records "
        "hold; use records made with create --keep_accents, or another model")
    assert last[3] == (
        f"train: error: --n_head=4 contradicts --init_checkpoint={export_dir} (config.json): n_head=2")
    assert last[4] == (
        f"train: error: {misshapen}/model.safetensors: transformer.layer.0.rel_attn.q has shape [32, 2, 8], the model "
        "needs [32, 2, 16] (n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, n_token=1000)")


# ----- export_hf's own checks -------------------------------------------------------------------------

@pytest.mark.slow
def test_export_refuses_in_one_line(trained, records, sample_spm, tmp_path):
    model_dir, export_dir, _ = trained
    cases = [
        ([f"--model_dir={tmp_path}", f"--sp_path={export_dir / 'spiece.model'}", f"--output_dir={tmp_path / 'b'}"],
         rf"export_hf: error: --model_dir={tmp_path} holds no checkpoint .*"),
        ([f"--model_dir={model_dir}", f"--sp_path={export_dir / 'spiece.model'}", f"--output_dir={export_dir}"],
         rf"export_hf: error: --output_dir={export_dir} already holds an export; use --overwrite or a new dir"),
        ([f"--checkpoint={model_dir}", f"--sp_path={export_dir / 'spiece.model'}", f"--output_dir={tmp_path / 'c'}",
          "--xlnet_config=" + str(tmp_path / "nope.json")],
         rf"export_hf: error: --xlnet_config={tmp_path}/nope.json: no such file"),
        # The records were made without --keep_accents (train_gpu wrote so in run_config.json).
        ([f"--model_dir={model_dir}", f"--sp_path={export_dir / 'spiece.model'}", f"--output_dir={tmp_path / 'd'}",
          "--keep_accents"],
         re.escape(f"export_hf: error: --keep_accents contradicts the records the model was trained on: "
                   f"keep_accents=false in {model_dir}/run_config.json; drop the flag (the tokenizer must normalise "
                   "text as create did)")),
    ]
    # run_config.json records the records' model (issue 27): another one is refused before its size is read, and
    # the records' is named (issue 36)
    other = tmp_path / "other.model"
    other.write_bytes(Path(sample_spm).read_bytes() + b"\0")
    cases.append(([f"--model_dir={model_dir}", f"--sp_path={other}", f"--output_dir={tmp_path / 'a'}"],
                  rf"export_hf: error: --sp_path={other} is not the SentencePiece model of the records the "
                  rf"model was trained on \({model_dir}/run_config.json records its sha256\): pass "
                  rf"{re.escape(str(sample_spm))} \(sp_path in {records}/corpus_info.json\)"))
    results = run_module_forked("xlnet_data.export_hf", [args for args, _ in cases])
    for (args, expected), result in zip(cases, results):
        assert result.returncode == 2, (args, result.stderr)
        assert re.fullmatch(expected, result.stderr.strip().splitlines()[-1]), (args, result.stderr)
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()
    run_config = json.loads((model_dir / "run_config.json").read_text())
    assert (run_config["uncased"], run_config["keep_accents"]) == (True, False)  # the records' corpus_info.json


def test_training_records_keep_accents_for_export(tmp_path):
    """run_config.json's keep_accents is the records' (any of several); a corpus_info.json without the key (the
    original's, or older ours) means the original's stripping; no corpus_info.json, no key."""
    from xlnet_data.pretrain import resume
    dirs = []
    for name, info in (("old", {"vocab_size": 1000}), ("kept", {"vocab_size": 1000, "keep_accents": True})):
        (tmp_path / name / "tfrecords").mkdir(parents=True)
        (tmp_path / name / "corpus_info.json").write_text(json.dumps(info))
        dirs.append(str(tmp_path / name / "tfrecords"))
    assert resume.records_keep_accents(dirs[0]) is False
    assert resume.records_keep_accents(",".join(dirs)) is True
    (tmp_path / "bare").mkdir()
    assert resume.records_keep_accents(str(tmp_path / "bare")) is None  # not known: export_hf's flag decides


@pytest.mark.slow
def test_export_of_an_original_checkpoint_reads_its_tensors(tf1_exports):
    """A TF1-style checkpoint with the original's names (as the goldens are) exports tensor for tensor."""
    out, result, model = tf1_exports["original"]
    _ok(result)
    assert "bi_data=False" in result.stderr and "mem_len=None" in result.stderr  # no run_config.json: fine-tuning's
    # and the tokenizer's settings are the flags'
    assert "(cased, accents kept)" in result.stderr
    assert hf_tokenizer.tokenizer_settings(str(out)) == {"uncased": False, "keep_accents": True}
    tensors = hf.read_tensors(str(out))
    assert len(tensors) == len(hf.links(ORIGINAL_CONFIG))
    np.testing.assert_array_equal(tensors["transformer.layer.1.rel_attn.r_w_bias"],
                                  model.weights["model/transformer/r_w_bias"].numpy()[1])
    hf_config = json.loads((out / "config.json").read_text())
    assert (hf_config["ff_activation"], hf_config["vocab_size"], hf_config["d_head"]) == ("gelu_new", 1000, 4)


# ----- the tokenizer --------------------------------------------------------------------------------------

# Hand-written sentences in the scripts our users write, with the marks the original's stripping drops (Thai
# vowels and tone marks, kana voicing, Hangul that NFKD splits into jamo, Vietnamese tones, Indic viramas and
# vowel signs, Arabic harakat, Greek tonos and a final sigma, French and German accents), and `` '' quotes.
LANGUAGE_LINES = {
    "th": ["ภาษาไทยเป็นภาษาที่มีวรรณยุกต์ ผู้พูดต้องออกเสียงให้ถูกต้อง",
           "เมื่อวานนี้ฉันไปตลาดน้ำกับครอบครัว และซื้อผลไม้สดมาหลายอย่าง",
           "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย"],
    "ja": ["パソコンが大好きです。毎日プログラムを書いています。",
           "東京駅から新幹線に乗って、京都へ行きました。",
           "日本語の文章には、ひらがな、カタカナ、漢字が混ざっています。"],
    "ko": ["한국어는 한글로 적으며, 세종대왕이 만들었습니다.",
           "오늘 날씨가 좋아서 친구들과 공원에서 산책했어요.",
           "서울은 대한민국의 수도입니다."],
    "zh": ["我们明天早上八点在北京火车站见面。",
           "中文没有空格，所以分词是一个重要的问题。",
           "这本书讲述了一个关于友谊和勇气的故事。"],
    "vi": ["Tiếng Việt có dấu, và mỗi thanh điệu làm thay đổi nghĩa của từ.",
           "Hôm qua tôi đã đi chợ Bến Thành với mẹ để mua trái cây.",
           "Hà Nội là thủ đô của nước Cộng hòa Xã hội Chủ nghĩa Việt Nam."],
    "hi": ["हिन्दी भारत की सबसे अधिक बोली जाने वाली भाषा है।",
           "मैं कल सुबह दिल्ली से मुंबई के लिए ट्रेन पकड़ूँगा।",
           "बच्चों ने स्कूल में एक सुंदर कविता पढ़ी।"],
    "ta": ["தமிழ் உலகின் மிகப் பழமையான மொழிகளில் ஒன்றாகும்.",
           "நேற்று நான் சென்னையில் என் நண்பரைச் சந்தித்தேன்.",
           "இந்தப் புத்தகம் மிகவும் சுவாரசியமாக இருக்கிறது."],
    "ar": ["اللغة العربية هي لغة رسمية في أكثر من عشرين دولة.",
           "ذهبتُ إلى السوقِ صباحاً واشتريتُ خبزاً وفاكهة.",
           "مَرْحَبًا بِكُمْ فِي مَدِينَتِنَا الجَمِيلَةِ."],
    "el": ["Η ελληνική γλώσσα έχει τόνους και διαλυτικά, όπως στη λέξη «Ταΰγετος».",
           "Χθες πήγαμε στην Αθήνα για να δούμε την Ακρόπολη.",
           "ΟΔΟΣ ΠΑΝΕΠΙΣΤΗΜΙΟΥ: το άλφα είναι το πρώτο γράμμα του ελληνικού αλφαβήτου."],
    "fr": ["Le café de la gare ouvre à sept heures, même le dimanche.",
           "Où est passée la clé de la voiture ? Je l'ai cherchée partout.",
           "Noël approche : les enfants écrivent leur lettre au père Noël."],
    "de": ["Die Straße vor unserem Haus wird nächste Woche gesperrt.",
           "Müller und Schröder fahren übermorgen gemeinsam nach Köln.",
           "Ich hätte gern ein Stück Käsekuchen und einen großen Kaffee, sagte er ``leise''."],
}
# As typed, and decomposed (NFD: text from macOS, where Hangul and accents come as separate code points).
TOKENIZER_LINES = [line for lines in LANGUAGE_LINES.values() for line in lines]
TOKENIZER_LINES += [unicodedata.normalize("NFD", line) for line in TOKENIZER_LINES]
# Thai and Vietnamese as people type them (tests/data/thai_vietnamese.txt, written for these tests): tone marks
# before the vowel they sit on, Vietnamese decomposed or with only the tone combining, runs of one character.
TYPED_LINES = (Path(__file__).parent / "data" / "thai_vietnamese.txt").read_text(encoding="utf-8").splitlines()
SETTINGS = [(False, False), (False, True), (True, False), (True, True)]  # (uncased, keep_accents)


def _create_ids(sp, lines, uncased, keep_accents):
    """The ids create writes for the lines (its text step and encoder), one list per line."""
    flat, lengths = Encoder(sp, num_threads=1).encode_batch(
        preprocess_texts([line.strip() for line in lines], uncased, keep_accents))
    return [ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])]


@pytest.fixture(scope="module")
def language_spm(tmp_path_factory):
    """A SentencePiece model of the sentences as create feeds them, in every setting, at character_coverage=1.0:
    every mark is a piece."""
    from xlnet_data.datagen import tokenizer
    base = tmp_path_factory.mktemp("languages")
    text = base / "languages.txt"
    text.write_text("".join("\n".join(preprocess_texts(TOKENIZER_LINES + TYPED_LINES, uncased, keep_accents)) + "\n"
                            for uncased, keep_accents in SETTINGS))
    # Where spm_train normalises its text as create will, it must leave this text as it is: cased, accents kept.
    as_is = {name: value for name, value in (("uncased", False), ("keep_accents", True))
             if name in {field.name for field in dataclasses.fields(tokenizer.SpmTrainConfig)}}
    return tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
        input_files=(str(text),), model_prefix=str(base / "languages"), vocab_size=600, character_coverage=1.0,
        hard_vocab_limit=False, num_threads=1, **as_is))


def _write_tokenizer(directory, sp_path, uncased, keep_accents):
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in hf_tokenizer.tokenizer_files(str(sp_path), uncased, keep_accents).items():
        (directory / name).write_bytes(content)
    (directory / "config.json").write_text(json.dumps({"model_type": "xlnet"}))  # as an export's, for AutoTokenizer
    return directory


def _differing(lines, got, want):
    return [line for line, ids, expected in zip(lines, got, want) if list(ids) != expected]


@needs_transformers
@pytest.mark.parametrize("uncased,keep_accents", SETTINGS)
def test_tokenizer_gives_creates_pieces_in_eleven_languages(language_spm, uncased, keep_accents, tmp_path):
    """tokenizer.json run by `tokenizers` itself, and AutoTokenizer of the directory (Transformers), give the
    ids create writes; and the directory says which setting it holds."""
    import tokenizers
    from transformers import AutoTokenizer

    from xlnet_data.dataformat.vocab import load_sentencepiece

    want = _create_ids(load_sentencepiece(language_spm), TOKENIZER_LINES, uncased, keep_accents)
    assert not any(0 in ids for ids in want)  # no <unk>: every character is a piece
    directory = _write_tokenizer(tmp_path, language_spm, uncased, keep_accents)
    fast = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    got = [encoding.ids for encoding in fast.encode_batch(TOKENIZER_LINES, add_special_tokens=False)]
    assert not _differing(TOKENIZER_LINES, got, want)
    auto = AutoTokenizer.from_pretrained(str(directory))
    got = auto(TOKENIZER_LINES, add_special_tokens=False)["input_ids"]
    assert not _differing(TOKENIZER_LINES, got, want)
    assert auto("Hello there.")["input_ids"][-2:] == [4, 3]  # XLNet's "... <sep> <cls>"
    assert hf_tokenizer.tokenizer_settings(str(directory)) == {"uncased": uncased, "keep_accents": keep_accents}
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert (config["do_lower_case"], config["keep_accents"]) == (uncased, keep_accents)


@needs_transformers
@pytest.mark.parametrize("keep_accents", [False, True])
def test_xlnet_tokenizer_of_the_export_gives_creates_ids_in_korean_and_japanese(language_spm, keep_accents,
                                                                                 tmp_path):
    """XLNetTokenizer, the class tutorials load, gives AutoTokenizer's ids, which are create's: Transformers 5's
    own normaliser (NFKD + StripAccents) turned Korean into jamo and <unk> and dropped Japanese voicing marks.
    After save_pretrained, AutoTokenizer's copy still does."""
    from transformers import AutoTokenizer, XLNetTokenizer

    from xlnet_data.dataformat.vocab import load_sentencepiece

    lines = LANGUAGE_LINES["ko"] + LANGUAGE_LINES["ja"] + ["ばびぶべぼ、パピプペポ、ガギグゲゴ。"]
    lines += [unicodedata.normalize("NFD", line) for line in lines]  # as macOS hands them over
    want = _create_ids(load_sentencepiece(language_spm), lines, False, keep_accents)
    directory = _write_tokenizer(tmp_path / "export", language_spm, False, keep_accents)
    auto = AutoTokenizer.from_pretrained(str(directory))
    xlnet = XLNetTokenizer.from_pretrained(str(directory))
    assert not _differing(lines, auto(lines, add_special_tokens=False)["input_ids"], want)
    assert not _differing(lines, xlnet(lines, add_special_tokens=False)["input_ids"], want)
    assert xlnet(lines[0])["input_ids"] == auto(lines[0])["input_ids"] == want[0] + [4, 3]  # ... <sep> <cls>
    if keep_accents:  # the voicing marks are pieces of their own words: ば is not は
        assert want[-1] != _create_ids(load_sentencepiece(language_spm), ["はひふへほ、ハヒフヘホ、カキクケコ。"],
                                       False, True)[0]
    auto.save_pretrained(str(tmp_path / "saved"))
    saved = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    assert not _differing(lines, saved(lines, add_special_tokens=False)["input_ids"], want)


@needs_transformers
@pytest.mark.parametrize("uncased,keep_accents", SETTINGS)
def test_tokenizer_gives_creates_ids_on_typed_thai_and_vietnamese_but_float32_ties(language_spm, uncased,
                                                                                     keep_accents):
    """Every line gives create's ids, but for ties: two segmentations of the same text with equal score sums
    (`😘😘` + `😘😘😘` or the other way round), which SentencePiece and `tokenizers` break differently."""
    from xlnet_data.dataformat.vocab import load_sentencepiece
    from xlnet_data.datagen import hf_agreement

    sp = load_sentencepiece(language_spm)
    tokenizer = hf_tokenizer.tokenizer_files(str(language_spm), uncased, keep_accents)["tokenizer.json"].decode()
    agreement = hf_agreement.measure(sp, tokenizer, TYPED_LINES, uncased, keep_accents)
    assert agreement.lines == len(TYPED_LINES) == 22 and agreement.differing == 0, agreement
    assert agreement.describe().startswith(f"the tokenizer gives create's ids on {22 - agreement.ties} of 22 lines")
    scores = np.array([sp.GetScore(i) for i in range(sp.GetPieceSize())], dtype=np.float32)
    # A piece that is another one twice (`ออ`, `55`...): [x, xx] and [xx, x] spell the same text, at the same score.
    pieces = {sp.IdToPiece(i): i for i in range(sp.GetPieceSize())}
    double, single = next((pieces[p], pieces[p[:len(p) // 2]]) for p in pieces
                          if len(p) > 1 and p[:len(p) // 2] * 2 == p and p[:len(p) // 2] in pieces)
    assert hf_agreement._is_tie(sp, scores, [single, double], [double, single])
    assert not hf_agreement._is_tie(sp, scores, [single, double], [single, single, single])  # another score
    assert not hf_agreement._is_tie(sp, scores, [single, double], [double])  # another text


def test_tokenizer_settings_of_other_directories_and_the_records_check(tmp_path):
    """Transformers' own XLNet tokenizer.json (NFKD + StripAccents), one without a tokenizer.json, none at all;
    a corpus_info.json without keep_accents (the original's, older ours) means the original's stripping."""
    converted = {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": "``"}, "content": '"'}, {"type": "NFKD"}, {"type": "StripAccents"},
        {"type": "Precompiled", "precompiled_charsmap": ""}]}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(converted))
    assert hf_tokenizer.tokenizer_settings(str(tmp_path)) == {"uncased": False, "keep_accents": False}
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "keep_accents": True}))
    assert hf_tokenizer.tokenizer_settings(str(tmp_path)) == {"uncased": True, "keep_accents": True}
    hf.check_tokenizer_fits_records(str(tmp_path), [("a/corpus_info.json", {"uncased": True, "keep_accents": True})],
                                    "--init_checkpoint=x")
    with pytest.raises(hf.HFFormatError, match=re.escape(
            "--init_checkpoint=x: its tokenizer keeps accents (keep_accents=true), the records were made with "
            "keep_accents=false (b/corpus_info.json)")):
        hf.check_tokenizer_fits_records(str(tmp_path), [("b/corpus_info.json", {"uncased": True})], "--init_checkpoint=x")
    (tmp_path / "tokenizer_config.json").unlink()
    assert hf_tokenizer.tokenizer_settings(str(tmp_path)) is None
    hf.check_tokenizer_fits_records(str(tmp_path), [("b/corpus_info.json", {})], "--init_checkpoint=x")  # no tokenizer


def _check_tokenizer_matches_create(sp_path, uncased, directory):
    from transformers import AutoTokenizer

    from xlnet_data.dataformat.vocab import load_sentencepiece

    tokenizer = AutoTokenizer.from_pretrained(str(_write_tokenizer(directory, sp_path, uncased, False)))
    lines = [line for path in sorted(SAMPLE_CORPUS.glob("*.txt")) for line in path.read_text().splitlines()
             if line.strip()]
    expected = _create_ids(load_sentencepiece(str(sp_path)), lines, uncased, False)
    differ = _differing(lines, tokenizer(lines, add_special_tokens=False)["input_ids"], expected)
    assert not differ, f"{len(differ)} of {len(lines)} lines differ, e.g. {differ[0]!r}"
    return len(lines)


@needs_transformers
def test_tokenizer_of_the_export_encodes_as_create_uncased(trained, sample_spm, tmp_path):
    _, export_dir, _ = trained
    assert hf_tokenizer.tokenizer_settings(str(export_dir)) == {"uncased": True, "keep_accents": False}
    assert _check_tokenizer_matches_create(sample_spm, True, tmp_path) > 4000


@needs_shared
@needs_transformers
def test_tokenizer_of_the_export_encodes_as_create_with_xlnets_cased_model(tmp_path):
    _check_tokenizer_matches_create(XLNET_SPM, False, tmp_path)


def test_tokenizer_files_refuse_a_model_without_xlnets_ids(tmp_path):
    import sentencepiece as spm
    prefix = tmp_path / "plain"
    spm.SentencePieceTrainer.train(input=str(SAMPLE_CORPUS / "austen_persuasion.txt"), model_prefix=str(prefix),
                                   vocab_size=200, num_threads=1)
    with pytest.raises(ValueError, match=r"plain\.model does not have XLNet's special ids \(id <cls>=.*\)$"):
        hf_tokenizer.tokenizer_files(str(prefix) + ".model", False)


def test_the_model_card_names_no_path_of_the_machine(tmp_path):
    """Pushed to the Hub, the card would publish the machine's folders (a home directory): the records, the
    corpus, the SentencePiece model and the checkpoint are named by their folder or file names only."""
    from xlnet_data.dataformat.corpus_info import CorpusInfo
    from xlnet_data.pretrain import hf_card
    home = tmp_path / "home" / "alice"
    info = CorpusInfo.from_dict({"vocab_size": 8000, "seq_len": 128, "input_glob": f"{home}/corpus/ko/*.txt,"
                                 f"{home}/corpus/ko2/*.txt", "sp_path": f"{home}/spm/ko.model"},
                                str(home / "proc_data" / "ko" / "corpus_info.json"))
    config = C.ExportConfig(checkpoint=f"{home}/models/ko/model.ckpt-60", model=C.XLNetConfig(), run=C.RunConfig(),
                            pretraining=C.RunConfig(), sp_path=f"{home}/spm/ko.model", output_dir=str(tmp_path / "hf"))
    card = hf_card.model_card(config, [(str(home / "proc_data" / "ko" / "corpus_info.json"), info)],
                              "the tokenizer gives create's ids on 10 of 10 lines (the corpus: *.txt,*.txt)")
    assert "alice" not in card and str(tmp_path) not in card, card
    assert "`ko` (its `corpus_info.json`): made by xlnet-data create from `*.txt,*.txt`" in card
    assert "with `ko.model`" in card and "weights: `model.ckpt-60`" in card
    assert "Korean" in card and "Japanese" in card and "XLNetTokenizer" in card
