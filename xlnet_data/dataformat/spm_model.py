"""A SentencePiece model file read without the protobuf package: its pieces, normalisation and model type.

sentencepiece's own sentencepiece_model_pb2 needs a protobuf runtime at least as new as the one it was
generated with, which TensorFlow's pin may not allow; the few fields used here are read from the wire format.
"""

import struct
from typing import NamedTuple

# SentencePiece's piece types and model types (sentencepiece_model.proto).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE, WORD, CHAR = 1, 2, 3, 4
MODEL_TYPE_NAMES = {UNIGRAM: "unigram", BPE: "bpe", WORD: "word", CHAR: "char"}


def varint(buf: bytes, pos: int):
    """The varint at buf[pos:] and the position after it (also tf_checkpoint.py's protobuf and table reader)."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _raw_fields(buf: bytes):
    """(field number, value, the field's own bytes) of a protobuf message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = varint(buf, pos)
        elif wire_type == 2:
            size, pos = varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield number, value, buf[start:pos]


def fields(buf: bytes):
    """(field number, value) of a protobuf message: ints for varints, bytes otherwise (fixed32/64 too)."""
    for number, value, _ in _raw_fields(buf):
        yield number, value


def _length_delimited(number: int, payload: bytes) -> bytes:
    def varint(value):
        out = bytearray()
        while value >= 0x80:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes(out) + bytes([value])
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def with_model_prefix(data: bytes, model_prefix: str) -> bytes:
    """The serialized ModelProto with trainer_spec.model_prefix (field 2 of field 2) set to `model_prefix`, the
    rest as it was: SentencePiece records the prefix it wrote to, which spm_train makes a temporary one, and a
    model trained twice on the same text must be the same file (its sha256 is checked by create, train_gpu and
    dump)."""
    out = []
    for number, value, raw in _raw_fields(data):
        if number == 2:
            raw = _length_delimited(2, b"".join(_length_delimited(2, model_prefix.encode("utf-8")) if sub == 2
                                                else sub_raw for sub, _, sub_raw in _raw_fields(value)))
        out.append(raw)
    return b"".join(out)


class SentencePieceModel(NamedTuple):
    pieces: list  # (piece, score, type)
    charsmap: bytes  # normalizer_spec.precompiled_charsmap
    normalizer: str  # normalizer_spec.name: "nmt_nfkc" unless spm_train was given another rule
    add_dummy_prefix: bool = True  # normalizer_spec's whitespace rules, with the proto's defaults
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    model_type: int = UNIGRAM  # trainer_spec's
    byte_fallback: bool = False
    treat_whitespace_as_suffix: bool = False


def _piece(buf):
    piece, score, kind = "", 0.0, NORMAL
    for sub, value in fields(buf):
        if sub == 1:
            piece = bytes(value).decode("utf-8")
        elif sub == 2:
            score = struct.unpack("<f", value)[0]
        elif sub == 3:
            kind = value
    return piece, score, kind


# (message field, its field number, our name) of what is read from trainer_spec (2) and normalizer_spec (3).
_SPEC_FIELDS = {(2, 3): "model_type", (2, 35): "byte_fallback", (2, 24): "treat_whitespace_as_suffix",
                (3, 1): "normalizer", (3, 2): "charsmap", (3, 3): "add_dummy_prefix",
                (3, 4): "remove_extra_whitespaces", (3, 5): "escape_whitespaces"}


def read_model_proto(data: bytes) -> SentencePieceModel:
    """The pieces, normalisation and model type of a serialized SentencePiece ModelProto (pieces = field 1,
    trainer_spec = 2, normalizer_spec = 3)."""
    pieces, found = [], {}
    for number, value in fields(data):
        if number == 1:
            pieces.append(_piece(value))
        elif number in (2, 3):
            for sub, sub_value in fields(value):
                name = _SPEC_FIELDS.get((number, sub))
                if name == "normalizer":
                    found[name] = bytes(sub_value).decode("utf-8")
                elif name == "charsmap":
                    found[name] = bytes(sub_value)
                elif name is not None:
                    found[name] = sub_value if name == "model_type" else bool(sub_value)
    return SentencePieceModel(pieces, found.pop("charsmap", b""), found.pop("normalizer", ""), **found)
