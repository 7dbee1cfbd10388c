"""The held-out loss (pretrain/evaluation.py): the model's own loss (the training step's, on the training records),
the same at every evaluation, for one or two replicas and for records or a token cache; a run that evaluates, keeps
its best checkpoint (model_dir/best/) across a resume, and draws its curves; train and dev in one save_dir."""

import dataclasses
import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import SAMPLE_CORPUS, fork_server, run_module, two_logical_cpus
from test_train import TINY_SHAPE, tiny_config

from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records
from xlnet_data.pretrain import curves, held_out, resume
from xlnet_data.pretrain import training as T
from xlnet_data.pretrain.evaluation import Evaluator
from xlnet_data.pretrain.trainer import Trainer


def _create(sample_spm, text_glob, save_dir, split, write_records):
    config = CreateConfig(input_glob=str(text_glob), sp_path=sample_spm, save_dir=str(save_dir), bsz_per_host=8,
                          num_core_per_host=1, seq_len=64, reuse_len=32, bi_data=True, num_predict=10, uncased=True,
                          split=split, write_records=write_records)
    create_records(config.validate(), num_workers=1)


@pytest.fixture(scope="module")
def split_dirs(sample_spm, tmp_path_factory):
    """(records save_dir, cache-backed save_dir), each with a train split (40 lines of Emma, 17 steps) and a dev
    split (the next 30 lines) made by create --split=dev into the same save_dir."""
    text = tmp_path_factory.mktemp("text")
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()
    for split, part in (("train", lines[:40]), ("dev", lines[40:70])):
        (text / split).mkdir()
        (text / split / "emma.txt").write_text("\n".join(part) + "\n")
    out = tmp_path_factory.mktemp("split")
    for kind, write_records in (("records", True), ("cache", False)):
        for split in ("train", "dev"):
            _create(sample_spm, text / split / "*.txt", out / kind, split, write_records)
    return str(out / "records"), str(out / "cache")


def one_layer(record_dir, model_dir, **changes):
    """tiny_config on one layer: what these tests check (held-out numbers, bests, resumes, refusals) is the same at
    any depth (a tiny run's CPU: about 15% less than on two)."""
    return tiny_config(record_dir, model_dir, n_layer=1, **changes)


def with_eval(cfg, **changes):
    dirs = held_out.held_out_dirs(cfg.record_info_dir.split(","), None)
    return dataclasses.replace(cfg, eval_record_info_dir=dirs, **changes)


def test_train_and_dev_live_in_one_save_dir(split_dirs):
    records, cache = split_dirs
    for save_dir in split_dirs:
        names = sorted(os.listdir(Path(save_dir) / "tfrecords"))
        assert [name.split("-")[1] for name in names if name.startswith("record_info-")] == ["dev", "train"]
    assert held_out.held_out_dirs([f"{records}/tfrecords"], None) == f"{records}/tfrecords"
    counts = {split: 8 * json.loads(next((Path(records) / "tfrecords").glob(f"record_info-{split}-*")).read_text())
              ["num_batch"] for split in ("train", "dev")}
    both = run_module("xlnet_data.dump", records, "--stats", "--format=json")  # one run's units: both read
    assert both.returncode == 0, both.stderr
    stats = json.loads(both.stdout)
    assert stats["records_per_split"] == counts and stats["count"] == sum(counts.values())
    dev = json.loads(run_module("xlnet_data.dump", cache, "--stats", "--format=json", "--split=dev").stdout)
    assert dev["records_per_split"] == {"dev": counts["dev"]}


def test_evaluating_a_checkpoint_on_the_training_records_gives_the_training_steps_loss(split_dirs, tmp_path):
    """No dropout, the training step's factorization order (the seed's): the evaluation of the checkpoint of step
    2 on batch 2 of the training records is step 3's loss (within 1e-6; without memories, which a checkpoint
    carries from training and an evaluation starts afresh)."""
    records, _ = split_dirs
    cfg = one_layer(records, tmp_path / "model", train_steps=3, save_steps=2, mem_len=0)
    third = T.train(cfg).losses[2]
    trainer = Trainer(cfg, tf.distribute.OneDeviceStrategy("/cpu:0"))
    resume.restore(str(tmp_path / "model" / "model.ckpt-2"), trainer.model, trainer.optimizer)
    got = Evaluator(cfg, trainer, cfg.record_info_dir, 1, split="train", start=2).evaluate()
    assert abs(got.loss - third) < 1e-6 and 0 < got.tokens <= 8 * 10, (got, third)


def check_replicas_and_cache(records, cache, model_dir):
    """Run in a process with two logical CPUs: weights away from the initial ones evaluated on 3 dev batches
    (memories carried across them), twice, on 1 and 2 replicas, from the records and from the cache."""
    two_logical_cpus()
    noise = np.random.default_rng(0)
    weights = {name: var.numpy() + noise.normal(0, 0.05, var.shape).astype(np.float32)
               for name, var in Trainer(one_layer(records, model_dir), tf.distribute.OneDeviceStrategy("/cpu:0"))
               .model.weights.items()}

    def evaluator(save_dir, strategy):
        cfg = one_layer(save_dir, model_dir)
        trainer = Trainer(cfg, strategy)
        for name, value in weights.items():
            trainer.model.weights[name].assign(value)
        evaluator = Evaluator(cfg, trainer, f"{save_dir}/tfrecords", 3)
        assert evaluator.num_batches == 3
        return evaluator

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    on_one = evaluator(records, one)
    first, again = on_one.evaluate(), on_one.evaluate()
    assert first == again, (first, again)  # the same batches, orders and memories: the same numbers
    two = evaluator(records, tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])).evaluate()
    from_cache = evaluator(cache, one).evaluate()
    for got in (two, from_cache):
        assert abs(got.loss - first.loss) < 1e-6 and got.accuracy == first.accuracy, (got, first)
        assert got.tokens == first.tokens
    print(first, two, from_cache)


@pytest.mark.slow
def test_the_held_out_numbers_repeat_and_do_not_depend_on_replicas_or_the_cache(split_dirs, tmp_path):
    # In a fresh TensorFlow (two logical CPUs), forked from the test process's one import.
    result = fork_server().run("test_evaluation", *split_dirs, tmp_path / "model",
                                  function="check_replicas_and_cache")
    assert result.returncode == 0, result.stderr[-5000:]


HELD_OUT_LINE = re.compile(r"step (\d+) \| held-out loss ([\d.]+) \| pplx ([\d.]+) \| bpt ([\d.]+) \| acc ([\d.]+)% "
                           r"\| (\d+) tokens \| best ([\d.]+) at step (\d+)")


@pytest.mark.slow
def test_a_run_keeps_its_best_checkpoint_across_a_resume_and_draws_its_curves(split_dirs, tmp_path, caplog):
    records, _ = split_dirs
    model_dir = tmp_path / "model"
    cfg = with_eval(one_layer(records, model_dir, train_steps=6, iterations=2, max_save=1), eval_every=2,
                    eval_batches=2)
    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        result = T.train(cfg)
    logged = [HELD_OUT_LINE.search(message).groups() for message in caplog.messages if HELD_OUT_LINE.search(message)]
    assert [int(line[0]) for line in logged] == [2, 4, 6]
    scalars = curves.read_scalars(str(model_dir))
    steps, losses = scalars["held_out/loss"]
    assert steps.tolist() == [2, 4, 6] and {"held_out/perplexity", "held_out/accuracy"} <= set(scalars)
    assert [float(line[1]) for line in logged] == pytest.approx(losses, abs=1e-4)
    best = held_out.read_best(str(model_dir))
    assert best == result.best and best.step == steps[np.argmin(losses)] and best.loss == pytest.approx(min(losses))
    assert sorted(os.listdir(model_dir / "best")) == ["best.json", "checkpoint", f"model.ckpt-{best.step}.data-00000-"
                                                      "of-00001", f"model.ckpt-{best.step}.index"]
    assert held_out.best_checkpoint(str(model_dir)) == str(model_dir / "best" / f"model.ckpt-{best.step}")
    # Resumed with learning rate 0 (the weights of step 6): an evaluation as good as the best is no new best.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        again = T.train(dataclasses.replace(cfg, train_steps=8, learning_rate=0.0))
    assert f"best held-out loss so far {best.loss:.4f} at step {best.step}" in caplog.text
    assert again.best == best == held_out.read_best(str(model_dir))
    png = tmp_path / "curves.png"
    drawn = curves.plot_curves(curves.read_scalars(str(model_dir)), str(png), "test", curves.tokens_per_step(
        str(model_dir)))
    assert drawn == ["loss", "held_out/loss", "learning_rate"] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert curves.tokens_per_step(str(model_dir)) == 8 * 64


@pytest.mark.slow
def test_train_gpu_evaluates_each_sources_dev_split_by_default_and_says_the_best(split_dirs, tmp_path):
    """Mixed: each source's own dev split (found beside its train split) and the mixture, weighted as training
    draws the sources; the summary line ends with the best."""
    model_dir = tmp_path / "model"
    train_only = tmp_path / "train_only"
    shutil.copytree(split_dirs[0], train_only, ignore=shutil.ignore_patterns("*dev-*"))
    # Two processes' runs, forked from the test process's one TensorFlow import (conftest.ForkServer).
    result, off = (fork_server().run("xlnet_data.train_gpu", *args) for args in (
        [f"--record_info_dir={','.join(split_dirs)}", f"--model_dir={model_dir}", "--mix_sampling_factor=0.5",
         *TINY_SHAPE, "--n_layer=1", "--mem_len=32", "--train_steps=4", "--iterations=2", "--eval_batches=1"],
        [f"--record_info_dir={train_only}", f"--model_dir={tmp_path / 'x'}", "--eval_every=5"]))
    assert result.returncode == 0, result.stderr
    logged = HELD_OUT_LINE.findall(result.stderr)
    assert [int(line[0]) for line in logged] == [2, 4]  # every --iterations steps
    assert result.stderr.count("| held-out records | loss") == result.stderr.count("| held-out cache | loss") == 2
    best = held_out.read_best(str(model_dir))
    assert result.stderr.rstrip().endswith(f"; best held-out loss {best.loss:.4f} at step {best.step} "
                                           f"({model_dir / 'best'})")
    scalars = curves.read_scalars(str(model_dir))
    each = [scalars[f"held_out/{name}/loss"][1] for name in ("records", "cache")]
    np.testing.assert_allclose(each[0], each[1], atol=1e-6)  # the same text, from records or from the cache
    tokens = [T.source_tokens(f"{save_dir}/tfrecords", one_layer(save_dir, "unused").data) for save_dir in split_dirs]
    np.testing.assert_allclose(scalars["held_out/loss"][1], np.dot(T.sampling_probs(tokens, 0.5), each), atol=1e-6)
    assert off.returncode == 2 and "--eval_every=5: no held-out records" in off.stderr.splitlines()[-1]


# ----- issue 43: held-out records of the right model, a best of the same batches, a dry run that tells all ------

@pytest.fixture(scope="module")
def other_model_dev(other_spm, tmp_path_factory):
    """A save_dir holding only a dev split (the same 30 lines as split_dirs') made with another SentencePiece model
    (of 500 pieces)."""
    text = tmp_path_factory.mktemp("other_text") / "emma.txt"
    text.write_text("\n".join((SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[40:70]) + "\n")
    out = tmp_path_factory.mktemp("other_dev") / "other"
    _create(other_spm, text, out, "dev", True)
    return str(out)


@pytest.fixture(scope="module")
def evaluated_model_dir(split_dirs, tmp_path_factory):
    """A model_dir of 2 steps that evaluated 2 dev batches at step 2 (its best)."""
    cfg = with_eval(one_layer(split_dirs[0], tmp_path_factory.mktemp("evaluated") / "model", train_steps=2,
                                iterations=2, mem_len=0), eval_every=2, eval_batches=2)
    T.train(cfg)
    return cfg


@pytest.mark.slow
def test_held_out_records_of_another_sentencepiece_model_are_refused_naming_both(split_dirs, other_model_dev,
                                                                                sample_spm, other_spm, tmp_path):
    from xlnet_data.common.errors import ConfigError
    from xlnet_data.dataformat import provenance
    cfg = dataclasses.replace(one_layer(split_dirs[0], tmp_path / "model"), eval_every=1,
                              eval_record_info_dir=f"{other_model_dev}/tfrecords")
    for run in (T.train, T.dry_run):
        with pytest.raises(ConfigError) as refused:
            run(cfg)
        assert provenance.sha256_of(other_spm) in str(refused.value)
        assert provenance.sha256_of(sample_spm) in str(refused.value)
        assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_a_resume_on_other_held_out_batches_starts_a_new_best(evaluated_model_dir, tmp_path, caplog):
    """best.json's loss is made unbeatable (0.0, as if its held-out text were trivial): resumed on the same batches
    the best stays; on other batches (another --eval_batches) the first evaluation is the new best, said."""
    model_dir = tmp_path / "model"
    shutil.copytree(evaluated_model_dir.model_dir, model_dir)
    best_json = model_dir / "best" / "best.json"
    best_json.write_text(json.dumps({**json.loads(best_json.read_text()), "loss": 0.0}))
    cfg = dataclasses.replace(evaluated_model_dir, model_dir=str(model_dir), learning_rate=0.0)
    same = T.train(dataclasses.replace(cfg, train_steps=4))
    assert (same.best.step, same.best.loss) == (2, 0.0)
    with caplog.at_level(logging.WARNING, logger="xlnet_data"):
        other = T.train(dataclasses.replace(cfg, train_steps=6, eval_batches=1))
    assert other.best.step == 6 and other.best.loss > 0 and held_out.read_best(str(model_dir)) == other.best
    assert other.best.measured_on["batches"] == [1]
    assert sorted(os.listdir(model_dir / "best")) == ["best.json", "checkpoint", "model.ckpt-6.data-00000-of-00001",
                                                      "model.ckpt-6.index"]
    assert len([r for r in caplog.records if "new best" in r.getMessage()]) == 1


@pytest.mark.slow
def test_the_dry_run_counts_the_evaluations_and_makes_every_check_of_the_real_run(evaluated_model_dir, split_dirs,
                                                                                 tmp_path):
    from test_train_faults import _made_otherwise

    from xlnet_data.common.errors import ConfigError
    model_dir = Path(evaluated_model_dir.model_dir)
    def contents():  # but the locks' notes of who holds them
        return {path: path.read_bytes() for path in model_dir.rglob("*") if path.is_file() and "lock" not in path.name}

    before = contents()
    dry = T.dry_run(dataclasses.replace(evaluated_model_dir, train_steps=12, eval_every=1), steps=1, seconds=0)
    assert (dry.start_step, dry.evaluations, dry.evaluation_batches) == (2, 10, 2)
    assert 0 < dry.evaluation_seconds and 0 < dry.first_evaluation_seconds
    assert dry.projected_seconds == pytest.approx(dry.first_step_seconds + 9 * dry.step_seconds
                                                  + dry.first_evaluation_seconds + 9 * dry.evaluation_seconds)
    # What the real run refuses before its first step, the dry run refuses too: another model shape on this
    # model_dir, records of another SentencePiece model than its checkpoints learnt, another --seed.
    other_records = _made_otherwise(split_dirs[0], tmp_path, "model_b", model_sha256="b" * 64)
    refused = [dataclasses.replace(evaluated_model_dir, train_steps=4,
                                   model=dataclasses.replace(evaluated_model_dir.model, d_inner=128)),
               dataclasses.replace(evaluated_model_dir, train_steps=4, record_info_dir=f"{other_records}/tfrecords",
                                   eval_every=0),
               dataclasses.replace(evaluated_model_dir, train_steps=4, seed=7)]
    for cfg in refused:
        for run in (T.dry_run, T.train):
            with pytest.raises(ConfigError):
                run(cfg)
    assert contents() == before
