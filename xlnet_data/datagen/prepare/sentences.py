"""A document (its paragraphs) → its block of create's input format.

Whitespace inside a paragraph (newlines within it, tabs, runs of spaces, Unicode spaces) becomes one
space; each paragraph is split into sentences by sentencex (Wikimedia's rule-based segmenter: about
300 languages, with their abbreviations and sentence marks — 。！？ । ॥ ؟ ։ ...; chosen by measurement,
see BENCHMARKS.md "prepare"). sentencex never splits inside a quotation, so a quoted speech of many
sentences (most paragraphs of a novel) would be one line; the inside of each quotation that holds a
sentence mark before its end is therefore split by sentencex on its own, and cut there too (the
closing mark stays with the last sentence). One sentence per line; `<eop>` glued to the last sentence of every
paragraph but the document's last (whose end the blank line after the document marks), as the
original README's example; a blank line ends the document.
"""

import dataclasses
import re

try:
    import sentencex
except ImportError:  # an extra: prepare stops with one line saying how to install it (require_splitter)
    sentencex = None

from xlnet_data.datagen.prepare.config import PrepareError

EOP = "<eop>"
# Quotations whose inside is split on its own: straight and curly double quotes, guillemets, „German“,
# 「CJK」 brackets. Single quotes are left out: ' and ’ are apostrophes too.
_QUOTATION = re.compile('"[^"]+"|“[^“”]+”|«[^«»]+»|„[^„“”]+[“”]|「[^「」]+」|『[^『』]+』')
# Marks that may end a sentence inside a quotation (a cheap test before splitting its inside).
_SENTENCE_MARK = re.compile("[.!?…。！？।॥؟۔։;;]")


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


def split_sentences(paragraph, language):
    """The sentences of one paragraph, whitespace normalised; [] for a blank paragraph."""
    text = " ".join(paragraph.split())
    if not text:
        return []
    segments = sentencex.segment(language, text)  # their concatenation is `text`
    cuts = set()
    for quotation in _QUOTATION.finditer(text):
        inside = quotation.group()[1:-1]
        if _SENTENCE_MARK.search(inside, 0, len(inside) - 1):
            position = quotation.start() + 1
            for sentence in sentencex.segment(language, inside)[:-1]:
                position += len(sentence)
                cuts.add(position)
    if cuts:
        position = 0
        for sentence in segments[:-1]:
            position += len(sentence)
            cuts.add(position)
        bounds = [0, *sorted(cuts), len(text)]
        segments = [text[start:end] for start, end in zip(bounds, bounds[1:])]
    return [s for s in (part.strip() for part in segments) if s]


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
