"""Tokenizer files for Hugging Face Transformers, from one of our SentencePiece models.

`AutoTokenizer.from_pretrained(dir)` loads them. We write `tokenizer.json` ourselves, from the model file's
bytes, with no tokenizer library: the Unigram vocabulary (pieces and scores), SentencePiece's normalisation
table, and the normalisation of the original's `preprocess_text` as create applied it: `` and '' to ", NFKD
with the combining characters dropped unless the records kept accents, lower-casing when they were uncased.

Transformers 5's own `XLNetTokenizer` builds its normaliser itself, ignoring tokenizer.json's and its
`keep_accents` option: NFKD + StripAccents, which drops every nonspacing mark (Thai vowels, Indic vowel signs,
Japanese voicing marks) where the original drops only the combining ones, and leaves Korean as conjoining jamo,
which are <unk> to a model that learnt syllables. No tokenizer_config.json setting changes that normaliser; but
Transformers 5 (5.25 measured) keeps tokenizer.json as written for a class with its own __init__ where
`trust_remote_code` is true among the config's keys (its convert_to_native_format), so the config has it:
XLNetTokenizer.from_pretrained(export) then gives AutoTokenizer's ids (tests/test_hf.py). No code is loaded: an
export has none (no auto_map). tokenizer_config.json names "PreTrainedTokenizerFast" (TokenizersBackend), which
AutoTokenizer loads; its `keep_accents` and `do_lower_case` keys are for Transformers 4's SentencePiece-based
XLNetTokenizer, which applied the original's preprocess_text itself.

Two rules of the original cannot be written exactly as a tokenizers pipeline. A piece ending in digit + comma
("▁1990,") is split and its digits re-encoded: as Transformers' own converter does, such pieces are made 100
nats less likely, which gives the same pieces nearly always ("1,234,567," can still differ). And SentencePiece
matches its table (the model's precompiled charsmap) against the longest sequence at each position, `tokenizers`'
Precompiled per grapheme: alone it leaves Hangul jamo, Tamil two-part vowels and kana with voicing marks apart
where SentencePiece composes them (8 to 12 of the 72 test lines differ). So NFKC runs first, which composes them
as the table does; but NFKC also reorders marks typed out of canonical order (a Thai tone mark before its vowel)
and composes a precomposed letter with a further mark (Vietnamese `ơ` + combining grave), which the table, made
of full decompositions, leaves. With --keep_accents (without, the marks are gone by then) a noncharacter is put
at those places before NFKC and removed after it. Measured against SentencePiece's own normalisation: the same
on 10,785 lines in 20 scripts (as typed, NFC, NFD, NFKC, NFKD) in every setting; on 20,000 random strings of
Latin, Vietnamese, Thai, Devanagari, Tamil, jamo and kana letters and marks, 34 differ (1,043 with NFKC alone):
NFKC composes a letter with a mark across a mark of a lower class, which the table does not.
"""

import base64
import functools
import json
import os
import sys
import unicodedata
from typing import Optional

from xlnet_data.common import fileio
from xlnet_data.common.errors import ConfigError
from xlnet_data.dataformat import vocab
from xlnet_data.dataformat.spm_model import SentencePieceModel, read_model_proto
from xlnet_data.dataformat.vocab import SPECIAL_SYMBOLS, SPIECE_UNDERLINE, VocabError

TOKENIZER_FILES = ("spiece.model", "tokenizer.json", "tokenizer_config.json")
# Transformers' converter lowers pieces that end in digit + comma by this much (see the docstring).
_DIGIT_COMMA_PENALTY = 100.0
# SentencePiece's built-in rules whose table is NFKC (plus whitespace and control rules): NFKC runs before
# them (see the docstring). A custom rule (a TSV) gets no NFKC.
_NFKC_RULES = ("nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf")
# Put between two marks in non-canonical order, it stops NFKC's reordering (combining class 0) and is removed after:
# a noncharacter, which text never holds and NFKC keeps.
_REORDER_GUARD = "\ufdd0"
# Python's str.lower maps a capital sigma that ends a word to final sigma; `tokenizers`' Lowercase does not. Its
# rule (Final_Sigma): after a cased letter and case-ignorables, not before case-ignorables and a cased letter.
_FINAL_SIGMA = ("(?<=" + "|".join(r"\p{Cased}" + r"\p{Case_Ignorable}" * n for n in range(4)) + ")"
                "\u03a3" r"(?!\p{Case_Ignorable}*\p{Cased})")


def _ends_in_digit_comma(piece: str) -> bool:
    return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


def _special_token(token_id: int, content: str) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": content == "<mask>",
            "rstrip": False, "normalized": False, "special": True}


def _char_class(codes) -> str:
    """A regex class of the code points (ascending), as ranges."""
    ranges = []
    for code in codes:
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return "[" + "".join(f"\\x{{{a:X}}}" + (f"-\\x{{{b:X}}}" if b > a else "") for a, b in ranges) + "]"


def _combining_pattern() -> str:
    """A regex class of the characters the original drops after NFKD (vocab.py owns which they are)."""
    return _char_class(vocab.combining_code_points().tolist())


@functools.lru_cache(maxsize=1)
def _composition_guard_pattern() -> str:
    """A zero-width regex at the places where NFKC would reorder or compose marks and SentencePiece's table does
    not (see the docstring): between two marks in non-canonical order (the first character's decomposition ends
    in a mark of a higher combining class than the one the second's begins with), and between a precomposed
    letter and a mark (Vietnamese typed as `ơ` + combining grave: the table composes only full decompositions)."""
    ends, begins, precomposed = {}, {}, []
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if unicodedata.category(char) in ("Cn", "Cs"):
            continue
        decomposed = unicodedata.normalize("NFKD", char)
        for where, part in ((ends, decomposed[-1]), (begins, decomposed[0])):
            if unicodedata.combining(part):
                where.setdefault(unicodedata.combining(part), []).append(code)
        if unicodedata.normalize("NFD", char) != char:
            precomposed.append(code)
    marks = sorted(code for codes in begins.values() for code in codes)
    lower = {high: sorted(code for low in begins if low < high for code in begins[low]) for high in ends}
    out_of_order = [f"(?<={_char_class(ends[high])})(?={_char_class(lower[high])})" for high in sorted(ends) if lower[high]]
    return "|".join([f"(?<={_char_class(precomposed)})(?={_char_class(marks)})"] + out_of_order)


def normalizers(model: SentencePieceModel, uncased: bool, keep_accents: bool) -> list[dict]:
    """create's normalisation as `tokenizers` normalizers: the original's preprocess_text (which is
    text.preprocess_texts), then SentencePiece's own."""
    steps = [{"type": "Replace", "pattern": {"String": "``"}, "content": '"'},
             {"type": "Replace", "pattern": {"String": "''"}, "content": '"'}]
    if not keep_accents:
        steps += [{"type": "NFKD"}, {"type": "Replace", "pattern": {"Regex": _combining_pattern()}, "content": ""}]
    if uncased:
        steps += [{"type": "Replace", "pattern": {"Regex": _FINAL_SIGMA}, "content": "\u03c2"}, {"type": "Lowercase"}]
    if model.charsmap:
        if model.normalizer in _NFKC_RULES:
            if keep_accents:  # a mark typed out of canonical order stays where it is (without, marks are gone)
                steps.append({"type": "Replace", "pattern": {"Regex": _composition_guard_pattern()},
                              "content": _REORDER_GUARD})
            steps.append({"type": "NFKC"})
            if keep_accents:
                steps.append({"type": "Replace", "pattern": {"String": _REORDER_GUARD}, "content": ""})
        steps.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(model.charsmap).decode("ascii")})
    return steps


def tokenizer_json(model: SentencePieceModel, uncased: bool, keep_accents: bool = False) -> dict:
    """The `tokenizers` serialization: Unigram over the pieces, create's normalisation, words split on
    whitespace with "▁" before each, "<sep> <cls>" appended as XLNet's fine-tuning expects."""
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
        "normalizer": {"type": "Sequence", "normalizers": normalizers(model, uncased, keep_accents)},
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
                            for piece, score, _ in model.pieces]},
    }


def tokenizer_config(uncased: bool, keep_accents: bool = False) -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": uncased, "remove_space": True,
            "keep_accents": keep_accents,
            "trust_remote_code": True,  # XLNetTokenizer runs tokenizer.json as written (see the docstring)
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "<sep>", "pad_token": "<pad>",
            "cls_token": "<cls>", "mask_token": "<mask>", "additional_special_tokens": ["<eop>", "<eod>"],
            "padding_side": "left"}


def tokenizer_files(sp_path: str, uncased: bool, keep_accents: bool = False) -> dict[str, bytes]:
    """{file name: content} of the tokenizer files (TOKENIZER_FILES) for the SentencePiece model at sp_path,
    which must have XLNet's special ids; the text normalised as create normalised the records' (--uncased,
    --keep_accents)."""
    with fileio.open_read(sp_path) as f:
        model = f.read()
    try:
        proto = read_model_proto(model)
    except (ValueError, IndexError, UnicodeDecodeError) as err:
        raise VocabError(f"{sp_path} is not a SentencePiece model: {err}") from None
    pieces = proto.pieces
    wrong = [f"{symbol}={pieces[i][0] if i < len(pieces) else 'none'}" for symbol, i in SPECIAL_SYMBOLS.items()
             if i >= len(pieces) or pieces[i][0] != symbol]
    if wrong:
        raise VocabError(f"SentencePiece model {sp_path} does not have XLNet's special ids (id {', '.join(wrong)})")
    dump = lambda obj: json.dumps(obj, ensure_ascii=False, indent=1).encode("utf-8")
    return {"spiece.model": model, "tokenizer.json": dump(tokenizer_json(proto, uncased, keep_accents)),
            "tokenizer_config.json": dump(tokenizer_config(uncased, keep_accents))}


def tokenizer_settings(directory: str) -> Optional[dict]:
    """{"uncased": bool, "keep_accents": bool} of a Transformers directory's tokenizer: what its tokenizer.json
    normaliser does (ours, or Transformers' XLNet converter's: NFKD there strips accents), else its
    tokenizer_config.json's do_lower_case and keep_accents; None when it has neither file."""
    path = os.path.join(directory, "tokenizer.json")
    if fileio.exists(path):
        try:
            normalizer = json.loads(fileio.read_text(path)).get("normalizer") or {}
        except ValueError as err:
            raise VocabError(f"{path} is not valid JSON ({err})") from None
        steps = normalizer.get("normalizers", [normalizer]) if normalizer.get("type") == "Sequence" else [normalizer]
        kinds = {step.get("type") for step in steps}
        return {"uncased": "Lowercase" in kinds, "keep_accents": not kinds & {"NFKD", "StripAccents"}}
    path = os.path.join(directory, "tokenizer_config.json")
    if fileio.exists(path):
        try:
            config = json.loads(fileio.read_text(path))
        except ValueError as err:
            raise VocabError(f"{path} is not valid JSON ({err})") from None
        return {"uncased": bool(config.get("do_lower_case", False)),
                "keep_accents": bool(config.get("keep_accents", False))}
    return None


def vocabulary_difference(path_a: str, path_b: str):
    """None when the two SentencePiece models have the same pieces in the same order, else the first
    difference in words."""
    pieces = []
    for path in (path_a, path_b):
        with fileio.open_read(path) as f:
            data = f.read()
        try:
            pieces.append([piece for piece, _, _ in read_model_proto(data).pieces])
        except ValueError as err:
            raise VocabError(f"{path} is not a SentencePiece model: {err}") from None
    a, b = pieces
    if len(a) != len(b):
        return f"{len(a)} pieces in {path_a}, {len(b)} in {path_b}"
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return None if first is None else f"piece {first} is {a[first]!r} in {path_a}, {b[first]!r} in {path_b}"


def check_vocabulary(hf_dir: str, corpus_infos) -> None:
    """A Transformers directory's spiece.model must be the records' SentencePiece model (corpus_info.json's
    sp_path; corpus_infos: [(its path, CorpusInfo)]), where both files are there to compare; ConfigError says
    which piece differs."""
    ours = os.path.join(hf_dir, "spiece.model")
    for info_path, info in corpus_infos:
        if not (info.sp_path and os.path.isfile(info.sp_path) and os.path.isfile(ours)):
            continue
        difference = vocabulary_difference(ours, info.sp_path)
        if difference:
            raise ConfigError(f"--init_checkpoint={hf_dir} has another vocabulary than the records (sp_path in "
                              f"{info_path}): {difference}")
