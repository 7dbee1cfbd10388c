"""Shared test helpers: where ../shared is, running the CLIs, reading a save_dir back."""

import atexit
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
XLNET_SPM = SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"
GOLDEN = SHARED / "golden"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason="../shared (goldens, XLNet's SentencePiece model) is absent")
# The original code (zihangdai/xlnet), the tests' oracle: ../shared/xlnet_original unless XLNET_REF names another.
XLNET_REF = Path(os.environ.get("XLNET_REF") or SHARED / "xlnet_original")
HAVE_ORIGINAL = (XLNET_REF / "data_utils.py").is_file()
needs_original = pytest.mark.skipif(not HAVE_ORIGINAL,
                                    reason=f"the original code (XLNET_REF) is not at {XLNET_REF}")


def command_env(**more):
    """The environment of a command a test runs: this checkout's package, TensorFlow's start-up lines off."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT), **more)


def run_module(module, *args, cwd=None, timeout=600):
    """Runs `python -m module args` and returns the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=command_env(),
                          capture_output=True, text=True, timeout=timeout)


def golden_flags(case_dir):
    """The flags of a golden case (one per line, comments dropped)."""
    lines = Path(case_dir, "flags.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def read_save_dir(save_dir, seq_len=None):
    """{tfrecords base name (without .gz): [features dict, ...]} of a save_dir."""
    from xlnet_data.dataformat import record_reader
    out = {}
    for path in sorted(glob.glob(os.path.join(save_dir, "tfrecords", "*.tfrecords*"))):
        name = os.path.basename(path)
        name = name[:-3] if name.endswith(".gz") else name
        out[name] = [features for _, features in record_reader.read_numbered_examples(path, seq_len)]
    return out


def record_infos(save_dir):
    out = {}
    for path in sorted(glob.glob(os.path.join(save_dir, "tfrecords", "record_info-*.json"))):
        info = json.loads(Path(path).read_text())
        out[os.path.basename(path)] = (info["num_batch"], [os.path.basename(f) for f in info["filenames"]])
    return out


SAMPLE_CORPUS = ROOT / "sample_corpus"
G1 = GOLDEN / "g1_blog"


def g1_file():
    return next((G1 / "expected" / "tfrecords").glob("*.tfrecords.gz"))


def tf_parse(tf, path, compression=""):
    """Every record of a file as {name: list}, parsed by TensorFlow itself."""
    out = []
    for raw in tf.data.TFRecordDataset(str(path), compression_type=compression):
        example = tf.train.Example.FromString(raw.numpy())
        out.append({k: list(v.int64_list.value) for k, v in example.features.feature.items()})
    return out


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for the tests' tiny torch shapes (`pytestmark = pytest.mark.usefixtures(...)`): on a shared
    2-core machine torch's second OpenMP thread waits on the other processes (a step of the tiny model took 1-4.6 s
    with 2 threads, 0.11-0.13 s with 1, measured; gpu_torch.py --smoke 71 s against 20 s)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def g1(tf):
    """The g1 golden's records as TensorFlow parses them."""
    if not (G1 / "expected").is_dir():
        pytest.skip(f"shared test data not found at {SHARED}")
    return tf_parse(tf, g1_file(), "GZIP")


@pytest.fixture(scope="session")
def sample_spm(tmp_path_factory):
    """A small SentencePiece model with XLNet's special ids, trained on sample_corpus/ (no ../shared needed);
    cased, as the tests' hard-coded record counts were measured with."""
    from xlnet_data.datagen import tokenizer
    prefix = str(tmp_path_factory.mktemp("spm") / "sample.v1000")
    config = tokenizer.SpmTrainConfig(input_files=tuple(sorted(map(str, SAMPLE_CORPUS.glob("*.txt")))),
                                      model_prefix=prefix, vocab_size=1000, num_threads=2, uncased=False)
    return tokenizer.train_sentencepiece(config)


@pytest.fixture(scope="session")
def other_spm(tmp_path_factory):
    """Another SentencePiece model (of another vocabulary size, 500, on the first 1,000 lines of Emma): records of
    two models must never meet in one run or one save_dir."""
    from xlnet_data.datagen import tokenizer
    folder = tmp_path_factory.mktemp("other_spm")
    text = folder / "emma.txt"
    text.write_text("\n".join((SAMPLE_CORPUS / "austen_emma.txt").read_text().splitlines()[:1000]) + "\n")
    config = tokenizer.SpmTrainConfig(input_files=(str(text),), model_prefix=str(folder / "other.v500"),
                                      vocab_size=500, num_threads=2, uncased=False)
    return tokenizer.train_sentencepiece(config)

MODEL_CASES = ["m1_bi_untied", "m2_uni_tied", "m3_sharp"]


@pytest.fixture(scope="session")
def original_here(tmp_path_factory):
    """{case of ../shared/golden_model: the original graph's outputs on this machine} (tests/original_model.py, one
    process, once for the TF2 and the PyTorch model's tests); None without the original code (then only the stored
    values are compared)."""
    if not HAVE_ORIGINAL:
        return None
    import numpy as np
    out = tmp_path_factory.mktemp("original_model")
    env = dict(os.environ, XLNET_REF=str(XLNET_REF), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, str(Path(__file__).parent / "original_model.py"), str(out),
                             *MODEL_CASES], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return {case: np.load(out / f"{case}.npz") for case in MODEL_CASES}


def pytest_configure(config):
    """Before pytest-xdist's workers start (on its controller only), compiles the package's numba code into its
    on-disk caches, the usual and the bounds-checked (tests/numba_warmup.py), in two processes at once; a fresh
    clone would otherwise compile it in every worker and create process that starts before the cache is written
    (docs/testing.md has the measurement). Only for a run of the whole suite (no test files named, no -k), which
    compiles it anyway; the bounds-checked code not with -m (its tests are all slow). Skipped once done for this
    checkout and this code (a marker in the cache folder, which is keyed on the code), and with XLNET_NUMBA_WARMUP=0."""
    whole_suite = not config.option.keyword and all(Path(arg).resolve() in (ROOT, ROOT / "tests") for arg in config.args)
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None) or not whole_suite or \
            os.environ.get("XLNET_NUMBA_WARMUP") == "0":
        return
    import hashlib

    from fuzz_files import boundscheck_cache

    from xlnet_data.common import compiled
    code = os.path.basename(compiled.CACHE_DIR)  # the hash of the compiled code; numba's folders are per source path
    marker = f"warm-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:16]}"
    caches = [(os.path.dirname(compiled.CACHE_DIR), {})]
    if not config.option.markexpr:
        caches.append((boundscheck_cache(), {"NUMBA_BOUNDSCHECK": "1"}))
    envs = {base: dict(os.environ, NUMBA_CACHE_DIR=base, **flags) for base, flags in caches}
    todo = {base: env for base, env in envs.items() if not os.path.exists(os.path.join(base, code, marker))}
    runs = {base: subprocess.Popen([sys.executable, str(ROOT / "tests" / "numba_warmup.py")], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for base, env in todo.items()}
    for base, run in runs.items():
        stderr = run.communicate()[1]
        if run.returncode == 0:
            Path(base, code).mkdir(parents=True, exist_ok=True)
            Path(base, code, marker).touch()
        else:  # the tests that compile will say what is wrong; the warm-up only saves time
            config.issue_config_time_warning(pytest.PytestWarning(
                f"numba warm-up (tests/numba_warmup.py, NUMBA_CACHE_DIR={base}) failed: {stderr[-2000:]}"), 2)


# ----- commands forked from one TensorFlow import ------------------------------------------------------------------
# Each `python -m xlnet_data.train_gpu` or `export_hf` pays TensorFlow's import (4.5 s quiet, 7-10 s loaded) before
# its first check; a test of several one-line refusals paid it once per refusal. Here one process per test process, a
# ForkServer, imports TensorFlow and the trainer once and forks each command from it on request (one JSON line on its
# stdin; it answers the child's pid). The child runs the command's own `run()` (flag parsing, cli.run's one-line
# errors, the exit status) with its own stdout and stderr files, environment and working directory, as `python -m`
# would; it is a real process, as a Popen's (signals, a kill), and several can run at once (a cluster's workers). The
# server reaps each and writes its exit status to <status_dir>/<request number>.status (not the pid's name, which a
# later child may reuse). Fork is safe because the server runs no TensorFlow op (its thread pools start at the first
# one, in the child).

# What train_gpu imports before its first step.
TRAIN_GPU_PRELOAD = ("tensorflow", "xlnet_data.pretrain.training")

# In a forked child: the command's own run(), as `python -m module argv` would (or a test module's `function`), stdout
# and stderr to these files. What the function returns is kept until os._exit, which skips freeing it: freeing a run's
# input iterators waited up to a minute with the CPU idle while tf.data's autotuning thread was on (inputs.py).
_RUN_IN_CHILD = r"""
import importlib, json, os, sys, traceback
def run_in_child(module_name, argv, out_path, err_path, function=None):
    for fd, path in ((1, out_path), (2, err_path)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = [module_name, *argv]
    try:
        module = importlib.import_module(module_name)
        kept = getattr(module, function)(*argv) if function else module.run()
        status = 0
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(status)
"""

_FORK_SERVER = _RUN_IN_CHILD + r"""
import signal
status_dir, preload = sys.argv[1], json.loads(sys.argv[2])
sys.path.append(sys.argv[3])  # the tests' folder, for a test module's function
for name in preload:
    importlib.import_module(name)

numbers = {}  # pid -> request number

def reap(wait_flags):
    while True:
        try:
            pid, wait_status = os.waitpid(-1, wait_flags)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = os.path.join(status_dir, f"{numbers.pop(pid)}.status")
        with open(path + ".tmp", "w") as fp:
            fp.write(str(os.waitstatus_to_exitcode(wait_status)))
        os.replace(path + ".tmp", path)

signal.signal(signal.SIGCHLD, lambda *_: reap(os.WNOHANG))
for line in sys.stdin:
    request = json.loads(line)
    if not request["function"]:  # a command: imported here, once (a test module is imported in the child)
        importlib.import_module(request["module"])
    sys.stdout.flush(); sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reaped only once its number is known
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ.clear(); os.environ.update(request["env"])
        os.chdir(request["cwd"])
        run_in_child(request["module"], request["argv"], request["stdout"], request["stderr"], request["function"])
    numbers[pid] = request["number"]
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    print(pid, flush=True)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
reap(0)  # stdin closed: the children left, then leave
"""


class ForkedProcess:
    """A command forked by a ForkServer, with what the tests use of a Popen: pid, poll, wait, send_signal, kill,
    returncode (a signal's death is its negative number)."""

    def __init__(self, pid, status_path, args):
        self.pid, self.args, self.returncode = pid, args, None
        self._status_path = status_path

    def poll(self):
        if self.returncode is None and self._status_path.exists():
            self.returncode = int(self._status_path.read_text())
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum):
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """Starts commands (`python -m module argv`, stdout and stderr to files) as processes forked from one process that
    imported `preload` once; close() waits for those left (kill them first)."""

    def __init__(self, status_dir, preload=TRAIN_GPU_PRELOAD):
        self.status_dir = Path(status_dir)
        self.status_dir.mkdir(parents=True)
        self._requests = 0
        self.server = subprocess.Popen([sys.executable, "-c", _FORK_SERVER, str(self.status_dir), json.dumps(list(preload)),
                                        str(Path(__file__).parent)],
                                       env=command_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def start(self, module, argv, stderr_path, env=None, cwd=None, stdout_path=os.devnull, function=None):
        """`python -m module argv`, or with `function` module.function(*argv) (a check that must run in a fresh
        TensorFlow: logical devices set before its first op), in a forked child."""
        argv = [str(arg) for arg in argv]
        env = command_env(**(env or {}))  # the caller's whole environment, as a Popen's
        Path(stderr_path).write_text("")  # there before the child opens it: its log can be read from now on
        self._requests += 1
        self.server.stdin.write(json.dumps({"number": self._requests, "module": module, "argv": argv,
                                            "stdout": str(stdout_path),
                                            "stderr": str(stderr_path), "env": env, "function": function,
                                            "cwd": str(cwd or os.getcwd())}) + "\n")
        self.server.stdin.flush()
        pid = self.server.stdout.readline()
        assert pid, f"the fork server ended (status {self.server.wait()})"
        return ForkedProcess(int(pid), self.status_dir / f"{self._requests}.status",
                             [sys.executable, *(["-c", f"{module}.{function}"] if function else ["-m", module]), *argv])

    def run(self, module, *args, cwd=None, timeout=600, function=None):
        """Runs a command (or `function`, as start) to its end, as run_module does (a CompletedProcess, text
        output)."""
        out, err = (self.status_dir / f"{self._requests + 1}.{name}" for name in ("out", "err"))
        process = self.start(module, args, err, cwd=cwd, stdout_path=out, function=function)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, out.read_text(), err.read_text())

    def close(self, timeout=60):
        self.server.stdin.close()
        try:
            self.server.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # a child left running (a failed test's): the server goes, not the session
            self.server.kill()


def two_logical_cpus():
    """Two logical CPU devices, for MirroredStrategy's two replicas: in a fresh TensorFlow only (before its first op),
    as a check that a ForkServer runs (`function`) is."""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


_fork_server = None


def fork_server():
    """This test process's ForkServer (train_gpu, TensorFlow and the trainer imported), started at its first use and
    closed when the process leaves."""
    global _fork_server
    if _fork_server is None:
        folder = tempfile.mkdtemp(prefix="fork_server_")
        _fork_server = ForkServer(Path(folder) / "status", (*TRAIN_GPU_PRELOAD, "xlnet_data.train_gpu"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        atexit.register(_fork_server.close)  # first: atexit runs the last registered first
    return _fork_server


def run_modules_forked(runs, timeout=600):
    """Runs `python -m module args` for each (module, args) of `runs`, one after the other, forked by fork_server();
    returns a CompletedProcess (text output) per run."""
    return [fork_server().run(module, *args, timeout=timeout) for module, args in runs]


def run_module_forked(module, argvs, timeout=600):
    """run_modules_forked of one module's runs, one per argv."""
    return run_modules_forked([(module, argv) for argv in argvs], timeout)
