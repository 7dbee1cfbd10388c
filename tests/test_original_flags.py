"""create and train_gpu accept every flag of the original data_utils.py and train_gpu.py, with its default,
except the differences docs/create.md and docs/pretraining.md list."""

import ast
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, XLNET_REF, needs_original

pytestmark = needs_original

# flag: (the original's default, ours), as docs/pretraining.md and docs/create.md say.
CREATE_DIFFERENCES = {"task": (0, None)}  # unset: every task of --num_task
TRAIN_DIFFERENCES = {
    # data flags: they default to the records' corpus_info.json; these defaults apply without one
    "train_batch_size": (16, None), "seq_len": (0, None), "reuse_len": (0, None),
    "num_core_per_host": (8, 1),  # the records' layout (the original split the batch over this many GPUs)
    "num_passes": (1, None),  # unset: every pass of the records
    "d_embed": (32, None),  # the original's model never read it; given, it must equal d_model
}


def original_flags(script):
    """{flag: default} of the flags a script of the original defines (read from its source)."""
    out = {}
    for node in ast.walk(ast.parse((XLNET_REF / script).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "").startswith("DEFINE_"):
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            default = default if default is not None else node.args[1]
            out[node.args[0].value] = ast.literal_eval(default)
    return out


def our_flags(module):
    """{flag: default} of a command of ours (a fresh process: absl's FLAGS is global)."""
    code = (f"import json; from absl import flags; from xlnet_data import {module} as m; m.define_flags(); "
            "print(json.dumps({n: flags.FLAGS[n].default for n in flags.FLAGS}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("module, script, differences", [
    ("create", "data_utils.py", CREATE_DIFFERENCES), ("train_gpu", "train_gpu.py", TRAIN_DIFFERENCES)])
def test_every_flag_of_the_original_is_accepted_with_its_default(module, script, differences):
    theirs, ours = original_flags(script), our_flags(module)
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"{module} lacks the original's flags {missing}"
    differing = {name: (theirs[name], ours[name]) for name in theirs if theirs[name] != ours[name]}
    assert differing == differences


def test_train_gpu_flag_defaults_are_the_config_classes_defaults():
    """train_gpu takes its flag defaults from the config classes (stated once, there): every field of a config
    class that has a default and a flag of its name shares the flag's default (and so, by the test above, the
    original's); the data flags fall back to InputConfig's where the records have no corpus_info.json."""
    import dataclasses

    from xlnet_data.dataformat import settings
    from xlnet_data.pretrain.config import InputConfig, RunConfig, TrainConfig, XLNetConfig

    ours = our_flags("train_gpu")
    # train_gpu resolves these before the config: the dev split beside the records, every --iterations steps.
    resolved = {"eval_record_info_dir", "eval_every"}
    compared = 0
    for cls in (TrainConfig, RunConfig, XLNetConfig, InputConfig):
        for field in dataclasses.fields(cls):
            if field.name in ours and field.name not in resolved and field.default is not dataclasses.MISSING and (
                    cls is InputConfig or field.name not in settings.TRAIN_FLAGS):
                flag = ours[field.name]
                assert (tuple(flag) if isinstance(flag, list) else flag) == field.default, (cls.__name__, field.name)
                compared += 1
    assert compared >= 40


def test_train_gpu_defines_its_flags_without_loading_tensorflow():
    """The config classes hold no TensorFlow: a wrong flag is reported before it loads, and the Python API builds
    a TrainConfig without it."""
    code = ("import sys; import xlnet_data.pretrain.config; from xlnet_data import train_gpu, export_hf; "
            "train_gpu.define_flags(); "
            "import xlnet_data as xd; xd.TrainConfig; "
            "print(sorted(m for m in sys.modules if m.startswith('tensorflow')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout[-2000:] + out.stderr[-2000:]
