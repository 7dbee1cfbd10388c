"""Tests of the TFRecord reader in xlnet_data.dataformat.records: framing, CRCs, gzip and the example schema.

Most records here are written by records.put_record (the writer `create` uses); the reader
is also checked against TensorFlow's own parse of the g1 golden.
"""

import gzip
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from conftest import G1, ROOT, SHARED, g1_file

from xlnet_data.dataformat import crc32c, record_reader, records
from xlnet_data.dataformat.record_reader import RecordError, SchemaError
from xlnet_data.dataformat.records import FEATURES
from xlnet_data.dataformat.vocab import CLS_ID, SEP_ID

needs_g1 = pytest.mark.skipif(not (G1 / "expected").is_dir(), reason=f"golden g1_blog not found under {SHARED}")


def random_examples(count, seq_len=16, seed=0):
    """Examples within the schema's value ranges (not a real layout), as {name: list}."""
    rng = np.random.default_rng(seed)
    return [{"input": rng.integers(0, 32000, seq_len).tolist(), "is_masked": rng.integers(0, 2, seq_len).tolist(),
             "target": rng.integers(0, 32000, seq_len).tolist(), "seg_id": rng.integers(0, 3, seq_len).tolist(),
             "label": [int(rng.integers(0, 2))]} for _ in range(count)]


def encode(examples):
    """The TFRecord bytes of `examples` ({name: list of ints}), written by records.put_record."""
    names = list(examples[0])
    keys = np.frombuffer("".join(names).encode(), dtype=np.uint8)
    key_lengths = np.array([len(n) for n in names], dtype=np.int64)
    width = max(len(v) for ex in examples for v in ex.values())
    buf = np.zeros(len(examples) * records.max_record_bytes(width), dtype=np.uint8)
    region = 9 * width + 3  # a non-negative int64 takes up to 9 varint bytes; put_varints' stores 3 past the end
    begins = np.arange(len(names), dtype=np.int64) * region
    pos = 0
    for ex in examples:
        payloads = np.zeros(len(names) * region, dtype=np.uint8)
        ends = np.array([records.put_varints(payloads, begin, np.array(ex[name], dtype=np.int64), 0, len(ex[name]))
                         for begin, name in zip(begins, names)], dtype=np.int64)
        pos = records.put_record(buf, pos, payloads, begins, ends, keys, key_lengths)
    return buf[:pos].tobytes()


def record_offsets(data):
    """Where each record of plain TFRecord bytes begins, and the end."""
    offsets = [0]
    while offsets[-1] < len(data):
        offsets.append(offsets[-1] + int.from_bytes(data[offsets[-1]:offsets[-1] + 8], "little") + 16)
    return offsets


def read_until_error(path, **kwargs):
    """(indices read, the RecordError) of reading a file that is expected to be bad."""
    seen = []
    with pytest.raises(RecordError) as err:
        for index, _, _ in record_reader.read_records(str(path), **kwargs):
            seen.append(index)
    return seen, err.value


# ---------------------------------------------------------------- framing, CRCs, gzip


def test_masked_crc32c_known_value():
    crc = 0xE3069283  # the CRC-32C check value, of b"123456789"
    masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    data = np.frombuffer(b"123456789", dtype=np.uint8)
    assert crc32c.masked_crc32c(data, 0, 9) == masked
    assert crc32c.crc32c_sliced(data, 0, 9) == crc
    if crc32c.HARDWARE_CRC32C:
        assert crc32c.crc32c_hardware(data, 0, 9) == crc


def bytewise_crc32c(data):
    """CRC-32C bit by bit, from its definition (reflected polynomial 0x82F63B78): the reference."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("begin, end", [(0, 0), (0, 1), (3, 10), (0, 8), (1, 17), (5, 300), (7, 1000)])
def test_sliced_and_hardware_crc32c_equal_the_definition_at_any_offset(begin, end):
    data = np.random.default_rng(end).integers(0, 256, 1024, dtype=np.uint8)
    want = bytewise_crc32c(data[begin:end].tobytes())
    assert crc32c.crc32c_sliced(data, begin, end) == want
    if not crc32c.HARDWARE_CRC32C:
        pytest.skip("this CPU has no crc32 instruction; the sliced CRC is the one in use")
    assert crc32c.crc32c_hardware(data, begin, end) == want


def test_round_trip_plain_and_gzip_told_by_content(tmp_path):
    examples = random_examples(40)
    data = encode(examples)
    offsets = record_offsets(data)
    paths = {"plain.tfrecords": data, "packed.tfrecords.gz": gzip.compress(data),
             "packed_without_suffix.tfrecords": gzip.compress(data), "plain_named.tfrecords.gz": data}
    for name, content in paths.items():
        path = tmp_path / name
        path.write_bytes(content)
        assert [(i, o) for i, o, _ in record_reader.read_records(str(path))] == list(enumerate(offsets[:-1])), name
        got = list(record_reader.read_numbered_examples(str(path), seq_len=16, vocab_size=32000))
        assert [i for i, _ in got] == list(range(40))
        for (_, features), want in zip(got, examples):
            assert {k: v.tolist() for k, v in features.items()} == want
            assert all(v.dtype == np.int64 for v in features.values())
    empty = tmp_path / "empty.tfrecords"
    empty.write_bytes(b"")
    assert list(record_reader.read_numbered_examples(str(empty))) == []


@pytest.mark.parametrize("large", [0, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**35, 2**63 - 1])
def test_every_varint_length_round_trips(tmp_path, large):
    """Values of every varint length (1 to 9 bytes), so the writer's fast paths for small ids and its general
    path agree with protobuf's parser."""
    example = random_examples(1, seed=large % 1000)[0]
    example["input"][3] = example["target"][7] = large
    path = tmp_path / "r.tfrecords"
    path.write_bytes(encode([example]))
    (_, features), = record_reader.read_numbered_examples(str(path), seq_len=16)
    assert {k: v.tolist() for k, v in features.items()} == example


@pytest.mark.slow
def test_reading_never_imports_tensorflow(tmp_path):
    path = tmp_path / "r.tfrecords.gz"
    path.write_bytes(gzip.compress(encode(random_examples(3))))
    code = ("import sys; from xlnet_data.dataformat import record_reader; "
            f"assert len(list(record_reader.read_numbered_examples({str(path)!r}))) == 3; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'")
    res = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_crc_corruption_names_the_record(tmp_path):
    data = encode(random_examples(20))
    offsets = record_offsets(data)
    path = tmp_path / "bad.tfrecords"

    corrupt = bytearray(data)
    corrupt[offsets[7] + 20] ^= 0x10                 # inside record 7's payload
    path.write_bytes(bytes(corrupt))
    seen, err = read_until_error(path)
    assert seen == list(range(7))                    # every record before it is yielded first
    assert (err.path, err.index, err.offset) == (str(path), 7, offsets[7])
    assert "data CRC mismatch" in err.reason
    assert str(err) == f"{path}: record 7 (byte {offsets[7]}): corrupt record: data CRC mismatch"
    assert len(list(record_reader.read_records(str(path), verify_crc=False))) == 20

    corrupt = bytearray(data)
    corrupt[offsets[3] + 1] ^= 0x01                  # record 3's length
    path.write_bytes(bytes(corrupt))
    seen, err = read_until_error(path)
    assert seen == [0, 1, 2] and err.index == 3 and "corrupt record: length CRC mismatch" in str(err)

    path.write_bytes(os.urandom(3000))
    _, err = read_until_error(path)
    assert err.index == 0 and "not a TFRecord file" in str(err)


def test_truncation_names_the_record(tmp_path):
    data = encode(random_examples(20))
    offsets = record_offsets(data)
    path = tmp_path / "cut.tfrecords"
    for cut, what, got in ((offsets[5] + 100, "record data", 88), (offsets[12] + 5, "record header", 5)):
        path.write_bytes(data[:cut])
        index = 5 if cut < offsets[6] else 12
        seen, err = read_until_error(path)
        want = offsets[index + 1] - offsets[index] - 12 if what == "record data" else 12
        assert seen == list(range(index)) and err.index == index
        assert err.reason == f"truncated {what} ({got} of {want} bytes)"

    packed = tmp_path / "cut.tfrecords.gz"
    packed.write_bytes(gzip.compress(data)[:-40])
    seen, err = read_until_error(packed)
    assert err.index == len(seen) and err.index >= 15
    assert "the gzip stream is truncated" in err.reason

    packed.write_bytes(gzip.compress(data) + b"\0" * 4 + b"junk")
    seen, err = read_until_error(packed)
    assert seen == list(range(20)) and "not gzip" in str(err)


def test_gzip_data_error_names_the_exact_record(tmp_path):
    """zlib drops the output of a call that fails; the bytes before the bad spot are still read."""
    data = encode(random_examples(200))
    offsets = record_offsets(data)
    cut = offsets[30] + 7                             # inside record 30's header
    packer = zlib.compressobj(0, zlib.DEFLATED, 16 + zlib.MAX_WBITS)   # stored blocks
    first = packer.compress(data[:cut]) + packer.flush(zlib.Z_FULL_FLUSH)
    assert first.endswith(b"\0\0\xff\xff")           # an empty stored block: LEN 0, NLEN ~0
    packed = bytearray(first + packer.compress(data[cut:]) + packer.flush())
    packed[len(first) - 1] ^= 0x01                   # NLEN no longer matches LEN
    path = tmp_path / "bad.tfrecords.gz"
    path.write_bytes(bytes(packed))
    seen, err = read_until_error(path)
    assert seen == list(range(30)) and err.index == 30
    assert "gzip data error" in err.reason and "invalid stored block lengths" in err.reason
    assert "record header incomplete (7 of 12 bytes)" in err.reason


@pytest.mark.slow
@needs_g1
def test_read_numbered_examples_equals_tensorflow_plain_and_gzip(g1, tmp_path):
    gz = g1_file()
    plain = tmp_path / "plain.tfrecords"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    for path in (gz, plain):
        ours = list(record_reader.read_numbered_examples(str(path), seq_len=128, vocab_size=32000))
        assert len(ours) == len(g1) == 1248
        assert [i for i, _ in ours] == list(range(1248))
        for (_, mine), theirs in zip(ours, g1):
            assert set(mine) == set(theirs) == set(FEATURES)
            for name in FEATURES:
                assert mine[name].tolist() == theirs[name]


@needs_g1
def test_gzip_members_and_a_bad_gzip_trailer(tmp_path):
    packed = g1_file().read_bytes()
    twice = tmp_path / "twice.tfrecords.gz"
    twice.write_bytes(packed + packed + b"\0" * 8)          # two gzip members, zero padding
    assert sum(1 for _ in record_reader.read_records(str(twice))) == 2 * 1248
    bad = bytearray(packed)
    bad[-6] ^= 1                                          # the gzip CRC32 in the trailer
    trailer = tmp_path / "trailer.tfrecords.gz"
    trailer.write_bytes(bytes(bad))
    seen, err = read_until_error(trailer)
    assert seen == list(range(1248))                     # every record is still read...
    assert err.index == 1248 and "incorrect data check" in str(err)   # ...then the error


# ---------------------------------------------------------------- the example schema


def test_foreign_schema_names_the_record(tmp_path):
    good = random_examples(2)
    foreign = {"image": [137, 80, 78, 71], "class": [3]}
    path = tmp_path / "other.tfrecords"
    path.write_bytes(encode(good) + encode([foreign]))
    got = []
    with pytest.raises(SchemaError) as err:
        for index, _ in record_reader.read_numbered_examples(str(path)):
            got.append(index)
    assert got == [0, 1] and isinstance(err.value, RecordError)
    assert (err.value.path, err.value.index) == (str(path), 2)
    message = str(err.value)
    assert message.startswith(f"{path}: record 2 (byte ") and "\n" not in message
    assert "missing input" in message and "unexpected class, image" in message

    with pytest.raises(SchemaError, match=r"record 0 .*the example has 16 positions, not seq_len=12"):
        list(record_reader.read_numbered_examples(str(path), seq_len=12))


def test_parse_example_schema_errors(tf):
    def example(**features):
        feats = {}
        for name, values in features.items():
            if isinstance(values, bytes):
                feats[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[values]))
            else:
                feats[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()

    good = dict(input=[10, SEP_ID, 11, SEP_ID, CLS_ID] * 2, is_masked=[0] * 10, target=[1] * 10,
                seg_id=[0] * 5 + [1] * 4 + [2], label=[1])
    parsed = record_reader.parse_example(example(**good))
    assert parsed["input"].tolist() == good["input"]
    cases = [
        (dict(good, foo=[1]), "unexpected foo"),
        ({k: v for k, v in good.items() if k != "label"}, "missing label"),
        (dict(good, label=b"x"), "'label' is bytes_list"),
        (dict(good, target=[1] * 9), "'target' has 9 values"),
        (dict(good, label=[1, 0]), "'label' has 2 values"),
        (dict(good, is_masked=[2] * 10), "'is_masked' holds 2"),
        (dict(good, seg_id=[3] * 10), "'seg_id' holds 3"),
    ]
    for features, message in cases:
        with pytest.raises(SchemaError, match=message):
            record_reader.parse_example(example(**features))
    with pytest.raises(SchemaError, match="not seq_len=12"):
        record_reader.parse_example(example(**good), seq_len=12)
    with pytest.raises(SchemaError, match="id 40000"):
        record_reader.parse_example(example(**dict(good, input=[40000] * 10)), vocab_size=32000)
    with pytest.raises(SchemaError, match="not a serialized"):
        record_reader.parse_example(b"\xff\xff\xff")
