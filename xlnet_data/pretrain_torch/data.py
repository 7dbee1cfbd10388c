"""The PyTorch trainer's data: each rank's rows of every step as train_gpu lays them out, made with numpy (no
TensorFlow, no torch) ahead of the step in a background thread.

For the trainer (train_torch.py):

    sources, schedule, probs = open_sources(cfg, num_replicas, replica, start_step, permutation, positions)
    source = sources[schedule[step]]          # the source this step reads (always 0 without mixing)
    batch = source.next_batch()               # {feature: np.ndarray}: this replica's rows of the source's next step
    positions = [s.position() for s in sources]   # into the checkpoint; give them back to open_sources to resume
    for s in sources: s.close()

`ReplicaSource(record_dir, cfg, num_replicas, replica, *, start_step, permutation=None, resume=None)` is one
stream: a record dir (a save_dir or its tfrecords/ folder, or a comma list read one after the other), records or a
cache-backed save_dir (create --nowrite_records: the records made again from the token cache, generated.py),
repeated forever as train_gpu reads it. Step s of a source is records s*bsz_per_host .. (s+1)*bsz_per_host-1 of its
stream; replica r of num_replicas (a torchrun rank) gets the rows layout.replica_rows gives it, in that order (its
forward rows, then their backward rows with bi_data), which is sources.replica_batches' element s*num_replicas + r,
feature for feature (examples.features; example k of the stream gets the permutation of k). A rank parses and
makes only its own rows. Its memories are its own: `mems` is there for the trainer to keep them with the stream.

The position (`SourcePosition`): the steps read, and for a cache-backed source generated.py's Position at or before
it, so that a resume generates from there instead of from the start of the unit. `open_sources` without positions
starts each source at the steps the schedule gave it before start_step, as train_gpu does.

Damaged or missing records end in one line (record_reader.RecordError naming the file, the record and the byte;
NoRecordsError; TokenCacheError), raised by next_batch when it meets them.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from xlnet_data.dataformat import record_reader
from xlnet_data.dataformat.examples.generated import GeneratedStream, Position
from xlnet_data.pretrain.config import TrainConfig
from xlnet_data.pretrain.layout import (
    NoRecordsError,
    find_records,
    mixing_schedule,
    replica_rows,
    sampling_probs,
    source_tokens,
    tfrecords_folders,
)
from xlnet_data.pretrain_torch.examples import RECORD_FEATURES, PermutationFn, features, seeded_permutation

MakeFn = Callable[..., dict]  # examples.features (every feature on the host) or examples.shipped (the trainer's)

PREFETCH_STEPS = 2  # steps made ahead of the one the trainer reads


@dataclasses.dataclass(frozen=True)
class SourcePosition:
    """Where a source's stream stands: `step` steps read (the next one read is step `step`); for a cache-backed
    source, `generated`: where its generation can start again (at or before `step`; None: from its unit's start)."""
    step: int
    generated: Optional[Position] = None


def _first_record(filenames: list[str], skip: int) -> tuple[int, int]:
    """(the file, the record in it) of record `skip` of the files' stream repeated forever; the files before it
    are counted by their framing (record_reader.count_records), not parsed, and only when there is something to skip."""
    counts: list[int] = []
    while skip:
        for i, path in enumerate(filenames):
            if len(counts) < len(filenames):
                counts.append(record_reader.count_records(path)[0])
            if skip < counts[i]:
                return i, skip
            skip -= counts[i]
        if not sum(counts):
            raise NoRecordsError(f"{','.join(filenames)}: the record files hold no records")
        skip %= sum(counts)
    return 0, 0


class ReplicaSource:
    """One source (a record dir or a comma list of them) as one stream of this replica's step batches, with its
    own memories (see the module doc)."""

    def __init__(self, record_dir: str, cfg: TrainConfig, num_replicas: int, replica: int, *, start_step: int = 0,
                 permutation: Optional[PermutationFn] = None, resume: Optional[Position] = None,
                 prefetch: int = PREFETCH_STEPS, workers: int = 1, make: MakeFn = features):
        """start_step: the first step of the stream to read; resume: a cache-backed source's saved position (from
        position().generated) at or before start_step; prefetch: steps made ahead; workers: threads making
        examples (the records are read in order by one more); make: what makes a step's examples from its records
        (examples.features, or examples.shipped: the permutation features left for the device to make)."""
        data = cfg.data
        if not 0 <= replica < num_replicas:
            raise ValueError(f"replica {replica} of {num_replicas}")
        self.name = record_dir
        self.cfg = cfg
        self.rows = replica_rows(data.num_core_per_host, data.bsz_per_host, num_replicas, data.bi_data)[replica]
        self.permutation = permutation or seeded_permutation(cfg.seed, data.perm_size)
        self._make = make
        self.mems: Any = None  # the trainer's memories of this stream's rows
        self.steps = 0  # steps this run took from it (the mixture line's count)
        self._step = start_step
        found = find_records(tfrecords_folders(record_dir), data)
        self._generated = None
        if found.cache_units:
            keep = np.zeros(data.bsz_per_host, dtype=bool)
            keep[self.rows] = True
            self._generated = GeneratedStream(found.cache_units, keep=keep, vocab_size=cfg.model.n_token)
            steps = self._cache_steps(start_step, resume)
        elif found.filenames:
            steps = self._record_steps(found.filenames, start_step)
        else:
            raise NoRecordsError(f"{record_dir}: no records selected (num_passes={data.num_passes})")
        self._steps_made = steps
        self._error: Optional[BaseException] = None  # what ended the stream (raised by every next_batch after it)
        self._queue: queue.Queue = queue.Queue(maxsize=max(prefetch, 1))
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="examples")
        self._reader = threading.Thread(target=self._read_ahead, name=f"records {record_dir}", daemon=True)
        self._reader.start()

    # ----- the stream: one step's records (this replica's rows) at a time -----

    def _parse(self, payloads, where) -> dict[str, np.ndarray]:
        seq_len, vocab = self.cfg.data.seq_len, self.cfg.model.n_token
        parsed = [record_reader.parse_example(payload, seq_len, vocab, path, index, offset)
                  for payload, (path, index, offset) in zip(payloads, where)]
        return {name: np.stack([example[name] for example in parsed]) for name in RECORD_FEATURES}

    def _record_steps(self, filenames, start_step) -> Iterator[dict[str, np.ndarray]]:
        """The record files' steps from start_step on, cycling through the files as train_gpu's repeat does."""
        bsz = self.cfg.data.bsz_per_host
        first, skip = _first_record(filenames, start_step * bsz)
        wanted = set(self.rows.tolist())
        payloads: dict[int, tuple] = {}
        row = 0
        while True:
            read = 0
            for path in filenames[first:]:
                for index, offset, payload in record_reader.read_records(path):
                    read += 1
                    if skip:
                        skip -= 1
                        continue
                    if row in wanted:
                        payloads[row] = (payload, (path, index, offset))
                    row += 1
                    if row == bsz:
                        chosen = [payloads[r] for r in self.rows]
                        yield self._parse([p for p, _ in chosen], [w for _, w in chosen])
                        payloads, row = {}, 0
            if not read:
                raise NoRecordsError(f"{self.name}: its record files hold no records")
            first = 0

    def _cache_steps(self, start_step, resume) -> Iterator[dict[str, np.ndarray]]:
        """A cache-backed source's steps from start_step on (generated from `resume` when given)."""
        bsz = self.cfg.data.bsz_per_host
        slot = 0
        payloads = {}
        for data, offsets, lengths in self._generated.chunks(start_step, resume):
            view = memoryview(data)
            for offset, length in zip(offsets, lengths):
                row = slot % bsz
                if length:
                    payloads[row] = bytes(view[offset:offset + length])
                slot += 1
                if row == bsz - 1:
                    step = start_step + slot // bsz - 1
                    where = [(f"{self.name} (from its token cache)", step * bsz + r, None) for r in self.rows]
                    yield self._parse([payloads[r] for r in self.rows], where)
                    payloads = {}

    # ----- ahead of the trainer -----

    def _read_ahead(self):
        step = self._step
        bsz = self.cfg.data.bsz_per_host
        try:
            for records in self._steps_made:
                indices = step * bsz + self.rows  # each example's index in the stream: its permutation's
                made = self._pool.submit(self._make, records, indices, self.cfg.data, self.permutation)
                if not self._put(made):
                    return
                step += 1
        except BaseException as err:  # raised by next_batch, in the trainer's thread
            failed: Future = Future()
            failed.set_exception(err)
            self._put(failed)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next_batch(self) -> dict[str, np.ndarray]:
        """This replica's features of the stream's next step (the `make` function's dict, its rows in replica
        order)."""
        if self._error is not None:  # the stream ended there: the same error again, not a wait for ever
            raise self._error
        made = self._queue.get()
        self._error = made.exception()
        if self._error is not None:
            raise self._error
        batch = made.result()
        self._step += 1
        self.steps += 1
        return batch

    def position(self) -> SourcePosition:
        """Where the stream stands after the batches next_batch returned (for a checkpoint)."""
        generated = self._generated.position(self._step) if self._generated is not None else None
        return SourcePosition(self._step, generated)

    def close(self) -> None:
        """Stops making batches ahead (the reader thread and the example workers)."""
        self._stop.set()
        self._reader.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_sources(cfg: TrainConfig, num_replicas: int, replica: int, start_step: int = 0,
                 permutation: Optional[PermutationFn] = None, positions: Optional[list[SourcePosition]] = None,
                 **source_options) -> tuple[list[ReplicaSource], np.ndarray, np.ndarray]:
    """The run's sources (cfg.sources: one, or each mixed dir), each at the step of its own stream where this run
    starts, the source of every step (train_gpu's mixing_schedule: all zeros with one source) and the mixing
    probabilities. positions: the checkpoint's (else each source starts at the steps the schedule gave it before
    start_step). source_options: ReplicaSource's prefetch and workers."""
    names = cfg.sources
    probs = sampling_probs([source_tokens(tfrecords_folders(name), cfg.data) for name in names],
                           cfg.mix_sampling_factor or 0.0)
    schedule = mixing_schedule(probs, cfg.train_steps, cfg.seed)
    if positions is None:
        done = np.bincount(schedule[:start_step], minlength=len(names))
        positions = [SourcePosition(int(steps)) for steps in done]
    sources = []
    try:
        for name, at in zip(names, positions):
            sources.append(ReplicaSource(name, cfg, num_replicas, replica, start_step=at.step, permutation=permutation,
                                         resume=at.generated, **source_options))
    except BaseException:
        for source in sources:
            source.close()
        raise
    return sources, schedule, probs
