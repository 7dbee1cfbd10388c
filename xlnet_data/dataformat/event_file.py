"""TensorBoard event files written without TensorFlow: the PyTorch trainer's scalars (pretrain_torch/reporting.py),
read back by curves.py, TensorBoard and tf.compat.v1.train.summary_iterator as train_gpu's.

An event file is TFRecord framing (a little-endian uint64 length, its masked CRC-32C, the payload, the payload's
masked CRC-32C: crc32c.py) around serialized tensorflow.Event protos: the first one names the format
(`file_version: "brain.Event:2"`), each next one holds a step's Summary of scalars (`simple_value`, which
TensorBoard's scalars plugin reads as it reads tf.summary.scalar's). The protos are built, as record_reader
builds tf.train.Example's, in a private protobuf pool with the same field numbers as TensorFlow's
event.proto and summary.proto (wire-compatible, nothing of TensorFlow imported).

    EventWriter     one run's event file in a log dir: scalars(step, {tag: value}), flush, close
"""

from __future__ import annotations

import functools
import os
import socket
import time
from typing import Optional

import numpy as np

from xlnet_data.dataformat import protos
from xlnet_data.dataformat.crc32c import masked_crc32c

FILE_VERSION = "brain.Event:2"  # what TensorBoard expects of the first event
FILE_PREFIX = "events.out.tfevents."  # what TensorBoard and curves.py look for in a log dir


@functools.cache
def _event_class():
    """tensorflow.Event, with Summary and Summary.Value, as a protobuf class of a private pool (the field numbers
    of TensorFlow's event.proto and summary.proto)."""
    from google.protobuf import descriptor_pb2

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="xlnet_data_event.proto", package="xlnet_data", syntax="proto3")
    value = proto.message_type.add(name="SummaryValue")
    value.field.add(name="tag", number=1, label=f.LABEL_OPTIONAL, type=f.TYPE_STRING)
    value.oneof_decl.add(name="value")
    value.field.add(name="simple_value", number=2, label=f.LABEL_OPTIONAL, type=f.TYPE_FLOAT, oneof_index=0)
    proto.message_type.add(name="Summary").field.add(name="value", number=1, label=f.LABEL_REPEATED,
                                                     type=f.TYPE_MESSAGE, type_name=".xlnet_data.SummaryValue")
    event = proto.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, label=f.LABEL_OPTIONAL, type=f.TYPE_DOUBLE)
    event.field.add(name="step", number=2, label=f.LABEL_OPTIONAL, type=f.TYPE_INT64)
    event.oneof_decl.add(name="what")
    event.field.add(name="file_version", number=3, label=f.LABEL_OPTIONAL, type=f.TYPE_STRING, oneof_index=0)
    event.field.add(name="summary", number=5, label=f.LABEL_OPTIONAL, type=f.TYPE_MESSAGE,
                    type_name=".xlnet_data.Summary", oneof_index=0)
    return protos.message_class(proto, "xlnet_data.Event")


def _masked_crc(data: bytes) -> int:
    return int(masked_crc32c(np.frombuffer(data, dtype=np.uint8), 0, len(data)))


def tfrecord(payload: bytes) -> bytes:
    """One record in TFRecord framing."""
    length = len(payload).to_bytes(8, "little")
    return length + _masked_crc(length).to_bytes(4, "little") + payload + _masked_crc(payload).to_bytes(4, "little")


class EventWriter:
    """Appends events to a new file `events.out.tfevents.<time>.<host>.<pid><suffix>` in `log_dir` (made if
    missing). Each scalars() call is one event, written whole and flushed (a reader of a running trainer's file,
    or of a killed one's, ends at its last whole event: curves.py, TensorBoard)."""

    def __init__(self, log_dir: str, suffix: str = ""):
        os.makedirs(log_dir, exist_ok=True)
        started = time.time()
        self.path = os.path.join(log_dir, f"{FILE_PREFIX}{int(started)}.{socket.gethostname()}.{os.getpid()}{suffix}")
        self._file = open(self.path, "ab")
        self._write(_event_class()(wall_time=started, file_version=FILE_VERSION))

    def _write(self, event) -> None:
        self._file.write(tfrecord(event.SerializeToString()))
        self._file.flush()

    def scalars(self, step: int, values: dict[str, float], wall_time: Optional[float] = None) -> None:
        """The scalars of `step`, by tag (float32, as tf.summary.scalar writes them)."""
        event = _event_class()(wall_time=time.time() if wall_time is None else wall_time, step=int(step))
        for tag, value in values.items():
            event.summary.value.add(tag=tag, simple_value=float(value))
        self._write(event)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
