"""create's command line: invalid flags and inputs stop with one clear line before anything is written."""

import pytest
from conftest import ROOT, XLNET_SPM, needs_shared, run_module

SAMPLE_GLOB = str(ROOT / "sample_corpus" / "*.txt")


def base_flags(tmp_path, **overrides):
    flags = {"input_glob": SAMPLE_GLOB, "sp_path": XLNET_SPM, "save_dir": tmp_path / "out", "seq_len": 64,
             "reuse_len": 32, "bsz_per_host": 4, "num_core_per_host": 1, "num_predict": 10}
    flags.update(overrides)
    return [f"--{k}={v}" for k, v in flags.items()]


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@needs_shared
@pytest.mark.parametrize("overrides, fragments", [
    ({"reuse_len": 61}, ["--reuse_len=61", "seq_len - 3"]),
    ({"bsz_per_host": 6, "num_core_per_host": 2, "use_tpu": True}, ["--bsz_per_host=6", "divisible"]),
    ({"bsz_per_host": 3, "bi_data": True, "use_tpu": False}, ["--bsz_per_host=3", "bi_data"]),
    ({"mask_alpha": 1, "mask_beta": 2}, ["--mask_alpha=1", "--mask_beta=2"]),
    ({"num_predict": 70}, ["--num_predict=70", "does not fit"]),
    ({"input_glob": "/nonexistent/*.txt"}, ["no file matches", "/nonexistent/*.txt"]),
    ({"sp_path": "/nonexistent.model"}, ["not found", "/nonexistent.model"]),
    ({"sp_path": SAMPLE_GLOB.replace("*.txt", "README.md")}, ["cannot load SentencePiece model"]),
    ({"task": 2, "num_task": 2}, ["--task=2"]),
    ({"no_such_flag": 1}, ["no_such_flag"]),
])
def test_invalid_flags_stop_before_writing(tmp_path, overrides, fragments):
    result = run_module("xlnet_data.create", *base_flags(tmp_path, **overrides))
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_model_without_xlnet_special_ids_is_refused(tmp_path):
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(input=SAMPLE_GLOB.replace("*.txt", "austen_emma.txt"),
                                   model_prefix=str(tmp_path / "plain"), vocab_size=500, minloglevel=2)
    result = run_module("xlnet_data.create", *base_flags(tmp_path, sp_path=tmp_path / "plain.model"))
    assert_one_line_error(result, "does not have XLNet's special ids", "<cls>", "spm_train")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_shared
def test_reuse_len_other_than_half_is_supported(tmp_path):
    """The original asserts reuse_len == seq_len/2; we split num_predict over the two parts as usual."""
    from conftest import read_save_dir
    result = run_module("xlnet_data.create", *base_flags(tmp_path, seq_len=64, reuse_len=16, num_predict=13,
                                                          bi_data=True, use_tpu=False), "--num_workers=1")
    assert result.returncode == 0, result.stderr
    examples = next(iter(read_save_dir(tmp_path / "out", seq_len=64).values()))
    assert len(examples) > 100
    for ex in examples:
        assert ex["is_masked"][:16].sum() == 7 and ex["is_masked"][16:].sum() == 6
        np_input, target = ex["input"], ex["target"]
        assert (target[:15] == np_input[1:16]).all()  # memory targets are the next tokens
        assert list(np_input[-1:]) == [3] and ex["seg_id"][-1] == 2


def test_help_explains_every_flag():
    result = run_module("xlnet_data.create", "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("bsz_per_host", "num_core_per_host", "seq_len", "reuse_len", "uncased", "bi_data", "mask_alpha",
                 "mask_beta", "use_eod", "from_raw_text", "num_predict", "input_glob", "sp_path", "save_dir",
                 "split", "pass_id", "num_task", "task", "num_passes", "num_workers", "span_unit", "overwrite"):
        assert f"{flag}:" in result.stdout + result.stderr, flag
