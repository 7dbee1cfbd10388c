"""The records' schema (tf.train.Example features) and TFRecord framing: writing records, and reading them back
without TensorFlow. Their file names are save_dir.py's."""

import functools
import sys
import zlib

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from xlnet_data.common import compiled, fileio
from xlnet_data.common.errors import UserError

# Feature names and order as the original writes them; all int64 lists.
FEATURES = ("input", "is_masked", "target", "seg_id", "label")


# ---- serialisation: tf.train.Example protos in TFRecord framing, written without proto objects ----

def _crc32c_tables():
    """Slicing-by-8 tables of CRC-32C (Castagnoli, reflected): tables[k][b] is the CRC of byte b followed
    by k zero bytes, so that eight bytes are folded in with eight independent lookups."""
    tables = np.zeros((8, 256), dtype=np.uint32)
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        tables[0, i] = crc
    for k in range(1, 8):
        tables[k] = tables[0][tables[k - 1] & 0xFF] ^ (tables[k - 1] >> 8)
    return tables


CRC32C_TABLES = _crc32c_tables()
FEATURE_KEYS = np.frombuffer("".join(FEATURES).encode(), dtype=np.uint8)
FEATURE_KEY_LENGTHS = np.array([len(k) for k in FEATURES], dtype=np.int64)


def _host_has_crc32_instruction():
    """Whether this CPU has SSE 4.2's crc32 instruction (CRC-32C in hardware), as LLVM sees it."""
    try:
        from llvmlite import binding
        return (binding.get_process_triple().startswith("x86_64")
                and "+sse4.2" in binding.get_host_cpu_features().flatten().split(","))
    except Exception:  # another architecture or llvmlite version: the table-driven CRC is always right
        return False


HARDWARE_CRC32C = _host_has_crc32_instruction()


def _crc32_instruction(state_bits, data_bits):
    """SSE 4.2's `crc32` on a `data_bits` operand (8 or 64), folding it into the CRC-32C state, as a function
    that compiled code calls (LLVM emits the one instruction: no call overhead)."""
    state_type, data_type = getattr(types, f"uint{state_bits}"), getattr(types, f"uint{data_bits}")
    name = f"llvm.x86.sse42.crc32.{state_bits}.{data_bits}"

    @intrinsic
    def crc32(typingctx, crc, data):
        def codegen(context, builder, signature, args):
            function_type = ir.FunctionType(ir.IntType(state_bits), [ir.IntType(state_bits), ir.IntType(data_bits)])
            return builder.call(builder.module.declare_intrinsic(name, fnty=function_type), args)
        return state_type(state_type, data_type), codegen

    return crc32


_crc32_u64 = _crc32_instruction(64, 64)  # eight bytes, a little-endian word
_crc32_u8 = _crc32_instruction(32, 8)


@intrinsic
def _load_u64_unaligned(typingctx, buf, i):
    """The eight bytes at buf[i:] (a uint8 array; need not be aligned) as one native uint64 load, little-endian
    on x86-64 (assembling them from eight byte loads and shifts took 3x the time of the crc32 instructions)."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.gep(array.data, [args[1]])
        return builder.load(builder.bitcast(address, ir.IntType(64).as_pointer()), align=1)
    return types.uint64(buf, types.intp), codegen


@compiled.jit(inline="always")
def crc32c_hardware(buf, begin, end):
    """CRC-32C of buf[begin:end] with the crc32 instruction, eight bytes at a time (x86-64 with SSE 4.2)."""
    crc = np.uint64(0xFFFFFFFF)
    i = begin
    while i + 8 <= end:
        crc = _crc32_u64(crc, _load_u64_unaligned(buf, i))
        i += 8
    small = np.uint32(crc)
    while i < end:
        small = _crc32_u8(small, buf[i])
        i += 1
    return small ^ np.uint32(0xFFFFFFFF)


@compiled.jit(inline="always")
def crc32c_sliced(buf, begin, end):
    """CRC-32C of buf[begin:end] by slicing-by-8 (any CPU): eight table lookups per eight bytes."""
    t = CRC32C_TABLES
    crc = np.uint32(0xFFFFFFFF)
    i = begin
    while i + 8 <= end:
        low = crc ^ (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << np.uint32(8))
                     | (np.uint32(buf[i + 2]) << np.uint32(16)) | (np.uint32(buf[i + 3]) << np.uint32(24)))
        crc = (t[7, low & np.uint32(0xFF)] ^ t[6, (low >> np.uint32(8)) & np.uint32(0xFF)]
               ^ t[5, (low >> np.uint32(16)) & np.uint32(0xFF)] ^ t[4, low >> np.uint32(24)]
               ^ t[3, buf[i + 4]] ^ t[2, buf[i + 5]] ^ t[1, buf[i + 6]] ^ t[0, buf[i + 7]])
        i += 8
    while i < end:
        crc = t[0, (crc ^ buf[i]) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
        i += 1
    return crc ^ np.uint32(0xFFFFFFFF)


_crc32c = crc32c_hardware if HARDWARE_CRC32C else crc32c_sliced


@compiled.jit(inline="always")
def masked_crc32c(buf, begin, end):
    """TFRecord's checksum of buf[begin:end]: CRC-32C, rotated right by 15 bits, plus a constant."""
    crc = _crc32c(buf, begin, end)
    rotated = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) & np.uint32(0xFFFFFFFF)
    return (np.uint64(rotated) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)


@compiled.jit(inline="always")
def _varint_size(v):
    """Bytes of the varint of a non-negative int64, without a loop (the sizes of all values are summed first)."""
    return (1 + (v >= 1 << 7) + (v >= 1 << 14) + (v >= 1 << 21) + (v >= 1 << 28) + (v >= 1 << 35) + (v >= 1 << 42)
            + (v >= 1 << 49) + (v >= 1 << 56))


@compiled.jit(inline="always")
def put_varint(buf, pos, v):
    """Writes the varint of one non-negative value at buf[pos:]; returns the end."""
    if v < 0x80:  # most values of a record's headers, and frequent ids: one byte
        buf[pos] = v
        return pos + 1
    if v < 0x4000:  # most other ids: two bytes
        buf[pos] = (v & 0x7F) | 0x80
        buf[pos + 1] = v >> 7
        return pos + 2
    while v >= 0x80:
        buf[pos] = (v & 0x7F) | 0x80
        v >>= 7
        pos += 1
    buf[pos] = v
    return pos + 1


LITTLE_ENDIAN = sys.byteorder == "little"  # put_varints' 4-byte stores put the first varint byte first


@intrinsic
def _store_u32_unaligned(typingctx, buf, i, value):
    """Stores the uint32 `value` at buf[i:i + 4] (a uint8 array; need not be aligned) as one native store."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.bitcast(builder.gep(array.data, [args[1]]), ir.IntType(32).as_pointer())
        builder.store(builder.trunc(args[2], ir.IntType(32)) if args[2].type.width > 32 else args[2], address, align=1)
        return context.get_dummy_value()
    return types.none(buf, types.intp, value), codegen


@compiled.jit(inline="always")
def put_varints(buf, pos, values, begin, end):
    """Writes the varints of values[begin:end] (non-negative) at buf[pos:]; returns the end.

    Ids below 2**21 (every vocabulary) take one, two or three bytes at random, which branches mispredict:
    their 1-3 bytes are made without a branch and stored as one 4-byte word, the position moved by their
    size (what follows a value overwrites the bytes stored past it; `buf` needs 3 bytes of room past the
    end). Should a value be larger, all are written again one by one.
    """
    if LITTLE_ENDIAN:
        start = pos
        seen = 0  # every value OR-ed together: below 2**21 when each of them is
        for k in range(begin, end):
            v = values[k]
            seen |= v
            two, three = v >= 0x80, v >= 0x4000
            word = (v & 0x7F) | (two << 7) | ((v & 0x3F80) << 1) | (three << 15) | ((v & 0x1FC000) << 2)
            _store_u32_unaligned(buf, pos, word)
            pos += 1 + two + three
        if 0 <= seen < 1 << 21:
            return pos
        pos = start
    for k in range(begin, end):
        pos = put_varint(buf, pos, values[k])
    return pos


@compiled.jit()
def varints_bytes_bound(count):
    """Room for put_varints of `count` values below 2**32 (5 bytes at most each, and the 3 bytes a 4-byte
    store can reach past the end)."""
    return 5 * count + 3


@intrinsic
def _memcpy(typingctx, dst, dst_pos, src, src_pos, count):
    """Copies `count` bytes from src[src_pos:] to dst[dst_pos:] (uint8 arrays, not overlapping) with LLVM's
    memcpy: numba's slice assignment costs ~70 ns more a call, and a loop of byte stores ran at 2.5 cycles a
    byte (3 µs a record) where the compiler could not tell that its indices are never negative."""
    def codegen(context, builder, signature, args):
        dst_array = context.make_array(signature.args[0])(context, builder, args[0])
        src_array = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memcpy(builder, builder.gep(dst_array.data, [args[1]]), builder.gep(src_array.data, [args[3]]),
                           args[4], 1)
        return context.get_dummy_value()
    return types.none(dst, types.intp, src, types.intp, types.intp), codegen


@compiled.jit(inline="always")
def copy_bytes(dst, pos, src, begin, end):
    """Copies src[begin:end] to dst[pos:] (uint8 arrays, not overlapping); returns the end."""
    _memcpy(dst, pos, src, begin, end - begin)
    return pos + end - begin


@compiled.jit(inline="always")
def _put_le(buf, pos, v, nbytes):
    for k in range(nbytes):
        buf[pos + k] = (v >> (8 * k)) & 0xFF
    return pos + nbytes


@compiled.jit(inline="always")
def _int64_list_size(payload_size):
    """Bytes of an Int64List of packed varints of `payload_size` bytes (nothing for an empty list)."""
    return 1 + _varint_size(payload_size) + payload_size if payload_size else 0


@compiled.jit(inline="always")
def _feature_size(int64_list_size):
    """Bytes of a Feature holding an Int64List of `int64_list_size` bytes."""
    return 1 + _varint_size(int64_list_size) + int64_list_size


@compiled.jit(inline="always")
def _entry_size(key_length, payload_size):
    """Bytes of a Features.feature map entry: its key and a Feature of packed varints of `payload_size` bytes."""
    feature = _feature_size(_int64_list_size(payload_size))
    return 1 + _varint_size(key_length) + key_length + 1 + _varint_size(feature) + feature


@compiled.jit()
def max_record_bytes(seq_len):
    """An upper bound of one framed record's size (ids below 2**32 take at most 5 varint bytes)."""
    return 16 + 4 * (seq_len * 5 + 64) + 64 + 16


@compiled.jit()
def put_record(buf, pos, payloads, begins, ends, keys, key_lengths):
    """Writes one tf.train.Example of int64-list features as a TFRecord at `buf[pos:]`; returns the end.

    Feature f, named by the f-th key in `keys`, comes encoded: the varints of its values (put_varints; a
    value below 128 is its own byte) are payloads[begins[f]:ends[f]], none for an empty list. Encoded by
    the caller, a feature costs one pass over its values, not a pass for its size and another to write it,
    and a feature made of another's values (the target is the input shifted) can be a copy of its bytes.
    """
    num_features = begins.shape[0]
    features_len = 0
    for f in range(num_features):
        entry = _entry_size(key_lengths[f], ends[f] - begins[f])
        features_len += 1 + _varint_size(entry) + entry
    example_len = 1 + _varint_size(features_len) + features_len

    start = pos
    pos = _put_le(buf, pos, example_len, 8)
    pos = _put_le(buf, pos, masked_crc32c(buf, start, start + 8), 4)
    data_start = pos
    buf[pos] = 0x0A  # Example.features
    pos = put_varint(buf, pos + 1, features_len)
    key_start = 0
    for f in range(num_features):
        payload_size = ends[f] - begins[f]
        int64_list = _int64_list_size(payload_size)
        buf[pos] = 0x0A  # Features.feature map entry
        pos = put_varint(buf, pos + 1, _entry_size(key_lengths[f], payload_size))
        buf[pos] = 0x0A  # entry.key
        pos = put_varint(buf, pos + 1, key_lengths[f])
        pos = copy_bytes(buf, pos, keys, key_start, key_start + key_lengths[f])
        key_start += key_lengths[f]
        buf[pos] = 0x12  # entry.value: Feature
        pos = put_varint(buf, pos + 1, _feature_size(int64_list))
        buf[pos] = 0x1A  # Feature.int64_list
        pos = put_varint(buf, pos + 1, int64_list)
        if payload_size:
            buf[pos] = 0x0A  # Int64List.value, packed
            pos = put_varint(buf, pos + 1, payload_size)
            pos = copy_bytes(buf, pos, payloads, begins[f], ends[f])
    pos = _put_le(buf, pos, masked_crc32c(buf, data_start, pos), 4)
    return pos


# ---- reading: TFRecord framing (plain or gzip) and the tf.train.Example schema, without TensorFlow ----

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


def _crc_matches(chunk, end):
    """Whether chunk[end:end + 4] holds the TFRecord checksum (masked CRC32C) of chunk[:end]."""
    stored = int.from_bytes(chunk[end:end + 4], "little")
    return stored == int(masked_crc32c(np.frombuffer(chunk, dtype=np.uint8), 0, end))


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
            if verify_crc and not _crc_matches(header, 8):
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
            if verify_crc and body is not None and not _crc_matches(body, length):
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
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

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
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("xlnet_data.Example")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


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
