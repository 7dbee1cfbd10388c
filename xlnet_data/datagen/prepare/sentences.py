"""A document (its paragraphs) → its block of create's input format.

Whitespace inside a paragraph (newlines within it, tabs, runs of spaces, Unicode spaces) becomes one
space, and the other control characters (NUL, escape, C1 controls...; what create would take for a
binary file) are dropped, in every input format. Each paragraph is split into sentences by sentencex
(Wikimedia's rule-based segmenter: about 300 languages, with their abbreviations and sentence marks —
。！？ । ॥ ؟ ։ ...; chosen by measurement, see BENCHMARKS.md "prepare"). sentencex never splits inside
a quotation, so a quoted speech of many sentences (most paragraphs of a novel) would be one line; the
inside of each quotation that holds a sentence mark before its end is therefore split by sentencex on
its own, and cut there too (the closing mark stays with the last sentence).

sentencex's time grows with the square of the text it is given (CJK text most: 1,000 characters of
Chinese at 0.5 µs a character, 64,000 at 12 µs), and a signal waits for it, so a long paragraph is
given to it in windows of PIECE characters (_cuts): time stays linear and a signal is answered
between two windows.

One sentence per line; `<eop>` glued to the last sentence of every paragraph but the document's last
(whose end the blank line after the document marks), as the original README's example; a blank line
ends the document."""

import dataclasses
import re

try:
    import sentencex
except ImportError:  # an extra: prepare stops with one line saying how to install it (require_splitter)
    sentencex = None

from xlnet_data.datagen.prepare import languages
from xlnet_data.datagen.prepare.config import PrepareError

EOP = "<eop>"
# Quotations whose inside is split on its own: straight and curly double quotes, guillemets, „German“,
# 「CJK」 brackets. Single quotes are left out: ' and ’ are apostrophes too.
_QUOTATION = re.compile('"[^"]+"|“[^“”]+”|«[^«»]+»|„[^„“”]+[“”]|「[^「」]+」|『[^『』]+』')
# Marks that may end a sentence inside a quotation (a cheap test before splitting its inside).
_SENTENCE_MARK = re.compile("[.!?…。！？।॥؟۔։;;]")
# Control characters that are not whitespace (str.split() takes \t \n \v \f \r \x1c-\x1f \x85 for spaces).
_CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
# A paragraph longer than PIECE characters goes to sentencex a window of PIECE at a time; a sentence end
# found in the last MARGIN characters of a window is decided again with the next window's text after it.
PIECE = 2048
MARGIN = 256
_OPENING = re.compile("[“«「『„]")
_CLOSING = re.compile("[”»」』]")


@dataclasses.dataclass(frozen=True)
class Block:
    """A document in the input format, and what it holds."""
    text: str  # sentences one per line, ending with the blank line that ends the document
    paragraphs: int
    sentences: int
    characters: int  # of the sentences, without <eop> and line ends


def require_splitter():
    if sentencex is None:
        raise PrepareError("prepare needs the sentence splitter sentencex: pip install 'xlnet-data[prepare]'")


def _quote_balance(text, start, end):
    """(straight double quotes, opening minus closing curly quotes and brackets) in text[start:end]."""
    return text.count('"', start, end), len(_OPENING.findall(text, start, end)) - len(_CLOSING.findall(text, start, end))


def _cuts(language, text):
    """The offsets in `text` where sentencex ends a sentence (0 < offset < len(text)), in bounded time per
    character: a text longer than PIECE is given in windows; of each window's segments, those that end
    before its last MARGIN characters are kept (sentencex's rules look a few characters ahead), up to
    the last end outside a quotation where there is one (sentencex keeps a quotation whole), and the
    next window starts after them; a window that starts inside a quotation is given its opening mark
    (else its closing one would pair wrongly). Where no sentence ends early enough in a window (a
    sentence longer than it, or Thai, which has no marks), the next window starts at the window's last
    space, which is not taken for a sentence end."""
    if len(text) <= PIECE:
        return _ends(sentencex.segment(language, text), 0)
    cuts, start, balance = [], 0, (0, 0)  # balance: _quote_balance of text[:start]
    while len(text) - start > PIECE:
        # A window that starts inside a quotation gets its opening mark, as the whole text has it before
        prefix = ('"' if balance[0] % 2 else "") + ("“" if balance[1] > 0 else "")
        window = sentencex.segment(language, prefix + text[start:start + PIECE - len(prefix)])
        while prefix:
            cut = min(len(prefix), len(window[0]))
            window[0], prefix = window[0][cut:], prefix[cut:]
            if not window[0]:
                window.pop(0)
        ends, balances = [0], [balance]  # after each segment kept so far
        for segment in window:
            if ends[-1] + len(segment) > PIECE - MARGIN:
                break
            straight, depth = _quote_balance(text, start + ends[-1], start + ends[-1] + len(segment))
            ends.append(ends[-1] + len(segment))
            balances.append((balances[-1][0] + straight, balances[-1][1] + depth))
        outside = [k for k in range(1, len(ends)) if balances[k][0] % 2 == 0 and balances[k][1] <= 0]
        kept = outside[-1] if outside else len(ends) - 1
        if kept:
            cuts.extend(start + end for end in ends[1:kept + 1])
            end, balance = ends[kept], balances[kept]
        else:
            end = text.rfind(" ", start + MARGIN, start + PIECE - MARGIN) + 1 - start
            end = end if end > 0 else PIECE - MARGIN
            straight, depth = _quote_balance(text, start, start + end)
            balance = (balance[0] + straight, balance[1] + depth)
        start += end
    return cuts + _ends(sentencex.segment(language, text[start:]), start)


def _ends(segments, offset):
    """The ends of all segments but the last, as offsets (segments of a text starting at `offset`)."""
    ends, position = [], offset
    for segment in segments[:-1]:
        position += len(segment)
        ends.append(position)
    return ends


def split_sentences(paragraph, language):
    """The sentences of one paragraph, whitespace normalised; [] for a blank paragraph."""
    text = " ".join(_CONTROL.sub("", paragraph).split())
    if not text:
        return []
    cuts = set(_cuts(language, text))
    for quotation in _QUOTATION.finditer(text):
        inside = quotation.group()[1:-1]
        if _SENTENCE_MARK.search(inside, 0, len(inside) - 1):
            cuts.update(quotation.start() + 1 + end for end in _cuts(language, inside))
    bounds = [0, *languages.refine(language, text, cuts), len(text)]
    return [s for s in (text[start:end].strip() for start, end in zip(bounds, bounds[1:])) if s]


def format_document(paragraphs, language):
    """The Block of a document given as its paragraphs (strings), or None when it has no text."""
    lines = []
    num_paragraphs = characters = 0
    for paragraph in paragraphs:
        sentences = split_sentences(paragraph, language)
        if not sentences:
            continue
        if lines:
            lines[-1] += EOP  # the previous paragraph ends here
        lines.extend(sentences)
        num_paragraphs += 1
        characters += sum(map(len, sentences))
    if not lines:
        return None
    return Block("\n".join(lines) + "\n\n", num_paragraphs, len(lines), characters)
