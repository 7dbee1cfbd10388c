"""The training input of a cache-backed save_dir (create --write_records=false): the records made in the pipeline.

`generated_records` is the tf.data source that stands in for reading the records files: the serialized records,
one element each, in stream order, made from the token cache by create's own loop (dataformat/examples/generated.py), so
the batches parsed from them are those the records would give, bit for bit. The loop is compiled without the
GIL (numba nogil): it runs in a tf.data thread beside the training step, and the source prefetches ahead.
A chunk of steps (a few MB of records) is one element, cut into records by tf.strings.substr.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from xlnet_data.dataformat.examples.generated import CacheUnit, GeneratedStream, Position

PREFETCH_CHUNKS = 2  # chunks made ahead of the one being read


@dataclasses.dataclass
class CacheFeed:
    """How one input pipeline generates a cache-backed source, and its stream once made (whose positions go
    into checkpoints)."""
    keep: Optional[np.ndarray] = None  # the rows of each step this pipeline serialises (default: all)
    resume: Optional[Position] = None  # where a resumed run's generation starts (from the checkpoint)
    vocab_size: Optional[int] = None  # ids of the cache checked against it
    stream: Optional[GeneratedStream] = None  # set by generated_records


def generated_records(cache_units: tuple[CacheUnit, ...], bsz_per_host: int, *, repeat: bool = True, start: int = 0,
                      feed: Optional[CacheFeed] = None) -> tf.data.Dataset:
    """The serialized records of the units (tf.string scalars) from record `start` of the stream (repeated
    forever with `repeat`), as _read_records(...).repeat().skip(start) gives the records files' (rows outside
    feed.keep are empty strings)."""
    feed = feed or CacheFeed()
    stream = GeneratedStream(cache_units, keep=feed.keep, repeat=repeat, vocab_size=feed.vocab_size)
    feed.stream = stream
    start_step, skip = divmod(start, bsz_per_host)
    resume = feed.resume

    def chunks():
        yield from stream.chunks(start_step, resume)

    dataset = tf.data.Dataset.from_generator(chunks, output_signature=(
        tf.TensorSpec([], tf.string), tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)))
    dataset = dataset.prefetch(PREFETCH_CHUNKS)  # the generator runs in a tf.data thread, ahead of the reader
    dataset = dataset.map(lambda data, offsets, lengths: tf.strings.substr(data, offsets, lengths)).unbatch()
    return dataset.skip(skip) if skip else dataset
