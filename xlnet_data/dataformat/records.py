"""The records' schema names (FEATURES) and writing records: tf.train.Example protos in TFRecord framing, made
by compiled code without proto objects or TensorFlow. Reading them back: record_reader.py; their checksum:
crc32c.py; their file names: save_dir.py."""

import sys

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from xlnet_data.common import compiled
from xlnet_data.dataformat.crc32c import masked_crc32c

# Feature names and order as the original writes them; all int64 lists.
FEATURES = ("input", "is_masked", "target", "seg_id", "label")
FEATURE_KEYS = np.frombuffer("".join(FEATURES).encode(), dtype=np.uint8)
FEATURE_KEY_LENGTHS = np.array([len(k) for k in FEATURES], dtype=np.int64)


# ---- serialisation: tf.train.Example protos in TFRecord framing, written without proto objects ----

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
        address = compiled.element_pointer(context, builder, signature.args[0], args[0], args[1], ir.IntType(32))
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
        byte = ir.IntType(8)
        cgutils.raw_memcpy(builder, compiled.element_pointer(context, builder, signature.args[0], args[0], args[1], byte),
                           compiled.element_pointer(context, builder, signature.args[2], args[2], args[3], byte),
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
