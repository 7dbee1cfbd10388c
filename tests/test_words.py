"""create --word_boundaries=zh|ja|th (dataformat/words.py): masked spans start at the words a segmenter finds in
Chinese, Japanese and Thai; English text keeps the original's records.

The text: tests/data/words/{zh,ja,th}.txt, thirty sentences a language written for these tests with their words
cut by hand (the reference the segmenters are measured against), and the sentences of tests/data/sentences.jsonl.
One SentencePiece model (spm_train, --keep_accents, a small vocabulary: pieces of one to several characters, many
of them crossing words) serves every test.
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from xlnet_data.dataformat import record_reader, vocab, words
from xlnet_data.dataformat.examples import layout, rng
from xlnet_data.dataformat.examples.loop import ExampleSettings, Unit
from xlnet_data.dataformat.examples.masking import ngram_cdf
from xlnet_data.dataformat.inspection import decode_example, is_backward_row
from xlnet_data.dataformat.stats import compute_stats
from xlnet_data.datagen import encode, tokenizer
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import create_records
from xlnet_data.datagen.units import write_unit_records

for package in ("jieba", "fugashi", "unidic_lite", "nlpo3", "pythainlp"):
    pytest.importorskip(package, reason="the words extra (pip install -e '.[words]') is not installed")

DATA = Path(__file__).parent / "data"
LANGUAGES = ("zh", "ja", "th")
SETTINGS = dict(use_tpu=False, bsz_per_host=4, num_core_per_host=1, seq_len=64, reuse_len=32, bi_data=True,
                num_predict=12, keep_accents=True, num_passes=1)


def reference(language):
    """The hand-cut sentences: lists of words."""
    return [line.split() for line in (DATA / "words" / f"{language}.txt").read_text(encoding="utf-8").splitlines()]


def sentences(language):
    found = ["".join(line) for line in reference(language)] if language != "en" else []
    for line in (DATA / "sentences.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        if case["language"] == language:
            found += case["sentences"]
    return found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Per language a folder of two files, each four documents of its sentences shuffled."""
    root = tmp_path_factory.mktemp("words")
    shuffle = random.Random(0).sample
    for language in LANGUAGES + ("en",):
        lines = sentences(language)
        (root / language).mkdir()
        for name in ("a", "b"):
            documents = ["\n".join(shuffle(lines, len(lines))) for _ in range(4)]
            (root / language / f"{name}.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def model(corpus):
    config = tokenizer.SpmTrainConfig(input_files=tuple(str(p) for p in sorted(corpus.glob("*/a.txt"))),
                                      model_prefix=str(corpus / "spm"), vocab_size=1500, hard_vocab_limit=False,
                                      character_coverage=1.0, keep_accents=True, num_threads=1)
    return tokenizer.train_sentencepiece(config)


@pytest.mark.parametrize("language", LANGUAGES)
def test_each_segmenter_agrees_with_the_hand_cut_words(language):
    # Measured: jieba's route 0.95, MeCab (unidic-lite) 0.99, nlpo3 0.95 (benchmarks/bench_words.py prints them).
    assert words.boundary_f1(words.load_segmenter(language), reference(language)) > 0.93


def segmenter_starts(sp, language, line):
    """Independently of words.WordStarts: which of the line's pieces start a span: by the original's rule, or, a
    piece of the segmenter's script, where a word of the segmenter run on the line as written begins (offsets from
    SentencePiece's own alignment)."""
    char_starts = set(np.flatnonzero(words.load_segmenter(language)(line)).tolist())
    encoded = sp.encode(line, return_type="proto")
    raw = line.encode("utf-8")
    table = vocab.start_piece_table(sp)

    def starts(piece):
        at = len(raw[:piece.begin].decode("utf-8"))
        in_script = at < len(line) and any(low <= ord(line[at]) <= high for low, high in words.SCRIPTS[language])
        return bool(table[piece.id]) or in_script and at in char_starts
    return np.array([starts(p) for p in encoded.pieces]), np.array([p.id for p in encoded.pieces], dtype=np.int32)


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_piece_starts_a_span_where_a_segmenter_word_begins(model, language):
    sp = spm.SentencePieceProcessor(model_file=model)
    starts_of = words.WordStarts.of(sp, language)
    table = vocab.start_piece_table(sp)
    same = total = original = 0
    for line in sentences(language):
        want, ids = segmenter_starts(sp, language, line)
        got = starts_of(ids)
        same, total, original = same + int((got == want).sum()), total + ids.size, original + int(table[ids].sum())
    assert same / total > 0.97, same / total  # the segmenter reads NFKC text: a few pieces differ
    assert original / total < 0.35  # the original's rule: a line's first piece and punctuation
    print(f"{language}: {same / total:.3f} agree; the original's rule lets {original / total:.2f} start")


def exact_span_stats(sp, files, language, span_unit):
    """Statistics of a unit's masks reckoned with the very word starts the loop read: the ids replaced by their
    positions in the stream (masking reads only the starts), so each record's input says where its tokens were."""
    settings = encode.EncodeSettings.of(CreateConfig(keep_accents=True, word_boundaries=language))
    ids, sent_ids, starts = encode.encode_in_memory(settings, 0, files, sp).stream(list(range(len(files)))).arrays()
    first = vocab.EOP_ID + 1  # positions above the special ids, which stay what they are
    # The paper's ratio of masks (num_predict 85 of seq_len 512), on shorter sequences: 21 masks in each half
    example = ExampleSettings(bsz_per_host=2, num_core=1, seq_len=256, reuse_len=128, bi_data=True, mask_alpha=6,
                              mask_beta=1, num_predict=42, span_unit=span_unit)
    rows = layout.layout_rows(np.arange(first, first + ids.size, dtype=np.int32), sent_ids, 2, 1, True, starts)
    random_state = np.random.RandomState(Unit(0, 0).seed)
    path = files[0] + f".{span_unit}.tfrecords"
    with open(path, "wb") as out:
        write_unit_records(example, rows, np.ones(first + ids.size, dtype=bool), rng.numpy_state(random_state),
                           rng.python_state(0), out)
    by_position = np.concatenate([np.ones(first, dtype=bool), starts])
    examples = [decode_example(features, None, 128, is_backward_row(index, 2, 1, True))
                for index, features in record_reader.read_numbered_examples(path, 256)]
    original = float(vocab.start_piece_table(sp)[ids].mean())
    return compute_stats(examples, start_table=by_position), float(starts.mean()), original


@pytest.mark.parametrize("language", LANGUAGES)
def test_whole_word_spans_follow_the_segmenters_words(model, corpus, language):
    sp = spm.SentencePieceProcessor(model_file=model)
    files = [str(corpus / language / name) for name in ("a.txt", "b.txt")]
    word, start_share, original_share = exact_span_stats(sp, files, language, "word")
    piece, _, _ = exact_span_stats(sp, files, language, "piece")
    assert original_share < 0.2 and start_share > 3 * original_share  # zh 0.17 -> 0.60, ja 0.11 -> 0.58, th 0.10 -> 0.40
    assert word["count"] > 40 and word["masked"]["min"] == word["masked"]["max"] == 42
    assert word["spans_cutting_words"] == 0 and word["start_share"] == 1.0
    assert piece["cut_share"] > 0.05  # n pieces from a word start (xlnet#220), and the fill-up's single pieces
    lengths = word["span_words"]
    assert set(lengths) <= {1, 2, 3, 4, 5, 6, 7}
    share = np.array([lengths.get(n, 0) for n in range(1, 6)]) / sum(lengths.values())
    # p(n) ∝ 1/n (the paper's, ngram_cdf), skewed to one word by the goal: a half's last span is cut to what is
    # left of its 21 masks (measured: one word 0.51 zh, 0.52 ja, 0.55 th against 0.44)
    paper = np.diff(np.concatenate([[0], ngram_cdf()]))
    assert np.all(np.abs(share - paper) < [0.13, 0.06, 0.06, 0.06, 0.06]) and share[0] > share[1] > share[2], (share, paper)
    print(f"{language}: pieces that can start a span {original_share:.2f} -> {start_share:.2f}; spans cutting a "
          f"word: piece {piece['cut_share']:.2f}, word {word['cut_share']:.2f}; words a span {np.round(share, 2)}")


def create(corpus, model, tmp_path, language, name, beam_args=None, **changes):
    config = CreateConfig(input_glob=str(corpus / language / "*.txt"), sp_path=model, save_dir=str(tmp_path / name),
                          **{**SETTINGS, **changes})
    create_records(config.validate(), num_workers=1, beam_args=beam_args)
    return tmp_path / name


def record_bytes(save_dir):
    return [path.read_bytes() for path in sorted((save_dir / "tfrecords").glob("*.tfrecords"))]


def test_english_text_gives_the_same_records_with_and_without_the_flag(corpus, model, tmp_path):
    plain = create(corpus, model, tmp_path, "en", "plain")
    flagged = create(corpus, model, tmp_path, "en", "flagged", word_boundaries="zh", span_unit="word")
    plain_words = create(corpus, model, tmp_path, "en", "plain_words", span_unit="word")
    assert record_bytes(plain) and record_bytes(flagged) == record_bytes(plain_words)
    assert json.loads((flagged / "corpus_info.json").read_text())["word_boundaries"] == "zh"
    assert "word_boundaries" not in json.loads((plain / "corpus_info.json").read_text())


def test_records_cache_and_beam_give_the_same_examples_and_the_flag_changes_them(corpus, model, tmp_path):
    from test_beam import IN_PROCESS_RUNNER, needs_beam

    from xlnet_data.dataformat.examples.generated import find_cache_units, unit_payloads
    flagged = create(corpus, model, tmp_path, "zh", "records", word_boundaries="zh")
    if not needs_beam.args[0]:  # Beam installed: its workers segment too
        beam = create(corpus, model, tmp_path, "zh", "beam", beam_args=[f"--runner={IN_PROCESS_RUNNER}"],
                      word_boundaries="zh")
        assert record_bytes(beam) == record_bytes(flagged)
    cached = create(corpus, model, tmp_path, "zh", "cache", word_boundaries="zh", write_records=False)
    plain = create(corpus, model, tmp_path, "zh", "plain")
    (unit,) = find_cache_units(str(cached))
    assert unit.word_boundaries == "zh"
    from_cache = list(unit_payloads(unit))
    from_records = [record for path in sorted((flagged / "tfrecords").glob("*.tfrecords"))
                    for _, _, record in record_reader.read_records(str(path))]
    assert from_cache == from_records and len(from_cache) > 50
    assert record_bytes(flagged) != record_bytes(plain)  # the masks moved; the inputs are the same
    info = json.loads(next((cached / "tfrecords").glob("record_info-*.json")).read_text())
    assert info["create_settings"]["word_boundaries"] == "zh"


def test_a_missing_segmenter_or_an_unknown_language_is_one_line(monkeypatch):
    from xlnet_data.common.errors import ConfigError
    with pytest.raises(ConfigError, match="--word_boundaries=ko must be one of spaces, zh, ja, th"):
        CreateConfig(word_boundaries="ko").validate()
    monkeypatch.setattr(words.importlib.util, "find_spec", lambda name: None)  # jieba not installed
    words.load_segmenter.cache_clear()
    try:
        with pytest.raises(words.WordsError, match=r"--word_boundaries=zh needs the jieba package: pip install "
                                                   r"'xlnet-data\[words\]'"):
            words.load_segmenter("zh")
    finally:
        words.load_segmenter.cache_clear()


def test_the_compiled_chinese_route_cuts_where_rjieba_does():
    """zh_words is jieba's no-HMM cut (rjieba.cut(text, hmm=False)), compiled: the same word starts on every Han
    character of the test sentences (and of 729k Han characters of 红楼梦: benchmarks/bench_words.py)."""
    rjieba = pytest.importorskip("rjieba")
    text = " ".join(sentences("zh")) + " 他们在北京大学的图书馆里研究人工智能和自然语言处理。"
    han = np.array([any(low <= ord(c) <= high for low, high in words.SCRIPTS["zh"]) for c in text] + [False])
    got, want = words.load_segmenter("zh")(text), words.char_word_starts(text, rjieba.cut(text, False))
    assert han.sum() > 700 and got[han].tolist() == want[han].tolist()  # elsewhere only Han pieces read them


def test_text_without_spaces_is_warned_about_with_the_default_word_boundaries(corpus, model, tmp_path, caplog):
    """Japanese, Chinese and Thai records made with the default --word_boundaries=spaces: few pieces can start a
    span, so masked spans cut words (issue 43). create warns once a file, naming the file; not on English, nor
    with the language's segmenter."""
    def warned(language, **changes):
        caplog.clear()
        with caplog.at_level("WARNING"):
            create(corpus, model, tmp_path, language, f"{language}-{len(changes)}", **changes)
        return sorted(record.args[0] for record in caplog.records
                      if record.args and "word_boundaries" in record.getMessage())

    for language in LANGUAGES:
        assert warned(language) == [str(corpus / language / f"{name}.txt") for name in ("a", "b")], language
    assert warned("en") == []
    assert warned("ja", word_boundaries="ja") == []
