"""corpus_info.json through CorpusInfo (what create writes reads back the same, the original's files without
format_version and keep_accents read, a newer format or a wrong type is one line), and the one resolver of the
data settings (dataformat/settings.py): train_gpu, dump and export_hf read the same settings from the same
save_dir and differ only in their policy for a flag that contradicts it."""

import dataclasses
import json
import os
import shutil

import pytest
from conftest import GOLDEN, SAMPLE_CORPUS, run_module

from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import save_dir, selection, settings
from xlnet_data.dataformat.corpus_info import FORMAT_VERSION, CorpusInfo
from xlnet_data.dataformat.save_dir import SaveDirError
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records

# The original data_utils.py's keys, in the order it writes them.
ORIGINAL_KEYS = ["vocab_size", "bsz_per_host", "num_core_per_host", "seq_len", "reuse_len", "uncased", "bi_data",
                 "mask_alpha", "mask_beta", "num_predict", "use_eod", "sp_path", "input_glob"]
ORIGINAL = {"vocab_size": 32000, "bsz_per_host": 8, "num_core_per_host": 2, "seq_len": 128, "reuse_len": 64,
            "uncased": False, "bi_data": True, "mask_alpha": 6, "mask_beta": 1, "num_predict": 21, "use_eod": True,
            "sp_path": "../../data/spiece/xlnet_cased_spiece.model", "input_glob": "input/*.txt"}


def test_what_create_writes_round_trips_with_the_version(tmp_path):
    config = CreateConfig(input_glob="in/*.txt", sp_path="sp.model", save_dir=str(tmp_path), seq_len=64,
                          reuse_len=32, bsz_per_host=4, num_core_per_host=4, use_tpu=False, num_predict=10,
                          keep_accents=True).validate()
    info = CorpusInfo.of(config, vocab_size=1000)
    path = str(tmp_path / "corpus_info.json")
    info.write(path)
    written = json.loads((tmp_path / "corpus_info.json").read_text())
    assert list(written) == ORIGINAL_KEYS + ["keep_accents", "format_version"]
    assert written["format_version"] == FORMAT_VERSION == 1
    assert (written["num_core_per_host"], written["keep_accents"], written["vocab_size"]) == (1, True, 1000)
    assert CorpusInfo.read(path) == info
    # create's counts (added after the run) are kept, last, through another read and write
    written["input_counts"] = {"a.txt": {"unk": 3}}
    (tmp_path / "corpus_info.json").write_text(json.dumps(written))
    again = CorpusInfo.read(path)
    assert again.extra == {"input_counts": {"a.txt": {"unk": 3}}} and again.to_dict() == written
    assert list(again.to_dict())[-1] == "input_counts"


def _golden_infos():
    return sorted(GOLDEN.glob("*/expected/corpus_info.json")) if GOLDEN.is_dir() else []


@pytest.mark.parametrize("original", [ORIGINAL, *_golden_infos()],
                         ids=lambda p: p.parent.parent.name if hasattr(p, "parent") else "inline")
def test_an_original_corpus_info_reads_as_version_0(original, tmp_path):
    if not isinstance(original, dict):
        original = json.loads(original.read_text())
    assert list(original) == ORIGINAL_KEYS  # the original's file: no format_version, no keep_accents
    path = tmp_path / "corpus_info.json"
    path.write_text(json.dumps(original))
    info = CorpusInfo.read(str(path))
    assert info.format_version == 0 and info.keep_accents is None
    assert info.value("keep_accents") is False  # the original always removed accents
    assert (info.seq_len, info.bi_data, info.sp_path) == (original["seq_len"], True, original["sp_path"])
    assert info.to_dict() == original and list(info.to_dict()) == ORIGINAL_KEYS  # written back as it was
    # and train_gpu reads its settings as before: keep_accents False, the others as written
    values = settings.resolve([(str(path), info)], settings.TRAIN_FLAGS, {}, {})
    assert {flag: value for flag, (value, _) in values.items()} == {
        flag: original.get(key, False) for flag, key in settings.TRAIN_FLAGS.items()}


@pytest.mark.parametrize("edit, message", [
    ({"format_version": 2}, "format_version=2 is newer than this xlnet-data reads (1): upgrade xlnet-data "
                            "(pip install -U xlnet-data)"),
    ({"format_version": "1"}, "format_version='1' is not a format version; re-create the save_dir, or fix it"),
    ({"seq_len": True}, "seq_len=True is not a positive integer; re-create the save_dir, or fix it"),
    ({"reuse_len": 0}, "reuse_len=0 is not a positive integer; re-create the save_dir, or fix it"),
    ({"keep_accents": 1}, "keep_accents=1 is not true or false; re-create the save_dir, or fix it"),
    ({"sp_path": 7}, "sp_path=7 is not a string; re-create the save_dir, or fix it"),
])
def test_a_newer_format_or_a_wrong_type_is_one_line_naming_the_file(edit, message, tmp_path):
    path = tmp_path / "corpus_info.json"
    path.write_text(json.dumps({**ORIGINAL, **edit}))
    with pytest.raises(SaveDirError) as refused:
        CorpusInfo.read(str(path))
    assert str(refused.value) == f"{path}: {message}"


def _create_config(sp_path, out):
    return CreateConfig(input_glob=str(SAMPLE_CORPUS / "reina_valera_1909_marcos_santiago.txt"), sp_path=sp_path,
                        save_dir=str(out), seq_len=32, reuse_len=16, bsz_per_host=4, num_core_per_host=1,
                        use_tpu=False, num_predict=5, uncased=True, keep_accents=True, bi_data=False,
                        allow_accents_mismatch=True).validate()  # sample_spm strips accents: only the settings count


@pytest.fixture(scope="module")
def save_dir_made(sample_spm, tmp_path_factory):
    """A small save_dir of create (Spanish text, accents kept, uncased, forward rows only)."""
    out = tmp_path_factory.mktemp("settings") / "out"
    create_records(_create_config(sample_spm, out), num_workers=1)
    return out


def test_a_newer_format_stops_dump_train_gpu_and_create_in_one_line(save_dir_made, sample_spm, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(save_dir_made, copy)
    info_path = copy / "corpus_info.json"
    info_path.write_text(json.dumps({**json.loads(info_path.read_text()), "format_version": FORMAT_VERSION + 1}))
    want = (f"{info_path}: format_version={FORMAT_VERSION + 1} is newer than this xlnet-data reads "
            f"({FORMAT_VERSION}): upgrade xlnet-data (pip install -U xlnet-data)")
    with pytest.raises(SaveDirError, match="upgrade xlnet-data"):
        settings.find_record_dirs(str(copy))  # train_gpu's first step
    result = run_module("xlnet_data.dump", copy, "--limit=1")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [f"dump: error: {want}"], result.stderr
    # create does not add units of this version to it (--overwrite makes it again)
    with pytest.raises(SaveDirError, match="upgrade xlnet-data"):
        create_records(_create_config(sample_spm, copy), num_workers=1)
    assert save_dir.read_json(str(info_path))["format_version"] == FORMAT_VERSION + 1  # left as it was
    assert sorted(os.listdir(copy)) == sorted(os.listdir(save_dir_made))


# What create was given (test_corpus_info.save_dir_made), by corpus_info key.
MADE_WITH = {"seq_len": 32, "reuse_len": 16, "bsz_per_host": 4, "num_core_per_host": 1, "bi_data": False,
             "num_predict": 5, "uncased": True, "keep_accents": True, "mask_alpha": 6, "mask_beta": 1}


# train_gpu's flag defaults where no corpus_info.json gives a setting.
TRAIN_DEFAULTS = {"bi_data": True, "mask_alpha": 6, "mask_beta": 1, "uncased": False, "keep_accents": False,
                  "num_core_per_host": 1, "n_token": 32000}


def _train(path, given=None):
    """train_gpu's settings by corpus_info key (its flags have the original's names)."""
    resolved = settings.train_settings(settings.find_record_dirs(str(path)), given or {}, TRAIN_DEFAULTS)
    return {settings.TRAIN_FLAGS[flag]: value for flag, (value, _) in resolved.items()}


def _dump(path, overrides=None):
    return selection.select(selection.SelectionConfig((str(path),), limit=1, overrides=overrides or {}))


def test_train_gpu_dump_and_export_hf_read_the_same_settings(save_dir_made, tmp_path):
    train = _train(save_dir_made)
    assert {key: train[key] for key in MADE_WITH} == MADE_WITH
    assert train["vocab_size"] == CorpusInfo.read(str(save_dir_made / "corpus_info.json")).vocab_size == 1000
    dump = _dump(save_dir_made)
    assert dump.settings.values == {key: MADE_WITH[key] for key in settings.READ_KEYS}
    assert set(dump.settings.sources.values()) == {"corpus_info.json"} and dump.warnings == []
    assert dump.keep_accents is True and dump.keep_accents_text() == "True (corpus_info.json)"

    # export_hf reads them from the run_config.json train_gpu writes into model_dir
    from xlnet_data.pretrain import resume
    from xlnet_data.pretrain.config import InputConfig, RunConfig, TrainConfig, XLNetConfig
    data = InputConfig(seq_len=train["seq_len"], reuse_len=train["reuse_len"], perm_size=train["reuse_len"],
                       bsz_per_host=train["bsz_per_host"], num_predict=train["num_predict"],
                       num_core_per_host=train["num_core_per_host"], bi_data=train["bi_data"],
                       mask_alpha=train["mask_alpha"], mask_beta=train["mask_beta"], uncased=train["uncased"])
    config = TrainConfig(record_info_dir=str(save_dir_made / "tfrecords"), model_dir=str(tmp_path / "m"),
                         data=data, run=RunConfig(reuse_len=data.reuse_len, bi_data=data.bi_data),
                         model=XLNetConfig(n_layer=1, d_model=8, n_head=1, d_head=8, d_inner=8,
                                           ff_activation="relu", untie_r=False, n_token=train["vocab_size"]))
    resume.check_model_dir(config, chief=True, trained=False)
    run_config = str(tmp_path / "m" / "run_config.json")
    export = settings.tokenizer_settings(run_config, save_dir.read_json(run_config), given={})
    assert export == {key: train[key] for key in settings.TOKENIZER_KEYS} == {"uncased": True, "keep_accents": True}


def test_each_reader_has_its_policy_for_a_contradicting_flag(save_dir_made, tmp_path):
    info_path = save_dir_made / "corpus_info.json"
    # train_gpu refuses it, naming the flag (the original's name) and the file
    with pytest.raises(ConfigError, match=f"^--train_batch_size=8 contradicts the records: bsz_per_host=4 in "
                                          f"{info_path}$"):
        _train(save_dir_made, {"train_batch_size": 8})
    assert _train(save_dir_made, {"seq_len": 32})["seq_len"] == 32  # one that agrees is fine
    # dump takes it (to look at records as if made otherwise)
    dump = _dump(save_dir_made, {"bi_data": True, "num_core_per_host": None})
    assert (dump.settings.values["bi_data"], dump.settings.sources["bi_data"]) == (True, "flag")
    assert dump.settings.sources["num_core_per_host"] == "corpus_info.json"
    # export_hf refuses it, in its own words
    run_config = {"uncased": True, "keep_accents": True}
    with pytest.raises(ConfigError, match="^--nokeep_accents contradicts the records the model was trained on: "
                                          "keep_accents=true in rc.json; drop the flag"):
        settings.tokenizer_settings("rc.json", run_config, {"keep_accents": False})
    # what nothing records: the flag, else False (export_hf); the defaults, else a one-line need (train_gpu)
    assert settings.tokenizer_settings("rc.json", {"uncased": False}, {"keep_accents": True}) == \
        {"uncased": False, "keep_accents": True}
    assert settings.tokenizer_settings("rc.json", None, {}) == {"uncased": False, "keep_accents": False}


def test_without_corpus_info_dump_falls_back_to_the_file_name_and_train_gpu_to_its_flags(save_dir_made,
                                                                                        tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    os.symlink(save_dir_made / "tfrecords", bare / "tfrecords")
    dump = _dump(bare)
    assert dump.settings.corpus_info is None
    assert {key: dump.settings.values[key] for key in ("seq_len", "reuse_len", "bsz_per_host", "bi_data")} == \
        {key: MADE_WITH[key] for key in ("seq_len", "reuse_len", "bsz_per_host", "bi_data")}
    assert dump.settings.sources["seq_len"] == "file name"
    assert dump.keep_accents_text() == "unknown (no corpus_info.json)"
    with pytest.raises(ConfigError, match=r"^--train_batch_size, --seq_len, --reuse_len needed: no corpus_info.json "):
        _train(bare)
    given = {"train_batch_size": 4, "seq_len": 32, "reuse_len": 16}
    assert _train(bare, given) == {"bsz_per_host": 4, "seq_len": 32, "reuse_len": 16, "num_predict": None,
                                   "vocab_size": 32000, **{key: TRAIN_DEFAULTS[key] for key in (
                                       "bi_data", "mask_alpha", "mask_beta", "uncased", "keep_accents",
                                       "num_core_per_host")}}


def test_several_record_dirs_must_agree(save_dir_made, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(save_dir_made, other)
    info = CorpusInfo.read(str(other / "corpus_info.json"))
    dataclasses.replace(info, mask_alpha=5).write(str(other / "corpus_info.json"))
    # (find_record_dirs would refuse this corpus_info against its records' names: the resolver's own check)
    second = settings.RecordDir(str(other / "tfrecords"), str(other / "corpus_info.json"),
                                CorpusInfo.read(str(other / "corpus_info.json")))
    with pytest.raises(ConfigError, match=f"^--record_info_dir: the records disagree: mask_alpha=6 in "
                                          f"{save_dir_made / 'corpus_info.json'}, mask_alpha=5 in {second.corpus_info_path}$"):
        settings.train_settings(settings.find_record_dirs(str(save_dir_made)) + [second], {}, {})
