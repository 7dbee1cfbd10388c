"""Runs the original data_utils.py on many create cases in one process, so TensorFlow is imported once.

usage: XLNET_REF=DIR python tests/original_oracle.py CASES.json
CASES.json is a list of {"flags": {the original's flags}, "save_dir": DIR}, one task and one pass each.
The original is loaded through ../shared/tools/run_original.py (its shims for TF2, numpy 2 and protobuf 5),
and Python's `random` is seeded before each case as that script seeds it (100 * task + pass_id). A case that
raises writes the exception as one line to save_dir/ORIGINAL_ERROR-{task}-{pass_id}; the others still run.
"""

import json
import os
import random
import runpy
import sys
import traceback
import types
from pathlib import Path

RUN_ORIGINAL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "run_original.py"
ERROR_PREFIX = "ORIGINAL_ERROR"

# The original's flags and their defaults (data_utils.py's __main__ defines them; loaded as a module it has none).
DEFAULTS = dict(use_tpu=True, bsz_per_host=32, num_core_per_host=8, seq_len=512, reuse_len=256, uncased=True,
                bi_data=True, mask_alpha=6, mask_beta=1, use_eod=True, from_raw_text=True, num_predict=85,
                input_glob="data/example/*.txt", sp_path="", save_dir="proc_data/example", split="train",
                pass_id=0, num_task=1, task=0)


def load_data_utils():
    """data_utils.py's globals, loaded by run_original.py (its shims applied) but not run as a script."""
    real_run_path = runpy.run_path
    loaded = {}

    def load_as_module(path, run_name=None, **kwargs):
        loaded.update(real_run_path(path, run_name="xlnet_original_data_utils"))
        return loaded

    runpy.run_path = load_as_module
    argv = sys.argv
    try:
        sys.argv = [str(RUN_ORIGINAL)]
        real_run_path(str(RUN_ORIGINAL), run_name="__main__")
    finally:
        runpy.run_path, sys.argv = real_run_path, argv
    return loaded["create_data"].__globals__  # the namespace its functions read FLAGS from


def main(cases_path):
    data_utils = load_data_utils()
    data_utils["tf"].logging.set_verbosity(data_utils["tf"].logging.ERROR)
    for case in json.loads(Path(cases_path).read_text()):
        flags = types.SimpleNamespace(**{**DEFAULTS, **case["flags"], "save_dir": case["save_dir"]})
        data_utils["FLAGS"] = flags
        random.seed(100 * flags.task + flags.pass_id)
        try:
            data_utils["create_data"](None)
        except Exception as err:  # recorded for the test to judge
            where = traceback.extract_tb(err.__traceback__)[-1]
            os.makedirs(case["save_dir"], exist_ok=True)
            Path(case["save_dir"], f"{ERROR_PREFIX}-{flags.task}-{flags.pass_id}").write_text(
                f"{type(err).__name__}: {err} at {os.path.basename(where.filename)}:{where.lineno} {where.line}"
                .replace("\n", " "))


if __name__ == "__main__":
    main(sys.argv[1])
