"""Languages through the pipeline: spm_train and create with --keep_accents keep every letter and mark of
eleven languages (no <unk>); without it, create counts the letters that lost a mark and warns naming the file.

The sentences are hand-written, a few per language, in XLNet's input format. One SentencePiece model
(spm_train --keep_accents --character_coverage=1.0, a tiny vocabulary) serves every test.
"""

import dataclasses
import json
import logging
import re
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
from conftest import run_module

from xlnet_data.dataformat import record_reader
from xlnet_data.dataformat.vocab import UNK_ID
from xlnet_data.datagen import tokenizer
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.job import MARKS_WARNING_SHARE, UNK_WARNING_SHARE, create_records
from xlnet_data.datagen.text import StrippedMarks, preprocess_texts

# Each language: documents, each a list of sentences (<eop> glued to a paragraph's last sentence).
TEXTS = {
    "th": [["ฉันชอบกินข้าวผัดที่ร้านใกล้บ้าน", "วันนี้อากาศร้อนมาก เราจึงไปว่ายน้ำที่ทะเล<eop>",
            "ภาษาไทยมีวรรณยุกต์สี่รูปและห้าเสียง"], ["นักเรียนทุกคนต้องอ่านหนังสือก่อนสอบ"]],
    "ja": [["パソコンが大好きです。", "昨日は友達と一緒に映画を見に行きました。<eop>",
            "東京駅から電車で二十分ぐらいかかります。"], ["この本はとても面白いので、ぜひ読んでください。"]],
    "ko": [["한국어는 배우기 어렵지만 재미있습니다.", "저는 매일 아침 커피를 마십니다.<eop>"],
           ["서울에서 부산까지 기차로 세 시간 걸려요."]],
    "zh": [["我今天早上在图书馆看了一本很有意思的书。", "北京是中国的首都，有很多名胜古迹。<eop>"],
           ["学习一门语言需要耐心和时间。"]],
    "vi": [["Tiếng Việt có sáu thanh điệu khác nhau.", "Hôm nay trời đẹp, chúng tôi đi dạo ở công viên.<eop>"],
           ["Tôi thích ăn phở bò vào buổi sáng."]],
    "hi": [["हिन्दी भारत की सबसे अधिक बोली जाने वाली भाषा है।", "मैं हर सुबह चाय पीता हूँ।<eop>"],
           ["बच्चे स्कूल के मैदान में क्रिकेट खेल रहे हैं।", "ज़रूरत पड़ने पर फ़ोन कर देना।"]],
    "ta": [["தமிழ் உலகின் மிகப் பழமையான மொழிகளில் ஒன்று.", "நான் காலையில் காபி குடிப்பேன்.<eop>"],
           ["சென்னை ஒரு பெரிய நகரம்."]],
    "ar": [["اللغة العربية لغة جميلة وغنية.", "ذَهَبَ الوَلَدُ إِلَى المَدْرَسَةِ صَبَاحًا.<eop>"],
           ["أحب قراءة الكتب في المساء."]],
    "el": [["Η ελληνική γλώσσα έχει μακρά ιστορία.", "Το πρωί πίνω καφέ στο μπαλκόνι.<eop>"],
           ["Η Αθήνα είναι η πρωτεύουσα της Ελλάδας."]],
    "fr": [["Le café est très chaud ce matin.", "M. Dupont est arrivé à la gare à dix-sept heures.<eop>"],
           ["Les élèves ont étudié le français pendant l'été."]],
    "de": [["Die Bäume im Garten sind schön grün.", "Über die Brücke fährt ein großer Lastwagen.<eop>"],
           ["Wir müssen morgen früh aufstehen."]],
    "en": [["Alice was beginning to get very tired of sitting by her sister on the bank.",
            "She had peeped into the book her sister was reading.<eop>"], ["It had no pictures in it."]],
}
# Where the original's accent removal changes letters (Arabic: only its optional harakat; Korean: NFKD splits
# the syllables into jamo, which are not marks, and SentencePiece's NFKC composes them back).
LOSE_MARKS = {"th", "ja", "vi", "hi", "ta", "el", "fr", "de"}
# A letter or mark of each language that must come back from the records' pieces (NFC).
PROBES = {"th": "\u0e48", "ja": "が", "ko": "한", "zh": "书", "vi": "ệ", "hi": "\u094d", "ta": "\u0bcd",
          "ar": "\u064e", "el": "ά", "fr": "é", "de": "ü", "en": "a"}
SMALL = dict(use_tpu=False, bsz_per_host=1, num_core_per_host=1, seq_len=32, reuse_len=16, bi_data=False,
             num_predict=4, num_passes=1)


def _write(folder, languages):
    folder.mkdir(parents=True, exist_ok=True)
    for code in languages:
        text = "".join("\n".join(document) + "\n\n" for document in TEXTS[code])
        (folder / f"{code}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("languages") / "corpus", TEXTS)


@pytest.fixture(scope="module")
def accents_model(corpus):
    """spm_train --keep_accents --character_coverage=1.0 on the corpus: every character is a piece."""
    config = tokenizer.SpmTrainConfig(input_files=tuple(sorted(map(str, corpus.glob("*.txt")))),
                                      model_prefix=str(corpus.parent / "spm" / "langs"), vocab_size=2000,
                                      hard_vocab_limit=False, character_coverage=1.0, keep_accents=True,
                                      num_threads=2)
    return tokenizer.train_sentencepiece(config)


def _memory_stream(save_dir):
    """The ids of the records' memory parts, in order: with one row a batch (bsz_per_host 1, no bi_data) they
    tile the token stream (the files in the pass's order), up to the dropped tail."""
    files = sorted((save_dir / "tfrecords").glob("*.tfrecords"))
    parts = [features["input"][:SMALL["reuse_len"]]
             for path in files for _, features in record_reader.read_numbered_examples(path)]
    return np.concatenate(parts)


def _letters(text):
    """The text without its spaces, NFC: what must come back from the pieces."""
    return unicodedata.normalize("NFC", "".join(text.replace("\u2581", " ").split()))


@pytest.fixture(scope="module")
def kept(accents_model, corpus, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("kept")
    config = CreateConfig(input_glob=str(corpus / "*.txt"), sp_path=accents_model, save_dir=str(save_dir),
                          keep_accents=True, **SMALL).validate()
    return save_dir, create_records(config, num_workers=1)


def test_keep_accents_records_decode_to_every_letter_and_mark_without_unk(accents_model, corpus, kept):
    save_dir, summary = kept
    sp = spm.SentencePieceProcessor(model_file=accents_model)
    info = json.loads((save_dir / "corpus_info.json").read_text())
    assert info["keep_accents"] is True and info["uncased"] is True
    stream = _memory_stream(save_dir)
    assert stream.size > 0.8 * summary.total("tokens") and UNK_ID not in stream
    for path in (save_dir / "tfrecords").glob("*.tfrecords"):
        for _, features in record_reader.read_numbered_examples(path):
            assert UNK_ID not in features["input"] and UNK_ID not in features["target"]
    # The stream is the files one after the other (in the pass's order); each file's letters, marks included,
    # come back from its pieces: the decoded stream is the files' texts, whole, until the dropped tail.
    decoded = _letters(sp.decode(stream.tolist()))
    expected = {code: _letters(" ".join(sp.normalize(line) for line in preprocess_texts(
        [s for document in TEXTS[code] for s in document], True, keep_accents=True))) for code in TEXTS}
    found, at = [], 0
    while at < len(decoded):
        code = next((c for c in expected if c not in found and decoded.startswith(expected[c], at)), None)
        if code is None:  # the last file in the stream, cut by the dropped tail
            rest = decoded[at:]
            assert any(expected[c].startswith(rest) for c in expected if c not in found), rest
            break
        found.append(code)
        at += len(expected[code])
    assert len(found) >= len(TEXTS) - 1, found
    for code in found:  # e.g. the Thai tone mark, the viramas, kana voicing, Vietnamese tones, the fatha
        assert PROBES[code] in expected[code], code
    # Not one input file lost a mark: nothing to count, no warning.
    assert all(counts["marks"] == counts["arabic_marks"] == 0 for counts in summary.input_counts.values())
    assert summary.marks_warning() is None
    assert summary.total("tokens") and not any(c["unk"] for c in summary.input_counts.values())


def test_without_keep_accents_the_letters_that_lose_a_mark_are_counted_per_file_and_warned(
        accents_model, corpus, tmp_path, caplog):
    # The model was trained with --keep_accents: create without it is refused, before anything is written, unless
    # told to go on
    config = CreateConfig(input_glob=str(corpus / "*.txt"), sp_path=accents_model, save_dir=str(tmp_path / "out"),
                          **{**SMALL, "num_passes": 2}).validate()
    from xlnet_data.datagen.plan import CreateError
    with pytest.raises(CreateError, match=r"was trained by spm_train --keep_accents .* and create runs with "
                       r"--nokeep_accents: .*; or pass --allow_accents_mismatch to make the records anyway$"):
        create_records(config, num_workers=1)
    assert not (tmp_path / "out").exists()
    config = dataclasses.replace(config, allow_accents_mismatch=True)
    with caplog.at_level(logging.WARNING, logger="xlnet_data"):
        summary = create_records(config, num_workers=1)
    assert len(summary.written) == 2  # two passes, each file counted once
    letters = sum(c["marks"] for c in summary.input_counts.values())
    assert f", {letters} letters lost a mark to the accent removal" in summary.line(1.0)
    # The model was trained with --keep_accents: one line says create's setting differs.
    assert any("spm_train --keep_accents" in r.getMessage() and "--nokeep_accents" in r.getMessage()
               for r in caplog.records)
    counts = {path.rsplit("/", 1)[-1][:-4]: c for path, c in summary.input_counts.items()}
    assert {code for code, c in counts.items() if c["marks"]} == LOSE_MARKS
    assert counts["ar"]["arabic_marks"] >= 5 and counts["ar"]["marks"] == 0
    assert "ko" not in counts or not counts["ko"]["marks"]
    for code in LOSE_MARKS:  # per file, by hand: the letters that lost a mark
        marks = StrippedMarks()
        preprocess_texts([s for document in TEXTS[code] for s in document], True, False, marks)
        assert counts[code]["marks"] == marks.letters > 0
        assert counts[code]["marks"] / counts[code]["chars"] >= MARKS_WARNING_SHARE, code
    assert counts["vi"]["marks"] >= 20
    warning = summary.marks_warning()
    assert warning.count("\n") == 0 and "--keep_accents" in warning and f"{corpus}/vi.txt" in warning
    info = json.loads((tmp_path / "out" / "corpus_info.json").read_text())
    assert info["keep_accents"] is False
    assert info["input_counts"][f"{corpus}/th.txt"] == summary.input_counts[f"{corpus}/th.txt"]


def test_a_model_of_text_without_marks_and_no_record_beside_it_is_warned_about_by_its_unk(corpus, tmp_path):
    """Without spm_train's record (PREFIX.text.json) beside the model, create cannot compare --keep_accents with
    how the model was trained; the <unk> it then reads says so instead."""
    stripped = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
        input_files=tuple(sorted(map(str, corpus.glob("*.txt")))), model_prefix=str(tmp_path / "spm" / "plain"),
        vocab_size=2000, hard_vocab_limit=False, character_coverage=1.0, num_threads=2))
    moved = tmp_path / "moved.model"
    moved.write_bytes(open(stripped, "rb").read())  # its text.json left behind
    config = CreateConfig(input_glob=str(corpus / "*.txt"), sp_path=str(moved), save_dir=str(tmp_path / "out"),
                          keep_accents=True, **SMALL).validate()
    summary = create_records(config, num_workers=1)
    counts = summary.input_counts
    unk = sum(c["unk"] for c in counts.values()) / summary.per_input("tokens")  # counts: the files with <unk> only
    assert summary.per_input("tokens") > sum(c["tokens"] for c in counts.values())  # some files have none
    assert unk >= UNK_WARNING_SHARE
    warning = summary.unk_warning()
    worst = max(counts, key=lambda path: counts[path]["unk"] / counts[path]["tokens"])
    assert warning.startswith(f"{100 * unk:.1f}% of the tokens read are <unk> ({worst}: ")
    assert "--keep_accents" in warning and "\n" not in warning
    # The same text with the model's own setting: no <unk> to speak of.
    config = dataclasses.replace(config, keep_accents=False, save_dir=str(tmp_path / "same"))
    assert create_records(config, num_workers=1).unk_warning() is None


def test_english_and_chinese_get_no_warning(accents_model, tmp_path):
    corpus = _write(tmp_path / "corpus", ["en", "zh"])
    config = CreateConfig(input_glob=str(corpus / "*.txt"), sp_path=accents_model, save_dir=str(tmp_path / "out"),
                          allow_accents_mismatch=True, **SMALL).validate()
    summary = create_records(config, num_workers=1)
    assert not any(c["marks"] for c in summary.input_counts.values())
    assert summary.marks_warning() is None
    # The same save_dir as an older create wrote it, without keep_accents: read as False, the original's.
    for path in [tmp_path / "out" / "corpus_info.json", *(tmp_path / "out" / "tfrecords").glob("record_info-*")]:
        info = json.loads(path.read_text())
        info.pop("keep_accents", None)
        info.get("create_settings", {}).pop("keep_accents", None)
        path.write_text(json.dumps(info))
    assert create_records(config, num_workers=1).written == []  # complete already
    from xlnet_data.datagen.plan import CreateError
    with pytest.raises(CreateError, match="keep_accents False there, True here"):
        create_records(dataclasses.replace(config, keep_accents=True), num_workers=1)


@pytest.mark.slow
def test_create_cli_ends_with_one_warning_line_naming_the_file(accents_model, tmp_path):
    corpus = _write(tmp_path / "corpus", ["en", "th"])
    result = run_module("xlnet_data.create", f"--input_glob={corpus}/*.txt", f"--sp_path={accents_model}",
                        f"--save_dir={tmp_path / 'out'}", "--nouse_tpu", "--bsz_per_host=1", "--seq_len=32",
                        "--reuse_len=16", "--num_predict=4", "--nobi_data", "--num_workers=1",
                        "--allow_accents_mismatch")
    assert result.returncode == 0, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"{corpus}/th.txt" in last and "--keep_accents" in last and "of the characters" in last, last
    assert "letters lost a mark" in result.stderr.strip().splitlines()[-2]  # the summary counts them
    # The progress line's last state agrees with the summary: units, tokens encoded, records, 100%
    from xlnet_data.common.progress import format_count
    progress = [line for line in result.stderr.splitlines() if line.startswith("units ")][-1]
    summary = re.search(r"done: (\d+) unit\(s\), \d+ tokens \((\d+) encoded, once for all passes\), (\d+) records",
                        result.stderr)
    units, encoded, records = map(int, summary.groups())
    assert progress.startswith(f"units {units}/{units} | ")
    assert f"| encoded {format_count(encoded)} tokens | records {format_count(records)} |" in progress
    assert "| 100% |" in progress


def test_a_file_in_a_script_the_model_does_not_know_is_warned_about(accents_model, tmp_path, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "ka.txt").write_text("ქართული ენა ძალიან ლამაზია.\nთბილისი საქართველოს დედაქალაქია.\n\n", encoding="utf-8")
    config = CreateConfig(input_glob=str(corpus / "*.txt"), sp_path=accents_model, save_dir=str(tmp_path / "out"),
                          keep_accents=True, **SMALL).validate()
    with caplog.at_level(logging.WARNING, logger="xlnet_data"):
        summary = create_records(config, num_workers=1)
    assert summary.input_counts[str(corpus / "ka.txt")]["unk"] > 0
    assert any(r.getMessage().startswith(f"{corpus}/ka.txt: ") and "<unk>" in r.getMessage() for r in caplog.records)


def test_spm_train_records_its_text_settings_and_trains_on_what_create_feeds(accents_model, corpus):
    settings = tokenizer.model_text_settings(accents_model)
    assert settings["keep_accents"] is True and settings["uncased"] is True
    assert settings["unk"] == 0 and settings["pieces"] > 100
    assert tokenizer.text_settings_mismatch(accents_model, uncased=True, keep_accents=True) is None
    assert "--keep_accents" in tokenizer.text_settings_mismatch(accents_model, uncased=True, keep_accents=False)
    assert "--nouncased" in tokenizer.text_settings_mismatch(accents_model, uncased=False, keep_accents=True)
    sp = spm.SentencePieceProcessor(model_file=accents_model)
    pieces = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    # Lower-cased as create's default feeds it: no piece holds a capital.
    assert not any(p != p.lower() for p in pieces if not p.startswith("<"))
    # Every character of the text create feeds it (marks included) is in a piece: none can become <unk>.
    config = tokenizer.SpmTrainConfig(input_files=tuple(sorted(map(str, corpus.glob("*.txt")))), model_prefix="x",
                                      keep_accents=True)
    fed = set("".join(sp.normalize(line) for line in tokenizer.training_lines(config))) - {" ", "\u2581"}
    assert fed <= set("".join(pieces)) and {"\u0e48", "\u094d", "\u0bcd", "\u064e"} <= fed


def test_spm_train_reads_compressed_files_as_create_does_and_refuses_binary_ones(corpus, tmp_path):
    import gzip
    plain = corpus / "th.txt"
    packed = tmp_path / "th.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    config = tokenizer.SpmTrainConfig(input_files=(str(plain),), model_prefix=str(tmp_path / "m"))
    as_gzip = tokenizer.SpmTrainConfig(input_files=(str(packed),), model_prefix=str(tmp_path / "m"))
    assert list(tokenizer.training_lines(as_gzip)) == list(tokenizer.training_lines(config))
    assert len(list(tokenizer.training_lines(config))) == 4
    binary = tmp_path / "image.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)))
    with pytest.raises(tokenizer.SpmTrainError, match=rf"^{binary}:\d+: a NUL byte: .*take it out of --input$"):
        tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(input_files=(str(binary),),
                                                               model_prefix=str(tmp_path / "b"), vocab_size=100))
    assert not list(tmp_path.glob("b*"))


def beam_and_local_runs(model, corpus, save_dir, beam_args):
    """create --keep_accents on `corpus` by the local runner and by Beam with `beam_args`, into save_dir/local and
    save_dir/beam; returns both dirs."""
    dirs = []
    for name, args in (("local", None), ("beam", beam_args)):
        config = CreateConfig(input_glob=str(corpus / "*.txt"), sp_path=model, save_dir=str(save_dir / name),
                              keep_accents=True, **{**SMALL, "num_passes": 2}).validate()
        create_records(config, num_workers=1, beam_args=args)
        dirs.append(save_dir / name)
    return dirs


def assert_keep_accents_reached_the_records(local_dir, beam_dir):
    from test_golden import assert_same_records
    assert_same_records(local_dir, beam_dir)
    assert json.loads((beam_dir / "corpus_info.json").read_text())["keep_accents"] is True
    for path in (beam_dir / "tfrecords").glob("record_info-*.json"):
        assert json.loads(path.read_text())["create_settings"]["keep_accents"] is True


def test_beam_runner_keeps_the_accents(accents_model, tmp_path):
    pytest.importorskip("apache_beam")
    from test_beam import IN_PROCESS_RUNNER
    corpus = _write(tmp_path / "corpus", ["th", "vi"])
    local_dir, beam_dir = beam_and_local_runs(accents_model, corpus, tmp_path, [f"--runner={IN_PROCESS_RUNNER}"])
    assert_keep_accents_reached_the_records(local_dir, beam_dir)
    # The records hold the Thai tone mark, which they would not without --keep_accents.
    sp = spm.SentencePieceProcessor(model_file=accents_model)
    assert "\u0e48" in sp.decode(_memory_stream(beam_dir).tolist())


@pytest.mark.slow
def test_dump_stats_show_the_setting_and_the_unk_share_per_file(kept):
    save_dir, _ = kept
    result = run_module("xlnet_data.dump", str(save_dir), "--stats", "--format=json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["keep_accents"] is True
    [(path, counts)] = stats["unk_per_file"].items()
    assert path.endswith(".tfrecords") and counts["unk"] == 0 and counts["pieces"] > 100
    text = run_module("xlnet_data.dump", str(save_dir), "--stats")
    assert "keep_accents True (corpus_info.json)" in text.stdout and "<unk> in input            0 of" in text.stdout


def test_the_demo_keeps_the_accents_of_its_spanish_sample():
    """bin/demo trains and creates with the same --keep_accents (else create now refuses), and with it: the Spanish
    of sample_corpus/ keeps its ñ (the original's accent removal made `señor` `senor`)."""
    from conftest import ROOT
    demo = (ROOT / "bin" / "demo").read_text()
    commands = [command for command in demo.replace("\\\n", " ").splitlines()
                if "xlnet_data.spm_train" in command or "xlnet_data.create" in command]
    assert len(commands) == 2 and all("--keep_accents" in command.split() for command in commands), commands
    spanish = (ROOT / "sample_corpus" / "reina_valera_1909_marcos_santiago.txt").read_text(encoding="utf-8")
    line = next(line for line in spanish.splitlines() if "señor" in line.lower())
    assert "señor" in preprocess_texts([line], True, True)[0].lower()
    assert "señor" not in preprocess_texts([line], True, False)[0].lower()  # without the flag, the demo showed senor
