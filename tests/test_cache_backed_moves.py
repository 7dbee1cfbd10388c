"""A save_dir of records made cache-backed by create --nowrite_records (its records removed), read back by
read_examples, moved with its SentencePiece model and found again, and readers refusing another model."""

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_CORPUS, run_module

import xlnet_data as xd
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import settings
from xlnet_data.dataformat.selection import InspectionError, SelectionConfig, select
from xlnet_data.dataformat.token_cache import TokenCacheError
from xlnet_data.datagen import local_runner, tokenizer
from xlnet_data.pretrain.config import InputConfig


@pytest.fixture(scope="module")
def made(tmp_path_factory, sample_spm):
    """home/spm/sample.model and home/save: records of 2 passes, their examples read, a copy of the save_dir
    (home/records), then the same create with --nowrite_records (its summary)."""
    home = tmp_path_factory.mktemp("home")
    (home / "spm").mkdir()
    model = shutil.copy(sample_spm, home / "spm" / "sample.model")
    config = xd.CreateConfig(input_glob=str(SAMPLE_CORPUS / "austen_emma.txt"), sp_path=str(model),
                             save_dir=str(home / "save"), seq_len=64, reuse_len=32, bsz_per_host=4, use_tpu=False,
                             num_predict=10, num_passes=2, uncased=False).validate()
    xd.create_records(config, num_workers=1)
    examples = list(xd.read_examples(str(home / "save")))
    shutil.copytree(home / "save", home / "records")
    summary = xd.create_records(dataclasses.replace(config, write_records=False), num_workers=1)
    return home, config, examples, summary


def assert_same(got, want):
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in b)


def test_nowrite_records_on_records_removes_them_once_the_cache_stands_for_them(made):
    home, _, examples, summary = made
    assert not list((home / "save" / "tfrecords").glob("*.tfrecords*"))
    files, nbytes = summary.replaced_records
    assert files == 2 and nbytes == sum(p.stat().st_size for p in (home / "records" / "tfrecords").glob("*.tfrecords"))
    assert "2 records file(s) of an earlier run removed" in summary.line(1.0)


def test_a_failed_nowrite_records_run_loses_no_records(made, tmp_path, monkeypatch):
    """The second unit fails: both records files stay (the first unit's record_info is cache-backed already);
    the same command then finishes the run and removes them."""
    home, config, examples, _ = made
    shutil.copytree(home / "records", tmp_path / "save")
    config = dataclasses.replace(config, save_dir=str(tmp_path / "save"), write_records=False)
    real = local_runner.units.run_unit

    def fail_on_pass_1(config, unit, *args, **kwargs):
        if unit.pass_id == 1:
            raise OSError(28, "No space left on device")
        return real(config, unit, *args, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(local_runner.units, "run_unit", fail_on_pass_1)
        with pytest.raises(OSError):
            xd.create_records(config, num_workers=1)
    assert len(list((tmp_path / "save" / "tfrecords").glob("*.tfrecords"))) == 2
    assert xd.create_records(config, num_workers=1).replaced_records[0] == 2
    assert_same(list(xd.read_examples(str(tmp_path / "save"))), examples)


def test_read_examples_of_a_cache_backed_save_dir_are_the_records_it_stands_for(made, tmp_path):
    home, _, examples, _ = made
    shutil.copytree(home / "save", tmp_path / "save")
    for path in (tmp_path / "save" / "tfrecords").glob("*.tfrecords"):  # as a save_dir made --nowrite_records has
        path.unlink()
    assert_same(list(xd.read_examples(str(tmp_path / "save"))), examples)
    with pytest.raises(InspectionError, match=r"save is cache-backed \(create --nowrite_records: .*give it as the "
                                              "only path, alone"):
        next(xd.read_examples(str(tmp_path / "save"), str(home / "records")))


def test_a_cache_backed_save_dir_moved_with_its_model_is_found_and_a_model_moved_alone_given(made, tmp_path):
    home, _, examples, _ = made
    moved = tmp_path / "elsewhere"
    shutil.copytree(home / "save", moved / "save")
    shutil.copytree(home / "records", moved / "records")
    shutil.copytree(home / "spm", moved / "spm")
    (home / "spm").rename(home / "spm.away")  # where create recorded it: gone
    try:
        assert_same(list(xd.read_examples(str(moved / "save"))), examples)  # beside it, as it was
        assert select(SelectionConfig(paths=(str(moved / "records"),))).sp_where == str(moved / "spm" / "sample.model")
        (moved / "spm").rename(moved / "model")
        with pytest.raises(TokenCacheError, match=r"is missing; put it back there, or give its new place \(--sp_path\)"):
            next(xd.read_examples(str(moved / "save")))
        new_place = str(moved / "model" / "sample.model")
        assert_same(list(xd.read_examples(str(moved / "save"), sp_path=new_place)), examples)
        dumped = run_module("xlnet_data.dump", moved / "save", f"--sp_path={new_place}", "--limit=2")
        assert dumped.returncode == 0 and "all checks pass" in dumped.stdout + dumped.stderr, dumped.stderr
        (record_dir,) = settings.find_record_dirs(str(moved / "save"), new_place)  # train_gpu --sp_path's checks
        from xlnet_data.pretrain import inputs  # TensorFlow (loaded by the suite's collection anyway)
        data = InputConfig(seq_len=64, reuse_len=32, perm_size=32, bsz_per_host=4, num_predict=10, sp_path=new_place)
        found = inputs.find_records(record_dir.tfrecords, data)  # what training reads
        assert [unit.sp_path for unit in found.cache_units] == [new_place] * 2
    finally:
        (home / "spm.away").rename(home / "spm")


@pytest.fixture(scope="module")
def other_model(made):
    """Another SentencePiece model of the same size (1000 pieces), trained on other text."""
    home = made[0]
    return tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
        input_files=(str(SAMPLE_CORPUS / "austen_persuasion.txt"),), model_prefix=str(home / "other"),
        vocab_size=1000, num_threads=1, uncased=True))


@pytest.mark.slow
def test_another_model_of_the_same_size_is_refused_for_records_and_for_a_cache(made, other_model):
    home = made[0]
    with pytest.raises(InspectionError, match=r"^--sp_path=.*other.model is not the SentencePiece model the records "
                                              "were made with"):
        select(SelectionConfig(paths=(str(home / "records"),), sp_path=other_model))
    with pytest.raises(TokenCacheError, match=r"other.model is not the SentencePiece model .* was made with"):
        select(SelectionConfig(paths=(str(home / "save"),), sp_path=other_model))
    with pytest.raises(ConfigError, match="--sp_path=.* is not the "):
        settings.find_record_dirs(str(home / "records"), other_model)
    dumped = run_module("xlnet_data.dump", home / "records", f"--sp_path={other_model}", "--limit=1")
    assert dumped.returncode == 2 and dumped.stderr.strip().splitlines()[-1].startswith(
        f"dump: error: --sp_path={other_model} is not the SentencePiece model")
    assert Path(other_model).is_file()
