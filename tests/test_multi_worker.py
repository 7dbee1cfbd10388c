"""train_gpu --strategy=multi_worker for real: two worker processes on this machine, TF_CONFIG on loopback ports.

The reference is one process with the same global batch over two replicas (MirroredStrategy on two
logical CPUs): the multi-worker run must give its losses step for step, write checkpoints and summaries
once (the chief), resume from its checkpoint, and end with one line when a worker dies.
"""

import glob
import json
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import fork_server, two_logical_cpus
from test_train import TINY_SHAPE, small_records  # noqa: F401 (small_records is a fixture)

WORKER_TIMEOUT_S = 600  # a bound for a hang, not a speed check: a loaded 2-core machine is slow
# A constant learning rate after warmup (min_lr_ratio 1), so a run stopped at step 3 and resumed to step 6 has
# the rates of one run of 6 steps; no memories, which a resumed run starts empty. One layer (the last --n_layer
# counts): what is checked is how the workers share the steps, not the model, and each worker traces it.
TRAIN_FLAGS = [*TINY_SHAPE, "--n_layer=1", "--mem_len=0", "--learning_rate=1e-3", "--warmup_steps=2", "--min_lr_ratio=1",
               "--iterations=1", "--save_steps=3"]

def write_reference_losses(losses_path, *flags):
    """Run in a fresh TensorFlow (two logical CPUs): train_gpu's config of `flags` trained on two replicas in one
    process, its losses written to losses_path."""
    from absl import flags as absl_flags

    from xlnet_data import train_gpu
    from xlnet_data.pretrain import training
    two_logical_cpus()
    train_gpu.define_flags()
    absl_flags.FLAGS(["train_gpu", *flags])
    losses = training.train(train_gpu.config_from_flags(),
                            strategy=tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])).losses
    with open(losses_path, "w") as f:
        json.dump(losses, f)


def free_loopback_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


class Worker:
    """One train_gpu process of a cluster, forked from the test process's one TensorFlow import (conftest.ForkServer:
    the module's twelve workers each paid their own, about 5 s of CPU, before their first step); its stderr goes to a
    file (`log`)."""

    def __init__(self, flags, tf_config, log_path):
        self.log_path = log_path
        self.process = fork_server().start("xlnet_data.train_gpu", ["--strategy=multi_worker", *flags], log_path,
                                           env={"TF_CONFIG": json.dumps(tf_config)})

    def log(self):
        return self.log_path.read_text()


def start_workers(flags, log_dir, count=2, extra_flags=None):
    """`count` train_gpu processes forming one cluster on loopback ports (worker 0 is the chief); worker i also
    gets extra_flags[i]."""
    log_dir.mkdir(exist_ok=True)
    workers = [f"127.0.0.1:{port}" for port in free_loopback_ports(count)]
    return [Worker([*flags, *(extra_flags or {}).get(index, [])],
                   {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}},
                   log_dir / f"worker{index}.log") for index in range(count)]


def finish(workers, timeout=WORKER_TIMEOUT_S):
    """[(return code, stderr)] of each worker; one still running after `timeout` is killed (return code -9)."""
    deadline = time.monotonic() + timeout
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
    return [(worker.process.returncode, worker.log()) for worker in workers]


def chief_losses(model_dir):
    """The per-step losses the chief wrote as TensorBoard scalars, in step order, from every events file."""
    losses = {}
    for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "loss":
                    losses[event.step] = tf.make_ndarray(value.tensor).item()
    return [losses[step] for step in sorted(losses)]


@pytest.fixture(scope="module")
def reference(small_records, tmp_path_factory):  # noqa: F811
    """One process, two replicas, the same global batch: the losses of 6 steps straight, which the workers' 3 steps
    and 3 more after resuming must give (a resume repeats a run bit for bit: test_train_faults' two-replica resume;
    TRAIN_FLAGS' constant rate makes a run of 3 steps the first 3 of 6)."""
    out = tmp_path_factory.mktemp("reference")
    flags = [f"--record_info_dir={small_records}", f"--model_dir={out / 'model'}", *TRAIN_FLAGS, "--train_steps=6"]
    result = fork_server().run("test_multi_worker", out / "losses.json", *flags, function="write_reference_losses",
                                  timeout=WORKER_TIMEOUT_S)  # forked from the test process's one TensorFlow import
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads((out / "losses.json").read_text())


@pytest.mark.slow
def test_two_workers_train_as_one_process_checkpoint_once_and_resume(small_records, reference, tmp_path):  # noqa: F811
    model_dir = tmp_path / "model"
    flags = [f"--record_info_dir={small_records}", f"--model_dir={model_dir}", *TRAIN_FLAGS]
    first = finish(start_workers([*flags, "--train_steps=3"], tmp_path / "first"))
    assert [code for code, _ in first] == [0, 0], first[0][1][-3000:] + first[1][1][-3000:]
    second = finish(start_workers([*flags, "--train_steps=6"], tmp_path / "second"))
    assert [code for code, _ in second] == [0, 0], second[0][1][-3000:] + second[1][1][-3000:]

    np.testing.assert_allclose(chief_losses(model_dir), reference, rtol=0, atol=1e-5)
    # Both workers resumed from the chief's checkpoint of step 3.
    for _, stderr in second:
        assert f"resumed from {model_dir}/model.ckpt-3 (step 3" in stderr, stderr[-3000:]
    # Only the chief wrote: its checkpoints, one events file per run.
    for (_, chief), (_, worker) in (first, second):
        assert "saved " in chief and "saved " not in worker
    names = sorted(os.listdir(model_dir))
    assert [name for name in names if not name.startswith("events.out.tfevents.")] == [  # the chief's lock, too
        ".train.lock", "checkpoint", "model.ckpt-3.data-00000-of-00001", "model.ckpt-3.index",
        "model.ckpt-6.data-00000-of-00001", "model.ckpt-6.index", "run_config.json", "xlnet_config.json"]
    assert len([name for name in names if name.startswith("events.out.tfevents.")]) == 2

    # A worker whose model_dir is not the chief's (no shared filesystem) would start from step 0: refused.
    split = start_workers([*flags, "--train_steps=9"], tmp_path / "split",
                          extra_flags={1: [f"--model_dir={tmp_path / 'not_shared'}"]})  # the last --model_dir counts
    for code, stderr in finish(split):
        assert code == 2 and stderr.strip().splitlines()[-1].startswith(
            "train: error: the workers start from different steps (6, 0, replica by replica)"), stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("lost, how", [(1, signal.SIGKILL), (0, signal.SIGKILL), (1, signal.SIGSTOP)])
def test_a_worker_that_dies_ends_the_others_with_one_line(small_records, tmp_path, lost, how):  # noqa: F811
    """Worker `lost` (1: a worker, 0: the chief) is killed, or stopped (it holds its connections open but stops
    answering: only the heartbeats tell), once training runs; the other must stop by itself."""
    flags = [f"--record_info_dir={small_records}", f"--model_dir={tmp_path / 'model'}", *TRAIN_FLAGS,
             "--train_steps=100000"]
    workers = start_workers(flags, tmp_path / "logs")
    survivor = workers[1 - lost]
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while "step 2 |" not in survivor.log():  # training runs: two steps are done (the first traces the step)
            assert survivor.process.poll() is None and time.monotonic() < deadline, survivor.log()[-3000:]
            time.sleep(0.2)
        workers[lost].process.send_signal(how)
        # A survivor that never notices is killed at WORKER_TIMEOUT_S (a hang bound, not a speed check): code -9.
        [(code, stderr)] = finish([survivor])
    finally:
        finish(workers, timeout=1)  # kills the stopped one
    lines = stderr.strip().splitlines()
    assert code == 2 and lines[-1].startswith("train: error: lost worker "), stderr[-3000:]
    assert f"worker {lost} of the cluster" in lines[-1] and "start them all again to resume" in lines[-1]
    assert "Traceback" not in stderr
