"""Many lines as one UTF-8 buffer: what create's text step hands the encoder, without a str a line between them."""

import dataclasses

import numpy as np


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
        data = np.frombuffer(("\n".join(texts) + "\n").encode("utf-8", "surrogatepass") if texts else b"",
                             dtype=np.uint8)
        lines = cls.split(data)
        if len(lines) == len(texts):
            return lines
        ends = np.cumsum([len(text.encode("utf-8", "surrogatepass")) + 1 for text in texts], dtype=np.int64)
        return cls(data, np.concatenate(([0], ends)))

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
