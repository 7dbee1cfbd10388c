"""docs/python-api.md's example runs as written, as a plain script (no __main__ guard), and the API's configs
refuse values of the wrong type with one ConfigError line."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, SAMPLE_CORPUS

import xlnet_data as xd
from xlnet_data.common.errors import ConfigError, UserError
from xlnet_data.pretrain.config import InputConfig, RunConfig, XLNetConfig

# The page's sizes are a user's; the test's are small. Each must be on the page exactly once (else the test
# would not run what the page shows).
SMALLER = {"vocab_size=8000": "vocab_size=1000", "n_token=8000": "n_token=1000", "train_steps=1000": "train_steps=2",
           "n_layer=6": "n_layer=1"}


def page_blocks() -> list[str]:
    """The page's code blocks (the records made, then trained on), with SMALLER's sizes."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "python-api.md").read_text(), re.S)
    assert len(blocks) == 2
    script = "\0".join(blocks)
    for page, test in SMALLER.items():
        assert script.count(page) == 1, page
        script = script.replace(page, test)
    return script.split("\0")


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory):
    """The page's first block run as a plain script (without a __main__ guard) in a folder with corpus/a.txt and
    b.txt: (the folder, the script's run)."""
    folder = tmp_path_factory.mktemp("page")
    (folder / "corpus").mkdir()
    for name, book in (("a", "austen_emma"), ("b", "austen_persuasion")):
        shutil.copy(SAMPLE_CORPUS / f"{book}.txt", folder / "corpus" / f"{name}.txt")
    (folder / "example.py").write_text(page_blocks()[0] + 'print("the script ran to its end")\n')
    done = subprocess.run([sys.executable, "example.py"], cwd=folder, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return folder, done


@pytest.mark.slow
def test_the_pages_example_runs_as_a_plain_script(page_dir):
    """Spawned workers (create_records' two, train_sentencepiece's one) do not run the unguarded script again:
    it runs once, to its end."""
    _, done = page_dir
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("the script ran to its end") == 1
    assert re.search(r"^done: 2 unit\(s\), \d+ tokens \(\d+ encoded, once for all passes\), \d+ records", done.stdout, re.M)


@pytest.mark.slow
def test_the_pages_train_config_trains_on_the_records_of_its_create_config(page_dir, monkeypatch):
    folder, done = page_dir
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.chdir(folder)
    exec(page_blocks()[1], {"xd": xd})  # the page's second block continues its first
    assert (folder / "models" / "my" / "checkpoint").is_file()


def test_a_setting_that_contradicts_the_records_is_named(page_dir):
    """InputConfig's defaults are the original train_gpu.py's (uncased=False), create's are the original
    data_utils.py's (uncased=True): xd.train says which setting differs, before any TensorFlow work."""
    from xlnet_data.pretrain.layout import check_records
    folder, _ = page_dir
    page = dict(record_info_dir=str(folder / "proc_data/my/tfrecords"), model_dir=str(folder / "m"),
                model=XLNetConfig(n_layer=1, n_token=1000), run=RunConfig(reuse_len=64, bi_data=True))
    data = dict(seq_len=128, reuse_len=64, perm_size=64, bsz_per_host=8, num_predict=21)
    with pytest.raises(ConfigError, match=r"^InputConfig.uncased=False contradicts the records: uncased=True in "
                                          r".*proc_data/my/corpus_info.json; set it to the records' value$"):
        check_records(xd.TrainConfig(**page, data=InputConfig(**data)))
    with pytest.raises(ConfigError, match=r"^XLNetConfig.n_token=32000 contradicts the records: vocab_size=1000"):
        check_records(xd.TrainConfig(**{**page, "model": XLNetConfig(n_layer=1)}, data=InputConfig(**data,
                                                                                                   uncased=True)))


@pytest.mark.slow
def test_train_takes_a_save_dir_as_train_gpu_does_and_a_folder_without_records_is_one_user_error(page_dir,
                                                                                                tmp_path):
    folder, _ = page_dir
    page = dict(model=XLNetConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=1000),
                run=RunConfig(reuse_len=64, bi_data=True), train_steps=1,
                data=InputConfig(seq_len=128, reuse_len=64, perm_size=64, bsz_per_host=8, num_predict=21,
                                 uncased=True))
    assert xd.train(xd.TrainConfig(record_info_dir=str(folder / "proc_data/my"), model_dir=str(tmp_path / "m"),
                                   **page)).step == 1
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=rf"^no record_info file matches {tmp_path}/empty/record_info-train-.*: give a "
                                        r"save_dir of create \(or its tfrecords/ folder\) made with these data "
                                        r"settings$"):
        xd.train(xd.TrainConfig(record_info_dir=str(tmp_path / "empty"), model_dir=str(tmp_path / "m2"), **page))


def _train_config(**changes):
    fields = dict(record_info_dir="r", model_dir="m", model=XLNetConfig(), run=RunConfig(reuse_len=4),
                  data=InputConfig(seq_len=8, reuse_len=4, perm_size=4, bsz_per_host=2, bi_data=False))
    return xd.TrainConfig(**{**fields, **changes})


@pytest.mark.parametrize("make, line", [
    (lambda: xd.CreateConfig(seq_len="128"), "CreateConfig: seq_len='128' must be an integer"),
    (lambda: xd.CreateConfig(input_glob=["a.txt", "b.txt"]), "CreateConfig: input_glob=['a.txt', 'b.txt'] must be a "
                                                              "string"),
    (lambda: xd.CreateConfig(num_passes=2.0), "CreateConfig: num_passes=2.0 must be an integer or None"),
    (lambda: xd.SpmTrainConfig(input_files=("a.txt",), model_prefix="m", vocab_size="1000"),
     "SpmTrainConfig: vocab_size='1000' must be an integer"),
    (lambda: xd.SpmTrainConfig(input_files=("a.txt", 3), model_prefix="m"),
     "SpmTrainConfig: input_files=('a.txt', 3) must be a tuple of strings"),
    (lambda: _train_config(train_steps="3"), "TrainConfig: train_steps='3' must be an integer"),
    (lambda: _train_config(learning_rate="1e-4"), "TrainConfig: learning_rate='1e-4' must be a number"),
    (lambda: _train_config(model={"n_layer": 2}), "TrainConfig: model={'n_layer': 2} must be of type XLNetConfig"),
    (lambda: InputConfig(seq_len=8, reuse_len=4, perm_size=4, bsz_per_host=2, bi_data="no"),
     "InputConfig: bi_data='no' must be True or False"),
])
def test_a_value_of_the_wrong_type_is_one_config_error(make, line):
    with pytest.raises(ConfigError) as err:
        make()
    assert str(err.value) == line


def test_a_run_config_that_contradicts_the_data_config_names_both():
    with pytest.raises(ConfigError, match=r"^RunConfig\(reuse_len=2, bi_data=False\) must be the data's: "
                                          r"InputConfig\(reuse_len=4, bi_data=False\)$"):
        _train_config(run=RunConfig(reuse_len=2))


def test_plainly_meant_values_are_taken_as_the_type(tmp_path):
    import numpy as np
    config = xd.CreateConfig(seq_len=np.int64(128), save_dir=tmp_path / "out")
    assert type(config.seq_len) is int and config.save_dir == str(tmp_path / "out")
    assert xd.SpmTrainConfig(input_files=[tmp_path / "a.txt"], model_prefix="m").input_files == (str(tmp_path / "a.txt"),)
    assert _train_config(devices=["/cpu:0"], learning_rate=1).devices == ("/cpu:0",)
    flags = np.array([1, 0]) > 0  # a numpy bool, as an array of flags gives
    config = xd.CreateConfig(uncased=flags[1], bi_data=flags[0])
    assert (config.uncased, config.bi_data) == (False, True) and type(config.uncased) is bool
