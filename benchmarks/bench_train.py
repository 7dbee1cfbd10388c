"""Times XLNet training: the step on a GPU, the step and the input pipeline on one CPU core against the original.

    python benchmarks/bench_train.py gpu                      # XLNet-Base shape on every local GPU, 20 steps
    python benchmarks/bench_train.py gpu --bfloat16 --bsz_per_replica=8
    python benchmarks/bench_train.py gpu --small --steps=5    # a tiny shape: checks the script on a CPU
    python benchmarks/bench_train.py step --original=/tmp/xlnet-original    # train_gpu's step vs the original's, HF's
    python benchmarks/bench_train.py input --original=/tmp/xlnet-original   # input pipeline vs the original's

gpu: the real step (xlnet_data.pretrain.trainer.Trainer: PLM loss, all-reduce, clipping, Adam) on synthetic
  features, the memories carried from step to step: median step time, tokens/s and model FLOPs utilisation
  (costs.train_flops: the matmuls, 3x the forward pass, over the device's peak). XLNet-Base: 12 layers,
  d_model 768, 12 heads of 64, d_inner 3072, seq_len 512, reuse_len 256, mem_len 384, 85 predictions per
  example, 32,000 tokens. Do not run it on a CPU beyond a step or two.

step: train_gpu's step against the yardsticks a user would pick instead, each in its own process pinned to one core
  (taskset -c 0), in alternating rounds, all on the same shape and features: the original
  (../shared/tools/original_train_step.py: train_gpu.py's graph in a TF1 session, one Session.run per step, on a
  synthetic batch), `python -m xlnet_data.train_gpu` exactly as the CLI runs it on records (--iterations=1: a step
  is the time between two log lines; from the original's initial weights, --save_init -> --init_checkpoint) and
  Hugging Face's XLNetLMHeadModel (PyTorch, torch.set_num_threads(1); the same perm_mask, target_mapping, token
  types, labels and memories, "bi" attention, bi_data, dropout 0, clipping, Adam; --no-hf leaves it out) and our
  PyTorch XLNet (xlnet_data.pretrain_torch, from the original's initial weights, the same features and optimiser as
  Hugging Face's; --no-torch leaves it out). Each step
  is timed in process CPU time (all threads) and wall time; CPU time is the figure to compare on a shared machine.
  Shapes: "issue" (shape A: 4 layers, d_model 256, 4 heads of 64, d_inner 1024, seq_len 128, reuse 64, mem_len 64,
  8 rows, 32,000 tokens, bi_data, untie_r, gelu; the records of ../shared/golden/g1_blog) and "demo" (bin/demo's
  train command: 2 layers, d_model 32, 2 heads of 16, d_inner 64, mem_len 64, on records made as bin/demo makes
  them, 4,000 tokens). Prints the CPU, TensorFlow's and PyTorch's builds and the load first, then per round each
  run's median, the median over the rounds, the ratios and the per-round ratios. --env KEY=VALUE sets a variable
  for every run (TF_ENABLE_ONEDNN_OPTS=0: TensorFlow's Eigen kernels, its default on CPUs without AVX512_VNNI).

input: examples/s of make_dataset (batches of bsz_per_core) and of training.replica_batches (what the
  trainer reads) against the original's data_utils.get_input_fn (under tf.compat.v1 with the shims of
  ../shared/tools/original_train_step.py), each in its own process pinned to one core, alternating, on the
  (gunzipped) records of the goldens g1_blog (seq_len 128) and g5_seq512 (seq_len 512), in stream order,
  cycling through them. Both hand each batch back as numpy arrays on TensorFlow's buffers (no copy).

The machine these figures come from is shared: run the rounds alternately and compare medians.
"""

import argparse
import contextlib
import glob
import gzip
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHARED = os.path.join(ROOT, "..", "shared")
sys.path.insert(0, ROOT)

# step mode: shape -> (model flags shared by both implementations, original_train_step.py's extra flags)
STEP_SHAPES = {
    "issue": dict(n_layer=4, d_model=256, n_head=4, d_head=64, d_inner=1024, n_token=32000, mem_len=64),
    "demo": dict(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, n_token=4000, mem_len=64),
}
# Record flags of both shapes' records (the seed blog's, as g1_blog and bin/demo use).
STEP_RECORDS = dict(seq_len=128, reuse_len=64, bsz=8, num_predict=21)
# input mode: seq_len -> (create golden, its record flags)
INPUT_CASES = {
    128: ("g1_blog", dict(bsz_per_host=8, reuse_len=64, num_predict=21, uncased=True)),
    512: ("g5_seq512", dict(bsz_per_host=4, reuse_len=256, num_predict=85, uncased=False)),
}

def pinned(args, env=None):
    """Runs a command pinned to core 0 (taskset -c 0); returns the completed process (raises with its stderr
    on failure)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT, **(env or {})}
    result = subprocess.run(["taskset", "-c", "0", sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{result.stderr[-3000:]}")
    return result


def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


# ----- step: train_gpu against the original --------------------------------------------------------

def demo_records(work_dir):
    """Records made as bin/demo makes them (a 4,000-piece SentencePiece model of sample_corpus/)."""
    save_dir = os.path.join(work_dir, "demo_records")
    if not os.path.isfile(os.path.join(save_dir, "corpus_info.json")):
        prefix = os.path.join(work_dir, "spm", "sample")
        subprocess.run([sys.executable, "-m", "xlnet_data.spm_train", "--input=sample_corpus/*.txt",
                        f"--model_prefix={prefix}", "--vocab_size=4000"], cwd=ROOT, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "xlnet_data.create", "--input_glob=sample_corpus/*.txt",
                        f"--sp_path={prefix}.model", f"--save_dir={save_dir}", "--bsz_per_host=8",
                        "--num_core_per_host=1", "--seq_len=128", "--reuse_len=64", "--bi_data", "--mask_alpha=6",
                        "--mask_beta=1", "--num_predict=21", "--num_passes=2", "--overwrite"],
                       cwd=ROOT, check=True, capture_output=True)
    return save_dir


def step_worker(args):
    """One implementation's steps in this process: prints {"cpu_ms": [...], "wall_ms": [...]} of every step after
    --warmup (process CPU time, all its threads, and wall time)."""
    if args.impl == "original":
        times = original_worker(args)
    elif args.impl == "hf":
        times = hf_worker(args)
    elif args.impl == "torch":
        times = torch_worker(args)
    else:
        times = train_gpu_worker(args)
    times = times[args.warmup:]
    if len(times) != args.steps:
        raise SystemExit(f"{args.impl}: {len(times)} timed steps, expected {args.steps}")
    print(json.dumps({"cpu_ms": [1000 * cpu for cpu, _ in times], "wall_ms": [1000 * wall for _, wall in times]}))


def original_worker(args):
    """../shared/tools/original_train_step.py run in this process, its clock read both ways: it times each
    Session.run between two time.perf_counter() calls, which here also read the process's CPU time."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("original_train_step",
                                                  os.path.join(SHARED, "tools", "original_train_step.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    readings = []

    def perf_counter():
        readings.append((time.process_time(), time.perf_counter()))
        return readings[-1][1]

    tool.time = types.SimpleNamespace(perf_counter=perf_counter)
    flags = [f"--{key}={value}" for key, value in {**STEP_SHAPES[args.shape], **STEP_RECORDS}.items()]
    sys.argv = ["original_train_step.py", *flags, f"--steps={args.warmup + args.steps}", "--warmup=0",
                f"--save_init={args.init}", f"--model_dir={tempfile.mkdtemp()}"]
    with contextlib.redirect_stdout(io.StringIO()):
        tool.main()
    return [(end[0] - start[0], end[1] - start[1]) for start, end in zip(readings[0::2], readings[1::2])]


def train_gpu_worker(args):
    """`python -m xlnet_data.train_gpu` on records, as the CLI runs it (--iterations=1: every step is logged),
    in this process: a step's time is the time between its log line and the one before (its first step from
    the start of the loop is not timed)."""
    import logging

    from xlnet_data import cli, train_gpu
    readings = []

    class StepClock(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("step "):
                readings.append((time.process_time(), time.perf_counter()))

    logging.getLogger("xlnet_data").addHandler(StepClock())
    model_dir = tempfile.mkdtemp()
    flags = {key: value for key, value in STEP_SHAPES[args.shape].items() if key != "n_token"}  # n_token: the records'
    sys.argv = ["train_gpu", f"--record_info_dir={args.records}", f"--model_dir={model_dir}",
                f"--init_checkpoint={args.init}", "--strategy=one_device", "--ff_activation=gelu", "--untie_r",
                *[f"--{key}={value}" for key, value in flags.items()], f"--jit_compile={args.jit_compile}",
                f"--train_steps={args.warmup + args.steps + 1}", "--iterations=1", f"--save_steps={10 ** 9}",
                "--max_save=1", *args.extra]
    try:  # train_gpu.run() as the CLI runs it, but for its os._exit at the end: this process goes on to report
        cli.run(train_gpu.main, "train", train_gpu.__doc__, train_gpu.define_flags)
    except SystemExit as stop:
        if stop.code:
            raise
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    return [(end[0] - start[0], end[1] - start[1]) for start, end in zip(readings, readings[1:])]


def hf_worker(args):
    """Hugging Face transformers' XLNetLMHeadModel (PyTorch, one thread) trained as the original trains: the
    same shape and features (perm_mask, target_mapping, token types, labels; bi_data, "bi" attention, the
    memories carried), dropout 0, the original's GELU (gelu_new), global-norm clipping to 1 and Adam."""
    import torch
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = STEP_SHAPES[args.shape]
    config = transformers.XLNetConfig(
        vocab_size=shape["n_token"], d_model=shape["d_model"], n_layer=shape["n_layer"], n_head=shape["n_head"],
        d_inner=shape["d_inner"], ff_activation="gelu_new", untie_r=True, attn_type="bi", bi_data=True,
        mem_len=shape["mem_len"], reuse_len=STEP_RECORDS["reuse_len"], dropout=0.0, use_mems_train=True,
        initializer_range=0.02)
    model = transformers.XLNetLMHeadModel(config).train()
    features = synthetic_features(STEP_RECORDS["bsz"], STEP_RECORDS["seq_len"], STEP_RECORDS["num_predict"],
                                  shape["n_token"], 0)
    inputs = dict(input_ids=torch.from_numpy(features["input_k"]).long(),
                  token_type_ids=torch.from_numpy(features["seg_id"]).long(),
                  perm_mask=torch.from_numpy(features["perm_mask"]),
                  target_mapping=torch.from_numpy(features["target_mapping"]),
                  labels=torch.from_numpy(features["target"]).long())

    def forward(mems):
        out = model(**inputs, mems=mems, use_mems=True)
        return out.loss, out.mems
    return timed_torch_steps(args, model, forward, None)


def timed_torch_steps(args, model, forward, mems):
    """(CPU, wall) seconds of each training step of a PyTorch model: forward(mems) -> (loss, new memories), then
    global-norm clipping to 1 and Adam."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-8)
    times = []
    for _ in range(args.warmup + args.steps):
        cpu, wall = time.process_time(), time.perf_counter()
        loss, mems = forward(mems)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)
        times.append((time.process_time() - cpu, time.perf_counter() - wall))
    return times


def torch_worker(args):
    """Our PyTorch XLNet (xlnet_data.pretrain_torch.modeling, one thread) from the original's initial weights (read
    by tf_checkpoint, without TensorFlow), on the same features as hf_worker: the query stream at the predicted
    positions only, the memories carried, dropout 0, global-norm clipping to 1 and torch's Adam (as hf_worker's)."""
    import torch

    from xlnet_data.pretrain import config as C
    from xlnet_data.pretrain_torch import modeling, tf_checkpoint

    torch.set_num_threads(1)
    shape = STEP_SHAPES[args.shape]
    model = modeling.XLNet(C.XLNetConfig(**{key: shape[key] for key in ("n_layer", "d_model", "n_head", "d_head",
                                                                         "d_inner", "n_token")},
                                         ff_activation="gelu", untie_r=True),
                           C.RunConfig(mem_len=shape["mem_len"], reuse_len=STEP_RECORDS["reuse_len"], bi_data=True))
    tf_checkpoint.load_original(model, args.init)
    model.train()
    features = {key: torch.from_numpy(value) for key, value in synthetic_features(
        STEP_RECORDS["bsz"], STEP_RECORDS["seq_len"], STEP_RECORDS["num_predict"], shape["n_token"], 0).items()}

    def forward(mems):
        out = model(features, mems)
        return out.loss, out.new_mems
    return timed_torch_steps(args, model, forward, model.initial_mems(STEP_RECORDS["bsz"]))


def machine_line(extra_env: dict) -> str:
    """The CPU, TensorFlow's and PyTorch's builds, the load: so that figures of different machines are not mixed."""
    code = ("import json, tensorflow as tf\n"
            "from tensorflow.python.util import _pywrap_util_port as port\n"
            "build = tf.sysconfig.get_build_info()\n"
            "print(json.dumps([tf.__version__, port.IsMklEnabled(), build.get('cpu_compiler', '')]))")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **extra_env}
    version, onednn, compiler = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                                          text=True, check=True).stdout.strip().splitlines()[-1])
    try:
        torch_line = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, "
                                     "torch.backends.mkldnn.is_available(), torch.backends.mkl.is_available())"],
                                    capture_output=True, text=True, check=True).stdout.split()
        torch_line = f"PyTorch {torch_line[0]} (oneDNN {torch_line[1]}, MKL {torch_line[2]})"
    except (subprocess.CalledProcessError, IndexError):
        torch_line = "PyTorch not installed"
    with open("/proc/cpuinfo") as fp:
        model = next((line.split(":", 1)[1].strip() for line in fp if line.startswith("model name")), "unknown CPU")
    flags = open("/proc/cpuinfo").read()
    features = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {name}" in flags]
    opts = env.get("TF_ENABLE_ONEDNN_OPTS", "unset")
    return (f"CPU: {model} ({os.cpu_count()} cores; {', '.join(features)}); TensorFlow {version} (oneDNN ops "
            f"{'on' if onednn else 'off'}, TF_ENABLE_ONEDNN_OPTS={opts}{'; ' + compiler if compiler else ''}); {torch_line}; "
            f"load average "
            f"{' '.join(f'{value:.2f}' for value in os.getloadavg())}")


def bench_step(args):
    os.makedirs(args.work_dir, exist_ok=True)
    print(machine_line(dict(item.split("=", 1) for item in args.env)), flush=True)
    for shape in args.shapes.split(","):
        records = (os.path.join(SHARED, "golden", "g1_blog", "expected") if shape == "issue"
                   else demo_records(args.work_dir))
        init = os.path.join(args.work_dir, f"init_{shape}", "model.ckpt")
        common = [os.path.abspath(__file__), "_step_worker", f"--shape={shape}", f"--init={init}",
                  f"--steps={args.steps}", f"--warmup={args.warmup}"]
        runs = {"original": [*common, "--impl=original"]}  # first: it writes the initial weights
        for v in args.jit_compile.split(","):
            runs[f"train_gpu --jit_compile={v}"] = [*common, "--impl=train_gpu", f"--records={records}",
                                                     f"--jit_compile={v}"]
        if args.hf:
            runs["Hugging Face XLNetLMHeadModel"] = [*common, "--impl=hf"]
        if args.torch:
            runs["pretrain_torch XLNet"] = [*common, "--impl=torch"]
        cpu, wall = {key: [] for key in runs}, {key: [] for key in runs}
        for round_ in range(args.rounds):
            for key, command in runs.items():
                env = {"XLNET_REF": args.original, **dict(item.split("=", 1) for item in args.env)}
                if key == "original":
                    env.update(item.split("=", 1) for item in args.original_env)
                out = json.loads(pinned(command, env=env).stdout.strip().splitlines()[-1])
                cpu[key].append(statistics.median(out["cpu_ms"]))
                wall[key].append(statistics.median(out["wall_ms"]))
            print(f"{shape} round {round_ + 1}: " + ", ".join(f"{key} {cpu[key][-1]:.1f} CPU ms ({wall[key][-1]:.1f})"
                                                              for key in runs), flush=True)
        yardsticks = [key for key in runs if not key.startswith(("train_gpu", "pretrain_torch"))]
        print(f"\n{shape} shape, ms per step: median (min-max) over {args.rounds} rounds of each run's median of "
              f"{args.steps} steps after {args.warmup}, one core; CPU time, then wall time; load average now "
              f"{' '.join(f'{value:.2f}' for value in os.getloadavg())}:")
        for key in runs:
            ratios = "  ".join(f"{statistics.median(cpu[key]) / statistics.median(cpu[base]):.2f}x {base.split()[0]}"
                               for base in yardsticks if base != key)
            print(f"  {key:32s} CPU {spread(cpu[key]):>24s}  wall {spread(wall[key]):>24s}  {ratios}")
        for key in runs:
            if key.startswith(("train_gpu", "pretrain_torch")):
                for base in yardsticks:
                    per_round = ", ".join(f"{ours / theirs:.3f}" for ours, theirs in zip(cpu[key], cpu[base]))
                    print(f"  {key} / {base}, CPU time per round: {per_round}")
        print(flush=True)


# ----- input: make_dataset / replica_batches against the original's input_fn -----------------------

def input_records(work_dir, seq_len):
    """The golden's records gunzipped (the original reads no .gz), with its record_info and corpus_info."""
    case, _ = INPUT_CASES[seq_len]
    source = os.path.join(SHARED, "golden", case, "expected", "tfrecords")
    target = os.path.join(work_dir, f"records_{seq_len}")
    os.makedirs(target, exist_ok=True)
    for path in glob.glob(os.path.join(source, "*")):
        name = os.path.basename(path)
        if name.endswith(".gz"):
            if not os.path.exists(os.path.join(target, name[:-3])):
                with gzip.open(path, "rb") as src, open(os.path.join(target, name[:-3]), "wb") as dst:
                    shutil.copyfileobj(src, dst)
        else:
            shutil.copy(path, target)
    return target


def input_worker(args):
    """One pipeline in this process: prints {"examples_per_s": ...} over --batches batches after --warmup."""
    _, fields = INPUT_CASES[args.seq_len]
    bsz, reuse_len, num_predict = fields["bsz_per_host"], fields["reuse_len"], fields["num_predict"]
    if args.impl == "original":
        next_batch = original_input(args.records, args.seq_len, fields)
    else:
        import tensorflow as tf

        from xlnet_data.pretrain import config as C
        from xlnet_data.pretrain import inputs as ip
        from xlnet_data.pretrain import training as T
        data = C.InputConfig(seq_len=args.seq_len, reuse_len=reuse_len, perm_size=reuse_len, bsz_per_host=bsz,
                             num_predict=num_predict, bi_data=True, uncased=fields["uncased"])
        if args.impl == "make_dataset":
            dataset = ip.make_dataset(args.records, data)
        else:
            model = C.XLNetConfig(n_layer=1, d_model=8, n_head=1, d_head=8, d_inner=8, ff_activation="gelu",
                                  untie_r=True, n_token=32000)
            cfg = C.TrainConfig(record_info_dir=args.records, model_dir="", model=model,
                                run=C.RunConfig(reuse_len=reuse_len, bi_data=True), data=data)
            dataset = T.replica_batches(args.records, cfg, 1)
        iterator = iter(dataset)

        def next_batch():
            # Arrays on TensorFlow's buffers, as the original's Session.run hands them back; Tensor.numpy()
            # would copy each one (5 MB a batch at seq_len 512), a copy the trainer never makes.
            return tf.nest.map_structure(np.asarray, next(iterator))
    for _ in range(args.warmup):
        next_batch()
    tic, cpu = time.perf_counter(), time.process_time()  # process_time: CPU seconds of all its threads
    for _ in range(args.batches):
        batch = next_batch()
    seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
    rows = batch["input_k"].shape[0]
    print(json.dumps({"examples_per_s": args.batches * rows / seconds,
                      "examples_per_cpu_s": args.batches * rows / cpu_seconds}))


def original_input(records, seq_len, fields):
    """The original get_input_fn's dataset in a TF1 session (shims as original_train_step.py's)."""
    import types

    np.bool = bool
    import tensorflow.compat.v1 as v1
    v1.disable_v2_behavior()

    class _TFProxy(types.ModuleType):
        def __getattr__(self, name):
            return getattr(v1, name)

    sys.modules["tensorflow"] = _TFProxy("tensorflow")
    sys.path.insert(0, os.environ["XLNET_REF"])
    import data_utils
    input_fn, _ = data_utils.get_input_fn(
        tfrecord_dir=records, split="train", bsz_per_host=fields["bsz_per_host"], seq_len=seq_len,
        reuse_len=fields["reuse_len"], bi_data=True, num_core_per_host=1, perm_size=fields["reuse_len"],
        mask_alpha=6, mask_beta=1, uncased=fields["uncased"], num_predict=fields["num_predict"])
    batch = v1.data.make_one_shot_iterator(input_fn({"batch_size": fields["bsz_per_host"]})).get_next()
    session = v1.Session()
    return lambda: session.run(batch)


def bench_input(args):
    os.makedirs(args.work_dir, exist_ok=True)
    for seq_len in (int(value) for value in args.seq_lens.split(",")):
        records = input_records(args.work_dir, seq_len)
        impls = ["original", "make_dataset", "replica_batches"]
        rates = {impl: [] for impl in impls}  # examples per CPU second
        wall = {impl: [] for impl in impls}  # examples per second
        batches = args.batches * 128 // seq_len
        for round_ in range(args.rounds):
            for impl in impls:
                out = pinned([os.path.abspath(__file__), "_input_worker", f"--impl={impl}", f"--records={records}",
                              f"--seq_len={seq_len}", f"--batches={batches}", f"--warmup={args.warmup}"],
                             env={"XLNET_REF": args.original})
                result = json.loads(out.stdout.strip().splitlines()[-1])
                rates[impl].append(result["examples_per_cpu_s"])
                wall[impl].append(result["examples_per_s"])
            print(f"seq_len {seq_len} round {round_ + 1}: " + ", ".join(f"{impl} {rates[impl][-1]:.0f}/CPU s "
                                                                         f"({wall[impl][-1]:.0f}/s)" for impl in impls),
                  flush=True)
        print(f"\nseq_len {seq_len}, one core, {args.rounds} rounds of {batches} batches: median (min-max) examples "
              f"per CPU second, and per second:")
        for impl in impls:
            cpu_ratio = statistics.median(rates[impl]) / statistics.median(rates["original"])
            wall_ratio = statistics.median(wall[impl]) / statistics.median(wall["original"])
            print(f"  {impl:16s} {spread(rates[impl]):>28s} {cpu_ratio:.2f}x   {spread(wall[impl]):>28s} "
                  f"{wall_ratio:.2f}x")
        print(flush=True)


# ----- gpu: XLNet-Base on every local GPU ----------------------------------------------------------

def synthetic_features(bsz, seq_len, num_predict, n_token, seed):
    """One replica's batch with the input pipeline's shapes and dtypes (random content)."""
    rng = np.random.default_rng(seed)
    positions = np.stack([rng.choice(seq_len, num_predict, replace=False) for _ in range(bsz)])
    input_q = np.zeros((bsz, seq_len), np.float32)
    np.put_along_axis(input_q, positions, 1.0, axis=1)
    return {
        "input_k": rng.integers(0, n_token, (bsz, seq_len), dtype=np.int32),
        "input_q": input_q,
        "seg_id": np.repeat((np.arange(seq_len) >= seq_len // 2)[None].astype(np.int32), bsz, 0),
        "perm_mask": (rng.random((bsz, seq_len, seq_len)) < 0.5).astype(np.float32),
        "target": rng.integers(0, n_token, (bsz, num_predict), dtype=np.int32),
        "target_mask": np.ones((bsz, num_predict), np.float32),
        "target_mapping": np.eye(seq_len, dtype=np.float32)[positions],
        "label": np.ones((bsz, 1), np.int32),
    }


def bench_gpu(args):
    import tensorflow as tf

    from xlnet_data.pretrain import config as C
    from xlnet_data.pretrain import costs
    from xlnet_data.pretrain import training as T
    shapes = {  # model, seq_len, reuse_len, mem_len, num_predict
        "base": (C.XLNetConfig(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, ff_activation="gelu",
                               untie_r=True, n_token=32000), 512, 256, 384, 85),
        "small": (C.XLNetConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, ff_activation="gelu",
                                untie_r=True, n_token=1000), 64, 32, 48, 10),
    }
    model, seq_len, reuse_len, mem_len, num_predict = shapes["small" if args.small else "base"]
    mem_len = mem_len if args.mem_len is None else args.mem_len
    tf.config.experimental.enable_tensor_float_32_execution(args.tf32)
    strategy = T.make_strategy(args.strategy)
    replicas = strategy.num_replicas_in_sync
    global_bsz = args.bsz_per_replica * replicas
    cfg = C.TrainConfig(
        record_info_dir="", model_dir="", model=model,
        run=C.RunConfig(mem_len=mem_len, reuse_len=reuse_len, bi_data=True, use_bfloat16=args.bfloat16),
        data=C.InputConfig(seq_len=seq_len, reuse_len=reuse_len, perm_size=reuse_len, bsz_per_host=global_bsz,
                           num_predict=num_predict),
        train_steps=args.warmup + args.steps, jit_compile=args.jit_compile, tf32=args.tf32)
    trainer = T.Trainer(cfg, strategy)
    features = strategy.experimental_distribute_values_from_function(
        lambda context: {key: tf.constant(value) for key, value in synthetic_features(
            args.bsz_per_replica, seq_len, num_predict, model.n_token, context.replica_id_in_sync_group).items()})
    mems = trainer.initial_mems()
    devices = ", ".join(strategy.extended.worker_devices)
    precision = "bfloat16" if args.bfloat16 else "float32 (TF32)" if args.tf32 else "float32"
    print(f"{'small' if args.small else 'XLNet-Base'}: {replicas} replica(s) ({devices}), {args.bsz_per_replica} "
          f"rows x {seq_len} tokens each, mem_len {mem_len}, {precision}, XLA {'on' if trainer.uses_xla else 'off'}")

    times = []
    for step in range(args.warmup + args.steps):
        tic = time.perf_counter()
        loss, _, _, mems = trainer.train_step(features, mems)
        loss = float(loss)  # waits for the step
        if step >= args.warmup:
            times.append(time.perf_counter() - tic)
    median = statistics.median(times)
    flops = costs.train_flops(model, costs.step_shape(cfg, replicas))
    line = (f"median step {1000 * median:.1f} ms, {global_bsz * seq_len / median:,.0f} tokens/s, "
            f"{flops / median / 1e12:.1f} TFLOP/s")
    gpu = tf.config.list_physical_devices("GPU")
    name = tf.config.experimental.get_device_details(gpu[0]).get("device_name", "") if gpu else ""
    peak = args.peak_tflops or costs.peak_tflops(name, args.bfloat16)
    if peak:
        line += f", model FLOPs utilisation {100 * flops / median / 1e12 / (peak * replicas):.1f}% of {peak:g} " \
                f"TFLOP/s per device"
    print(f"{line} (min {1000 * min(times):.1f} ms, max {1000 * max(times):.1f} ms over {len(times)} steps; "
          f"loss {loss:.3f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    gpu = modes.add_parser("gpu", help="the step on every local GPU (XLNet-Base)")
    gpu.add_argument("--small", action="store_true", help="a tiny shape instead of XLNet-Base")
    gpu.add_argument("--steps", type=int, default=20, help="timed steps")
    gpu.add_argument("--warmup", type=int, default=2, help="untimed steps first (tracing, compiling, autotuning)")
    gpu.add_argument("--bsz_per_replica", type=int, default=4, help="rows per replica (even: bi_data)")
    gpu.add_argument("--mem_len", type=int, default=None, help="default: the shape's (384 for Base)")
    gpu.add_argument("--bfloat16", action="store_true", help="compute in bfloat16 (mixed precision)")
    gpu.add_argument("--tf32", action="store_true", help="float32 matmuls in TF32")
    gpu.add_argument("--jit_compile", default="auto", choices=["auto", "on", "off"])
    gpu.add_argument("--strategy", default="auto", choices=["auto", "one_device", "mirrored"])
    gpu.add_argument("--peak_tflops", type=float, default=None,
                     help="the device's dense peak for the utilisation (default: costs.PEAK_TFLOPS by its name)")
    for name, helptext in (("step", "train_gpu's step against the original's, one core"),
                           ("input", "the input pipeline against the original's, one core")):
        mode = modes.add_parser(name, help=helptext)
        mode.add_argument("--original", required=True, help="a checkout of zihangdai/xlnet (XLNET_REF)")
        mode.add_argument("--rounds", type=int, default=3, help="alternating runs of each implementation")
        mode.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bench_train"))
    step = modes.choices["step"]
    step.add_argument("--shapes", default="issue,demo", help="comma-separated: issue, demo")
    step.add_argument("--steps", type=int, default=20, help="timed steps per run")
    step.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    step.add_argument("--jit_compile", default="off", help="train_gpu --jit_compile values to run, comma-separated")
    step.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                      help="an environment variable for every run (e.g. TF_ENABLE_ONEDNN_OPTS=0, ONEDNN_MAX_CPU_ISA=AVX2)")
    step.add_argument("--original_env", action="append", default=[], metavar="KEY=VALUE",
                      help="an environment variable for the original's runs only (after --env)")
    step.add_argument("--hf", default=True, action=argparse.BooleanOptionalAction,
                      help="run Hugging Face's XLNetLMHeadModel (PyTorch) as a yardstick too")
    step.add_argument("--torch", default=True, action=argparse.BooleanOptionalAction,
                      help="run our PyTorch XLNet (xlnet_data.pretrain_torch) too")
    inp = modes.choices["input"]
    inp.add_argument("--seq_lens", default="128,512")
    inp.add_argument("--batches", type=int, default=400, help="timed batches at seq_len 128 (fewer at 512)")
    inp.add_argument("--warmup", type=int, default=20, help="untimed batches first")
    worker = modes.add_parser("_input_worker")
    worker.add_argument("--impl", choices=["original", "make_dataset", "replica_batches"])
    worker.add_argument("--records")
    worker.add_argument("--seq_len", type=int)
    worker.add_argument("--batches", type=int)
    worker.add_argument("--warmup", type=int)
    step_worker_mode = modes.add_parser("_step_worker")
    step_worker_mode.add_argument("--impl", choices=["original", "train_gpu", "hf", "torch"])
    step_worker_mode.add_argument("--shape", choices=list(STEP_SHAPES))
    step_worker_mode.add_argument("--init", help="the initial weights (the original writes them, train_gpu reads them)")
    step_worker_mode.add_argument("--records")
    step_worker_mode.add_argument("--jit_compile", default="off")
    step_worker_mode.add_argument("--steps", type=int)
    step_worker_mode.add_argument("--warmup", type=int)
    step_worker_mode.add_argument("extra", nargs="*", help="more train_gpu flags")
    args = parser.parse_args()
    {"gpu": bench_gpu, "step": bench_step, "input": bench_input, "_input_worker": input_worker,
     "_step_worker": step_worker}[args.mode](args)


if __name__ == "__main__":
    main()
