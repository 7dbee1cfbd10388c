"""Tokenizer files for Hugging Face Transformers' XLNetTokenizer, from one of our SentencePiece models.

`XLNetTokenizer.from_pretrained(dir)` (Transformers 5: backed by the `tokenizers` library) reads
`tokenizer.json` when it is there and otherwise converts `spiece.model`, which needs a protobuf runtime
at least as new as the one Transformers was generated with (TensorFlow pins an older one). So we write
`tokenizer.json` ourselves, from the model file's bytes, with no tokenizer library: the Unigram vocabulary
(pieces and scores), SentencePiece's normalisation table, and the normalisation of the original's
`preprocess_text` (`` and '' to ", NFKD without accents, lower-casing when the records were uncased).

One rule of the original cannot be written as a tokenizers pipeline: a piece ending in digit + comma
("▁1990,") is split and its digits re-encoded. As Transformers' own converter does, such pieces are made
100 nats less likely, which gives the same pieces nearly always ("1,234,567," can still differ).
"""

import base64
import json
import struct

from xlnet_data.common import fileio
from xlnet_data.common.vocab import SPECIAL_SYMBOLS, SPIECE_UNDERLINE, VocabError

TOKENIZER_FILES = ("spiece.model", "tokenizer.json", "tokenizer_config.json")
# Transformers' converter lowers pieces that end in digit + comma by this much (see the docstring).
_DIGIT_COMMA_PENALTY = 100.0
# SentencePiece's piece types (sentencepiece_model.proto).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4


def _varint(buf: bytes, pos: int):
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(buf: bytes):
    """(field number, value) of a protobuf message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _varint(buf, pos)
        elif wire_type == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield number, value


def read_model_proto(data: bytes):
    """([(piece, score, type)], precompiled_charsmap) of a serialized SentencePiece ModelProto
    (pieces = field 1; normalizer_spec = field 3, its precompiled_charsmap = field 2)."""
    pieces, charsmap = [], b""
    for number, value in _fields(data):
        if number == 1:
            piece, score, kind = "", 0.0, _NORMAL
            for sub, sub_value in _fields(value):
                if sub == 1:
                    piece = bytes(sub_value).decode("utf-8")
                elif sub == 2:
                    score = struct.unpack("<f", sub_value)[0]
                elif sub == 3:
                    kind = sub_value
            pieces.append((piece, score, kind))
        elif number == 3:
            charsmap = next((bytes(v) for sub, v in _fields(value) if sub == 2), charsmap)
    return pieces, charsmap


def _ends_in_digit_comma(piece: str) -> bool:
    return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


def _special_token(token_id: int, content: str) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": content == "<mask>",
            "rstrip": False, "normalized": False, "special": True}


def tokenizer_json(pieces, charsmap: bytes, uncased: bool) -> dict:
    """The `tokenizers` serialization XLNetTokenizer loads: Unigram over the pieces, XLNet's normalisation,
    words split on whitespace with "▁" before each, "<sep> <cls>" appended as XLNet's fine-tuning expects."""
    normalizers = [{"type": "Replace", "pattern": {"String": "``"}, "content": '"'},
                   {"type": "Replace", "pattern": {"String": "''"}, "content": '"'},
                   {"type": "NFKD"}, {"type": "StripAccents"}]
    if uncased:
        normalizers.append({"type": "Lowercase"})
    if charsmap:
        normalizers.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode("ascii")})
    metaspace = {"type": "Metaspace", "replacement": SPIECE_UNDERLINE, "prepend_scheme": "always", "split": True}
    sep, cls = SPECIAL_SYMBOLS["<sep>"], SPECIAL_SYMBOLS["<cls>"]

    def template(*parts):
        return [{"SpecialToken": {"id": p[0], "type_id": p[1]}} if p[0].startswith("<")
                else {"Sequence": {"id": p[0], "type_id": p[1]}} for p in parts]

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_special_token(i, piece) for piece, i in sorted(SPECIAL_SYMBOLS.items(), key=lambda kv: kv[1])],
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": template(("A", 0), ("<sep>", 0), ("<cls>", 2)),
            "pair": template(("A", 0), ("<sep>", 0), ("B", 1), ("<sep>", 1), ("<cls>", 2)),
            "special_tokens": {"<cls>": {"id": "<cls>", "ids": [cls], "tokens": ["<cls>"]},
                               "<sep>": {"id": "<sep>", "ids": [sep], "tokens": ["<sep>"]}},
        },
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": SPECIAL_SYMBOLS["<unk>"], "byte_fallback": False,
                  "vocab": [[piece, score - _DIGIT_COMMA_PENALTY if _ends_in_digit_comma(piece) else score]
                            for piece, score, _ in pieces]},
    }


def tokenizer_config(uncased: bool) -> dict:
    return {"tokenizer_class": "XLNetTokenizer", "do_lower_case": uncased, "remove_space": True, "keep_accents": False,
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "<sep>", "pad_token": "<pad>",
            "cls_token": "<cls>", "mask_token": "<mask>", "additional_special_tokens": ["<eop>", "<eod>"],
            "padding_side": "left"}


def tokenizer_files(sp_path: str, uncased: bool) -> dict[str, bytes]:
    """{file name: content} of the tokenizer files (TOKENIZER_FILES) for the SentencePiece model at sp_path,
    which must have XLNet's special ids."""
    with fileio.open_read(sp_path) as f:
        model = f.read()
    try:
        pieces, charsmap = read_model_proto(model)
    except (ValueError, IndexError, UnicodeDecodeError) as err:
        raise VocabError(f"{sp_path} is not a SentencePiece model: {err}") from None
    wrong = [f"{symbol}={pieces[i][0] if i < len(pieces) else 'none'}" for symbol, i in SPECIAL_SYMBOLS.items()
             if i >= len(pieces) or pieces[i][0] != symbol]
    if wrong:
        raise VocabError(f"SentencePiece model {sp_path} does not have XLNet's special ids (id {', '.join(wrong)})")
    dump = lambda obj: json.dumps(obj, ensure_ascii=False, indent=1).encode("utf-8")
    return {"spiece.model": model, "tokenizer.json": dump(tokenizer_json(pieces, charsmap, uncased)),
            "tokenizer_config.json": dump(tokenizer_config(uncased))}


def vocabulary_difference(path_a: str, path_b: str):
    """None when the two SentencePiece models have the same pieces in the same order, else the first
    difference in words."""
    pieces = []
    for path in (path_a, path_b):
        with fileio.open_read(path) as f:
            pieces.append([piece for piece, _, _ in read_model_proto(f.read())[0]])
    a, b = pieces
    if len(a) != len(b):
        return f"{len(a)} pieces in {path_a}, {len(b)} in {path_b}"
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return None if first is None else f"piece {first} is {a[first]!r} in {path_a}, {b[first]!r} in {path_b}"
