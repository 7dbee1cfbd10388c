"""The original's preprocess_text, compiled, over many lines of UTF-8 in one call.

Each line: whitespace collapsed (" ".join(line.split())), `` and '' to ", NFKD with the combining characters
dropped (unless keep_accents), ASCII letters lower-cased (when lower: text.preprocess_lines lower-cases the
rest with str.lower).

NFKD is each character's own decomposition, then a canonical reordering that moves only combining characters
(canonical combining class > 0): the very characters the accent removal drops. So the result is each
character's decomposition with its marks dropped, and one table over the code points, made from the installed
Python's unicodedata (the module the original calls), gives it. The dropped marks are counted as
text.StrippedMarks counts them: a run of marks is one letter that lost them, Arabic where the run's first mark
after the reordering (the first of the lowest class) is an Arabic one.
"""

import contextlib
import dataclasses
import functools
import os
import sys
import unicodedata

import numpy as np

from xlnet_data.common import compiled, fileio
from xlnet_data.datagen.utf8_lines import code_point_2, code_point_3

SPACE = 1  # str.isspace(): what str.split() collapses
CHANGED = 2  # its NFKD is not itself, or it is a mark: the table gives what it becomes
ARABIC = 4  # an Arabic mark (harakat, Quranic annotation): optional vowels, counted apart
LOWER = 8  # beyond ASCII, and str.lower changes it: its line is lower-cased by str.lower

# The Arabic marks among those the accent removal drops.
_ARABIC_MARKS = ((0x0610, 0x061A), (0x064B, 0x065F), (0x0670, 0x0670), (0x06D6, 0x06ED), (0x08D3, 0x08FF))
ROOM = 80  # bytes one character can become at most: U+FDFA's NFKD is 18 characters of 2 bytes


@dataclasses.dataclass(frozen=True)
class Tables:
    """Per code point: `flags` (SPACE, CHANGED, ARABIC, LOWER), `ccc` (the canonical combining class), and for the
    CHANGED ones their NFKD, marks included: decomposed[starts[c]:starts[c + 1]]; `growth`, the most
    times its UTF-8 a character's becomes (11: U+FDFA)."""
    flags: np.ndarray
    ccc: np.ndarray
    starts: np.ndarray
    decomposed: np.ndarray
    growth: int


@functools.cache
def tables() -> Tables:
    """The tables of the installed unicodedata: built once (0.3 s), then read from numba's cache folder."""
    path = os.path.join(compiled.CACHE_DIR, f"preprocess_tables-unicode-{unicodedata.unidata_version}.npz")
    try:
        with np.load(path) as saved:
            return Tables(*(saved[field.name] for field in dataclasses.fields(Tables)[:-1]), int(saved["growth"]))
    except (OSError, KeyError, ValueError, EOFError):
        pass
    built = _build_tables()
    with contextlib.suppress(OSError):  # a folder we may not write: built again next time
        os.makedirs(compiled.CACHE_DIR, exist_ok=True)
        with fileio.atomic_write(path) as f:
            np.savez_compressed(f, **dataclasses.asdict(built))
    return built


def _build_tables() -> Tables:
    size = sys.maxunicode + 1
    ccc = np.fromiter((unicodedata.combining(chr(c)) for c in range(size)), dtype=np.uint8, count=size)
    flags = np.zeros(size, dtype=np.uint8)
    flags[[c for c in range(size) if chr(c).isspace()]] |= SPACE
    flags[[c for c in range(0x80, size) if chr(c).lower() != chr(c)]] |= LOWER
    for first, last in _ARABIC_MARKS:
        flags[first:last + 1] |= ARABIC
    changed = {c: unicodedata.normalize("NFKD", chr(c)) for c in range(size)
               if not unicodedata.is_normalized("NFKD", chr(c)) or ccc[c]}
    lengths = np.zeros(size, dtype=np.int32)
    for c, decomposition in changed.items():
        flags[c] |= CHANGED
        lengths[c] = len(decomposition)
    starts = np.zeros(size + 1, dtype=np.int32)
    np.cumsum(lengths, out=starts[1:])
    decomposed = np.fromiter((ord(d) for c in sorted(changed) for d in changed[c]), dtype=np.int32,
                             count=int(starts[-1]))
    growth = max(len("".join(d for d in decomposition if not ccc[ord(d)]).encode("utf-8", "surrogatepass"))
                 / len(chr(c).encode("utf-8", "surrogatepass")) for c, decomposition in changed.items())
    return Tables(flags, ccc, starts, decomposed, int(growth) + 1)


@compiled.jit(inline="always")
def _put(out, n, cp, lower):
    """UTF-8 of code point `cp` at out[n]; ASCII letters lower-cased if `lower`. The new end."""
    if cp < 0x80:
        out[n] = cp + 32 if lower and 65 <= cp <= 90 else cp
        return n + 1
    if cp < 0x800:
        out[n] = 0xC0 | (cp >> 6)
        out[n + 1] = 0x80 | (cp & 0x3F)
        return n + 2
    if cp < 0x10000:
        out[n] = 0xE0 | (cp >> 12)
        out[n + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[n + 2] = 0x80 | (cp & 0x3F)
        return n + 3
    out[n] = 0xF0 | (cp >> 18)
    out[n + 1] = 0x80 | ((cp >> 12) & 0x3F)
    out[n + 2] = 0x80 | ((cp >> 6) & 0x3F)
    out[n + 3] = 0x80 | (cp & 0x3F)
    return n + 4


@compiled.jit()
def preprocess(data, n_lines, out, flags, ccc, starts, decomposed, keep_accents, lower):
    """(n, line_starts, is_text, needs_lower, counts) for `data`: n_lines lines of valid UTF-8, each ended by
    "\\n"; out[:n] is their preprocess_text, each ended by "\\n", where line_starts says (its ASCII lower-cased
    if `lower`; needs_lower: the lines that have more for str.lower); is_text: whether a line has a character
    beyond whitespace; counts: [letters that lost marks, Arabic]. n is -1 where `out` is too small:
    a character may become Tables.growth times its bytes.

    Three steps in turn for each character: whitespace collapsing passes on one or two (a space before it),
    the quote step one or two (a held ` or ' and it) or a '"', and NFKD writes what they become."""
    line_starts = np.zeros(n_lines + 1, dtype=np.int64)
    is_text = np.zeros(n_lines, dtype=np.bool_)
    needs_lower = np.zeros(n_lines, dtype=np.bool_)
    counts = np.zeros(2, dtype=np.int64)
    plain_ascii = np.zeros(256, dtype=np.uint8)  # what a byte that needs no step becomes, else 0
    for b in range(33, 128):
        if b != 39 and b != 96:
            plain_ascii[b] = b + 32 if lower and 65 <= b <= 90 else b
    collapsed, quoted = np.empty(2, dtype=np.int64), np.empty(2, dtype=np.int64)
    n = line = 0
    space = False  # whitespace seen since this line's last character
    started = False  # this line has a character
    held = 0  # a ` or ' not passed on yet: "``" and "''" become '"'
    run_ccc = run_cp = 0  # the open run of dropped marks: its lowest class, and the first mark of that class
    pos = 0
    while pos < data.size:
        lead = data[pos]
        if plain_ascii[lead] and not held and not run_ccc:  # a run of ASCII that needs no step
            if space and started:
                out[n] = 32
                n += 1
            space, started = False, True
            p, q, size = np.uint64(pos), np.uint64(n), np.uint64(data.size)
            while p < size and plain_ascii[data[p]]:
                out[q] = plain_ascii[data[p]]
                p += np.uint64(1)
                q += np.uint64(1)
            pos, n = np.int64(p), np.int64(q)
            continue
        if lead < 0x80:
            cp, length = np.int64(lead), 1
        elif lead < 0xE0:
            cp, length = code_point_2(lead, data[pos + 1]), 2
        elif lead < 0xF0:
            cp = code_point_3(lead, data[pos + 1], data[pos + 2])
            length = 3
        else:
            cp = np.int64(((lead & 0x07) << 18) | ((data[pos + 1] & 0x3F) << 12) | ((data[pos + 2] & 0x3F) << 6)
                          | (data[pos + 3] & 0x3F))
            length = 4
        pos += length
        if not (held or flags[cp]) and cp != 96 and cp != 39:  # most characters ("\\n" is a SPACE): as they are
            if run_ccc:  # a starter closes the run of dropped marks before it: counted (Arabic or not)
                counts[(flags[run_cp] & ARABIC) >> 2] += 1
                run_ccc = 0
            if space and started:
                out[n] = 32
                n += 1
            n = _put(out, n, cp, lower)
            space, started = False, True
            if length == 3:  # a run of such (CJK, Thai), with unsigned indices (numba fixes up a negative signed
                # one at every access)
                p, q, size = np.uint64(pos), np.uint64(n), np.uint64(data.size)
                while p + np.uint64(2) < size:
                    b0, b1, b2 = data[p], data[p + np.uint64(1)], data[p + np.uint64(2)]
                    if b0 >> 4 != 0xE or flags[code_point_3(b0, b1, b2)]:
                        break
                    out[q], out[q + np.uint64(1)], out[q + np.uint64(2)] = b0, b1, b2
                    p += np.uint64(3)
                    q += np.uint64(3)
                pos, n = np.int64(p), np.int64(q)
            continue
        # The characters up to here wrote no more than they took (the fast path copies); this one may.
        if out.size - n < data.size - pos + 2 * ROOM:
            return -1, line_starts, is_text, needs_lower, counts
        if cp == 10:
            is_text[line] = started
            space = started = False
            collapsed[0], n_collapsed = cp, 1
        elif flags[cp] & SPACE:
            space = True
            continue
        else:
            n_collapsed = 0
            if space and started:
                collapsed[0], n_collapsed = 32, 1
            collapsed[n_collapsed] = cp
            n_collapsed += 1
            space, started = False, True
        for i in range(n_collapsed):
            c = collapsed[i]
            n_quoted = 0
            if held and c == held:
                quoted[0], n_quoted, held = 34, 1, 0
            else:
                if held:
                    quoted[0], n_quoted, held = held, 1, 0
                if c == 96 or c == 39:
                    held = c
                else:
                    quoted[n_quoted] = c
                    n_quoted += 1
            for j in range(n_quoted):
                c = quoted[j]
                decompose = c >= 0x80 and not keep_accents and (flags[c] & CHANGED) != 0
                k, end = (starts[c], starts[c + 1]) if decompose else (-1, 0)  # k = -1: c itself
                while k < end:
                    d = decomposed[k] if k >= 0 else c
                    k += 1
                    if decompose and ccc[d]:  # a mark: dropped, and counted a run at a time
                        if not run_ccc or ccc[d] < run_ccc:
                            run_ccc, run_cp = ccc[d], d
                        continue
                    if run_ccc:
                        counts[(flags[run_cp] & ARABIC) >> 2] += 1
                        run_ccc = 0
                    if d >= 0x80 and lower and flags[d] & LOWER:
                        needs_lower[line] = True
                    n = _put(out, n, d, lower)
                if c == 10:
                    line += 1
                    line_starts[line] = n
    if run_ccc:
        counts[(flags[run_cp] & ARABIC) >> 2] += 1
    return n, line_starts, is_text, needs_lower, counts
