"""create against the original's outputs: every golden case must give identical records."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN, golden_flags, needs_shared, read_save_dir, record_infos, run_module

from xlnet_data.dataformat.corpus_info import FORMAT_VERSION

CASES = sorted(p.name for p in GOLDEN.glob("g*")) if GOLDEN.is_dir() else []


def assert_same_records(expected_dir, actual_dir):
    expected, actual = read_save_dir(expected_dir), read_save_dir(actual_dir)
    assert sorted(actual) == sorted(expected)
    for name, want in expected.items():
        got = actual[name]
        assert len(got) == len(want), name
        for index, (a, b) in enumerate(zip(got, want)):
            for feature in b:
                np.testing.assert_array_equal(a[feature], b[feature], err_msg=f"{name} record {index} {feature}")
    assert record_infos(actual_dir) == record_infos(expected_dir)


# corpus_info.json's keys that the original does not write (see dataformat/corpus_info.py).
OUR_KEYS = ("keep_accents", "format_version", "input_counts")


def assert_same_corpus_info(expected_dir, actual_dir):
    path = Path(expected_dir, "corpus_info.json")
    if not path.exists():  # the original writes it from task 0 only
        assert not Path(actual_dir, "corpus_info.json").exists()
        return
    want = json.loads(path.read_text())
    got = json.loads(Path(actual_dir, "corpus_info.json").read_text())
    # The original's keys in its order (`want` may be ours: another runner's), then ours.
    assert [key for key in got if key not in OUR_KEYS] == [key for key in want if key not in OUR_KEYS]
    ours = [key for key in got if key in OUR_KEYS]
    assert ours[:2] == ["keep_accents", "format_version"] and list(got)[-len(ours):] == ours, list(got)
    assert got["format_version"] == FORMAT_VERSION
    for key in want:
        if key not in ("vocab_size", "sp_path", "input_glob"):
            assert got[key] == want[key], key
    assert got["vocab_size"] == 32000  # the model's real size (the original hard-codes 32000)


@needs_shared
@pytest.mark.parametrize("case", CASES)
def test_golden_case_is_identical(case, tmp_path):
    case_dir = GOLDEN / case
    # --keep_cache: every unit reads its task's stream from the token cache on disk (mapped), as a run of several
    # passes does; a one-pass run's in-memory stream gives the same (test_token_cache).
    result = run_module("xlnet_data.create", *golden_flags(case_dir), f"--save_dir={tmp_path}", "--num_workers=1",
                        "--keep_cache", cwd=case_dir)
    assert result.returncode == 0, result.stderr
    assert_same_records(case_dir / "expected", tmp_path)
    assert_same_corpus_info(case_dir / "expected", tmp_path)


@pytest.mark.slow
@needs_shared
def test_num_passes_in_parallel_equals_pass_by_pass(tmp_path):
    """--num_passes=3 on two workers equals the original's three runs with --pass_id=0,1,2 (g6)."""
    case_dir = GOLDEN / "g6_num_passes"
    result = run_module("xlnet_data.create", *golden_flags(case_dir), f"--save_dir={tmp_path}", "--num_workers=2",
                        cwd=case_dir)
    assert result.returncode == 0, result.stderr
    assert_same_records(case_dir / "expected", tmp_path)
