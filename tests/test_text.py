"""Text to ids: normalisation, the digit-comma rule, sentence flags, shard order and flag flip."""

import sys
import unicodedata

import numpy as np
import pytest
from conftest import XLNET_SPM, needs_shared

from xlnet_data.dataformat.examples import layout
from xlnet_data.dataformat.vocab import EOD_ID, load_sentencepiece
from xlnet_data.datagen import block_tokens, corpus, text
from xlnet_data.datagen.utf8_lines import Utf8Lines


def original_preprocess(line, lower):
    """The original's prepro_utils.preprocess_text, restated: the reference for the batched version."""
    out = " ".join(line.strip().split()).replace("``", '"').replace("''", '"')
    out = "".join(c for c in unicodedata.normalize("NFKD", out) if not unicodedata.combining(c))
    return out.lower() if lower else out


def test_preprocess_texts_follows_the_original():
    assert text.preprocess_texts(["Hello \t  World"], lower=False) == ["Hello World"]
    assert text.preprocess_texts(["``quoted''"], lower=False) == ['"quoted"']
    assert text.preprocess_texts(["Café Zürich façade"], lower=True) == ["cafe zurich facade"]
    assert text.preprocess_texts(["ﬁ ①"], lower=False) == ["fi 1"]  # NFKD compatibility forms


def test_batched_preprocessing_equals_line_by_line_on_every_whitespace_and_tricky_case():
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace() and chr(c) != "\n"]
    lines = [f"a{s}b{s}{s}c" for s in spaces] + [
        "ΟΔΟΣ ΟΔΟΣ.", "İstanbul ΣΑΣ", "e\u0301\u0327 ç ǅ ß ﬃ", "1,000, 2,", "``a'' `b' ''", "x\u200by", "東京 한국어 ไทย",
        "a\u0308\u0323b", "\u1e9b\u0323"]
    lines = [line.strip() for line in lines if line.strip()]
    for lower in (False, True):
        assert text.preprocess_texts(lines, lower) == [original_preprocess(line, lower) for line in lines]


def test_each_whitespace_and_accent_alone_in_a_block_of_plain_lines_is_normalised_as_the_original():
    """The fast paths: a block whose only unusual line is one of these goes through the line-subset steps."""
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace() and chr(c) != "\n"]
    odd_lines = [f"a{s}b{s}{s}c" for s in spaces] + ["Café Zürich", "Café  Zürich", "a\u0308\u0323b", "x  y", "``q'' Ünï"]
    for odd in odd_lines:
        lines = ["Plain words here.", odd.strip(), "More plain words, ``quoted''."]
        for lower in (False, True):
            assert text.preprocess_texts(lines, lower) == [original_preprocess(line, lower) for line in lines], odd


def original_marks(line):
    """(letters, Arabic) that lose marks in the original's accent removal of `line`, counted as create
    reports them: a run of combining characters in the NFKD text is one letter, Arabic where the run's first
    mark is one of the Arabic ranges."""
    nfkd = unicodedata.normalize("NFKD", " ".join(line.strip().split()).replace("``", '"').replace("''", '"'))
    letters = arabic = 0
    for i, c in enumerate(nfkd):
        if unicodedata.combining(c) and (i == 0 or not unicodedata.combining(nfkd[i - 1])):
            is_arabic = any(first <= ord(c) <= last for first, last in text.preprocess_utf8._ARABIC_MARKS)
            arabic += is_arabic
            letters += not is_arabic
    return letters, arabic


def _random_lines(rng, count):
    """Lines of random code points of many scripts, salted with what each step changes: every whitespace
    character, quotes, marks of Latin, Greek, Arabic, Hebrew, Thai, Devanagari and kana, compatibility forms,
    Hangul, final sigma and dotted I."""
    special = ([chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()] + list("`'\"ΣσİıAZaz ")
               + [chr(c) for c in range(0x300, 0x370)] + [chr(c) for c in range(0x64B, 0x660)]
               + list("\u0670\u05b0\u0e48\u0e31\u093c\u094d\u3099\u309a\ufdfa가각\u1100\u1161ﬁ①＇｀㍿ǅṩ\u0344\u0f73é"))
    planes = [(0x20, 0x3000), (0x3000, 0xD800), (0xF900, 0x10000), (0x10000, 0x30000)]
    lines = []
    for _ in range(count):
        chars = []
        for _ in range(rng.integers(0, 40)):
            if rng.random() < 0.5:
                chars.append(special[rng.integers(len(special))])
            else:
                low, high = planes[rng.integers(len(planes))]
                chars.append(chr(rng.integers(low, high)))
        lines.append("".join(chars))
    return lines


def test_the_compiled_text_step_equals_the_original_on_random_text_of_many_scripts():
    rng = np.random.default_rng(20261202)
    few = list("`' \t\u00a0a\u0301é\u064b\u0651")  # the steps' interplay: quotes across collapsed spaces, marks
    lines = _random_lines(rng, 3000) + ["".join(rng.choice(few, rng.integers(1, 12))) for _ in range(2000)]
    lines += ["\ufdfa" * 500, "㍿ " * 300 + "x"]  # a line 11x its bytes: the buffer grows
    for lower in (False, True):
        assert text.preprocess_texts(lines, lower) == [original_preprocess(line, lower) for line in lines]
        kept = [" ".join(line.split()).replace("``", '"').replace("''", '"') for line in lines]
        assert text.preprocess_texts(lines, lower, keep_accents=True) == [k.lower() if lower else k for k in kept]
    marks = text.StrippedMarks()
    text.preprocess_texts(lines, False, stripped=marks)
    letters, arabic = np.sum([original_marks(line) for line in lines], axis=0)
    assert (marks.letters, marks.arabic) == (letters, arabic) and letters > 1000 and arabic > 100


def test_the_text_tables_read_from_the_cache_are_those_built_from_unicodedata():
    text.preprocess_utf8.tables()  # built and saved, or read
    text.preprocess_utf8.tables.cache_clear()
    cached, built = text.preprocess_utf8.tables(), text.preprocess_utf8._build_tables()
    for name in ("flags", "ccc", "starts", "decomposed"):
        np.testing.assert_array_equal(getattr(cached, name), getattr(built, name))
    assert cached.growth == built.growth == 12  # U+FDFA: 3 bytes become 33


def test_the_text_step_tells_blank_lines_from_text_as_strip_does():
    lines = ["  ", "\u3000\u2028", "\u0301", "a", "", " \t``"]
    normalised, is_text = text.preprocess_lines(Utf8Lines.of(lines), lower=False)
    assert is_text.tolist() == [bool(line.strip()) for line in lines]
    assert normalised.texts() == [original_preprocess(line, False) for line in lines] == ["", "", "", "a", "", '"']


def test_the_compiled_utf8_check_agrees_with_pythons_decoder_on_random_bytes():
    """create checks each block with Utf8Lines.checked, not bytes.decode: the same verdict (overlong forms,
    surrogates, past U+10FFFF, cut sequences, stray continuation bytes), the same character count, the same
    lines. The alphabet holds every boundary of the second byte's range and every byte from 0x80."""
    rng = np.random.default_rng(3)
    alphabet = [b"a", b"\n", b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xe4\xb8\xad", b"\xed\x9f\xbf", b"\xed\xa0\x80",
                b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
                *(bytes([b]) for b in range(0x80, 0x100))]
    verdicts = set()
    for _ in range(20000):
        raw = b"".join(alphabet[i] for i in rng.integers(0, len(alphabet), rng.integers(0, 7))) + b"\n"
        data = np.frombuffer(raw, dtype=np.uint8)
        checked = Utf8Lines.checked(data)
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError:
            assert checked is None, raw
            verdicts.add(False)
            continue
        assert checked is not None, raw
        lines, chars = checked
        assert chars == len(decoded) and lines.line_starts.tolist() == Utf8Lines.split(data).line_starts.tolist()
        verdicts.add(True)
    assert verdicts == {True, False}
    chinese = "中文的一句話。\n".encode() * 50  # the three-byte run's own loop
    assert Utf8Lines.checked(np.frombuffer(chinese, dtype=np.uint8))[1] == len(chinese.decode())


@pytest.fixture(scope="module")
def sp():
    if not XLNET_SPM.exists():
        pytest.skip("../shared is absent: XLNet's SentencePiece model is needed")
    return load_sentencepiece(str(XLNET_SPM))


def test_digit_comma_pieces_are_split(sp):
    encoder = text.Encoder(sp)
    pieces = sp.encode("I was born in 2000, and this is 92000, ok", out_type=str)
    assert any(len(p) > 1 and p.endswith(",") and p[-2].isdigit() for p in pieces)  # the rule applies here
    ids = encoder.encode_original("I was born in 2000, and this is 92000, ok")
    as_pieces = [sp.id_to_piece(i) for i in ids]
    assert "," in as_pieces and not any(p.endswith(",") and len(p) > 1 and p[-2].isdigit() for p in as_pieces)
    assert "".join(as_pieces).replace("\u2581", " ").strip() == "I was born in 2000, and this is 92000, ok"


@pytest.mark.parametrize("output", ["buffers", "numpy", "lists"])
def test_batched_encoding_equals_line_by_line(sp, output):
    """Every way SentencePiece's ids come back: one buffer a line or int32 arrays (sentencepiece 0.2.3), or
    lists (older versions)."""
    encoder = text.Encoder(sp)
    ways = ["buffers", "numpy", "lists"]
    if ways.index(output) < ways.index(encoder.output):
        pytest.skip(f"this sentencepiece cannot encode to {output}")
    encoder.output = output
    lines = ["In 1865, Alice fell.", "Prices: 1,000, 2,500, and 3,", "東京 and 한국어", "x", "", "café 19, 20,", "",
             "1,2,3,4, 5, 1999,2000,", "no numbers here", "7, " * 50]
    flat, lengths = encoder.encode_batch(lines)
    expected = [encoder.encode_original(line) for line in lines]
    assert lengths.tolist() == [len(e) for e in expected]
    assert flat.tolist() == [i for e in expected for i in e]
    assert flat.dtype == np.int32 and lengths.dtype == np.int64
    empty_flat, empty_lengths = encoder.encode_batch([])
    assert empty_flat.dtype == np.int32 and empty_flat.size == 0 and empty_lengths.size == 0


@needs_shared
def test_sentence_flags_alternate_and_eod_takes_the_flipped_flag(sp, tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("One.\nTwo.\n\nThree.\n", encoding="utf-8")
    shard = corpus.read_shard(str(path), text.Encoder(sp), from_raw_text=True, uncased=False, use_eod=True,
                              vocab_size=sp.get_piece_size())
    ids, flags = np.concatenate(shard.ids), np.concatenate(shard.sent_ids)
    pieces = [sp.encode(s) for s in ("One.", "Two.", "Three.")]
    assert ids.tolist() == pieces[0] + pieces[1] + [EOD_ID] + pieces[2]
    # True for "One.", False for "Two."; the blank line flips before and after its <eod>, so <eod> keeps
    # the flag of the sentence before it and "Three." takes the other one.
    want = [True] * len(pieces[0]) + [False] * len(pieces[1]) + [False] + [True] * len(pieces[2])
    assert flags.tolist() == want


@pytest.mark.parametrize("seed", range(4))
def test_a_blocks_flags_and_counts_are_numpys(seed):
    """block_tokens.flags_and_counts against the numpy that corpus.shard_blocks ran before it: blank lines (an <eod>
    each, the flipped flag), runs of them, text lines of no ids, both first flags, with and without the start
    table."""
    rng = np.random.default_rng(seed)
    is_text = rng.random(300) < (0.9, 0.5, 0.1, 1.0)[seed]
    lengths = np.where(is_text, rng.integers(0, 6, is_text.size), 1)
    ids = rng.integers(0, 40, int(lengths.sum())).astype(np.int32)
    ids[::7] = 0  # <unk>, the id counted
    start_pieces = rng.random(40) < 0.3
    flips_before = np.cumsum(is_text) - is_text
    for sent_id in (True, False):
        flags = (np.bool_(sent_id) ^ (flips_before & 1).astype(bool)) ^ ~is_text
        for count_starts in (True, False):
            got, next_id, unk, starts = block_tokens.flags_and_counts(ids, lengths, is_text, sent_id, 0, start_pieces,
                                                                      count_starts)
            assert got.tolist() == np.repeat(flags, lengths).tolist()
            assert next_id == bool(sent_id ^ (int(is_text.sum()) & 1))
            assert unk == np.count_nonzero(ids == 0) > 0
            assert starts == (np.count_nonzero(start_pieces[ids]) if count_starts else 0)


@pytest.mark.parametrize("data, ids", [(b"5 6\n\r", [5, 6]), (b"5\r6\r\n\r\n7\r", [56, EOD_ID, 7]), (b"\r", [])])
def test_carriage_returns_are_dropped_as_tf_gfile_drops_them(tmp_path, data, ids):
    """tf.gfile's ReadLine drops every CR byte: inside a line, before a line break, and after the last one
    (found by the differential test: a file ending in "\\n\\r" read one <eod> too many)."""
    path = tmp_path / "ids.txt"
    path.write_bytes(data)
    shard = corpus.read_shard(str(path), None, from_raw_text=False, uncased=False, use_eod=True, vocab_size=32000)
    assert (np.concatenate(shard.ids).tolist() if shard else []) == ids


def test_bidirectional_layout_interleaves_reversed_rows_per_core():
    ids = np.arange(24, dtype=np.int32)
    rows = layout.layout_rows(ids, ids % 2 == 0, bsz_per_host=8, num_core=2, bi_data=True)
    data = layout.materialize(rows)
    fwd = ids.reshape(4, 6)
    want = np.stack([fwd[0], fwd[1], fwd[0, ::-1], fwd[1, ::-1], fwd[2], fwd[3], fwd[2, ::-1], fwd[3, ::-1]])
    np.testing.assert_array_equal(data, want)
    plain = layout.layout_rows(ids[:23], ids[:23] > 0, bsz_per_host=4, num_core=1, bi_data=False)
    np.testing.assert_array_equal(layout.materialize(plain), ids[:20].reshape(4, 5))
