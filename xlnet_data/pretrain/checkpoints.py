"""Checkpoints: the one writer and reader, name-based as the original's tf.train.Saver.

The model's variables keep their original names ("model/transformer/layer_0/rel_attn/q/kernel", ...),
training adds "<name>/adam_m", "<name>/adam_v" and "global_step"; so the original code loads ours and
we load the original's. A directory's `checkpoint` file (the CheckpointState text proto) lists the
checkpoints, the latest last, with paths relative to it so that the directory can be moved.
"""

import contextlib
import json
import os
from collections.abc import Mapping
from typing import Optional

import numpy as np
import tensorflow as tf

from xlnet_data.common.errors import UserError


class CheckpointMismatchError(UserError, ValueError):
    """A checkpoint lacks a variable the model needs, or holds it with another shape."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permission, ...); nothing of it is left behind."""


def _reason(err: Exception) -> str:
    """The cause in a TensorFlow error's message without its op decoration ("No space left on device")."""
    if isinstance(err, tf.errors.OpError):
        return err.message.split("; ")[-1].split(" [Op:")[0].strip()
    return getattr(err, "strerror", None) or str(err)


def save(prefix: str, tensors: Mapping[str, tf.Tensor], max_save: Optional[int] = None) -> str:
    """Writes `tensors` under their names as checkpoint `prefix` (e.g. "out/model.ckpt-100") and lists it
    last in the directory's `checkpoint` file; with `max_save`, only the newest max_save stay (older ones
    are deleted). Returns the prefix."""
    directory = os.path.dirname(os.path.abspath(prefix))
    state_path = os.path.join(directory, "checkpoint")
    try:
        tf.io.gfile.makedirs(directory)
        names = list(tensors)
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[tf.convert_to_tensor(tensors[name]) for name in names])
        state = tf.train.get_checkpoint_state(directory)
        previous = [os.path.basename(p) for p in state.all_model_checkpoint_paths] if state else []
        name = os.path.basename(prefix)
        kept = [p for p in previous if p != name] + [name]
        if max_save is not None:
            kept = kept[-max_save:]
        lines = [f"model_checkpoint_path: {json.dumps(kept[-1])}"]
        lines += [f"all_model_checkpoint_paths: {json.dumps(p)}" for p in kept]
        with tf.io.gfile.GFile(state_path + ".tmp", "w") as fp:
            fp.write("\n".join(lines) + "\n")
        tf.io.gfile.rename(state_path + ".tmp", state_path, overwrite=True)
    except (tf.errors.OpError, OSError) as err:
        # SaveV2 writes under temporary names (….tempstate…) and renames at the end: remove whatever of this
        # checkpoint exists, so that neither a partial file nor an unlisted checkpoint is left behind.
        with contextlib.suppress(tf.errors.OpError, OSError):
            for path in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(state_path + ".tmp"):
                tf.io.gfile.remove(path)
        raise CheckpointWriteError(f"cannot write checkpoint {prefix}: {_reason(err)}") from None
    for old in set(previous) - set(kept):
        for path in tf.io.gfile.glob(os.path.join(directory, old) + ".*"):
            tf.io.gfile.remove(path)
    return prefix


def _shape_problems(found: Mapping[str, tuple], wanted: Mapping[str, tuple], required: bool) -> list[str]:
    problems = []
    for name, want in wanted.items():
        if name not in found:
            if required:
                problems.append(f"{name}: missing (expected shape {list(want)})")
        elif tuple(found[name]) != tuple(want):
            problems.append(f"{name}: expected shape {list(want)}, found {list(found[name])}")
    return problems


def load(path: str, variables: Mapping[str, tf.Variable], *, required: bool = True) -> list[str]:
    """Assigns each variable the checkpoint's tensor of the same name; returns the names assigned.

    `path` is a checkpoint prefix (".../model.ckpt") or a directory with a `checkpoint` file; other
    tensors in it are ignored. With `required`, nothing is assigned unless every variable is there with
    its shape, else CheckpointMismatchError lists the offenders; without, the ones present are assigned.
    """
    reader = tf.train.load_checkpoint(path)
    found = reader.get_variable_to_shape_map()
    problems = _shape_problems(found, {name: tuple(var.shape) for name, var in variables.items()}, required)
    if problems:
        raise CheckpointMismatchError(f"checkpoint {path} does not fit the model: " + "; ".join(problems))
    assigned = [name for name in variables if name in found]
    for name in assigned:
        variables[name].assign(tf.cast(reader.get_tensor(name), variables[name].dtype))
    return assigned


def read(path: str, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The checkpoint's tensors of these names as float32 arrays, each checked against its shape
    (CheckpointMismatchError lists the missing and misshapen ones). `path` as for `load`."""
    reader = tf.train.load_checkpoint(path)
    problems = _shape_problems(reader.get_variable_to_shape_map(), shapes, required=True)
    if problems:
        raise CheckpointMismatchError(f"checkpoint {path} does not fit the model: " + "; ".join(problems))
    return {name: np.asarray(reader.get_tensor(name), dtype=np.float32) for name in shapes}


def read_prefixed(path: str, prefix: str) -> dict[str, np.ndarray]:
    """The checkpoint's tensors whose names start with `prefix`, as arrays (state that is not a variable,
    such as training's memories); {} when it has none."""
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if name.startswith(prefix)}


def listed(model_dir: str) -> list[str]:
    """The checkpoint prefixes model_dir's `checkpoint` file lists, oldest first ([] without one), as paths that
    resolve from here: a relative entry (ours) is model_dir's, and an absolute one that is gone while model_dir
    holds a checkpoint of its name (a directory the original's Saver wrote, since moved) is that one."""
    state = tf.train.get_checkpoint_state(model_dir)
    if not state:
        return []
    # get_checkpoint_state has already joined the relative entries to model_dir: joined again, a relative
    # model_dir ("models/m") would name models/m/models/m/model.ckpt-5.
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    return [_found_here(model_dir, path) for path in paths]


def _found_here(model_dir: str, path: str) -> str:
    here = os.path.join(model_dir, os.path.basename(path))
    if here != path and not tf.io.gfile.exists(path + ".index") and tf.io.gfile.exists(here + ".index"):
        return here
    return path


def unreadable(path: str) -> Optional[str]:
    """Why checkpoint `path` cannot be read whole (its index or a tensor of its data), or None when it can."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, OSError, IndexError) as err:  # IndexError: a .data file cut short
        return _reason(err)
    return None


def latest(model_dir: str) -> Optional[str]:
    """The newest checkpoint prefix listed in model_dir (as `listed` resolves it), or None."""
    paths = listed(model_dir)
    return paths[-1] if paths else None
