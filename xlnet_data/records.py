"""The records' schema, their serialisation, file names and the info JSON files."""

import json
import os

import numba
import numpy as np

# Feature names and order as the original writes them; all int64 lists.
FEATURES = ("input", "is_masked", "target", "seg_id", "label")


def format_filename(prefix, bsz_per_host, seq_len, bi_data, suffix, mask_alpha=5, mask_beta=1,
                    reuse_len=None, uncased=False, fixed_num_predict=None):
    """The original's file-name scheme, e.g. `train-0-0.bsz-8.seqlen-128.reuse-64.bi.alpha-6.beta-1.fnp-21.tfrecords`."""
    reuse_part = "" if reuse_len is None else f"reuse-{reuse_len}."
    uncased_part = "uncased." if uncased else ""
    direction = "bi" if bi_data else "uni"
    fnp_part = "" if fixed_num_predict is None else f"fnp-{fixed_num_predict}."
    return (f"{prefix}.bsz-{bsz_per_host}.seqlen-{seq_len}.{reuse_part}{uncased_part}{direction}"
            f".alpha-{mask_alpha}.beta-{mask_beta}.{fnp_part}{suffix}")


def feature_lengths(seq_len):
    """Expected length of each feature of one example."""
    return {"input": seq_len, "is_masked": seq_len, "target": seq_len, "seg_id": seq_len, "label": 1}


# ---- serialisation: tf.train.Example protos in TFRecord framing, written without proto objects ----

def _crc32c_table():
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table[i] = crc
    return table


CRC32C_TABLE = _crc32c_table()
FEATURE_KEYS = np.frombuffer("".join(FEATURES).encode(), dtype=np.uint8)
FEATURE_KEY_LENGTHS = np.array([len(k) for k in FEATURES], dtype=np.int64)


@numba.njit(cache=True)
def _masked_crc32c(buf, begin, end, table):
    crc = np.uint32(0xFFFFFFFF)
    for i in range(begin, end):
        crc = table[(crc ^ buf[i]) & 0xFF] ^ (crc >> np.uint32(8))
    crc = crc ^ np.uint32(0xFFFFFFFF)
    rotated = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) & np.uint32(0xFFFFFFFF)
    return (np.uint64(rotated) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)


@numba.njit(cache=True)
def _varint_size(v):
    size = 1
    while v >= 0x80:
        v >>= 7
        size += 1
    return size


@numba.njit(cache=True)
def _put_varint(buf, pos, v):
    while v >= 0x80:
        buf[pos] = (v & 0x7F) | 0x80
        v >>= 7
        pos += 1
    buf[pos] = v
    return pos + 1


@numba.njit(cache=True)
def _put_le(buf, pos, v, nbytes):
    for k in range(nbytes):
        buf[pos + k] = (v >> (8 * k)) & 0xFF
    return pos + nbytes


@numba.njit(cache=True)
def max_record_bytes(seq_len):
    """An upper bound of one framed record's size (ids below 2**32 take at most 5 varint bytes)."""
    return 16 + 4 * (seq_len * 5 + 64) + 64 + 16


@numba.njit(cache=True)
def put_record(buf, pos, values, lengths, keys, key_lengths, crc_table):
    """Writes one tf.train.Example of int64-list features as a TFRecord at `buf[pos:]`; returns the end.

    `values[f, :lengths[f]]` holds feature f (non-negative), named by the f-th key in `keys`.
    """
    num_features = lengths.shape[0]
    packed = np.zeros(num_features, dtype=np.int64)
    entry = np.zeros(num_features, dtype=np.int64)
    features_len = 0
    for f in range(num_features):
        for k in range(lengths[f]):
            packed[f] += _varint_size(values[f, k])
        int64_list = 1 + _varint_size(packed[f]) + packed[f] if lengths[f] else 0
        feature = 1 + _varint_size(int64_list) + int64_list
        entry[f] = 1 + _varint_size(key_lengths[f]) + key_lengths[f] + 1 + _varint_size(feature) + feature
        features_len += 1 + _varint_size(entry[f]) + entry[f]
    example_len = 1 + _varint_size(features_len) + features_len

    start = pos
    pos = _put_le(buf, pos, example_len, 8)
    pos = _put_le(buf, pos, _masked_crc32c(buf, start, start + 8, crc_table), 4)
    data_start = pos
    buf[pos] = 0x0A  # Example.features
    pos = _put_varint(buf, pos + 1, features_len)
    key_start = 0
    for f in range(num_features):
        int64_list = 1 + _varint_size(packed[f]) + packed[f] if lengths[f] else 0
        buf[pos] = 0x0A  # Features.feature map entry
        pos = _put_varint(buf, pos + 1, entry[f])
        buf[pos] = 0x0A  # entry.key
        pos = _put_varint(buf, pos + 1, key_lengths[f])
        for k in range(key_lengths[f]):
            buf[pos + k] = keys[key_start + k]
        pos += key_lengths[f]
        key_start += key_lengths[f]
        buf[pos] = 0x12  # entry.value: Feature
        pos = _put_varint(buf, pos + 1, 1 + _varint_size(int64_list) + int64_list)
        buf[pos] = 0x1A  # Feature.int64_list
        pos = _put_varint(buf, pos + 1, int64_list)
        if lengths[f]:
            buf[pos] = 0x0A  # Int64List.value, packed
            pos = _put_varint(buf, pos + 1, packed[f])
            for k in range(lengths[f]):
                pos = _put_varint(buf, pos, values[f, k])
    pos = _put_le(buf, pos, _masked_crc32c(buf, data_start, pos, crc_table), 4)
    return pos


# ---- reading ----

class RecordError(ValueError):
    """A tfrecords file that is truncated, corrupt, or not of this schema; names the file and record."""


def _crc32c_of(data):
    return int(_masked_crc32c(np.frombuffer(data, dtype=np.uint8), 0, len(data), CRC32C_TABLE))


def read_records(path, verify_crc=True):
    """Yields the raw records of a tfrecords file (gzip when the name ends in .gz), checking the framing."""
    import gzip
    import struct
    from xlnet_data import fileio

    with fileio.open_read(path) as raw_file:
        f = gzip.GzipFile(fileobj=raw_file) if path.endswith(".gz") else raw_file
        index = 0
        while True:
            try:
                header = f.read(12)
            except (OSError, EOFError) as err:
                raise RecordError(f"{path}: record {index}: cannot read ({err})") from None
            if not header:
                return
            if len(header) < 12:
                raise RecordError(f"{path}: record {index}: truncated (file ends inside a record header)")
            (length,) = struct.unpack("<Q", header[:8])
            if verify_crc and struct.unpack("<I", header[8:])[0] != _crc32c_of(header[:8]):
                raise RecordError(f"{path}: record {index}: corrupt length (CRC mismatch); not a tfrecords file?")
            try:
                data, footer = f.read(length), f.read(4)
            except (OSError, EOFError) as err:
                raise RecordError(f"{path}: record {index}: cannot read ({err})") from None
            if len(data) < length or len(footer) < 4:
                raise RecordError(f"{path}: record {index}: truncated (file ends inside the record)")
            if verify_crc and struct.unpack("<I", footer)[0] != _crc32c_of(data):
                raise RecordError(f"{path}: record {index}: corrupt data (CRC mismatch)")
            yield data
            index += 1


def parse_example(raw, seq_len=None, where=""):
    """A record's features as {name: int64 array}; RecordError when it is not this schema."""
    from tensorflow.core.example import example_pb2  # the proto only; importing it is cheap

    example = example_pb2.Example()
    try:
        example.ParseFromString(raw)
    except Exception:  # protobuf raises its own DecodeError
        raise RecordError(f"{where}: not a tf.train.Example") from None
    feature = example.features.feature
    if set(feature.keys()) != set(FEATURES):
        raise RecordError(f"{where}: features {sorted(feature.keys())}, expected {sorted(FEATURES)}")
    values = {name: np.array(feature[name].int64_list.value, dtype=np.int64) for name in FEATURES}
    if seq_len is not None:
        wrong = [n for n, want in feature_lengths(seq_len).items() if values[n].shape[0] != want]
        if wrong:
            raise RecordError(f"{where}: feature {wrong[0]} has {values[wrong[0]].shape[0]} values, "
                              f"expected {feature_lengths(seq_len)[wrong[0]]}")
    return values


def read_examples(path, seq_len=None):
    """Yields (index, features) of every record of a file; RecordError names the file and record."""
    for index, raw in enumerate(read_records(path)):
        yield index, parse_example(raw, seq_len, where=f"{path}: record {index}")
