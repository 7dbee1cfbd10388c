"""A SentencePiece model file read without the protobuf package: its pieces, normalisation and model type.

sentencepiece's own sentencepiece_model_pb2 needs a protobuf runtime at least as new as the one it was
generated with, which TensorFlow's pin may not allow; the few fields used here are read from the wire format.
"""

import functools
import struct
from typing import NamedTuple, Optional

import numpy as np

from xlnet_data.common import compiled
from xlnet_data.common.errors import UserError

# SentencePiece's piece types and model types (sentencepiece_model.proto).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE, WORD, CHAR = 1, 2, 3, 4
MODEL_TYPE_NAMES = {UNIGRAM: "unigram", BPE: "bpe", WORD: "word", CHAR: "char"}


class ModelFormatError(UserError, ValueError):
    """A model file whose fields do not hold together (cut short, a piece that is not UTF-8, a charsmap that a walk
    would leave); vocab.load_sentencepiece says it in one line with the file's name."""


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
    try:
        yield from _raw_fields_unchecked(buf)
    except IndexError:
        raise ModelFormatError("the file is cut short (a protobuf field runs past its end)") from None


def _raw_fields_unchecked(buf: bytes):
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = varint(buf, pos)
        elif wire_type == 2:
            size, pos = varint(buf, pos)
            if pos + size > len(buf):
                raise IndexError(pos + size)
            value, pos = buf[pos:pos + size], pos + size
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ModelFormatError(f"unsupported protobuf wire type {wire_type}")
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


def _text(value, what):
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ModelFormatError(f"{what} {bytes(value)!r} is not valid UTF-8 ({err.reason} at byte {err.start})") from None


def _piece(buf, number):
    piece, score, kind = "", 0.0, NORMAL
    for sub, value in fields(buf):
        if sub == 1:
            piece = _text(value, f"piece {number}")
        elif sub == 2:
            score = struct.unpack("<f", value)[0]
        elif sub == 3:
            kind = value
    return piece, score, kind


# (message field, its field number, our name) of what is read from trainer_spec (2) and normalizer_spec (3).
_SPEC_FIELDS = {(2, 3): "model_type", (2, 35): "byte_fallback", (2, 24): "treat_whitespace_as_suffix",
                (3, 1): "normalizer", (3, 2): "charsmap", (3, 3): "add_dummy_prefix",
                (3, 4): "remove_extra_whitespaces", (3, 5): "escape_whitespaces"}


@functools.lru_cache(maxsize=4)  # a run reads its model in several steps (the loader's checks, the encoder's choice
def read_model_proto(data: bytes) -> SentencePieceModel:  # and tables): 0.15-0.35 s for XLNet's, parsed once
    """The pieces, normalisation and model type of a serialized SentencePiece ModelProto (pieces = field 1,
    trainer_spec = 2, normalizer_spec = 3)."""
    pieces, found = [], {}
    for number, value in fields(data):
        if number == 1:
            pieces.append(_piece(value, len(pieces)))
        elif number in (2, 3):
            for sub, sub_value in fields(value):
                name = _SPEC_FIELDS.get((number, sub))
                if name == "normalizer":
                    found[name] = _text(sub_value, "the normalizer name")
                elif name == "charsmap":
                    found[name] = bytes(sub_value)
                elif name is not None:
                    found[name] = sub_value if name == "model_type" else bool(sub_value)
    charsmap = check_charsmap(found.pop("charsmap", b""))
    return SentencePieceModel(pieces, charsmap, found.pop("normalizer", ""), **found)


@compiled.jit(inline="always")
def darts_offset(unit):
    """Darts-clone's offset of a unit (uint32, as int64): bits 10+, shifted by 8 where bit 9 is set. A walk at a
    node goes to node ^ offset, then reads the unit at that ^ the next byte."""
    return (unit >> 10) << ((unit & 512) >> 6)


@compiled.jit()
def _darts_problem(units, strings):
    """0 when every walk of the Darts array `units` stays in it and finds values below `strings` (the replacement
    strings' bytes); 1: a node whose children lie past the array, 2: a value past the strings. Every node a walk
    can reach is visited once (depth first, its 256 bytes each), checked before each read."""
    n = units.shape[0]
    seen = np.zeros(n, dtype=np.bool_)
    stack = np.empty(n + 1, dtype=np.int64)  # a node is pushed once (`seen`): at most n and the root
    root = darts_offset(np.int64(units[0]))
    if root | 255 >= n:
        return 1
    stack[0], top = root, 1
    while top:
        top -= 1
        node = stack[top]
        for c in range(256):
            child = node ^ c  # below n: node | 255 < n
            unit = np.int64(units[child])
            if (unit & 0x800000FF) != c:
                continue
            found = child ^ darts_offset(unit)
            if found | 255 >= n:
                return 1
            if (unit >> 8) & 1 and (np.int64(units[found]) & 0x7FFFFFFF) >= strings:
                return 2
            if not seen[found]:
                seen[found] = True
                stack[top] = found
                top += 1
    return 0


def charsmap_problem(charsmap: bytes) -> Optional[str]:
    """Why a precompiled charsmap (a uint32 size, a Darts double array of that many bytes, NUL-terminated
    replacement strings: normalizer.cc's DecodePrecompiledCharsMap) cannot be walked within its arrays, or None.

    The units of the 256 children of every node a walk can reach must lie in the array, and the value of a key
    that ends there must be an offset into the strings: then no input leads a walk (datagen/tries.darts_walk,
    SentencePiece's own) outside them, whichever sentencepiece is installed (0.2.2 refuses such a table on
    load, 0.1.99 walks it)."""
    if not charsmap:
        return None  # the identity rule
    if len(charsmap) <= 4:
        return f"{len(charsmap)} bytes, no room for its size and array"
    size = int.from_bytes(charsmap[:4], "little")
    if size == 0 or size % 1024:
        return f"its array of {size} bytes is not whole blocks of 256 units of 4 bytes"
    if 4 + size >= len(charsmap):
        return f"its array of {size} bytes leaves no replacement strings in its {len(charsmap)} bytes"
    if charsmap[-1] != 0:
        return "its replacement strings do not end in a NUL byte"
    strings = len(charsmap) - 4 - size
    units = np.frombuffer(charsmap, dtype="<u4", count=size // 4, offset=4)
    found = _darts_problem(units, strings)
    if found == 1:
        return f"a node's children lie past the array's {units.size} units"
    if found == 2:
        return f"a replacement's offset lies past its {strings} bytes of strings"
    return None


def check_charsmap(charsmap: bytes) -> bytes:
    """`charsmap`, or ModelFormatError saying why no walk may trust it (charsmap_problem)."""
    problem = charsmap_problem(charsmap)
    if problem:
        raise ModelFormatError(f"its normalisation table (precompiled_charsmap) is damaged: {problem}")
    return charsmap
