"""What spm_train shows while SentencePiece trains, which is one C++ call that takes minutes on a large corpus.

The training process writes SentencePiece's log (fd 2) to a file (log_to_file); the parent reads it back every
second (TrainerLog): warnings and errors are passed on at once (with --verbose every line), and every 15 s a
line says where training is: reading the text, the seed pieces, or the EM rounds that prune the seed pieces
down to vocab_size, with the share done (on a log scale of pieces: each round keeps shrinking_factor=0.75 of
them) and an estimate of the time left.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
import time

from xlnet_data.common.progress import format_count, format_duration

LOG_SUFFIX = ".log"  # beside the temporary model, removed with it
_MESSAGE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [^\]]+\] (.*)$")
_LOADED = re.compile(r"Loaded all (\d+) sentences")
_SEEDS = re.compile(r"Initialized (\d+) seed")
_ROUND = re.compile(r"EM sub_iter=\d+ size=(\d+)")


@contextlib.contextmanager
def log_to_file(path):
    """In the training process: fd 2 (where SentencePiece's C++ code logs) goes to `path` within the block."""
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)


class TrainerLog:
    """Reads the log file of a training in another process and reports on `stream` (see the module)."""

    def __init__(self, path, vocab_size, verbose=False, stream=sys.stderr, report_every=15.0, poll_every=1.0):
        self.path, self.vocab_size, self.verbose, self.stream = path, vocab_size, verbose, stream
        self.report_every, self.poll_every = report_every, poll_every
        self.start = self._reported = time.time()
        self.stage, self._seeds, self._rounds_began, self._offset, self._partial = "reading the text", 0, None, 0, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._write(f"SentencePiece: training {self.vocab_size} pieces (one call to its trainer: a line every "
                    f"{self.report_every:.0f} s)")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._read()

    def _watch(self):
        while not self._stop.wait(self.poll_every):
            self._read()
            if time.time() - self._reported >= self.report_every:
                self._write(f"SentencePiece: {self.stage} | {format_duration(time.time() - self.start)}")
                self._reported = time.time()

    def _read(self):
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                f.seek(self._offset)
                text = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)

    def _line(self, line):
        match = _MESSAGE.match(line)
        level, message = match.groups() if match else ("I", line)
        if self.verbose or level != "I":
            self._write(line)
        if found := _LOADED.search(message):
            self.stage = f"read {format_count(int(found[1]))} lines; finding the seed pieces"
        elif found := _SEEDS.search(message):
            self._seeds = int(found[1])
            self.stage = f"{format_count(self._seeds)} seed pieces; EM rounds to prune them to {self.vocab_size}"
        elif (found := _ROUND.search(message)) and self._seeds > self.vocab_size:
            self._rounds_began = self._rounds_began or time.time()
            size = int(found[1])
            done = min(1.0, math.log(self._seeds / max(size, 1)) / math.log(self._seeds / self.vocab_size))
            left = (time.time() - self._rounds_began) * (1 - done) / done if done > 0 else 0
            self.stage = (f"EM rounds: {size} pieces, to {self.vocab_size} ({100 * done:.0f}%, about "
                          f"{format_duration(left)} left)")
        elif "Saving model" in message:
            self.stage = "saving the model"

    def _write(self, line):
        self.stream.write(line + "\n")
        self.stream.flush()


# Above this share of rare pieces (fewer than tokenizer.RARE_PIECE_COUNT occurrences in the text), spm_train
# warns that the vocabulary is too large for its text (see docs/spm_train.md for the measurements behind it).
RARE_SHARE_WARNING = 0.10


def vocabulary_warning(pieces: int, rare: int, min_count: int) -> str | None:
    """A line when too many of the model's `pieces` are rare in the text it was trained on, with a size that
    fits the text (the pieces that are not rare, rounded down), else None."""
    if pieces <= 0 or rare <= RARE_SHARE_WARNING * pieces:
        return None
    unit = 1000 if pieces - rare >= 2000 else 100
    suggested = max(unit, (pieces - rare) // unit * unit)
    return (f"{100 * rare / pieces:.0f}% of the {pieces} pieces occur fewer than {min_count} times in the text they "
            f"were trained on: their embeddings will learn little; about --vocab_size={suggested} fits this text "
            "(or train on more text)")
