"""A further pass of `create` by itself: one unit made from a kept token cache, CPU time per token, in process.

    taskset -c 0 python benchmarks/bench_pass.py [--size_mb=4] [--passes=5] [--root=DIR]

bench_create's further-pass figure is a difference of whole runs ((5 passes - 1 pass) on two corpus sizes),
which carries the processes' system time. Here a save_dir is made once (`create --keep_cache`, the production
flags of bench_create's MULTI_PASS), then passes 1..N are run one after the other in this process
(`units.run_unit`: the cache read back in the pass's order, the rows, the compiled loop, the records written),
each timed with time.process_time; the first is left out (compiled code loading). The yardstick, SentencePiece
alone over the same lines (bench_create's encode_only), is timed in the same process. `--root` runs another
checkout's create (e.g. an older commit unpacked with `git worktree add --detach`), for a before/after.
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_create import MULTI_PASS, SHARED, make_corpus  # noqa: E402  (the corpus and flags bench_create uses)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_mb", type=float, default=4)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose create is run")
    parser.add_argument("--sp_path", default=str(SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"))
    args = parser.parse_args()
    sys.path.insert(0, args.root)
    import sentencepiece as spm

    from xlnet_data.datagen import units
    from xlnet_data.datagen.config import CreateConfig
    try:
        from xlnet_data.dataformat.examples.loop import Unit
    except ImportError:  # a checkout from before dataformat/
        Unit = units.Unit
    sp = spm.SentencePieceProcessor(model_file=args.sp_path)
    with tempfile.TemporaryDirectory() as tmp:
        input_glob = make_corpus(Path(tmp) / "corpus", args.size_mb, sorted((ROOT / "sample_corpus").glob("*.txt")))
        out = f"{tmp}/out"
        subprocess.run([sys.executable, "-m", "xlnet_data.create", f"--input_glob={input_glob}",
                        f"--sp_path={args.sp_path}", f"--save_dir={out}", "--keep_cache", "--num_workers=1",
                        *MULTI_PASS], check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=args.root))
        key = os.path.basename(glob.glob(f"{out}/token_cache/tokens-0.*.json")[0]).split(".")[1]
        flags = {f.split("=")[0][2:]: f.split("=")[1] for f in MULTI_PASS}
        config = CreateConfig(input_glob=input_glob, sp_path=args.sp_path, save_dir=out,
                              **{k: int(v) if v.isdigit() else v == "True" for k, v in flags.items()}).validate()
        seconds = []
        for pass_id in range(1, args.passes + 1):
            start = time.process_time()
            tokens = units.run_unit(config, Unit(0, pass_id), key, sp).tokens
            seconds.append(time.process_time() - start)
        encode = []
        for _ in range(3):
            start = time.process_time()
            for path in sorted(glob.glob(input_glob)):
                with open(path, encoding="utf-8") as f:
                    lines = [line.strip() for line in f]
                sp.encode([line for line in lines if line], num_threads=1)
            encode.append(time.process_time() - start)
    pass_ns, encode_ns = statistics.median(seconds[1:]) / tokens * 1e9, statistics.median(encode) / tokens * 1e9
    print(f"root {args.root}; {tokens:,} tokens; a further pass {pass_ns:.1f} ns/token (passes 2-{args.passes}: "
          f"{', '.join(f'{s:.3f}' for s in seconds[1:])} s); SentencePiece alone {encode_ns:.1f} ns/token; "
          f"ratio {pass_ns / encode_ns:.3f}")


if __name__ == "__main__":
    main()
