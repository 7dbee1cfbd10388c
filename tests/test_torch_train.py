"""The PyTorch trainer (xlnet_data.pretrain_torch.training, python -m xlnet_data.train_torch): train_gpu's steps from
the same weights and permutations, accumulation and recomputation equal to one pass, an exact resume after SIGTERM,
a model_dir that Transformers loads as it is, one-line errors, and no TensorFlow on its import path."""

import dataclasses
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, SAMPLE_CORPUS, run_module

from xlnet_data.pretrain import config as C
from xlnet_data.pretrain_torch import accumulation, checkpoint, optim
from xlnet_data.pretrain_torch import data as D
from xlnet_data.pretrain_torch import examples as E
from xlnet_data.pretrain_torch import training as T
from xlnet_data.pretrain_torch.modeling import XLNet, init_weights

RECORD_FLAGS = ["--bsz_per_host=8", "--num_core_per_host=1", "--seq_len=64", "--reuse_len=32", "--bi_data",
                "--num_predict=10", "--uncased"]
TINY_SHAPE = ["--n_layer=2", "--d_model=16", "--n_head=2", "--d_head=8", "--d_inner=32", "--ff_activation=gelu",
              "--untie_r"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _create(sample_spm, tmp_path_factory, book, lines=40):
    """A save_dir of create over the first `lines` lines of a book of sample_corpus/ (about 17 steps of 8 rows)."""
    text_dir = tmp_path_factory.mktemp("text")
    (text_dir / "book.txt").write_text("\n".join((SAMPLE_CORPUS / book).read_text().splitlines()[:lines]) + "\n")
    save_dir = tmp_path_factory.mktemp("records") / book.split(".")[0]
    result = run_module("xlnet_data.create", f"--input_glob={text_dir}/*.txt", f"--sp_path={sample_spm}",
                        f"--save_dir={save_dir}", *RECORD_FLAGS, "--num_workers=1")
    assert result.returncode == 0, result.stderr
    return str(save_dir)


@pytest.fixture(scope="module")
def records(sample_spm, tmp_path_factory):
    return _create(sample_spm, tmp_path_factory, "austen_emma.txt")


@pytest.fixture(scope="module")
def other_records(sample_spm, tmp_path_factory):
    return _create(sample_spm, tmp_path_factory, "austen_persuasion.txt")


def tiny_config(record_dir, model_dir, **changes):
    """A TrainConfig for the records above and a tiny model (what the command builds from TINY_SHAPE)."""
    model = C.XLNetConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, ff_activation="gelu", untie_r=True,
                          n_token=1000)
    run = C.RunConfig(mem_len=changes.pop("mem_len", 32), reuse_len=32, bi_data=True,
                      dropout=changes.pop("dropout", 0.0), dropatt=changes.pop("dropatt", 0.0))
    data = C.InputConfig(seq_len=64, reuse_len=32, perm_size=32, bsz_per_host=8, num_predict=10, uncased=True)
    defaults = dict(learning_rate=1e-3, warmup_steps=5, train_steps=20, iterations=10, strategy="one_device")
    return C.TrainConfig(record_info_dir=",".join(os.path.join(d, "tfrecords") for d in record_dir.split(",")),
                         model_dir=str(model_dir), model=model, run=run, data=data, **{**defaults, **changes})


# ----- a trained model_dir, shared ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(records, tmp_path_factory):
    """100 steps of a tiny model with dropout (so the random state matters), uninterrupted: (config, result)."""
    cfg = tiny_config(records, tmp_path_factory.mktemp("model") / "whole", train_steps=100, iterations=50,
                      dropout=0.1, dropatt=0.1, seed=5)
    return cfg, T.train(cfg, device="cpu")


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_and_resumed_ends_with_the_uninterrupted_runs_weights(trained, tmp_path,
                                                                                       monkeypatch):
    cfg, whole = trained
    cfg = dataclasses.replace(cfg, model_dir=str(tmp_path / "stopped"))
    apply = optim.AdamWeightDecay.apply

    def apply_then_sigterm_at_50(self):
        lr = apply(self)
        if self.step == 50:
            # Sent to this thread, its handler run before raise_signal returns: the loop notes it before its next
            # step, saves at this step and ends. os.kill(getpid()) is the process's: any thread may take it (the
            # read-ahead's), and under load the main thread then ran step 51 before the handler noted it.
            signal.raise_signal(signal.SIGTERM)
        return lr

    with monkeypatch.context() as patch:
        patch.setattr(optim.AdamWeightDecay, "apply", apply_then_sigterm_at_50)
        stopped = T.train(cfg, device="cpu")
    assert (stopped.stopped_by, stopped.step) == (signal.SIGTERM, 50)
    assert stopped.checkpoint == str(tmp_path / "stopped" / "checkpoint-50")
    resumed = T.train(cfg, device="cpu")
    assert (resumed.stopped_by, resumed.first_step, resumed.step) == (None, 50, 100)
    assert stopped.losses + resumed.losses == whole.losses
    want, got = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(want[name], got[name]) for name in want), "weights differ from the uninterrupted run's"
    for a, b in zip(whole.sources[0].mems, resumed.sources[0].mems):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_the_model_dir_is_a_transformers_model_that_gives_our_logits_and_fine_tunes(trained):
    transformers = pytest.importorskip("transformers")
    cfg, whole = trained
    model_dir = cfg.model_dir
    assert sorted(name for name in os.listdir(model_dir) if name.startswith("checkpoint-")) == ["checkpoint-100"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    one = tokenizer(["She was very happy with the ball."], return_tensors="pt")
    hf_model = transformers.XLNetLMHeadModel.from_pretrained(model_dir).eval()
    ours = XLNet(cfg.model, C.RunConfig(clamp_len=cfg.run.clamp_len)).eval()  # config.json's: no memory, no bi_data
    ours.load_state_dict(whole.model.state_dict())
    with torch.no_grad():
        want = hf_model(input_ids=one["input_ids"]).logits
        hidden, _ = ours.transformer_output(one["input_ids"])
        got = ours.logits(hidden)
    assert got.shape == (1, one["input_ids"].shape[1], cfg.model.n_token)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=0)
    assert json.loads(open(os.path.join(model_dir, "xlnet_pretraining.json")).read())["mem_len"] == cfg.run.mem_len

    batch = tokenizer(["She was very happy with the ball.", "Emma smiled."], return_tensors="pt", padding=True)
    classifier = transformers.XLNetForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    labels = torch.tensor([1, 0])
    optimizer = torch.optim.Adam(classifier.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        loss = classifier(**batch, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    assert losses[-1] < 0.75 * losses[0], losses  # it learns the two labels


# ----- accumulation and recomputation: one pass's loss and gradients ---------------------------------------------

def _loss_and_grads(model, batch, mems, steps, recompute=False):
    model.recompute = recompute
    model.zero_grad(set_to_none=True)
    loss, new_mems = accumulation.forward_backward(model, batch, mems, steps, bi_data=True)
    return float(loss), {name: p.grad.clone() for name, p in model.named_parameters()}, new_mems


def test_micro_batches_and_recomputation_give_one_passs_loss_and_gradients(records):
    cfg = tiny_config(records, "unused", dropout=0.0)
    model = XLNet(cfg.model, cfg.run)
    init_weights(model, cfg.run, torch.Generator().manual_seed(0))
    model.train()
    with D.ReplicaSource(cfg.record_info_dir, cfg, 1, 0) as source:
        batch = {name: torch.from_numpy(value) for name, value in source.next_batch().items()}
    mems = [torch.randn(cfg.run.mem_len, 8, cfg.model.d_model, generator=torch.Generator().manual_seed(i))
            for i in range(cfg.model.n_layer)]
    loss, grads, new_mems = _loss_and_grads(model, batch, mems, 1)
    for steps, recompute in ((2, False), (4, False), (1, True), (4, True)):
        got_loss, got_grads, got_mems = _loss_and_grads(model, batch, mems, steps, recompute)
        assert abs(got_loss - loss) <= 1e-6 * abs(loss), (steps, recompute)
        for name, grad in grads.items():
            assert float((got_grads[name] - grad).norm()) <= 1e-6 * float(grad.norm()) + 1e-12, (name, steps)
        for want, got in zip(new_mems, got_mems):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # The micro-batches hold different numbers of targets: an unweighted mean of their losses is another loss.
    n_dir, counts = 2, []
    for k in range(4):
        counts.append(float(accumulation.micro_rows(batch["target_mask"], k, 4, n_dir).sum()))
    assert len(set(counts)) > 1, counts


# ----- train_gpu's steps ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_twenty_steps_equal_train_gpus_from_the_same_weights_and_permutations(records, other_records, tmp_path):
    pytest.importorskip("tensorflow")
    from xlnet_data.pretrain import inputs as ip
    from xlnet_data.pretrain import training as tf_training

    rng = np.random.default_rng(0)
    perms = rng.permutation(32), rng.permutation(32)
    cfg = tiny_config(f"{records},{other_records}", tmp_path / "torch", mix_sampling_factor=0.5, train_steps=20,
                      iterations=20, seed=2)
    start = tmp_path / "start"  # the PyTorch model's initial weights as a Transformers directory, for both
    model = XLNet(cfg.model, cfg.run)
    init_weights(model, cfg.run, torch.Generator().manual_seed(1))
    checkpoint.save(str(start), 0, model, {}, checkpoint.directory_settings(cfg), max_save=1)
    cfg = dataclasses.replace(cfg, init_checkpoint=str(start))
    ours = T.train(cfg, permutation=E.fixed_permutation(*perms), device="cpu")
    theirs = tf_training.train(dataclasses.replace(cfg, model_dir=str(tmp_path / "tf")),
                               permutation=ip.fixed_permutation(*perms))
    assert [source.steps for source in ours.sources] == [source.steps for source in theirs.sources]
    assert min(source.steps for source in ours.sources) >= 5  # both sources, each with its memories
    np.testing.assert_allclose(ours.losses, theirs.losses, rtol=1e-4)
    for source, tf_source in zip(ours.sources, theirs.sources):
        for mem, tf_mem in zip(source.mems, tf_source.mems):
            np.testing.assert_allclose(mem.numpy(), np.asarray(tf_mem), atol=1e-5, rtol=0)

    # train_gpu's model_dir, as TensorFlow reads it (its train_state strings too), continues in train_torch
    tf = pytest.importorskip("tensorflow")
    from xlnet_data.pretrain_torch import tf_checkpoint
    tf_dir = str(tmp_path / "tf")
    read, reader = tf_checkpoint.read(tf_dir), tf.train.load_checkpoint(tf_dir)
    assert sorted(read) == sorted(reader.get_variable_to_shape_map())
    assert any(value.dtype == object for value in read.values())  # train_state/source_0/made_from...
    for name, value in read.items():
        np.testing.assert_array_equal(value, reader.get_tensor(name), err_msg=name)
    start = XLNet(cfg.model, cfg.run)  # through the TensorFlow-free reader, not as a Transformers directory
    assert checkpoint.initialise(start, tf_dir) == tf_checkpoint.resolve(tf_dir)
    np.testing.assert_array_equal(start.transformer.word_embedding.weight.detach().numpy(),
                                  reader.get_tensor("model/transformer/word_embedding/lookup_table"))
    continued = T.train(dataclasses.replace(cfg, model_dir=str(tmp_path / "continued"), init_checkpoint=tf_dir,
                                            train_steps=1, iterations=1), device="cpu")
    assert continued.step == 1 and np.isfinite(continued.losses).all()


# ----- the command ------------------------------------------------------------------------------------------------

def test_the_commands_import_path_holds_no_tensorflow():
    code = ("import sys; from xlnet_data import train_torch; from xlnet_data.pretrain_torch import training; "
            "train_torch.define_flags(); bad = sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_one_line_errors_for_a_model_dir_of_another_shape_or_of_records_of_another_sentencepiece_model(trained,
                                                                                                       records, tmp_path):
    cfg, _ = trained
    model_dir = tmp_path / "copy"
    model_dir.mkdir()
    for name in ("xlnet_config.json", "run_config.json"):
        (model_dir / name).write_text(open(os.path.join(cfg.model_dir, name)).read())
    (model_dir / "checkpoint-1").mkdir()  # a model_dir with a checkpoint: its run_config.json is binding
    (model_dir / "checkpoint-1" / checkpoint.STATE_FILE).write_bytes(b"")
    common = [f"--record_info_dir={records}", f"--model_dir={model_dir}", "--train_steps=1", "--device=cpu"]
    other_shape = [flag.replace("--d_inner=32", "--d_inner=48") for flag in TINY_SHAPE]
    result = run_module("xlnet_data.train_torch", *common, *other_shape)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith(
        f"train_torch: error: --model_dir={model_dir} holds another model: d_inner=32 (here 48)"), result.stderr

    run_config = json.loads((model_dir / "run_config.json").read_text())
    run_config["sp_model_sha256"] = ["0" * 64]  # as a model_dir trained on records of another SentencePiece model
    (model_dir / "run_config.json").write_text(json.dumps(run_config))
    result = run_module("xlnet_data.train_torch", *common, *TINY_SHAPE)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith(f"train_torch: error: --model_dir={model_dir} was trained on "
                                                      "records of another SentencePiece model"), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_export_hf_reads_the_model_dir_as_its_latest_checkpoint(trained, tmp_path):
    from safetensors.numpy import load_file

    cfg, _ = trained
    result = run_module("xlnet_data.export_hf", f"--model_dir={cfg.model_dir}", f"--output_dir={tmp_path / 'hf'}",
                        "--agreement_lines=0")
    assert result.returncode == 0, result.stderr
    ours, exported = (load_file(os.path.join(d, "model.safetensors")) for d in (cfg.model_dir, tmp_path / "hf"))
    assert sorted(ours) == sorted(exported) and all(np.array_equal(ours[k], exported[k]) for k in ours)
