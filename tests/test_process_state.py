"""The Python API leaves the caller's process as it found it (issue 25): create_records run in-process
(num_workers=1) and train change no logging configuration, no glibc malloc setting and no TensorFlow
process setting (Grappler's options, TF32); importing the package leaves numba's cache folder alone. The
commands and the worker processes make those settings for themselves."""

import logging
import os

import numba
import pytest
from conftest import SAMPLE_CORPUS

from xlnet_data.common import compiled, memory
from xlnet_data.dataformat.examples import loop
from xlnet_data.datagen import local_runner
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records


def _logging_state():
    root = logging.getLogger()
    return list(root.handlers), root.level


@pytest.mark.slow
def test_create_records_and_train_in_process_leave_the_process_settings_alone(sample_spm, tmp_path, monkeypatch):
    # No handler on the root logger, as in a plain script or notebook: logging.basicConfig would add one.
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)
    process_settings = []  # glibc's mallopt has no getter: the call that makes it is watched instead
    monkeypatch.setattr(memory, "release_large_blocks_promptly", lambda: process_settings.append("mallopt"))
    text_dir = tmp_path / "text"
    text_dir.mkdir()
    lines = (SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:40]
    (text_dir / "emma.txt").write_text("\n".join(lines) + "\n")
    logging_before = _logging_state()

    config = CreateConfig(input_glob=str(text_dir / "*.txt"), sp_path=str(sample_spm), save_dir=str(tmp_path / "s"),
                          seq_len=64, reuse_len=32, bsz_per_host=8, num_predict=10, bi_data=True,
                          num_core_per_host=1, uncased=True).validate()
    summary = create_records(config, num_workers=1)
    assert sum(unit.num_batch for unit in summary.units) > 2  # it ran, in this process
    assert _logging_state() == logging_before
    assert process_settings == []

    import tensorflow as tf
    from test_train import tiny_config

    from xlnet_data.pretrain import training as T

    tf.config.optimizer.set_experimental_options({"constant_folding": True})  # a caller's own setting
    tf.config.experimental.enable_tensor_float_32_execution(True)
    grappler_before = tf.config.optimizer.get_experimental_options()
    try:
        cfg = tiny_config(config.save_dir, tmp_path / "model", train_steps=2, iterations=1, warmup_steps=0)
        with T.sum_in_graph_order():  # within the block it is off, as the repeatability tests need
            assert tf.config.optimizer.get_experimental_options()["arithmetic_optimization"] is False
        assert tf.config.optimizer.get_experimental_options() == grappler_before
        result = T.train(cfg)
        assert result.step == 2
        assert tf.config.optimizer.get_experimental_options() == grappler_before
        assert "arithmetic_optimization" not in tf.config.optimizer.get_experimental_options()
        assert tf.config.experimental.tensor_float_32_execution_enabled()  # cfg.tf32 is False
        assert _logging_state() == logging_before
    finally:
        tf.config.optimizer.set_experimental_options({"constant_folding": None})
    local_runner._init_process()  # what a worker process runs (last: it configures logging)
    assert process_settings == ["mallopt"]  # the watched call is the one that sets glibc's threshold


def test_the_compiled_code_cache_is_set_per_function_not_for_the_process():

    assert numba.config.CACHE_DIR == os.environ.get("NUMBA_CACHE_DIR", "")  # numba's own, from the environment
    assert loop._write_steps._cache._cache_path.startswith(compiled.CACHE_DIR + os.sep)
