"""Many lines as one UTF-8 buffer: what create's text step hands the encoder, without a str a line between them."""

import dataclasses

import numpy as np

from xlnet_data.common import compiled


@dataclasses.dataclass(frozen=True)
class Utf8Lines:
    """Lines as UTF-8 bytes, each ended by "\\n" (`data`, uint8), and where each starts (`line_starts`:
    len(lines) + 1 offsets, the last one data.size). Lone surrogates pass as they are ("surrogatepass")."""
    data: np.ndarray
    line_starts: np.ndarray

    @classmethod
    def split(cls, data: np.ndarray) -> "Utf8Lines":
        """The lines of `data`, UTF-8 whose every line is ended by "\\n"."""
        return cls(data, np.concatenate(([0], np.flatnonzero(data == 10) + 1)).astype(np.int64))

    @classmethod
    def of(cls, texts) -> "Utf8Lines":
        """The lines of `texts` (str; a "\\n" inside one stays in its line)."""
        data = np.frombuffer("\n".join([*texts, ""]).encode("utf-8", "surrogatepass") if texts else b"",
                             dtype=np.uint8)  # [*texts, ""]: the last line break without a copy of the whole
        lines = cls.split(data)
        if len(lines) == len(texts):
            return lines
        ends = np.cumsum([len(text.encode("utf-8", "surrogatepass")) + 1 for text in texts], dtype=np.int64)
        return cls(data, np.concatenate(([0], ends)))

    @classmethod
    def checked(cls, data: np.ndarray):
        """(the lines, their number of characters) of `data`, bytes whose every line is ended by "\\n", when
        they are valid UTF-8 as Python's strict decoder has it; None otherwise. One compiled pass: create
        read a block by decoding it to a str, then looking for its line breaks (decode, copy and search took
        25 ns a token of Chinese, more than our encoder)."""
        line_starts, chars = _check_utf8(data, np.count_nonzero(data == 10))
        return None if chars < 0 else (cls(data, line_starts), chars)

    def __len__(self):
        return self.line_starts.size - 1

    def line(self, i) -> str:
        return self.data[self.line_starts[i]:self.line_starts[i + 1] - 1].tobytes().decode("utf-8", "surrogatepass")

    def texts(self, count=None) -> list:
        """The lines as str (the first `count` of them, where given)."""
        count = len(self) if count is None else min(count, len(self))
        if count < len(self):
            return [self.line(i) for i in range(count)]
        if not count:
            return []
        texts = self.data[:-1].tobytes().decode("utf-8", "surrogatepass").split("\n")
        return texts if len(texts) == len(self) else [self.line(i) for i in range(len(self))]


@compiled.jit(inline="always")
def code_point_2(lead, second):
    """The code point of a sequence of two UTF-8 bytes (not checked)."""
    return ((np.int64(lead) & 0x1F) << 6) | (np.int64(second) & 0x3F)


@compiled.jit(inline="always")
def code_point_3(lead, second, third):
    """The code point of a sequence of three UTF-8 bytes (not checked)."""
    return ((np.int64(lead) & 0x0F) << 12) | ((np.int64(second) & 0x3F) << 6) | (np.int64(third) & 0x3F)


@compiled.jit()
def _check_utf8(data, line_breaks):
    """(line starts, characters) of `data`, which has `line_breaks` "\\n"s; characters -1 at the first sequence
    that is not UTF-8 (an overlong form, a surrogate, past U+10FFFF, cut short, a stray continuation byte)."""
    size = np.uint64(data.shape[0])
    starts = np.empty(line_breaks + 1, dtype=np.int64)  # allocated once: an array that may be replaced inside
    # the loop makes numba count its references at every turn (13 ns a byte)
    starts[0], count, chars, pos = 0, 1, 0, np.uint64(0)
    while pos < size:
        lead = data[pos]
        if lead < 0x80:
            chars += 1
            pos += np.uint64(1)
            if lead == 10:
                starts[count] = pos
                count += 1
            continue
        # A run of the commonest characters of three bytes (U+1000 to U+FFFF but for the surrogates: CJK,
        # Thai, Hindi...) in a loop of its own (Chinese twice as fast).
        while 0xE1 <= lead <= 0xEF and lead != 0xED and pos + np.uint64(3) <= size and (
                (data[pos + np.uint64(1)] & 0xC0) | ((data[pos + np.uint64(2)] & 0xC0) >> 2)) == 0xA0:
            chars += 1
            pos += np.uint64(3)
            lead = data[pos] if pos < size else 0
        if lead < 0x80:
            continue
        # Python's UTF-8 (RFC 3629): the second byte's range by the lead byte leaves out overlong forms,
        # surrogates and code points past U+10FFFF; every later byte is 80-BF.
        if 0xC2 <= lead < 0xE0:
            length, low, high = 2, 0x80, 0xBF
        elif 0xE0 <= lead < 0xF0:
            length = 3
            low, high = (0xA0, 0xBF) if lead == 0xE0 else (0x80, 0x9F) if lead == 0xED else (0x80, 0xBF)
        elif 0xF0 <= lead < 0xF5:
            length = 4
            low, high = (0x90, 0xBF) if lead == 0xF0 else (0x80, 0x8F) if lead == 0xF4 else (0x80, 0xBF)
        else:
            return starts[:count], -1
        if pos + np.uint64(length) > size or not low <= data[pos + np.uint64(1)] <= high:
            return starts[:count], -1
        for k in range(2, length):
            if data[pos + np.uint64(k)] & 0xC0 != 0x80:
                return starts[:count], -1
        chars += 1
        pos += np.uint64(length)
    return starts[:count], chars
