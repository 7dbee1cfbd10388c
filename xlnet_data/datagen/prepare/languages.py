"""What prepare knows of each language beyond sentencex's rules: the cuts sentencex makes that a reader
would not (after a title such as French `M.`, an initial, a list number, inside `O.N.U.`) are undone,
and the cuts it misses (after 。！？ before a digit, after `…` or `.)` before a capital, between Japanese
quotations 「…」「…」, Thai's spaces) are added. Each rule was written against the hand-checked cases of
tests/data/sentences.jsonl and is measured in BENCHMARKS.md "prepare".

Thai writes no sentence mark: a space ends a sentence, but spaces also stand inside one (around numbers
and Latin words, after ๆ and ฯ, between the items of a list, before a conjunction). A space is taken for
a sentence end when it stands between two Thai letters, the text after it does not begin with a
conjunction or particle that continues a sentence (และ แต่ เพราะ จึง ...), neither side is a piece of
fewer than SHORT_THAI characters (a list item), and the text before it is not a title and a name
(ดร.สมศักดิ์). pythainlp's CRF splitter was measured too (BENCHMARKS.md): a 22 MB dependency, 0.3 MB/s.
"""

import re
import unicodedata

# Abbreviations that stand before a name or a number, so that a cut after them is a mistake (those that
# often end a sentence too, as "etc.", are left to sentencex, which looks at the next word's case).
ABBREVIATIONS = {
    "en": {"approx.", "appt.", "dept.", "est.", "ft.", "gov.", "lt.", "sgt.", "col.", "gen.", "rev.", "hon."},
    "fr": {"M.", "MM.", "Mme.", "Mlle.", "Me.", "Mgr.", "Dr.", "Pr.", "St.", "Ste.", "chap.", "env.", "p.", "pp.",
           "vol.", "art.", "cf.", "Cf.", "éd.", "av.", "bd.", "fig.", "n.", "tél."},
    "de": {"Nr.", "Jh.", "Kap.", "S.", "Abs.", "Art.", "Hr.", "Fr.", "Frl.", "Prof.", "Dr.", "Str.", "ca.", "bzw.",
           "vgl.", "Vgl.", "z.", "d.", "u.", "St.", "Mo.", "Di.", "Mi.", "Do.", "Sa.", "So.", "Bd.", "Tel."},
    "es": {"aprox.", "Sr.", "Sra.", "Srta.", "Dr.", "Dra.", "Ud.", "Uds.", "pág.", "págs.", "núm.", "Avda.", "Av.",
           "Univ.", "Sto.", "Sta.", "Lic.", "Ing.", "Prof.", "tel."},
    "hi": {"डॉ.", "प्रो.", "श्री.", "कि.", "मी.", "रु.", "ई.", "पू.", "सं.", "जि."},
    "vi": {"TP.", "Tp.", "GS.", "PGS.", "TS.", "ThS.", "BS.", "KS.", "CN.", "Q.", "P."},
    "th": {"ดร.", "ศ.", "รศ.", "ผศ.", "อ.", "พล.อ."},
}
# German: a number with a full stop after an article or a preposition is an ordinal ("im 19. Jh.").
_GERMAN_ORDINAL = re.compile(r"(?:^|\s)(?:der|die|das|den|dem|des|am|im|zum|zur|vom|beim|ab|bis|seit|dem|ein|eine|"
                             r"einem|einen|eines|jeden|jedem)\s+\d{1,4}\.$", re.IGNORECASE)
# A list number: "1." alone, or after a colon or a sentence end.
_LIST_NUMBER = re.compile(r"(?:^|(?<=[:：。！？.!?]))\s*(\d{1,2}\.)$")
_CJK_END = re.compile(r"[。！？][。！？!?]*(?=[^\s。！？!?」』”’）)〕】》\"'])")
_ELLIPSIS_END = re.compile(r"(?:…|[.!?]\))(?= \(?[A-ZÀ-ÖØ-ÞА-ЯΑ-Ω])")
_DASH_LOWER = re.compile(r"[—–]\s*[^\W\d_]")
_JA_QUOTE_PARTICLE = re.compile("^(?:と|って|という|とか)")
# Back-to-back quotations, 「…」「…」: dialogue of two speakers (or two utterances) on one line of a novel.
_JA_QUOTES_BACK_TO_BACK = re.compile("[」』](?=[ \u3000]*[「『])")
CONTEXT = 32  # characters on each side of a cut that the rules look at

# Thai
_THAI_SPACE = re.compile("(?<=[\u0e01-\u0e2e\u0e30-\u0e3a\u0e40-\u0e45\u0e47-\u0e4e]) (?=[\u0e01-\u0e2e\u0e40-\u0e44])")
_THAI_CONTINUING = ("และ", "แต่", "เพราะ", "จึง", "หรือ", "ซึ่ง", "ที่", "ก็", "แล้ว", "โดย", "เพื่อ", "ถ้า", "หาก", "ว่า",
                    "ของ", "ให้", "กับ", "จาก", "เช่น", "จน", "เนื่องจาก", "ดังนั้น", "ส่วน", "นะ", "ครับ", "ค่ะ", "คะ", "ด้วย")
_THAI_TITLE = re.compile(r"^(?:ดร\.|นาย|นางสาว|นาง|ศ\.|รศ\.|ผศ\.|พล\.อ\.)\S{0,20}$")
SHORT_THAI = 6


def refine(language, text, cuts):
    """The sorted cut positions of `text` after the language's rules; `cuts` are sentencex's."""
    language = language.lower().split("-")[0].split("_")[0]
    cuts = set(cuts)
    if language in ("zh", "ja"):
        cuts.update(match.end() for match in _CJK_END.finditer(text))
    if language == "ja":
        cuts.update(match.end() for match in _JA_QUOTES_BACK_TO_BACK.finditer(text))
    if "…" in text or ")" in text:  # (the search is slow; these tests are not)
        cuts.update(match.end() + 1 for match in _ELLIPSIS_END.finditer(text))
    if language == "th":
        cuts.update(_thai_cuts(text))
    kept, start = [], 0
    for cut in sorted(cuts):
        if not 0 < cut < len(text):
            continue
        # the text since the previous cut (its last CONTEXT characters; "x" stands for what is left out)
        before = ("x" if cut - CONTEXT > start else "") + text[max(start, cut - CONTEXT):cut]
        start = cut
        after = text[cut:cut + CONTEXT]
        stripped = before.rstrip()
        label = _LIST_NUMBER.search(stripped) if stripped[-2:-1].isdigit() and stripped[-1] == "." else None
        prefix = stripped[:label.start(1)].rstrip() if label else ""
        if label and prefix and prefix[-1] in ".!?" and _undo(language, prefix, label.group(1), prefix[-1]):
            label = None  # "S. 45.", "núm. 3.": a number after an abbreviation, not a list's
        if label and prefix and prefix[-1] not in ":：":
            kept.append(cut - len(before) + label.start(1))  # the list number starts the next sentence
        elif not label and not _undo(language, stripped, after, text[cut - 1]):
            kept.append(cut)
    return sorted(set(kept))


def _undo(language, before, after, last):
    """Whether a cut between `before` (its end, right-stripped) and `after` is a mistake."""
    if last == "." and after[:1].isalnum():  # no space after the full stop: O.N.U., ดร.สมศักดิ์, 3.5
        return True
    if before[-1:] == ".":  # (tested first: most cuts of a text follow a full stop and a word, and go on here)
        token = _last_token(before)
        if token in ABBREVIATIONS.get(language, ()) or (language != "en" and _is_initial(token)):
            return True
        if language == "de" and before[-2:-1].isdigit() and _GERMAN_ORDINAL.search(before):
            return True
    if after[:1] in "—–" and _DASH_LOWER.match(after) and after[1:].lstrip()[:1].islower():
        return True  # dialogue: "—¿Quién es? —preguntó ella."
    if language == "ja" and before.endswith(("」", "』")) and _JA_QUOTE_PARTICLE.match(after):
        return True
    if language == "hi" and before.endswith(("...", "…")):
        return True  # no case to tell a new sentence by; a sentence of Hindi ends with । ? !
    return False


def _last_token(before):
    """The last word of `before`, after an apostrophe or an opening parenthesis in it (l'O. → O.)."""
    token = before.rsplit(None, 1)[-1]
    for mark in "'’(":
        token = token.rpartition(mark)[2]
    return token


def _is_initial(token):
    """A single capital letter (with its combining marks) and a full stop: a lower-case one is the end of a
    word after an apostrophe (Anne's., wish'd.). Not in Indic scripts, which have no capitals and where a
    word of one syllable ending a sentence (है. हूँ.) looks the same as an initial (जे.). Not asked for
    English: sentencex's English rules know initials, and "said I." ends many a sentence of a novel."""
    letter = token[:-1]
    return (len(letter) >= 1 and letter[0].isupper() and all(unicodedata.combining(c) for c in letter[1:]))


def _thai_cuts(text):
    spaces = [match.start() for match in _THAI_SPACE.finditer(text)]
    bounds = [-1, *spaces, len(text)]
    pieces = [text[start + 1:end] for start, end in zip(bounds, bounds[1:])]
    cuts = []
    for i, space in enumerate(spaces):
        before, after = pieces[i], pieces[i + 1]
        if after.startswith(_THAI_CONTINUING) or min(len(before), len(after)) < SHORT_THAI:
            continue
        if _THAI_TITLE.match(before):
            continue
        cuts.append(space + 1)
    return cuts
