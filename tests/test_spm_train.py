"""xlnet_data.spm_train: a SentencePiece model with XLNet's special ids, trained on sample_corpus/."""

import glob
import os
import random
import re
import signal
import string
import subprocess
import sys
import time

import numpy as np
import pytest
import sentencepiece as spm
from conftest import ROOT

from xlnet_data.dataformat import vocab
from xlnet_data.datagen import spm_log, tokenizer
from xlnet_data.datagen.text import preprocess_texts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "sample_corpus")
CORPUS_FILES = tuple(sorted(glob.glob(os.path.join(CORPUS, "*.txt"))))


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "xlnet_data.spm_train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("spm") / "sample.v1000")
    config = tokenizer.SpmTrainConfig(input_files=CORPUS_FILES, model_prefix=prefix, vocab_size=1000,
                                      num_threads=2, uncased=False)
    return tokenizer.train_sentencepiece(config)


def test_sample_corpus_is_in_xlnet_input_format():
    assert len(CORPUS_FILES) >= 3
    total = 0
    for path in CORPUS_FILES:
        with open(path, "rb") as f:
            data = f.read()
        total += len(data)
        text = data.decode("utf-8")
        assert text.endswith("\n\n"), path  # every document, the last one too, ends with an empty line
        assert "\n\n\n" not in text and not text.startswith("\n"), path
        lines = text.split("\n")[:-1]
        assert all(line == line.strip() for line in lines), path
        # <eop> only glued to the end of a paragraph's last sentence, never alone on a line.
        assert all("<eop>" not in line[:-5] for line in lines), path
        assert "<eop>" not in lines, path
        assert any(line.endswith("<eop>") for line in lines), path
    assert 300_000 <= total <= 600_000


@pytest.mark.slow
def test_special_ids_are_xlnets(model_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    assert sp.get_piece_size() == 1000
    assert vocab.special_id_mismatches(sp) == []
    assert [sp.id_to_piece(i) for i in range(9)] == list(vocab.SPECIAL_SYMBOLS)
    assert all(sp.is_control(i) for i in range(3, 8))
    # The loader the rest of the package uses accepts it.
    assert vocab.load_sentencepiece(model_path).get_piece_size() == 1000


def test_eop_glued_to_a_sentence_is_one_piece(model_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    line = "That was the end of the paragraph.<eop>"
    ids = sp.encode(line)
    assert ids[-1] == vocab.EOP_ID == 8
    assert ids.count(vocab.EOP_ID) == 1
    assert sp.encode(line, out_type=str)[-1] == "<eop>"
    assert sp.decode(ids) == line
    # The accented (Spanish) file is covered too, as create feeds it (accents removed, by default).
    spanish = "Y hubo una voz de los cielos que decía: Tú eres mi Hijo amado."
    assert vocab.UNK_ID not in sp.encode(preprocess_texts([spanish], False)[0])
    # It was trained on that text: the accented letters, which create never feeds it, are not pieces of it.
    assert vocab.UNK_ID in sp.encode(spanish)


def test_model_with_wrong_special_ids_is_reported(tmp_path):
    prefix = str(tmp_path / "plain")
    # Plain SentencePiece defaults: no XLNet control or user-defined symbols.
    spm.SentencePieceTrainer.train(input=CORPUS_FILES[0], model_prefix=prefix, vocab_size=300,
                                   num_threads=2, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    wrong = vocab.special_id_mismatches(sp)
    assert any(w.startswith("<cls>=") for w in wrong)
    assert any(w.startswith("<eop>=") for w in wrong)
    assert not any(w.startswith("<unk>=") for w in wrong)
    with pytest.raises(tokenizer.SpmTrainError, match="special ids"):
        tokenizer.verify_model(prefix + ".model")
    with pytest.raises(vocab.VocabError, match="special ids"):
        vocab.load_sentencepiece(prefix + ".model")


@pytest.mark.slow
def test_too_large_vocab_names_the_largest_that_works(tmp_path):
    config = tokenizer.SpmTrainConfig(input_files=CORPUS_FILES[:1], model_prefix=str(tmp_path / "big"),
                                      vocab_size=32000, num_threads=2)
    with pytest.raises(tokenizer.SpmTrainError) as info:
        tokenizer.train_sentencepiece(config)
    message = str(info.value)
    assert "\n" not in message
    assert "too large for this corpus" in message and "--vocab_size=" in message
    largest = int(message.split("--vocab_size=")[1].split()[0])
    assert 17 < largest < 32000
    # --nohard_vocab_limit turns the size into a bound and trains what the corpus allows.
    soft = tokenizer.train_sentencepiece(
        tokenizer.SpmTrainConfig(input_files=CORPUS_FILES[:1], model_prefix=str(tmp_path / "soft"),
                                 vocab_size=32000, hard_vocab_limit=False, num_threads=2))
    assert spm.SentencePieceProcessor(model_file=soft).get_piece_size() == largest
    # That size fills the vocabulary with pieces the text holds fewer than 5 times: spm_train warns, with a size
    # whose pieces are not rare
    rare = tokenizer.model_text_settings(soft)["rare_pieces"]
    assert rare > 0.1 * largest
    warning = spm_log.vocabulary_warning(largest, rare, tokenizer.RARE_PIECE_COUNT)
    suggested = int(warning.split("--vocab_size=")[1].split()[0])
    assert warning.startswith(f"{100 * rare / largest:.0f}% of the {largest} pieces occur fewer than 5 times")
    assert suggested == (largest - rare) // 100 * 100 and suggested % 100 == 0
    assert spm_log.vocabulary_warning(4000, 300, 5) is None  # 7.5%: not warned
    assert "--vocab_size=4000" in spm_log.vocabulary_warning(8000, 3581, 5)  # 2 MB of Thai (docs/spm_train.md)


def test_trainer_log_passes_warnings_on_and_says_where_training_is(tmp_path):
    """SentencePiece's log, as its trainer writes it: warnings at once, and a line on the stage (the EM rounds' share
    on a log scale of pieces, seed pieces to vocab_size)."""
    import io
    log, out = tmp_path / "train.log", io.StringIO()
    lines = ["I0000 00:00:1.2 7 trainer_interface.cc:446] Loaded all 558 sentences",
             "W0000 00:00:1.3 7 trainer_interface.cc:500] Too many sentences are loaded!",
             "I0000 00:00:1.4 7 unigram_model_trainer.cc:514] Initialized 8000 seed pieces",
             "I0000 00:00:1.5 7 unigram_model_trainer.cc:903] EM sub_iter=0 size=2000 obj=12.39 num_tokens=18811"]
    with spm_log.TrainerLog(str(log), 1000, stream=out, report_every=0.0, poll_every=0.05) as watching:
        log.write_text("\n".join(lines[:2]) + "\n")
        time.sleep(0.5)
        assert watching.stage == "read 558 lines; finding the seed pieces"
        log.write_text("\n".join(lines) + "\n")
    shown = out.getvalue()
    assert shown.startswith("SentencePiece: training 1000 pieces")
    assert lines[1] in shown and lines[0] not in shown  # its INFO lines only with --verbose
    assert "SentencePiece: read 558 lines; finding the seed pieces | 0m00s" in shown
    assert watching.stage.startswith("EM rounds: 2000 pieces, to 1000 (67%, about ")  # log(8000/2000) / log(8)


@pytest.mark.parametrize("change, match", [
    ({"model_type": "word"}, "model_type"),
    ({"vocab_size": 10}, "vocab_size must be more than 17"),
    ({"character_coverage": 0.0}, "character_coverage"),
    ({"input_files": ()}, "no input files"),
    ({"input_files": ("/nonexistent/corpus.txt",)}, "no such input file"),
])
def test_bad_config_is_rejected_before_training(tmp_path, change, match):
    fields = dict(input_files=CORPUS_FILES[:1], model_prefix=str(tmp_path / "m"), vocab_size=500)
    fields.update(change)
    with pytest.raises(tokenizer.SpmTrainError, match=match):
        tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(**fields))
    assert not os.path.exists(tmp_path / "m.model")


def test_expand_inputs(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\n")
    b.write_text("two\n")
    assert tokenizer.expand_inputs(f"{b},{tmp_path}/*.txt") == (str(b), str(a))
    with pytest.raises(tokenizer.SpmTrainError, match="no file matches"):
        tokenizer.expand_inputs(f"{tmp_path}/*.md")
    with pytest.raises(tokenizer.SpmTrainError, match="is a directory"):
        tokenizer.expand_inputs(str(tmp_path))
    with pytest.raises(tokenizer.SpmTrainError, match="required"):
        tokenizer.expand_inputs(" , ")


def test_cli_no_matching_input_fails_with_one_line(tmp_path):
    result = _cli(f"--input={tmp_path}/missing-*.txt", f"--model_prefix={tmp_path}/m")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "no file matches" in lines[0] and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "m.model")


@pytest.mark.slow
def test_cli_trains_and_reports(tmp_path):
    prefix = tmp_path / "out" / "cli"
    result = _cli(f"--input={CORPUS_FILES[0]},{CORPUS_FILES[-1]}", f"--model_prefix={prefix}",
                  "--vocab_size=500", "--num_threads=2")
    assert result.returncode == 0, result.stderr
    assert "500 pieces" in result.stdout
    assert result.stderr.startswith("SentencePiece: training 500 pieces") and "LOG(INFO)" not in result.stderr
    assert vocab.special_id_mismatches(spm.SentencePieceProcessor(model_file=f"{prefix}.model")) == []


@pytest.mark.slow
def test_the_same_training_twice_writes_the_same_model_and_another_one_in_its_place_is_said(tmp_path, caplog):
    """SentencePiece records the prefix it wrote to, a temporary one: the model names its real prefix instead, so
    that its sha256 (which create, train_gpu and dump check) is the same for the same training."""
    prefix = str(tmp_path / "spm" / "m")
    same = dict(input_files=CORPUS_FILES[:2], model_prefix=prefix, num_threads=2)
    models = []
    with caplog.at_level("WARNING", logger="xlnet_data"):
        for _ in range(2):
            with open(tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(vocab_size=500, **same)), "rb") as f:
                models.append(f.read())
    assert models[0] == models[1] and b".tmp" not in models[0] and prefix.encode() in models[0]
    assert "replaced" not in caplog.text
    with caplog.at_level("WARNING", logger="xlnet_data"):
        tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(vocab_size=400, **same))
    assert f"{prefix}.model: replaced by the model trained now (another one was there" in caplog.text
    assert spm.SentencePieceProcessor(model_file=f"{prefix}.model").get_piece_size() == 400


def test_cli_help_explains_each_flag():
    result = _cli("--help")  # absl exits 1 after printing help
    assert "Traceback" not in result.stderr
    for flag in ("input", "model_prefix", "vocab_size", "model_type", "character_coverage",
                 "input_sentence_size", "shuffle_input_sentence", "hard_vocab_limit", "num_threads"):
        assert f"--{flag}:" in result.stdout or f"--[no]{flag}:" in result.stdout, flag


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_training_at_once_with_one_line_and_leaves_nothing(tmp_path, signum):
    rng = random.Random(0)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 12))) for _ in range(50000)]
    corpus = tmp_path / "words.txt"  # many distinct words: seconds of training (in C++, which ignores signals)
    corpus.write_text("".join(" ".join(rng.choice(words) for _ in range(12)) + "\n" for _ in range(20000)))
    out = tmp_path / "spm"
    env = dict(os.environ, PYTHONPATH=REPO)
    process = subprocess.Popen([sys.executable, "-m", "xlnet_data.spm_train", f"--input={corpus}",
                                f"--model_prefix={out / 'm'}", "--vocab_size=8000", "--num_threads=1", "--verbose"],
                               cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    log = []
    try:
        for line in iter(process.stderr.readline, ""):  # SentencePiece's log (--verbose), from the worker
            log.append(line)
            if "Loaded all" in line:  # the C++ training has begun; it then takes seconds more
                break
        assert process.poll() is None, "training ended before the signal: " + "".join(log)
        os.killpg(process.pid, signum)
        log.append(process.communicate(timeout=300)[1])
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
    stderr = "".join(log)
    assert "Saving model" not in stderr, "the C++ training was left to finish"
    assert process.returncode == 128 + signum
    ours = [line for line in stderr.splitlines() if line.startswith("spm_train")]
    assert ours == [f"spm_train: error: stopped by {signal.Signals(signum).name}"]
    assert stderr.strip().splitlines()[-1] == ours[0] and "Traceback" not in stderr
    assert os.listdir(out) == []  # no model, vocab or temporary file


def _japanese_like(lines, seed=0):
    """Text written for this test with a Japanese text's shape: no spaces, 2,500 kanji of Zipf frequencies (many
    seen a few times, which the character-coverage rule keeps as pieces at any vocabulary size), kana, particles."""
    rng = np.random.default_rng(seed)
    kanji = [chr(0x4E00 + i) for i in rng.choice(20000, 2500, replace=False)]
    kana = [chr(c) for c in range(0x3042, 0x3093)]
    p = 1.0 / np.arange(1, len(kanji) + 1) ** 1.1
    words = ["".join(rng.choice(kanji, size=rng.integers(1, 3), p=p / p.sum()))
             + "".join(rng.choice(kana, size=rng.integers(0, 3))) for _ in range(6000)]
    q = 1.0 / np.arange(1, len(words) + 1)
    particles = ["は", "が", "を", "に", "の", "と", "で", "も"]
    return ["".join(words[w] + particles[rng.integers(len(particles))]
                    for w in rng.choice(len(words), size=rng.integers(4, 12), p=q / q.sum())) + "。"
            for _ in range(lines)]


@pytest.mark.slow
def test_vocabulary_advice_followed_settles_on_japanese_text(tmp_path):
    """The advice counts only the pieces the vocabulary size decides: on Japanese-like text, 4000 -> about 2000
    -> no warning. Counting the rare single kanji too (which every size keeps), the 2000 model had 548 rare
    pieces of 2000 (27%): the advice ran on (8000 -> 6000 -> 4000 -> 2000 on Aozora novels, issue 43)."""
    text = tmp_path / "ja.txt"
    text.write_text("\n".join(_japanese_like(6000)) + "\n", encoding="utf-8")
    size, sizes = 4000, []
    for _ in range(3):
        sizes.append(size)
        model = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
            input_files=(str(text),), model_prefix=str(tmp_path / f"ja{size}"), vocab_size=size, keep_accents=True,
            hard_vocab_limit=False, num_threads=2))
        warning = spm_log.vocabulary_warning(size, tokenizer.model_text_settings(model)["rare_pieces"],
                                             tokenizer.RARE_PIECE_COUNT)
        if warning is None:
            break
        size = int(warning.split("--vocab_size=")[1].split()[0])
    assert warning is None and sizes == [4000, 2000], sizes
    sp = spm.SentencePieceProcessor(model_file=model)  # rare single characters are there, and not counted
    ids = sp.encode(text.read_text(encoding="utf-8").splitlines())
    counts = np.bincount([i for line in ids for i in line], minlength=sp.get_piece_size())
    rare_singles = [i for i in range(9, sp.get_piece_size()) if len(sp.id_to_piece(i)) == 1 and counts[i] < 5]
    assert len(rare_singles) > 0.1 * size


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a process allowed 2 cores or more, to pin it to one")
def test_the_default_threads_and_workers_are_the_process_cores_not_the_machines():
    """Pinned to one core (taskset, a batch scheduler's allocation), spm_train trains with one thread and prepare
    reads with one worker by default, as create does: the machine's count started as many threads as it has."""
    from xlnet_data.common import workers
    script = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); import sys; from absl import flags;"
              "from xlnet_data import spm_train; from xlnet_data.common import workers;"
              "spm_train.define_flags(); print(flags.FLAGS['num_threads'].default, workers.process_cores())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.stdout.split() == ["1", "1"], done.stderr
    assert workers.process_cores() == len(os.sched_getaffinity(0))


def _command_flags(text, module):
    """{flag: value} of the first `python -m MODULE ...` command of a shell text (README.md, bin/demo)."""
    command = next(line for line in text.replace("\\\n", " ").splitlines() if f"-m xlnet_data.{module} " in line)
    return dict(re.findall(r"--(\w+)=(\S+)", command.split("#")[0]))


@pytest.mark.slow
def test_the_readme_path_and_the_demo_train_without_a_rare_piece_warning(tmp_path):
    """A newcomer's first runs, with the project's own settings: the README's Austen path (prepare, then spm_train)
    and bin/demo's spm_train give no rare-piece warning (they did: 14% of 2000 pieces and 33% of 4000)."""
    from xlnet_data.datagen.prepare import PrepareConfig, prepare
    readme, demo = (ROOT / "README.md").read_text(), (ROOT / "bin" / "demo").read_text()
    prepared = _command_flags(readme, "prepare")
    prepare(PrepareConfig(input_glob=str(ROOT / prepared["input_glob"].strip("'")), output_dir=str(tmp_path / "austen"),
                          language=prepared["language"], num_shards=int(prepared["num_shards"]),
                          dev_fraction=float(prepared["dev_fraction"])).validate())
    runs = [(_command_flags(readme, "spm_train"), str(tmp_path / "austen" / "*.txt"), False),
            (_command_flags(demo, "spm_train"), str(ROOT / "sample_corpus" / "*.txt"), True)]
    for flags, pattern, keep_accents in runs:
        size = int(flags["vocab_size"])
        model = tokenizer.train_sentencepiece(tokenizer.SpmTrainConfig(
            input_files=tuple(sorted(glob.glob(pattern))), model_prefix=str(tmp_path / f"v{size}"), vocab_size=size,
            keep_accents=keep_accents, num_threads=2))
        rare = tokenizer.model_text_settings(model)["rare_pieces"]
        assert spm_log.vocabulary_warning(size, rare, tokenizer.RARE_PIECE_COUNT) is None, (pattern, size, rare)
