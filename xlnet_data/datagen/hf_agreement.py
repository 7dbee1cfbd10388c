"""How often a Hugging Face tokenizer (the export's tokenizer.json) gives create's ids, on lines of the corpus.

create's ids are its text step and SentencePiece (text.preprocess_texts, text.Encoder); the tokenizer's are the
`tokenizers` library running tokenizer.json. A line whose two id sequences are segmentations of the same text
with the same score sum (within float32's rounding) is a tie: both are best, and SentencePiece and `tokenizers`
break ties differently (runs of one repeated character, `เธออออออออ`, `😘😘😘😘😘`), so it is counted apart.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from xlnet_data.common import fileio
from xlnet_data.datagen import corpus
from xlnet_data.datagen.text import Encoder, preprocess_texts


class Agreement(NamedTuple):
    lines: int  # lines compared
    ties: int  # lines that differ only by a float32 tie
    differing: int  # lines that differ otherwise
    example: Optional[str]  # the first differing line (not a tie)

    def describe(self) -> str:
        ties = f"; {self.ties} float32 tie(s) (two best segmentations of equal score, broken otherwise)"
        text = f"the tokenizer gives create's ids on {self.lines - self.differing - self.ties} of {self.lines} lines"
        return text + (ties if self.ties else "") + (
            f"; {self.differing} differ, e.g. {self.example!r}" if self.differing else "")


def corpus_lines(input_glob: str, max_lines: int) -> list[str]:
    """Up to max_lines non-blank lines of the corpus (the first of each file, shared out between the files), as
    create reads them; [] when the files are no longer there."""
    paths = sorted({path for pattern in input_glob.split(",") if pattern for path in fileio.glob(pattern)})
    lines = []
    for index, path in enumerate(paths):
        want, taken = (max_lines - len(lines)) // (len(paths) - index), []
        for block in corpus.line_blocks(path):
            if len(taken) >= want:
                break
            taken += [line for line in block if line.strip()]
        lines += taken[:want]
    return lines[:max_lines]


def _is_tie(sp, scores, ids, expected) -> bool:
    """Two segmentations of the same text whose scores are equal within float32's rounding of their sums (in
    which SentencePiece adds them), e.g. 😘😘 + 😘😘😘 and 😘😘😘 + 😘😘."""
    if "".join(map(sp.IdToPiece, ids)) != "".join(map(sp.IdToPiece, expected)):
        return False
    a, b = scores[list(ids)].astype(np.float64), scores[list(expected)].astype(np.float64)
    bound = np.finfo(np.float32).eps * max(len(a), len(b)) * max(np.abs(a).sum(), np.abs(b).sum())
    return abs(a.sum() - b.sum()) <= bound


def measure(sp, tokenizer_json: str, lines: list[str], uncased: bool, keep_accents: bool) -> Optional[Agreement]:
    """The agreement of the tokenizer (tokenizer.json's text) with create's ids on `lines`; None without the
    `tokenizers` package."""
    try:
        import tokenizers
    except ImportError:
        return None
    texts = [line.strip() for line in lines]
    flat, lengths = Encoder(sp, num_threads=1).encode_batch(preprocess_texts(texts, uncased, keep_accents))
    want = np.split(flat, np.cumsum(lengths)[:-1]) if len(texts) else []
    tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
    got = [encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
    scores = np.array([sp.GetScore(i) for i in range(sp.GetPieceSize())], dtype=np.float32)
    ties, differing, example = 0, 0, None
    for text, ids, expected in zip(texts, got, want):
        if list(ids) == expected.tolist():
            continue
        if _is_tie(sp, scores, ids, expected.tolist()):
            ties += 1
        else:
            differing += 1
            example = example or text
    return Agreement(len(texts), ties, differing, example)
