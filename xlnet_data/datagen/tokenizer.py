"""Training a SentencePiece model with XLNet's special symbols, and checking their ids.

train_sentencepiece(SpmTrainConfig(...)) runs the original README's recipe (`--vocab_size=32000
--character_coverage=0.99995 --model_type=unigram --control_symbols=<cls>,<sep>,<pad>,<mask>,<eod>
--user_defined_symbols=<eop>,.,(,),",-,–,£,€ --shuffle_input_sentence --input_sentence_size=10000000`)
and verify_model checks <unk>=0 <s>=1 </s>=2 <cls>=3 <sep>=4 <pad>=5 <mask>=6 <eod>=7 <eop>=8, and that
`<eop>` glued to the end of a sentence comes out as its own id 8. The command is xlnet_data/spm_train.py.
"""

import contextlib
import dataclasses
import glob
import os
import re
import signal

import sentencepiece as spm

from xlnet_data.common import fileio, vocab, workers

# The original README's spm_train symbols. Control symbols take ids 3..7 after
# <unk>, <s>, </s>; user-defined ones follow, so <eop> gets 8.
CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
USER_DEFINED_SYMBOLS = ("<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")
# `word` is left out: a word model keeps `<eop>` glued to the word before it
# (`end.<eop>` is one piece), so the paragraph ends in XLNet's input would be lost.
MODEL_TYPES = ("unigram", "bpe", "char")

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class SpmTrainError(ValueError):
    """Training could not start or finish, or the model is not XLNet-compatible."""


@dataclasses.dataclass(frozen=True)
class SpmTrainConfig:
    """What to train; the defaults are the original README's recipe."""

    input_files: tuple
    model_prefix: str
    vocab_size: int = 32000
    model_type: str = "unigram"
    character_coverage: float = 0.99995
    input_sentence_size: int = 10_000_000
    shuffle_input_sentence: bool = True
    hard_vocab_limit: bool = True
    num_threads: int = 16
    verbose: bool = False

    def __post_init__(self):
        files = self.input_files
        files = (files,) if isinstance(files, (str, os.PathLike)) else tuple(files)
        object.__setattr__(self, "input_files", tuple(os.fspath(f) for f in files))
        object.__setattr__(self, "model_prefix", os.fspath(self.model_prefix))


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


def _validate(config):
    if not config.input_files:
        raise SpmTrainError("no input files")
    for path in config.input_files:
        if not os.path.isfile(path):
            raise SpmTrainError(f"no such input file: {path}")
        if not os.access(path, os.R_OK):
            raise SpmTrainError(f"{path}: Permission denied (an input file)")
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


def _train(config, tmp_prefix):
    try:
        spm.SentencePieceTrainer.train(
            input=list(config.input_files),
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
            minloglevel=0 if config.verbose else 1,
        )
    except (RuntimeError, OSError) as err:
        raise SpmTrainError(_write_failure(err, tmp_prefix, config.model_prefix) or _explain(err)) from None


def _end_on_sigterm():
    """A training worker ends at SIGTERM itself: its parent removes the temporary files, and a Python handler
    would wait for SentencePiece's C++ training to return."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def train_sentencepiece(config):
    """Trains `<model_prefix>.model` and `.vocab` as `config` says, checks it; returns the .model path.

    SentencePiece writes both under a temporary prefix beside them, renamed when it is done: a failed
    or interrupted training leaves neither a half-written model nor its temporary files. It trains in a
    worker process, so that a signal (stopping.stop_on_signals) stops it at once: the C++ training would
    not let this process handle one until it is done.
    """
    _validate(config)
    _prepare_output_dir(config.model_prefix)
    tmp_prefix = fileio.temp_path_for(config.model_prefix)
    try:
        with workers.Workers(1, initializer=_end_on_sigterm) as worker:
            worker.run(_train, [(config, tmp_prefix)], on_done=lambda index, result: None,
                       on_counts=lambda *counts: None)
        for suffix in OUTPUT_SUFFIXES:
            try:
                os.replace(tmp_prefix + suffix, config.model_prefix + suffix)
            except OSError as err:
                raise SpmTrainError(f"{config.model_prefix}{suffix}: {err.strerror}") from None
    finally:
        for suffix in OUTPUT_SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp_prefix + suffix)
    path = config.model_prefix + ".model"
    verify_model(path)
    return path
