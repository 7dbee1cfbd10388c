"""Training a SentencePiece model with XLNet's special symbols, and checking their ids.

train_sentencepiece(SpmTrainConfig(...)) runs the original README's recipe (`--vocab_size=32000
--character_coverage=0.99995 --model_type=unigram --control_symbols=<cls>,<sep>,<pad>,<mask>,<eod>
--user_defined_symbols=<eop>,.,(,),",-,–,£,€ --shuffle_input_sentence --input_sentence_size=10000000`)
and verify_model checks <unk>=0 <s>=1 </s>=2 <cls>=3 <sep>=4 <pad>=5 <mask>=6 <eod>=7 <eop>=8, and that
`<eop>` glued to the end of a sentence comes out as its own id 8. The command is xlnet_data/spm_train.py.

The model is trained on the text as create feeds it: each file read as create reads it (decompressed, a
binary file refused), its lines stripped and normalised by create's own preprocess_texts with the same
`uncased` and `keep_accents`; so no piece is learnt that create cannot produce. How, and the share of
<unk> on that text, go into `<model_prefix>.text.json` beside the model (model_text_settings reads it).
"""

import contextlib
import dataclasses
import glob
import json
import logging
import os
import re
import signal
from typing import Optional

import numpy as np
import sentencepiece as spm

from xlnet_data.common import fileio, workers
from xlnet_data.common.config_types import check_field_types
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import spm_model, vocab
from xlnet_data.datagen import corpus, spm_log
from xlnet_data.datagen.text import Encoder, preprocess_texts

log = logging.getLogger("xlnet_data")

# The original README's spm_train symbols. Control symbols take ids 3..7 after
# <unk>, <s>, </s>; user-defined ones follow, so <eop> gets 8.
CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
USER_DEFINED_SYMBOLS = ("<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")
# `word` is left out: a word model keeps `<eop>` glued to the word before it
# (`end.<eop>` is one piece), so the paragraph ends in XLNet's input would be lost.
MODEL_TYPES = ("unigram", "bpe", "char")

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class SpmTrainError(UserError, ValueError):
    """Training could not start or finish, or the model is not XLNet-compatible."""


@dataclasses.dataclass(frozen=True)
class SpmTrainConfig:
    """What to train; the defaults are the original README's recipe."""

    input_files: tuple[str, ...]
    model_prefix: str
    vocab_size: int = 32000
    model_type: str = "unigram"
    character_coverage: float = 0.99995
    input_sentence_size: int = 10_000_000
    shuffle_input_sentence: bool = True
    hard_vocab_limit: bool = True
    num_threads: int = 16
    verbose: bool = False
    uncased: bool = True  # create's default (the original data_utils.py's), so that the two agree by default
    keep_accents: bool = False  # create's default: the original's accent removal

    def __post_init__(self):
        if isinstance(self.input_files, (str, os.PathLike)):  # one file
            object.__setattr__(self, "input_files", (self.input_files,))
        check_field_types(self)


def expand_inputs(spec):
    """Files named by a comma-separated list of paths and globs, in the order given, each once."""
    files = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if glob.has_magic(part):
            matched = sorted(p for p in glob.glob(part) if os.path.isfile(p))
            if not matched:
                raise SpmTrainError(f"--input: no file matches {part}")
        elif os.path.isdir(part):
            raise SpmTrainError(f"--input: {part} is a directory; name its files, e.g. {os.path.join(part, '*.txt')}")
        elif os.path.isfile(part):
            matched = [part]
        else:
            raise SpmTrainError(f"--input: no such file: {part}")
        files.extend(p for p in matched if p not in files)
    if not files:
        raise SpmTrainError("--input is required: text files, one sentence per line (comma-separated paths or globs)")
    return tuple(files)


def _input_error(err):
    """create's InputError about an input file, told as spm_train's (it has no --allow_binary)."""
    text = str(err).replace("take it out of --input_glob, or pass --allow_binary to read it anyway",
                            "take it out of --input")
    return SpmTrainError(text)


def _validate(config):
    if not config.input_files:
        raise SpmTrainError("no input files")
    for path in config.input_files:
        if not os.path.isfile(path):
            raise SpmTrainError(f"no such input file: {path}")
        if not os.access(path, os.R_OK):
            raise SpmTrainError(f"{path}: Permission denied (an input file)")
        try:
            corpus.check_first_block(path)  # a binary or damaged file, as create refuses it
        except corpus.InputError as err:
            raise _input_error(err) from None
    if config.model_type not in MODEL_TYPES:
        why = (" (a word model keeps <eop> glued to the word before it, losing the paragraph ends)"
               if config.model_type == "word" else "")
        raise SpmTrainError(f"model_type must be one of {', '.join(MODEL_TYPES)}, not {config.model_type!r}{why}")
    least = len(vocab.SPECIAL_SYMBOLS) + len(USER_DEFINED_SYMBOLS) - 1
    if config.vocab_size <= least:
        raise SpmTrainError(f"vocab_size must be more than {least} (the special and user-defined symbols), "
                            f"not {config.vocab_size}")
    if not 0.0 < config.character_coverage <= 1.0:
        raise SpmTrainError(f"character_coverage must be in (0, 1], not {config.character_coverage}")
    if config.input_sentence_size < 0:
        raise SpmTrainError(f"input_sentence_size must be >= 0 (0: all lines), not {config.input_sentence_size}")
    if config.num_threads < 1:
        raise SpmTrainError(f"num_threads must be >= 1, not {config.num_threads}")
    if not config.model_prefix or config.model_prefix.endswith(os.sep):
        raise SpmTrainError(f"model_prefix must name a file prefix, e.g. out/sp10m.cased.v3, not {config.model_prefix!r}")


def _prepare_output_dir(model_prefix):
    out_dir = os.path.dirname(os.path.abspath(model_prefix))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise SpmTrainError(f"cannot create the directory for --model_prefix={model_prefix}: "
                            f"{err.strerror or err}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise SpmTrainError(f"cannot write the model: directory {out_dir} is not writable")


def _explain(err):
    """One line for a SentencePiece training error."""
    text = str(err)
    m = _TOO_HIGH.search(text)
    if m:
        return (f"vocab_size {m.group(1)} is too large for this corpus: SentencePiece can make at most "
                f"{m.group(2)} pieces from it; pass --vocab_size={m.group(2)} or smaller "
                "(or --nohard_vocab_limit to accept fewer pieces)")
    m = _TOO_LOW.search(text)
    if m:
        return (f"vocab_size {m.group(1)} is too small for this corpus: it needs at least {m.group(2)} pieces "
                "for its characters and the special symbols; pass a larger --vocab_size or a lower "
                "--character_coverage")
    if "!sentences_.empty()" in text:
        return "the input files contain no text to train on"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return f"SentencePiece training failed: {first}"


def verify_model(path):
    """Checks a trained model: XLNet's special ids, and `<eop>` glued to a sentence is its own piece."""
    try:
        sp = vocab.load_sentencepiece(path)  # the same check create makes
    except vocab.VocabError as err:
        raise SpmTrainError(f"the trained model fails XLNet's checks: {err}") from None
    ids = sp.encode("the end.<eop>")
    if not ids or ids[-1] != vocab.EOP_ID or ids.count(vocab.EOP_ID) != 1:
        raise SpmTrainError(f"the trained model {path} does not encode <eop> after a sentence as id "
                            f"{vocab.EOP_ID}: {sp.encode('the end.<eop>', out_type=str)}")
    return sp


OUTPUT_SUFFIXES = (".model", ".vocab")  # SentencePiece writes them in this order


def _write_failure(err, tmp_prefix, model_prefix):
    """One line naming the output file SentencePiece failed to write (it says only which line of its code
    failed), with the reason where it can be told (a full disk); None when no output was begun."""
    begun = [suffix for suffix in OUTPUT_SUFFIXES if os.path.exists(tmp_prefix + suffix)]
    if not begun:
        return None
    stats = os.statvfs(os.path.dirname(os.path.abspath(tmp_prefix)))
    reason = "No space left on device" if stats.f_bavail == 0 else f"could not be written ({_explain(err)})"
    return f"{model_prefix}{begun[-1]}: {reason}"


def training_lines(config, limit=None):
    """The lines of the input files as create feeds them to SentencePiece (see the module's docstring), at
    most `limit` of them; gzip, bzip2 and xz files decompressed; corpus.InputError for a binary file."""
    left = limit
    for path in config.input_files:
        for lines in corpus.line_blocks(path):
            texts = [text for text in (line.strip() for line in lines) if text]
            if left is not None:
                texts, left = texts[:left], left - min(left, len(texts))
            yield from preprocess_texts(texts, config.uncased, config.keep_accents) if texts else ()
            if left == 0:
                return


UNK_MEASURE_BATCH = 10_000  # lines encoded at a time to measure <unk>
# A piece seen fewer times than this in the text it was trained on is rare: its embedding learns little.
RARE_PIECE_COUNT = 5


def unk_counts(model_path, lines, num_threads):
    """(<unk> pieces, pieces, rare) of `lines` encoded by the model at `model_path` as create encodes them; rare:
    how many of the pieces that the vocabulary size decides occur fewer than RARE_PIECE_COUNT times in them. Not
    counted: the special and user-defined symbols, and the single characters, which the character-coverage rule
    keeps at any size (a Japanese text's rare kanji: counting them, advice followed never settled, 8000 -> 6000
    -> 4000 -> 2000)."""
    sp = spm.SentencePieceProcessor(model_file=model_path)
    encoder = Encoder(sp, num_threads)
    counts = np.zeros(sp.get_piece_size(), dtype=np.int64)
    batch = []
    for line in [*lines, None]:
        if line is not None:
            batch.append(line)
        if batch and (line is None or len(batch) == UNK_MEASURE_BATCH):
            ids, _ = encoder.encode_batch(batch)
            counts += np.bincount(ids, minlength=counts.size)
            batch = []
    sized = [i for i in range(counts.size) if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))
             and sp.id_to_piece(i) not in USER_DEFINED_SYMBOLS and len(sp.id_to_piece(i)) > 1]
    return int(counts[vocab.UNK_ID]), int(counts.sum()), int(np.count_nonzero(counts[sized] < RARE_PIECE_COUNT))


def _train(config, tmp_prefix):
    """Trains (in a worker process); returns (<unk> pieces, pieces) of the first input_sentence_size lines (all
    with 0) of the text it was trained on."""
    failed = []

    def lines():  # an exception in the iterator comes out of SentencePiece as "INTERNAL: ..."; kept to raise
        try:
            yield from training_lines(config)
        except corpus.InputError as err:
            failed.append(err)
            raise

    try:
        with spm_log.log_to_file(tmp_prefix + spm_log.LOG_SUFFIX):
            spm.SentencePieceTrainer.train(
                sentence_iterator=lines(),
                model_prefix=tmp_prefix,
                vocab_size=config.vocab_size,
                model_type=config.model_type,
                character_coverage=config.character_coverage,
                input_sentence_size=config.input_sentence_size,
                shuffle_input_sentence=config.shuffle_input_sentence,
                hard_vocab_limit=config.hard_vocab_limit,
                num_threads=config.num_threads,
                control_symbols=list(CONTROL_SYMBOLS),
                user_defined_symbols=list(USER_DEFINED_SYMBOLS),
                minloglevel=0,  # all of it to the log file, which spm_log filters
            )
    except (RuntimeError, OSError) as err:
        if failed:
            raise _input_error(failed[0]) from None
        raise SpmTrainError(_write_failure(err, tmp_prefix, config.model_prefix) or _explain(err)) from None
    return unk_counts(tmp_prefix + ".model", training_lines(config, config.input_sentence_size or None),
                      config.num_threads)


TEXT_SETTINGS_SUFFIX = ".text.json"


def text_settings_path(model_path):
    """Where spm_train records how the text of the model at `model_path` was normalised: PREFIX.text.json."""
    prefix = model_path[:-len(".model")] if model_path.endswith(".model") else model_path
    return prefix + TEXT_SETTINGS_SUFFIX


def model_text_settings(model_path) -> Optional[dict]:
    """spm_train's record beside a model ({"uncased", "keep_accents", "lines", "pieces", "unk"}), or None
    for a model without one (trained elsewhere, or before it was written) or with an unreadable one."""
    path = text_settings_path(model_path)
    try:
        if not fileio.exists(path):
            return None
        settings = json.loads(fileio.read_text(path))
    except (OSError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def text_settings_mismatch(model_path, uncased, keep_accents) -> Optional[str]:
    """One line when the model at `model_path` was trained on text normalised otherwise than create's
    `uncased` and `keep_accents` will normalise it, else None (also for a model without spm_train's record)."""
    settings = model_text_settings(model_path)
    if settings is None:
        return None
    trained = bool(settings.get("keep_accents", False))
    if trained != keep_accents:
        how = "with their accents and marks" if trained else "with accents and marks removed"
        harm = ("the letters with marks it never saw may become <unk>" if keep_accents
                else "its pieces with marks are never used")
        return (f"{model_path} was trained by spm_train --{'' if trained else 'no'}keep_accents (text {how}), and "
                f"create runs with --{'' if keep_accents else 'no'}keep_accents: {harm}; use the same setting in both")
    # A cased model under an uncased create is the original's own practice and knows the lower-case letters
    # in all but rare cases (a letter seen only as a capital): not warned about. The other way, every capital
    # is unknown to the model.
    if settings.get("uncased", True) and not uncased:
        return (f"{model_path} was trained by spm_train --uncased (lower-cased text) and create runs with "
                "--nouncased: capitals may become <unk>; use the same setting in both")
    return None


def _end_on_sigterm():
    """A training worker ends at SIGTERM itself: its parent removes the temporary files, and a Python handler
    would wait for SentencePiece's C++ training to return."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _warn_if_replacing(path, model: bytes):
    try:
        with open(path, "rb") as f:
            if f.read() == model:
                return
    except FileNotFoundError:
        return
    log.warning("%s: replaced by the model trained now (another one was there: records made with it are "
                "refused with this one; train to a new --model_prefix to keep both)", path)


def train_sentencepiece(config):
    """Trains `<model_prefix>.model` and `.vocab` as `config` says, checks it, and records how its text was
    normalised in `<model_prefix>.text.json`; returns the .model path.

    SentencePiece writes both under a temporary prefix beside them, the JSON is written there too, and the
    three are renamed when all are done: a failed or interrupted training leaves neither a half-written model
    nor its temporary files. It trains in a worker process, so that a signal (stopping.stop_on_signals) stops
    it at once: the C++ training would not let this process handle one until it is done.
    """
    _validate(config)
    _prepare_output_dir(config.model_prefix)
    tmp_prefix = fileio.temp_path_for(config.model_prefix)
    suffixes = (*OUTPUT_SUFFIXES, TEXT_SETTINGS_SUFFIX, spm_log.LOG_SUFFIX)
    done = []
    try:
        with spm_log.TrainerLog(tmp_prefix + spm_log.LOG_SUFFIX, config.vocab_size, config.verbose), \
                workers.Workers(1, initializer=_end_on_sigterm) as worker:
            worker.run(_train, [(config, tmp_prefix)], on_done=lambda index, result: done.append(result),
                       on_counts=lambda *counts: None)
        unk, pieces, rare = done[0]
        settings = {"uncased": config.uncased, "keep_accents": config.keep_accents, "pieces": pieces, "unk": unk,
                    "rare_pieces": rare, "input_files": list(config.input_files)}
        try:  # before any rename: a full disk here leaves no model either
            with open(tmp_prefix + ".model", "rb") as f:
                model = spm_model.with_model_prefix(f.read(), config.model_prefix)
            with open(tmp_prefix + ".model", "wb") as f:
                f.write(model)
            with open(tmp_prefix + TEXT_SETTINGS_SUFFIX, "w", encoding="utf-8") as f:
                f.write(json.dumps(settings, indent=1) + "\n")
        except OSError as err:
            raise SpmTrainError(f"{config.model_prefix}: {err.strerror}") from None
        _warn_if_replacing(config.model_prefix + ".model", model)
        for suffix in suffixes:
            try:
                os.replace(tmp_prefix + suffix, config.model_prefix + suffix)
            except OSError as err:
                raise SpmTrainError(f"{config.model_prefix}{suffix}: {err.strerror}") from None
    finally:
        for suffix in suffixes:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp_prefix + suffix)
    path = config.model_prefix + ".model"
    verify_model(path)
    return path
