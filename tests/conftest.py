"""Shared test helpers: where ../shared is, running the CLIs, reading a save_dir back."""

import atexit
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
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


def run_module(module, *args, cwd=None, timeout=600):
    """Runs `python -m module args` and returns the CompletedProcess (text output)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=env,
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


# ----- several runs of a command, one interpreter start-up ---------------------------------------------------------
# Each `python -m xlnet_data.train_gpu` or `export_hf` pays TensorFlow's import (4.5 s quiet, 7-10 s loaded) before
# its first check; a test of several one-line refusals paid it once per refusal. Here one process per test process
# (a fork server, started at the first call, kept until the test process ends) imports the commands and `preload`
# once, then runs each argv in a child forked from it: the child runs the command's own `run()` (flag parsing,
# cli.run's one-line errors, the exit status) with its own stdout and stderr, environment and working directory, as
# `python -m` would. Fork is safe here because the server runs no TensorFlow op (its thread pools start at the first
# one, in the child).

# What train_gpu imports before its first step: a `preload` for its runs.
TRAIN_GPU_PRELOAD = ("tensorflow", "xlnet_data.pretrain.training")

_FORK_SERVER = r"""
import importlib, json, os, sys, traceback
for request in sys.stdin:
    out_dir, runs, preload, environ, cwd = json.loads(request)
    for name in preload + [module_name for module_name, _ in runs]:
        importlib.import_module(name)
    for i, (module_name, argv) in enumerate(runs):
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for fd, name in ((1, "out"), (2, "err")):
                os.dup2(os.open(os.path.join(out_dir, f"{i}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            os.environ.clear(); os.environ.update(environ); os.chdir(cwd)
            sys.argv = [module_name, *argv]
            try:
                sys.modules[module_name].run()
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
        _, wait_status = os.waitpid(pid, 0)
        with open(os.path.join(out_dir, f"{i}.status"), "w") as fp:
            fp.write(str(os.waitstatus_to_exitcode(wait_status)))
    print("done", flush=True)
"""
_fork_server = None  # (the server's Popen, its stderr file) in this test process


def _stop_fork_server():
    global _fork_server
    if _fork_server:
        server, stderr = _fork_server
        _fork_server = None
        os.killpg(server.pid, signal.SIGKILL)  # with a child it may be waiting for
        server.wait()
        stderr.close()


def run_modules_forked(runs, tmp_dir, preload=("tensorflow",), timeout=600):
    """Runs `python -m module args` for each (module, args) of `runs`, one after the other, in children forked from
    this test process's fork server, which imported the modules and `preload` once; returns a CompletedProcess (text
    output) per run."""
    global _fork_server
    out_dir = Path(tmp_dir) / "forked_runs"
    out_dir.mkdir(parents=True)
    runs = [(module, [str(arg) for arg in args]) for module, args in runs]
    if _fork_server is None:
        stderr = tempfile.TemporaryFile("w+")
        # tests/ on the path too: tests/two_cpus.py is a command of the server's
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
        server = subprocess.Popen([sys.executable, "-c", _FORK_SERVER], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
        _fork_server = server, stderr
        atexit.register(_stop_fork_server)
    server, stderr = _fork_server
    environ = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    server.stdin.write(json.dumps([str(out_dir), runs, list(preload), environ, os.getcwd()]) + "\n")
    server.stdin.flush()
    done = select.select([server.stdout], [], [], timeout)[0] and server.stdout.readline() == "done\n"
    if not done:
        stderr.seek(0)
        message = stderr.read()[-3000:]
        _stop_fork_server()
        raise AssertionError(f"the fork server stopped or ran over {timeout} s: {message}")
    return [subprocess.CompletedProcess([sys.executable, "-m", module, *args], int((out_dir / f"{i}.status").read_text()),
                                        (out_dir / f"{i}.out").read_text(), (out_dir / f"{i}.err").read_text())
            for i, (module, args) in enumerate(runs)]


def run_module_forked(module, argvs, tmp_dir, preload=("tensorflow",), timeout=600):
    """run_modules_forked of one module's runs, one per argv."""
    return run_modules_forked([(module, argv) for argv in argvs], tmp_dir, preload, timeout)


def run_forked(module, *args, preload=TRAIN_GPU_PRELOAD):
    """run_module's `python -m module args`, run as a child of the fork server: for a command that imports
    TensorFlow (train_gpu, export_hf) before what the test checks."""
    tmp_dir = tempfile.mkdtemp(prefix="forked_run_")
    try:
        return run_modules_forked([(module, args)], tmp_dir, preload)[0]
    finally:
        shutil.rmtree(tmp_dir)
