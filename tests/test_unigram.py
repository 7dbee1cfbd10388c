"""Our unigram encoder (datagen/unigram.py) against the installed SentencePiece, line by line: random text of
many scripts on several models, the books in ../shared, and the choice of encoder (datagen/encoder_check.py).

The fuzz seed is new on every run and printed; replay one with UNIGRAM_SEED=<seed>. UNIGRAM_LINES sets the
random lines per model (default 1500); UNIGRAM_BOOK_LINES the book lines checked (default 2000 spread over
all the books; 0: every line).
"""

import io
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from conftest import SAMPLE_CORPUS, SHARED, XLNET_SPM, needs_shared, read_save_dir
from fuzz_files import boundscheck_cache

from xlnet_data.dataformat import spm_model
from xlnet_data.datagen import encoder_check, spm_normalize, tokenizer, unigram
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records
from xlnet_data.datagen.text import Encoder, preprocess_texts
from xlnet_data.datagen.unigram import UnigramEncoder
from xlnet_data.datagen.utf8_lines import Utf8Lines

SEED = int(os.environ.get("UNIGRAM_SEED") or random.SystemRandom().randrange(10**6))
NUM_LINES = int(os.environ.get("UNIGRAM_LINES", "1500"))
BOOK_LINES = int(os.environ.get("UNIGRAM_BOOK_LINES", "2000"))
SAMPLE_TEXT = sorted(SAMPLE_CORPUS.glob("*.txt"))[0]

# Runs of characters of many scripts, and what trips encoders: accents (composed and not), jamo, digits with
# commas, control and space characters, U+2581, XLNet's user-defined symbols, repeated characters for ties.
ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "éèêëàâäîïôöùûüçñßøåæœ", "e\u0301a\u0308o\u0302n\u0303",
    "的一是不了人我在有他这为之大来以个中上们", "あいうえおかきくけこがぎアイウエオガ", "ｱｲｳｶﾞｷﾞﾊﾟ",
    "กขคงจฉชซญดตถทนบปผพฟมยรลวสหอะาิีึืุู่้๊๋",
    "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह्ािीुूेैोौं", "가각간갈감갑강개객거건걸검",
    "\u1100\u1161\u11a8\u1102\u1165\u11ab\u1112",
    "😀😃😄👍🏽🇫🇷❤️", "0123456789", ",,,.", "  \t\u3000\u00a0\u2009", "\x01\x02\x1f\x7f\u200b\u200d\ufeff",
    "\u2581", "<eop>", "().\"-–£€", "ﬁﬂ①②㍿½Ⅻｆｕｌｌ", "ΑαΒβΓγΔδΩωάέ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي\u064b\u064e", "אבגדהוזחטיכלמנסעפצקרשת", "ăâđêôơưạảấầẩẫậ",
]


def random_text(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        alphabet = rng.choice(ALPHABETS)
        roll = rng.random()
        if roll < 0.15:  # one character repeated: ties between segmentations
            part = rng.choice(alphabet) * rng.randint(2, 12)
        elif roll < 0.25:
            part = "".join(rng.choice("ulya") for _ in range(rng.randint(3, 9)))
        elif roll < 0.35:
            part = ",".join(str(rng.randint(0, 99999)) for _ in range(rng.randint(1, 4))) + rng.choice([",", "", ", "])
        else:
            part = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10)))
        parts.append(part)
    text = rng.choice([" ", "", " ", "  "]).join(parts)
    if rng.random() < 0.02:
        text = text * rng.randint(50, 400)  # long lines
    return text


def differences(encoder, sp, texts):
    flat, lengths = encoder.encode_ids(texts)
    ours = np.split(flat, np.cumsum(lengths)[:-1]) if texts else []
    theirs = sp.encode(list(texts), num_threads=1)
    return [(text, sp.id_to_piece(a.tolist()), sp.id_to_piece(b)) for text, a, b in zip(texts, ours, theirs)
            if a.tolist() != b]


def model_bytes(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def multiscript_spm(tmp_path_factory):
    """A unigram model trained by our spm_train on random text of all the scripts above (character coverage 1)."""
    folder = tmp_path_factory.mktemp("multiscript")
    rng = random.Random(7)
    (folder / "text.txt").write_text("\n".join(random_text(rng) for _ in range(3000)) + "\n", encoding="utf-8")
    config = tokenizer.SpmTrainConfig(input_files=(str(folder / "text.txt"),), model_prefix=str(folder / "ms"),
                                      vocab_size=800, character_coverage=1.0, num_threads=2, uncased=False,
                                      keep_accents=True)
    return tokenizer.train_sentencepiece(config)


@pytest.fixture(scope="module")
def bpe_spm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    config = tokenizer.SpmTrainConfig(input_files=(str(SAMPLE_TEXT),), model_prefix=str(folder / "bpe"),
                                      vocab_size=300, model_type="bpe", num_threads=2, uncased=False)
    return tokenizer.train_sentencepiece(config)


def fuzz(model_path, offset):
    print(f"UNIGRAM_SEED={SEED}")
    rng = random.Random(SEED + offset)
    data = model_bytes(model_path)
    texts = [random_text(rng) for _ in range(NUM_LINES)]
    texts += preprocess_texts([t.strip() for t in texts if t.strip()], True)  # as create feeds them
    found = differences(UnigramEncoder(data), spm.SentencePieceProcessor(model_proto=data),
                        texts)
    assert not found, (f"UNIGRAM_SEED={SEED}: {len(found)} of {len(texts)} lines differ, first "
                       f"{[str(x)[:300] for x in found[0]]}")


@needs_shared
def test_fuzz_xlnet_model():
    fuzz(XLNET_SPM, 0)


@pytest.mark.slow
def test_fuzz_spm_train_models(sample_spm, multiscript_spm):
    fuzz(sample_spm, 1)
    fuzz(multiscript_spm, 2)


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    dict(normalization_rule_name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False),
    dict(normalization_rule_name="nfkc_cf", split_digits=True),
    dict(user_defined_symbols=["ab", "中文", "<eop>", "▁x"], split_by_whitespace=False),
], ids=["identity-no-prefix-spaces-kept", "nfkc_cf-split-digits", "symbols-no-whitespace-split"])
def test_fuzz_models_of_other_trainer_options(options, tmp_path):
    """Models a user may bring from SentencePiece's own trainer (spm_train sets none of these): another normaliser,
    no dummy prefix, spaces kept, user-defined symbols of several scripts. An outside battery of 24 such models
    (2026-12-04) found no difference in 264,144 lines."""
    rng = random.Random(SEED + 3)
    (tmp_path / "text.txt").write_text("\n".join(random_text(rng) for _ in range(2000)) + "\n", encoding="utf-8")
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(tmp_path / "text.txt"), model_writer=writer, vocab_size=600,
                                   character_coverage=1.0, num_threads=1, minloglevel=2, **options)
    model = tmp_path / "options.model"
    model.write_bytes(writer.getvalue())
    fuzz(model, 4)


BOUNDS_CHECKED = """
import random, sys
import numpy as np
import sentencepiece as spm
sys.path.insert(0, sys.argv[1])
from test_unigram import random_text
from xlnet_data.datagen.text import preprocess_texts
from xlnet_data.datagen.unigram import UnigramEncoder
from xlnet_data.datagen.utf8_lines import Utf8Lines
rng = random.Random(int(sys.argv[2]))
texts = [random_text(rng) for _ in range(1500)]
texts += preprocess_texts([t.strip() for t in texts if t.strip()], True)
raw = ("\\n".join(texts) + "\\n").encode()
assert Utf8Lines.checked(np.frombuffer(raw, dtype=np.uint8))[1] == len(raw.decode())
assert Utf8Lines.checked(np.frombuffer(raw + b"\\xe4\\xb8\\n\\xff", dtype=np.uint8)) is None
for path in sys.argv[3:]:
    data = open(path, "rb").read()
    ours, sp = UnigramEncoder(data).encode_ids(texts), spm.SentencePieceProcessor(model_proto=data).encode(texts)
    assert ours[0].tolist() == [i for ids in sp for i in ids], path
print("checked")
"""


@pytest.mark.slow  # numba code compiled with bounds checks
def test_the_compiled_text_code_reads_and_writes_nothing_out_of_bounds(sample_spm, tmp_path):
    """numba checks no index unless asked: the read check, the text step, the normaliser and Viterbi run here with
    NUMBA_BOUNDSCHECK=1 (in the bounds-checked code's own numba cache, fuzz_files.boundscheck_cache, kept between
    runs), on a model with a charsmap and on one without (the identity rule:
    its empty table was one unit, which every walk read far past, found so on 2026-12-04)."""
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(SAMPLE_TEXT), model_writer=writer, vocab_size=300, num_threads=1,
                                   minloglevel=2, normalization_rule_name="identity")
    identity = tmp_path / "identity.model"
    identity.write_bytes(writer.getvalue())
    models = [str(identity), str(sample_spm)] + ([str(XLNET_SPM)] if XLNET_SPM.is_file() else [])
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=boundscheck_cache())
    result = subprocess.run([sys.executable, "-c", BOUNDS_CHECKED, str(Path(__file__).parent), str(SEED), *models],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "checked" in result.stdout, f"UNIGRAM_SEED={SEED}: {result.stderr[-3000:]}"


@needs_shared
def test_a_long_line_goes_to_sentencepiece_whatever_the_scratch_held():
    """A line whose path's score passes LARGEST_SCORE is SentencePiece's, also where the scratch's scores of
    the ends inside a character (never written) hold NaN from an earlier use (they once hid the score)."""
    data = model_bytes(XLNET_SPM)
    encoder, sp = UnigramEncoder(data), spm.SentencePieceProcessor(model_proto=data)
    text = "😀🏽 47204 uylullyaa ﬂｆﬂﬂｕﬂ②㍿ﬂ② <ppp< " * 400
    norm, best_score, *rest = encoder._scratch
    encoder._scratch = (norm, np.full(4 * len(text.encode()), np.nan, dtype=np.float32), *rest)
    assert encoder.encode_ids([text])[0].tolist() == sp.encode(text)


@needs_shared
def test_runs_of_characters_no_piece_holds_at_every_length():
    """Chinese to XLNet's English model: no piece holds its characters, so _viterbi sums a run's unknowns in
    one loop and writes only its end. Runs of every length from 1 to past LARGEST_SCORE's (then the line is
    SentencePiece's), alone, between pieces and after an unknown of another kind (an emoji: merged with it);
    2-byte characters too (Armenian, in no XLNet piece)."""
    data = model_bytes(XLNET_SPM)
    encoder, sp = UnigramEncoder(data), spm.SentencePieceProcessor(model_proto=data)
    assert encoder._pieceless[ord("中")] and encoder._pieceless[ord("Ճ")] and not encoder._pieceless[ord("ø")]
    unk_run = int(unigram.LARGEST_SCORE / -float(encoder._unk_score))  # the run whose score passes it
    patterns = ("{run}", "a{run}", "{run}b", "x {run}, y", "{run}。{run}", "{run}ø{run}", "{run}£", "😀{run}",
                "{run}😀{run}")
    texts = [pattern.format(run="中文" * (n // 2) + "Ճ" * (n % 2)) for n in [*range(1, 40), unk_run - 2, unk_run + 2]
             for pattern in patterns]
    assert not differences(encoder, sp, texts)


@needs_shared
def test_every_character_that_begins_a_charsmap_entry_is_normalised_as_sentencepiece_does():
    """A character of 2 or 3 bytes that begins an entry of the model's charsmap (2,563 in XLNet's: kana that take
    a voicing mark, letters with combining marks, compatibility forms) has the search go on from its cached node:
    each such character alone, before each mark that could compose with it, before a plain character and a
    space, at a line's end, and twice, normalised as SentencePiece's own normaliser does."""
    data = model_bytes(XLNET_SPM)
    encoder, sp = UnigramEncoder(data), spm.SentencePieceProcessor(model_proto=data)
    tables = encoder._norm_tables
    starters = [chr(c) for c in np.flatnonzero(spm_normalize.normalizer_tables(
        spm_model.read_model_proto(data)).char_nodes >= 0)]
    assert len(starters) > 1000 and "か" in starters and "и" in starters
    marks = ["\u3099", "\u309a", "\u309b", "\u309c", "\uff9e", "\uff9f", "\u0300", "\u0301", "\u0302", "\u0303",
             "\u0306", "\u0308", "\u030a", "\u030c", "\u0327", "\u0328", "\u093c", "中", " x", ""]
    texts = [c + m for c in starters for m in marks] + [c * 2 for c in starters]
    lines = Utf8Lines.of(texts)
    out, ends = np.empty(8 * lines.data.size + 16, dtype=np.uint8), np.empty(len(texts), dtype=np.int64)
    assert spm_normalize.normalize_lines(lines.data, lines.line_starts, 0, out, ends, *tables) == len(texts)
    ours = [out[begin:end].tobytes().decode("utf-8") for begin, end in zip([0, *ends[:-1]], ends)]
    assert [(t, a) for t, a, b in zip(texts, ours, map(sp.normalize, texts)) if a != b] == []


@pytest.fixture(scope="module")
def chinese_spm(tmp_path_factory):
    """A unigram model of SentencePiece's trainer on text of Chinese words (1-4 characters of 40, some kana and
    ASCII among them): pieces of several characters of three bytes, as a model trained on Chinese has."""
    rng = random.Random(11)
    alphabet = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生"
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    lines = ["".join(rng.choice(words) + rng.choice(["", "", "", "，", "。", " ", "x", "の"]) for _ in range(20))
             for _ in range(3000)]
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=writer, vocab_size=500,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    path = tmp_path_factory.mktemp("chinese") / "zh.model"
    path.write_bytes(writer.getvalue())
    return path, alphabet, lines


def test_every_piece_that_begins_with_a_character_of_three_bytes(chinese_spm):
    """_viterbi takes the first character of three bytes at a start from its code point's node
    (tries.three_byte_nodes) and walks on from there a byte at a time: every piece that begins with such a
    character (U+2581 included: most pieces of an English model) alone, doubled, before ASCII, before its own
    first character and before a character no piece holds; every character of the alphabet alone,
    doubled and tripled; the training lines. Fails when one character's node in the table is wrong."""
    path, alphabet, lines = chinese_spm
    data = model_bytes(path)
    encoder, sp = UnigramEncoder(data), spm.SentencePieceProcessor(model_proto=data)
    pieces = [sp.id_to_piece(i).replace("\u2581", " ") for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i))]
    starts = [p for p in pieces if 0x800 <= ord(p.lstrip()[:1] or "a") < 0x10000]
    assert sum(len(p.strip()) > 1 for p in starts) > 100  # pieces of several characters: the walk goes on
    texts = [t for p in starts for t in (p, p * 2, p + "x", p + p.lstrip()[0], p + "ꙮ", " " + p)]
    texts += [c * n for c in alphabet for n in (1, 2, 3)] + lines[:500]
    assert not differences(encoder, sp, texts)


def test_str_lines_in_batches_give_the_ids_of_one_call(sample_spm, monkeypatch):
    """Many str lines are encoded STR_BATCH at a time: the ids and lengths are those of one call, a line left
    to SentencePiece (past LARGEST_SCORE) and blank lines included."""
    data = model_bytes(sample_spm)
    encoder, sp = UnigramEncoder(data), spm.SentencePieceProcessor(model_proto=data)
    rng = random.Random(SEED)
    texts = [random_text(rng) for _ in range(60)] + ["", "ulyulyu " * 3000, "x"]
    rng.shuffle(texts)
    whole = encoder.encode_ids(Utf8Lines.of(texts))
    monkeypatch.setattr(unigram, "STR_BATCH", 7)
    batched = encoder.encode_ids(texts)
    assert [a.tolist() for a in batched] == [a.tolist() for a in whole]
    assert not differences(encoder, sp, texts)


def test_probe_lines_on_every_model(sample_spm, multiscript_spm):
    for path in filter(None, [XLNET_SPM if XLNET_SPM.is_file() else None, sample_spm, multiscript_spm]):
        data = model_bytes(path)
        encoder = UnigramEncoder(data)
        assert encoder_check.first_difference(encoder, spm.SentencePieceProcessor(model_proto=data),
                                              encoder_check.PROBES) is None, path


@needs_shared
def test_the_books_line_by_line():
    """Every book in ../shared (UNIGRAM_BOOK_LINES=0: every line; by default a spread sample), as create
    normalises them, cased and uncased."""
    lines = []
    for path in sorted((SHARED / "data" / "corpus_en").glob("*.txt")):
        lines += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if BOOK_LINES:
        lines = lines[::max(1, len(lines) // BOOK_LINES)]
    data = model_bytes(XLNET_SPM)
    encoder, sp = UnigramEncoder(data), spm.SentencePieceProcessor(model_proto=data)
    for uncased in (False, True):
        texts = preprocess_texts(lines, uncased)
        assert differences(encoder, sp, texts) == []


@pytest.mark.slow
def test_unsupported_model_falls_back_in_one_line(bpe_spm, caplog, tmp_path):
    sp = spm.SentencePieceProcessor(model_file=bpe_spm)
    encoder_check._SAID.clear()
    with caplog.at_level(logging.INFO, logger="xlnet_data"):
        assert not Encoder(sp, 1).uses_ours
        assert not Encoder(sp, 1).uses_ours
    said = [r.getMessage() for r in caplog.records if "our encoder does not reproduce" in r.getMessage()]
    assert len(said) == 1 and "a bpe model" in said[0], said
    with pytest.raises(encoder_check.EncoderChoiceError, match="--encoder=ours: .*bpe"):
        Encoder(sp, 1, "ours")
    records = {}
    for choice in ("auto", "sentencepiece"):
        config = CreateConfig(input_glob=str(SAMPLE_TEXT), sp_path=bpe_spm, save_dir=str(tmp_path / choice),
                              use_tpu=False, bsz_per_host=4, seq_len=64, reuse_len=32, num_predict=8, encoder=choice)
        create_records(config.validate(), num_workers=1)
        records[choice] = {name: [{key: value.tolist() for key, value in example.items()} for example in examples]
                           for name, examples in read_save_dir(tmp_path / choice).items()}
    assert records["auto"] == records["sentencepiece"] and records["auto"]


def test_a_difference_sends_the_run_to_sentencepiece(sample_spm, caplog, monkeypatch):
    sp = spm.SentencePieceProcessor(model_file=sample_spm)
    texts = preprocess_texts(["The first line of the corpus.", "And the second, 1,000 words."], False)
    expected = Encoder(sp, 1, "sentencepiece").encode_batch(texts)
    assert Encoder(sp, 1).uses_ours
    real = UnigramEncoder.encode_ids

    def one_id_off(self, lines):
        flat, lengths = real(self, lines)
        return np.where(flat == flat[-1], 0, flat).astype(np.int32), lengths
    monkeypatch.setattr(UnigramEncoder, "encode_ids", one_id_off)
    encoder_check._SAID.clear()
    encoder = Encoder(sp, 1)  # the probe check was made when the model was first loaded: the corpus's catches it
    with caplog.at_level(logging.WARNING, logger="xlnet_data"):
        got = encoder.encode_batch(texts)
    assert not encoder.uses_ours and [r.getMessage() for r in caplog.records if "differs" in r.getMessage()]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))
    encoder_check._built.cache_clear()  # and a model loaded now fails the probe check
    assert not Encoder(sp, 1).uses_ours
    encoder_check._built.cache_clear()


def test_the_encoder_flag_is_checked():
    with pytest.raises(Exception, match="--encoder=fast must be one of auto, ours, sentencepiece"):
        CreateConfig(sp_path="x", encoder="fast").validate()
