"""Reading records back without TensorFlow: TFRecord framing (plain or gzip, told by its magic bytes), each
frame's CRC checked, and each payload parsed as a tf.train.Example and checked against the XLNet schema
(records.FEATURES). A damaged file raises RecordError naming the file, the record and its byte."""

import functools
import zlib

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import crc32c, protos
from xlnet_data.dataformat.records import FEATURES


class RecordError(UserError, ValueError):
    """A tfrecords file that cannot be read at one record: truncated, corrupt, or not of this schema.

    `path`, `index` (the record's number in the file, from 0), `offset` (its byte in the
    decompressed stream, or None) and `reason`; the message is one line naming all of them.
    """

    def __init__(self, path, index, reason, offset=None):
        self.path, self.index, self.reason, self.offset = path, index, reason, offset
        where = f"record {index}" if offset is None else f"record {index} (byte {offset})"
        super().__init__(reason if path is None else f"{path}: {where}: {reason}")


class SchemaError(RecordError):
    """A record that is not an XLNet pretraining example (feature names, kinds, lengths, values)."""


class _GzipStream:
    """The decompressed bytes of a gzip file (one or more members, zero padding allowed), read lazily.

    On a truncated or corrupt stream, read() returns every byte before the bad spot and then
    nothing, and `problem` says what went wrong, so that the error can name the exact record.
    Not gzip.GzipFile: a GzipFile.read that meets the bad spot raises and drops everything it had
    decompressed in that call, so with the large reads below the records before the damage would be
    lost and the error would name the wrong one (tests/test_records.py tries both cases).
    """

    _CHUNK = 1 << 15

    def __init__(self, raw):
        self._raw = raw
        self._out = bytearray()
        self._dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._done = False
        self.problem = None

    def read(self, size):
        while len(self._out) < size and not self._done:
            self._fill()
        out = bytes(self._out[:size])
        del self._out[:size]
        return out

    def close(self):
        self._raw.close()

    def _stop(self, problem=None):
        self._done, self.problem = True, problem

    def _fill(self):
        if not self._dec.eof:
            chunk = self._raw.read(self._CHUNK)
            if not chunk:
                return self._stop("the gzip stream is truncated")
        else:  # a member has ended: skip zero padding; anything else must be the next member
            chunk = self._dec.unused_data.lstrip(b"\0")
            while not chunk:
                more = self._raw.read(self._CHUNK)
                if not more:
                    return self._stop()  # a clean end
                chunk = more.lstrip(b"\0")
            if not chunk.startswith(b"\x1f\x8b"):
                return self._stop("data after the end of the gzip stream is not gzip")
            self._dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
        before = self._dec.copy()
        try:
            self._out += self._dec.decompress(chunk)
        except zlib.error:
            # A failed call loses its output: feed the chunk again byte by byte to keep all before the bad spot.
            self._dec = before
            try:
                for i in range(len(chunk)):
                    self._out += self._dec.decompress(chunk[i:i + 1])
            except zlib.error as err:
                self._stop(f"gzip data error ({err})")


def _open_records(path):
    """A reader of the file's record bytes; gzip is told by its magic bytes, not by its name."""
    try:
        raw = fileio.open_read(path)
    except OSError as err:
        raise RecordError(path, 0, f"cannot open: {err.strerror or err}") from None
    try:
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
    except OSError as err:
        raw.close()
        raise RecordError(path, 0, f"cannot read: {err.strerror or err}") from None
    return _GzipStream(raw) if gzipped else raw


def _read_up_to(stream, size, piece=1 << 26):
    """stream.read(size) without allocating `size` bytes up front (an unchecked length can be huge)."""
    parts = []
    while size > 0:
        part = stream.read(min(size, piece))
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _cut_short(stream, what, got, want):
    """Why reading `what` ended after `got` of `want` bytes: the gzip stream's problem, else truncation."""
    problem = getattr(stream, "problem", None)
    cause = f"truncated {what}" if problem is None else f"{problem}; {what} incomplete"
    return f"{cause} ({got} of {want} bytes)"


def _skip(stream, size):
    """Moves `size` bytes ahead (seeking where the stream can); returns how many there were to skip."""
    if getattr(stream, "seekable", lambda: False)():
        here = stream.tell()
        end = stream.seek(0, 2)
        target = min(here + size, end)
        stream.seek(target)
        return target - here
    skipped = 0
    while skipped < size:
        part = stream.read(min(size - skipped, 1 << 20))
        if not part:
            break
        skipped += len(part)
    return skipped


def read_records(path, verify_crc=True, skip_data=False):
    """Yields `(index, offset, payload)` for each record of a tfrecords file, plain or gzip.

    `offset` is the record's byte in the (decompressed) stream. On a truncated file, a CRC
    mismatch or a gzip error, raises RecordError naming the file and the record, after
    yielding every record before it. With `skip_data` the payloads are skipped, not read (the
    payload's length is yielded instead; only the length CRCs are checked): a cheap walk over the framing.
    """
    stream = _open_records(path)
    try:
        index = offset = 0
        while True:
            header = stream.read(12)
            if not header:
                problem = getattr(stream, "problem", None)
                if problem is None:
                    return
                raise RecordError(path, index, problem, offset)
            if len(header) < 12:
                raise RecordError(path, index, _cut_short(stream, "record header", len(header), 12), offset)
            if verify_crc and not crc32c.crc_matches(header, 8):
                what = "not a TFRecord file" if index == 0 else "corrupt record"
                raise RecordError(path, index, f"{what}: length CRC mismatch", offset)
            length = int.from_bytes(header[:8], "little")
            if skip_data:
                got = _skip(stream, length + 4)
                body = None
            else:
                body = _read_up_to(stream, length + 4)
                got = len(body)
            if got < length + 4:
                raise RecordError(path, index, _cut_short(stream, "record data", got, length + 4), offset)
            if verify_crc and body is not None and not crc32c.crc_matches(body, length):
                raise RecordError(path, index, "corrupt record: data CRC mismatch", offset)
            yield index, offset, length if body is None else body[:length]
            index += 1
            offset += length + 16
    finally:
        stream.close()


def count_records(path):
    """(number of records, bytes) of a tfrecords file, plain or gzip, walking the framing only (data
    skipped, length CRCs checked); RecordError on a truncated or corrupt frame."""
    count = end = 0
    for index, offset, length in read_records(path, skip_data=True):
        count, end = index + 1, offset + length + 16
    return count, end


@functools.cache
def _example_class():
    """tf.train.Example as a protobuf class built in a private pool: wire-compatible, no TensorFlow."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto(name="xlnet_data_example.proto", package="xlnet_data",
                                               syntax="proto3")
    f = descriptor_pb2.FieldDescriptorProto
    for name, value_type in (("BytesList", f.TYPE_BYTES), ("FloatList", f.TYPE_FLOAT), ("Int64List", f.TYPE_INT64)):
        proto.message_type.add(name=name).field.add(name="value", number=1, label=f.LABEL_REPEATED,
                                                     type=value_type)
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
            (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), 1):
        feature.field.add(name=name, number=number, label=f.LABEL_OPTIONAL, type=f.TYPE_MESSAGE,
                          type_name=f".xlnet_data.{type_name}", oneof_index=0)
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=f.LABEL_OPTIONAL, type=f.TYPE_STRING)
    entry.field.add(name="value", number=2, label=f.LABEL_OPTIONAL, type=f.TYPE_MESSAGE,
                    type_name=".xlnet_data.Feature")
    features.field.add(name="feature", number=1, label=f.LABEL_REPEATED, type=f.TYPE_MESSAGE,
                       type_name=".xlnet_data.Features.FeatureEntry")
    proto.message_type.add(name="Example").field.add(name="features", number=1, label=f.LABEL_OPTIONAL,
                                                     type=f.TYPE_MESSAGE, type_name=".xlnet_data.Features")
    return protos.message_class(proto, "xlnet_data.Example")


_VALUE_RANGES = {"is_masked": (0, 1), "seg_id": (0, 2), "label": (0, 1)}
_INT64_MAX = np.iinfo(np.int64).max


def _first_outside(values, low, high):
    """The first of `values` outside low..high, or None (min and max first: the usual case is quick)."""
    if values.min() >= low and values.max() <= high:
        return None
    return values[(values < low) | (values > high)][0]


def parse_example(payload, seq_len=None, vocab_size=None, path=None, index=None, offset=None):
    """One serialized tf.train.Example as {name: int64 array}, checked against the XLNet schema.

    The schema: exactly FEATURES, all int64 lists; one label, the others of one length (at
    least 4; `seq_len` if given); is_masked and label 0 or 1, seg_id 0..2; input and target
    ids non-negative (and below `vocab_size` if given). Raises SchemaError saying what is
    wrong; `path`, `index` and `offset` only say where the record is, for the message.
    """
    from google.protobuf.message import DecodeError

    def invalid(reason):
        return SchemaError(path, index, reason, offset)

    example = _example_class()()
    try:
        example.ParseFromString(payload)
    except DecodeError:
        raise invalid("not a serialized tf.train.Example") from None
    feature = example.features.feature
    if set(feature.keys()) != set(FEATURES):
        missing = [n for n in FEATURES if n not in feature]
        extra = sorted(set(feature.keys()) - set(FEATURES))
        parts = ["missing " + ", ".join(missing)] if missing else []
        if extra:
            parts.append("unexpected " + ", ".join(extra[:8]) + (" …" if len(extra) > 8 else ""))
        raise invalid(f"not an XLNet pretraining example: {'; '.join(parts)} "
                      f"(expected features {', '.join(FEATURES)})")
    out = {}
    for name in FEATURES:
        kind = feature[name].WhichOneof("kind")
        if kind != "int64_list":
            raise invalid(f"feature {name!r} is {kind or 'empty'}, not an int64_list")
        out[name] = np.array(feature[name].int64_list.value, dtype=np.int64)

    length = len(out["input"])
    if len(out["label"]) != 1:
        raise invalid(f"feature 'label' has {len(out['label'])} values, not 1")
    for name in ("is_masked", "target", "seg_id"):
        if len(out[name]) != length:
            raise invalid(f"feature {name!r} has {len(out[name])} values but 'input' has {length}")
    if seq_len is not None and length != seq_len:
        raise invalid(f"the example has {length} positions, not seq_len={seq_len}")
    if length < 4:
        raise invalid(f"the example has only {length} positions")
    for name, (low, high) in _VALUE_RANGES.items():
        bad = _first_outside(out[name], low, high)
        if bad is not None:
            raise invalid(f"feature {name!r} holds {bad}, outside {low}..{high}")
    for name in ("input", "target"):
        bad = _first_outside(out[name], 0, vocab_size - 1 if vocab_size else _INT64_MAX)
        if bad is not None:
            size = "" if vocab_size is None else f" (size {vocab_size})"
            raise invalid(f"feature {name!r} holds id {bad}, outside the vocabulary{size}")
    return out


def read_numbered_examples(path, seq_len=None, vocab_size=None, verify_crc=True):
    """Yields (index, {feature name: int64 array}) for each record of a tfrecords file, plain or gzip.

    Raises RecordError (SchemaError for a record of another schema) naming the file and the record.
    """
    for index, offset, payload in read_records(path, verify_crc):
        yield index, parse_example(payload, seq_len, vocab_size, path, index, offset)
