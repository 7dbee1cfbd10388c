"""Where one pass of `create` spends its CPU time, stage by stage, next to SentencePiece alone.

    taskset -c 1 python benchmarks/create_stages.py [--size_mb=8] [--seq_len=512] [--repeat=3]

`create_records` (one worker, one pass) and bench_create's yardstick (read, strip, encode in batches)
run in this process on corpora of `size_mb` and 2 x `size_mb` (bench_create's make_corpus), after one
warm-up run of each, with CPU-time (time.process_time) timers around their stages. A stage's time is
its own: the stages it calls are taken out. Each figure is ns per token of the difference between the
two corpora, so fixed costs (imports, compiled-code loading, tables built once) cancel as they do in
bench_create's end-to-end figures; median of `--repeat` rounds. The warm-ups' objects are frozen out of
Python's cyclic garbage collector (gc.freeze), so that its row is the timed runs' own collections. Process
start-up is not measured here: bench_create cancels it.
"""

import argparse
import contextlib
import dataclasses
import functools
import gc
import io
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sentencepiece

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_create

from xlnet_data.common import fileio
from xlnet_data.dataformat import token_cache
from xlnet_data.dataformat.examples import layout, loop
from xlnet_data.datagen import corpus, encode, job, text, unigram, units
from xlnet_data.datagen.config import CreateConfig


class StageClock:
    """Own CPU time per stage: entering a stage stops the clock of the stage it was called from."""

    def __init__(self):
        self.seconds = {}
        self._stack = ["other"]
        self._since = time.process_time()

    def _switch(self, to):
        now = time.process_time()
        self.seconds[self._stack[-1]] = self.seconds.get(self._stack[-1], 0.0) + now - self._since
        self._since = now
        if to is None:
            self._stack.pop()
        else:
            self._stack.append(to)

    @contextlib.contextmanager
    def stage(self, name):
        self._switch(name)
        try:
            yield
        finally:
            self._switch(None)

    def reset(self):
        self.seconds = {}
        self._since = time.process_time()


CLOCK = StageClock()


def _timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with CLOCK.stage(name):
            return fn(*args, **kwargs)
    return wrapper


def _timed_generator(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        items = fn(*args, **kwargs)
        while True:
            with CLOCK.stage(name):
                item = next(items, StopIteration)
            if item is StopIteration:
                return
            yield item
    return wrapper


STAGES = [  # (module, attribute, stage name): create's stages, outermost first
    (job, "create_records", "rest: plan, lock, JSON, cache removal"),
    (encode, "encode_task", "encode stage rest: cache packing"),
    (corpus, "read_shard", "read_shard rest: sentence flags"),
    (corpus, "_encode_block", "encode block rest: lengths, <eod>"),
    (corpus, "preprocess_lines", "normalise (text.py, preprocess_utf8.py)"),
    (text.Encoder, "encode_batch", "ids: lengths, concatenate, digit-comma"),
    (unigram.UnigramEncoder, "encode_ids", "our encoder (unigram.py)"),
    (sentencepiece.SentencePieceProcessor, "encode", "SentencePiece encode"),
    (units, "run_unit", "unit rest: layout, record_info"),
    (token_cache, "mapped_stream", "token cache mapped, its checksums checked"),
    (encode.EncodedTask, "stream", "stream from memory (one pass)"),
    (layout, "row_boundaries", "sentence boundaries of the rows (flags read back)"),
    (loop, "_write_steps", "pass: pairing, masking, records (compiled)"),
    (fileio, "write_array", "file writes (cache and records)"),
]


def _garbage_collection(phase, info):
    if phase == "start":
        CLOCK._switch("Python's cyclic garbage collector")
    else:
        CLOCK._switch(None)


def instrument():
    for owner, name, stage in STAGES:
        setattr(owner, name, _timed(stage, getattr(owner, name)))
    gc.callbacks.append(_garbage_collection)
    corpus._line_blocks = _timed_generator("read, decode lines", corpus._line_blocks)
    buffer_batch = text._buffer_batch  # SentencePiece's call that the Encoder makes where it can

    def timed_buffer_batch(sp):
        encode = buffer_batch(sp)
        return encode and _timed("SentencePiece encode", encode)
    text._buffer_batch = timed_buffer_batch


def measure(run, small, large, repeat):
    """{stage: [ns per token of the large-minus-small difference, per round]}, and the tokens of each corpus."""
    run(small)  # warm-up: compiled code loaded, tables built
    # What the warm-ups left (numba's objects: 520k tracked after a create that compiled) is set aside from the cyclic
    # collector: else its full collections scanned them at random moments of the timed runs (the row spread 1-126 ns
    # a token); a create process (113k tracked objects) pays a fixed ~0.1 s for them, which all less half cancels.
    gc.collect()
    gc.freeze()
    per_stage, tokens = {}, {}
    for _ in range(repeat):
        seconds = {}
        for corpus_glob in (small, large):
            CLOCK.reset()
            tokens[corpus_glob] = run(corpus_glob)
            CLOCK._switch(None)
            CLOCK._stack.append("other")
            seconds[corpus_glob] = dict(CLOCK.seconds)
        extra = tokens[large] - tokens[small]
        for stage in set(seconds[small]) | set(seconds[large]):
            difference = seconds[large].get(stage, 0.0) - seconds[small].get(stage, 0.0)
            per_stage.setdefault(stage, []).append(difference / extra * 1e9)
    return per_stage, tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_mb", type=float, default=8, help="smaller corpus size; the larger is twice it")
    parser.add_argument("--seq_len", type=int, default=512, choices=(128, 512), help="bench_create's configuration")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sp_path", default=str(bench_create.SHARED / "data" / "spiece" / "xlnet_cased_spiece.model"))
    parser.add_argument("--source", default=str(bench_create.ROOT / "sample_corpus"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    books = sorted(Path(args.source).glob("*.txt"))
    work = Path(tempfile.mkdtemp(prefix="create_stages_"))
    small = bench_create.make_corpus(work / "small", args.size_mb, books)
    large = bench_create.make_corpus(work / "large", 2 * args.size_mb, books)
    flags = dict(flag[2:].split("=") for flag in bench_create.CONFIGS[f"seq_len {args.seq_len}"])
    flags.update(bench_create.text_settings(args.sp_path))
    config = CreateConfig(sp_path=args.sp_path, save_dir=str(work / "out"),  # create's defaults but these flags
                          **{name: value if isinstance(value, bool) else value == "True" if name == "bi_data" else
                             int(value) for name, value in flags.items()})

    def run_create(input_glob):
        summary = job.create_records(dataclasses.replace(config, input_glob=input_glob).validate(), overwrite=True,
                                     num_workers=1)
        return summary.total("tokens")

    def run_yardstick(input_glob):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            bench_create.encode_only(input_glob, args.sp_path)
        return int(out.getvalue())

    instrument()
    yard, yard_tokens = measure(run_yardstick, small, large, args.repeat)
    made, made_tokens = measure(run_create, small, large, args.repeat)
    shutil.rmtree(work)

    def total(per_stage):
        return [sum(values) for values in zip(*per_stage.values())]

    yard_total, made_total = statistics.median(total(yard)), statistics.median(total(made))
    print(f"seq_len {args.seq_len}; corpora {args.size_mb:g} and {2 * args.size_mb:g} MB; CPU time, ns per token of "
          f"the difference, median of {args.repeat} (lowest-highest); create {made_tokens[large]:,} tokens, "
          f"SentencePiece alone {yard_tokens[large]:,} (on the larger corpus)\n")
    print("| stage | create | SentencePiece alone |\n|---|---|---|")
    for stage in sorted(set(made) | set(yard), key=lambda s: -statistics.median(made.get(s, [0]))):
        cells = [f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" if (v := d.get(stage)) else ""
                 for d in (made, yard)]
        print(f"| {stage} | {cells[0]} | {cells[1]} |")
    print(f"| **total** | **{made_total:.0f}** | **{yard_total:.0f}** |")
    print(f"\none pass / SentencePiece alone (tokens/s): {yard_total / made_total:.2f}")


if __name__ == "__main__":
    main()
