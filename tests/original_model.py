"""Evaluates the original XLNet graph on the model goldens' checkpoints and features, on this machine.

usage: XLNET_REF=DIR python tests/original_model.py OUT_DIR CASE...
For each case of ../shared/golden_model, the original's two_stream_loss (function_builder.get_loss:
XLNetModel + lm_loss) is built under TF2 compat.v1 with ../shared/tools/original_train_step.py's shims,
the golden checkpoint restored, and two steps run as the goldens were made (step 1 fed step 0's new
memories). Writes OUT_DIR/CASE.npz with the keys of the golden's expected.npz. The stored values were
computed on another CPU; this run says what the original gives here (see ../shared/README.md,
"Tolerances across CPUs").
"""

import json
import os
import runpy
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared"
FEATURE_KEYS = ["input_k", "input_q", "seg_id", "perm_mask", "target", "target_mask", "target_mapping", "label"]


def evaluate(original, case_dir, out_path):
    v1, function_builder = original["v1"], original["function_builder"]
    config = json.loads(Path(case_dir, "xlnet_config.json").read_text())
    run = json.loads(Path(case_dir, "run_config.json").read_text())
    features = np.load(Path(case_dir, "features.npz"))
    flags = types.SimpleNamespace(
        **config, use_tpu=False, use_bfloat16=False, dropout=0.0, dropatt=0.0, init="normal", init_range=0.1,
        init_std=0.02, mem_len=run["mem_len"], reuse_len=run["reuse_len"], bi_data=run["bi_data"],
        clamp_len=run["clamp_len"], same_length=run["same_length"], num_predict=run["num_predict"],
        model_dir=tempfile.mkdtemp())
    graph = v1.Graph()
    with graph.as_default():
        placeholders = {key: v1.placeholder(features[f"{key}_0"].dtype, features[f"{key}_0"].shape)
                        for key in FEATURE_KEYS}
        mems_in = [v1.placeholder(v1.float32, features[f"mems_in_0_{layer}"].shape)
                   for layer in range(config["n_layer"])]
        total_loss, new_mems, _ = function_builder.get_loss(flags, placeholders, None, {"mems": mems_in}, False)
        # lm_loss's per-token cross entropy (flat, [num_predict * bsz]): get_loss returns only its masked mean
        token_loss = v1.reshape(next(op for op in graph.get_operations()
                                     if op.type == "SparseSoftmaxCrossEntropyWithLogits").outputs[0],
                                [run["num_predict"], -1])
        with v1.Session(graph=graph) as sess:
            v1.train.Saver(var_list=v1.trainable_variables()).restore(sess, str(Path(case_dir, "model.ckpt")))
            mems = [features[f"mems_in_0_{layer}"] for layer in range(config["n_layer"])]
            out = {}
            for step in range(2):
                feed = {placeholders[key]: features[f"{key}_{step}"] for key in FEATURE_KEYS}
                feed.update(zip(mems_in, mems))
                loss, tokens, mems = sess.run([total_loss, token_loss, new_mems["mems"]], feed_dict=feed)
                out[f"total_loss_{step}"] = loss
                out[f"token_loss_{step}"] = tokens.T
                for layer, mem in enumerate(mems):
                    out[f"new_mems_{step}_{layer}"] = mem
    np.savez(out_path, **out)


def main(out_dir, cases):
    # original_train_step.py, loaded without running its main: its shims and the original's function_builder
    original = runpy.run_path(str(SHARED / "tools" / "original_train_step.py"), run_name="original_train_step")
    os.makedirs(out_dir, exist_ok=True)
    for case in cases:
        evaluate(original, SHARED / "golden_model" / case, Path(out_dir, f"{case}.npz"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
