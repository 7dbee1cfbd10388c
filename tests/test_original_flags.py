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
    """Flags and dataclass fields of one name share a default (train_gpu restates them: taking them from the
    classes would import TensorFlow before a wrong flag is reported); the data flags default to the records'."""
    import dataclasses

    from xlnet_data import train_gpu
    from xlnet_data.dataformat import settings
    from xlnet_data.pretrain.inputs import InputConfig
    from xlnet_data.pretrain.modeling import RunConfig
    from xlnet_data.pretrain.training import TrainConfig

    ours = our_flags("train_gpu")
    compared = 0
    for cls in (TrainConfig, RunConfig):
        for field in dataclasses.fields(cls):
            if field.name in ours and field.name not in settings.TRAIN_FLAGS and \
                    field.default is not dataclasses.MISSING:
                flag = ours[field.name]
                assert (tuple(flag) if isinstance(flag, list) else flag) == field.default, (cls.__name__, field.name)
                compared += 1
    assert compared >= 25
    # Without a corpus_info.json the data flags fall back to the input pipeline's defaults.
    inputs = {field.name: field.default for field in dataclasses.fields(InputConfig)}
    fallbacks = {name: value for name, value in train_gpu._DATA_DEFAULTS.items() if name in inputs}
    assert len(fallbacks) == 5 and fallbacks == {name: inputs[name] for name in fallbacks}
