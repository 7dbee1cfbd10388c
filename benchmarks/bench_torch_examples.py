"""The PyTorch trainer's host side per CPU core: tokens/s of what a core makes for the GPU's step, from records.

    PYTHONPATH=. python benchmarks/bench_torch_examples.py --records=../shared/golden/g5_seq512/expected/tfrecords

Pinned to one core (os.sched_setaffinity), one thread, on XLNet-Base's example shape (the golden g5_seq512's
records: seq_len 512, reuse_len 256, 85 predictions, bi_data; the records are repeated, each step with new stream
indices, so new permutations), in alternating rounds:

  parse     record_reader.parse_example of a step's records (the reader thread's work)
  shipped   examples.shipped: what the trainer's workers make now (rev_index; perm_mask and target_mapping are
            made on the device)
  features  examples.features: everything on the host (what it shipped before issue 47)
  expand    device_features.expand on this CPU (what the GPU does instead; for scale only)

Tokens/s per core = rows x seq_len / seconds. Issue 47's target: 16 cores cover ~507,000 tokens/s (XLNet-Base at
45% of 989 TFLOP/s), 31,700 tokens/s a core for parse + shipped.
"""

import argparse
import glob
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # as PYTHONPATH=.

from xlnet_data.dataformat import record_reader
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain_torch import device_features, examples

TARGET_PER_CORE = 507_000 / 16


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="../shared/golden/g5_seq512/expected/tfrecords",
                        help="a folder of seq_len-512 records (g5_seq512's: reuse 256, 85 predictions, bi_data)")
    parser.add_argument("--rows", type=int, default=8, help="rows per step (one replica's)")
    parser.add_argument("--steps", type=int, default=20, help="steps timed per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    config = C.InputConfig(seq_len=512, reuse_len=256, perm_size=256, bsz_per_host=args.rows, num_predict=85,
                           bi_data=True)
    payloads = [payload for path in sorted(glob.glob(os.path.join(args.records, "*.tfrecords*")))
                for _, _, payload in record_reader.read_records(path)]
    if not payloads:
        sys.exit(f"no records in {args.records}")
    permutation = examples.seeded_permutation(0, config.perm_size)
    steps = [[payloads[(s * args.rows + r) % len(payloads)] for r in range(args.rows)] for s in range(args.steps)]

    def parse(step_payloads):
        parsed = [record_reader.parse_example(payload, 512) for payload in step_payloads]
        return {name: np.stack([example[name] for example in parsed]) for name in examples.RECORD_FEATURES}

    parsed = [parse(step) for step in steps]
    indices = [s * args.rows + np.arange(args.rows) for s in range(args.steps)]
    shipped = [examples.shipped(records, index, config, permutation) for records, index in zip(parsed, indices)]
    tensors = [{name: torch.from_numpy(value) for name, value in batch.items()} for batch in shipped]
    work = {
        "parse": lambda s: parse(steps[s]),
        "shipped": lambda s: examples.shipped(parsed[s], indices[s], config, permutation),
        "features": lambda s: examples.features(parsed[s], indices[s], config, permutation),
        "expand": lambda s: device_features.expand(tensors[s], config.num_predict),
    }
    seconds = {name: [] for name in work}
    for _ in range(args.rounds):
        for name, fn in work.items():
            tic = time.process_time()
            for s in range(args.steps):
                fn(s)
            seconds[name].append((time.process_time() - tic) / args.steps)
    tokens = args.rows * config.seq_len
    print(f"one core ({os.sched_getaffinity(0)}), {args.rows} rows x 512 a step, {args.steps} steps x {args.rounds} "
          f"rounds, process CPU time per step (median of the rounds); load {os.getloadavg()[0]:.1f}")
    rate = {}
    for name, values in seconds.items():
        rate[name] = tokens / float(np.median(values))
        print(f"  {name:9s} {1000 * np.median(values):7.2f} ms/step  {rate[name]:>10,.0f} tokens/s a core")
    for made in ("shipped", "features"):
        per_core = 1 / (1 / rate["parse"] + 1 / rate[made])
        print(f"  parse + {made}: {per_core:,.0f} tokens/s a core; 16 cores {16 * per_core:,.0f} "
              f"({16 * per_core / 507_000:.1f}x the 507,000 tokens/s of 45% MFU at XLNet-Base)")
    sent = sum(value.nbytes for value in shipped[0].values()) / args.rows
    full = sum(value.nbytes for value in examples.features(parsed[0], indices[0], config, permutation).values())
    print(f"  copied to the device a row: {sent / 1024:.1f} KiB shipped, {full / args.rows / 2**20:.2f} MiB with "
          f"perm_mask and target_mapping")


if __name__ == "__main__":
    main()
