"""Records made from the token cache (create --write_records=false) against records on disk, in one run.

    python benchmarks/bench_cache.py generator [--size_mb=10] [--core=1] [--rounds=3]
    python benchmarks/bench_cache.py step [--size_mb=2] [--core=1] [--rounds=3] [--steps=60]
    python benchmarks/bench_cache.py disk [--size_mb=100] [--passes=20]

generator: for seq_len 128 (the seed blog's flags) and 512 (the original README's production flags: 16 rows,
  4 TPU cores, bi_data), a save_dir with records (one pass) and its kept token cache is made from a corpus of
  `size_mb` (sample_corpus/ repeated), then, in this process pinned to one core (CPU time, the machine may be
  shared), the unit's records are made from the cache by the input pipeline's generator (GeneratedStream:
  the compiled pairing, masking and serialising loop), made again without serialising (what a resume without
  a saved position costs a step) and, as the yardstick, read from the records file
  by tf.data (TFRecordDataset, what train_gpu's records path costs before parsing). Record tokens/s =
  records x seq_len / seconds; the unit's set-up (the stream read from the cache, laid out) is timed apart.
step: train_gpu's CPU training step (train_gpu's default small model, seq_len 128, 8 rows, mem_len 64) fed
  by the records and by the cache, the two alternated `rounds` times in this process; median seconds of a
  step (next batch + step, the loss read back) after 10 untimed ones. `--core` pins the process (the
  generator then shares that core with the step); --core=-1 leaves all cores.
disk: one pass of records at seq_len 512 (production flags) with --keep_cache on a `size_mb` corpus: the
  records' bytes x `passes` (every pass is the same size to a few records) against the token cache's bytes.
Output: Markdown lines for BENCHMARKS.md.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT / "benchmarks"))
from run_all import cpu_name  # noqa: E402  (one reading of the CPU's model name for every report)

SP_PATH = SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"

CONFIGS = {
    128: ["--seq_len=128", "--reuse_len=64", "--bsz_per_host=8", "--num_core_per_host=1", "--bi_data=True",
          "--mask_alpha=6", "--mask_beta=1", "--num_predict=21"],
    512: ["--seq_len=512", "--reuse_len=256", "--bsz_per_host=16", "--num_core_per_host=4", "--use_tpu=True",
          "--bi_data=True", "--mask_alpha=6", "--mask_beta=1", "--num_predict=85"],
}


def make_corpus(directory, size_mb, num_files=4):
    from bench_create import make_corpus as make
    return make(directory, size_mb, sorted(str(p) for p in (ROOT / "sample_corpus").glob("*.txt")), num_files)


def create(input_glob, save_dir, flags, *extra):
    cmd = [sys.executable, "-m", "xlnet_data.create", f"--input_glob={input_glob}", f"--sp_path={SP_PATH}",
           f"--save_dir={save_dir}", "--num_workers=1", "--overwrite", *flags, *extra]
    result = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])


def pin(core):
    if core >= 0:
        os.sched_setaffinity(0, {core})


def bench_generator(args, work):
    import json

    from xlnet_data.dataformat import save_dir as layout
    from xlnet_data.dataformat.examples import generated
    corpus = make_corpus(work / "corpus", args.size_mb)
    pin(args.core)
    import tensorflow as tf
    lines = []
    for seq_len, flags in CONFIGS.items():
        out = work / f"gen{seq_len}"
        create(corpus, out, flags, "--keep_cache")
        info_path = layout.record_info_paths(str(out / "tfrecords"))[0]
        info = json.loads(Path(info_path).read_text())
        record_file = info["filenames"][0]
        # The same unit, cache-backed: its record_info as --write_records=false writes it.
        import dataclasses

        from xlnet_data.dataformat import record_info, token_cache
        unit = generated.cache_unit(info_path, {**info, record_info.TOKEN_CACHE_KEY: {}}, info["num_batch"])
        key = next(Path(out, "token_cache").glob("*.json")).name.split(".")[1]
        cache_index = token_cache.read_index(unit.save_dir, unit.unit.task, key)
        unit = dataclasses.replace(unit, reference=token_cache.cache_reference(unit.save_dir, unit.sp_path,
                                                                               cache_index))
        records = info["num_batch"] * unit.settings.bsz_per_host
        gen, setup, read, walls, skips = [], [], [], [], []
        list(generated.GeneratedStream([unit], repeat=False).chunks())  # untimed: compiled code loaded, files cached
        for _ in range(args.rounds):
            start = time.process_time()
            generated.open_loop(unit)
            setup.append(time.process_time() - start)
            start, wall = time.process_time(), time.perf_counter()
            made = nbytes = 0
            for _, _, lengths in generated.GeneratedStream([unit], repeat=False).chunks():
                made, nbytes = made + len(lengths), nbytes + int(lengths.sum())
            gen.append(time.process_time() - start)
            walls.append(time.perf_counter() - wall)
            assert made == records
            start = time.process_time()  # a resume without a saved position: the steps before it, unserialised
            stream = generated.GeneratedStream([unit], repeat=False)
            stream._skip(generated.open_loop(unit), unit, 0, unit.num_batch)
            skips.append(time.process_time() - start)
            start = time.process_time()
            count = 0
            for _ in tf.data.TFRecordDataset(record_file).batch(4096).prefetch(1):
                count += 1
            read.append(time.process_time() - start)
        tokens = records * seq_len
        g, s, r = (statistics.median(v) for v in (gen, setup, read))
        lines.append(f"| {seq_len} | {records} ({nbytes / 1e6:.0f} MB) | {tokens / (g - s) / 1e6:.2f} | "
                     f"{tokens / g / 1e6:.2f} (wall {tokens / statistics.median(walls) / 1e6:.2f}) | "
                     f"{tokens / r / 1e6:.2f} | {s:.2f} | {tokens / statistics.median(skips) / 1e6:.2f} |")
    print(f"CPU: {cpu_name()}; one core (#{args.core}), CPU seconds, median of {args.rounds}; corpus "
          f"{args.size_mb} MB of sample_corpus/ repeated")
    print("| seq_len | records | generated, M record tokens/s (loop only) | generated incl. the unit's set-up | "
          "yardstick: tf.data reading the records file, M record tokens/s | set-up s | "
          "made unserialised (a resume without a saved position), M record tokens/s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))


def bench_step(args, work):
    corpus = make_corpus(work / "corpus", args.size_mb, num_files=1)
    records, cache = work / "records", work / "cache"
    create(corpus, records, CONFIGS[128])
    create(corpus, cache, CONFIGS[128], "--nowrite_records")
    pin(args.core)
    import tensorflow as tf

    from xlnet_data.pretrain import config as C
    from xlnet_data.pretrain import training as T
    model = C.XLNetConfig(n_layer=6, d_model=32, n_head=4, d_head=8, d_inner=32, ff_activation="relu", untie_r=False,
                          n_token=32000)
    data = C.InputConfig(seq_len=128, reuse_len=64, perm_size=64, bsz_per_host=8, num_predict=21, uncased=True)

    def step_times(save_dir):
        cfg = C.TrainConfig(record_info_dir=str(save_dir / "tfrecords"), model_dir=str(work / "m"), model=model,
                            run=C.RunConfig(mem_len=64, reuse_len=64, bi_data=True), data=data, strategy="one_device")
        trainer = T.Trainer(cfg, tf.distribute.OneDeviceStrategy("/cpu:0"))
        batches = iter(trainer.strategy.distribute_datasets_from_function(
            lambda context: T.replica_batches(cfg.record_info_dir, cfg, 1, input_context=context)))
        mems, times = trainer.initial_mems(), []
        for i in range(10 + args.steps):
            start = time.perf_counter()
            loss, _, _, mems = trainer.train_step(next(batches), mems)
            float(loss)
            if i >= 10:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    runs = {"records": [], "cache": []}
    for _ in range(args.rounds):
        for name, save_dir in (("records", records), ("cache", cache)):
            runs[name].append(step_times(save_dir))
    where = f"one core (#{args.core})" if args.core >= 0 else f"all {os.cpu_count()} cores"
    print(f"CPU: {cpu_name()}; {where}; wall ms a step (median of {args.steps} steps, median of {args.rounds} "
          "alternated runs)")
    r, c = statistics.median(runs["records"]) * 1e3, statistics.median(runs["cache"]) * 1e3
    print(f"| records {r:.1f} ms (runs {', '.join(f'{t * 1e3:.1f}' for t in runs['records'])}) | cache {c:.1f} ms "
          f"(runs {', '.join(f'{t * 1e3:.1f}' for t in runs['cache'])}) | cache / records {c / r:.3f} |")


def bench_disk(args, work):
    corpus = make_corpus(work / "corpus", args.size_mb)
    out = work / "disk"
    create(corpus, out, CONFIGS[512], "--keep_cache")
    records = sum(p.stat().st_size for p in (out / "tfrecords").glob("*.tfrecords"))
    cache = sum(p.stat().st_size for p in (out / "token_cache").iterdir())
    text = sum(p.stat().st_size for p in (work / "corpus").glob("*.txt"))
    print(f"corpus {text / 1e6:.1f} MB; seq_len 512 production flags; one pass of records {records / 1e6:.1f} MB")
    print(f"| {args.passes} passes of records (one pass x {args.passes}) | {records * args.passes / 1e9:.2f} GB |")
    print(f"| token cache (+ record_infos) | {cache / 1e6:.1f} MB | cache / records = "
          f"1/{records * args.passes / cache:.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["generator", "step", "disk"])
    parser.add_argument("--size_mb", type=float, default=None)
    parser.add_argument("--core", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--work_dir", default=None)
    args = parser.parse_args()
    args.size_mb = args.size_mb or {"generator": 10, "step": 2, "disk": 100}[args.mode]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_cache_"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        {"generator": bench_generator, "step": bench_step, "disk": bench_disk}[args.mode](args, work)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
