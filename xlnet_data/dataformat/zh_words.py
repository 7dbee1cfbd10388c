"""Chinese word starts as jieba cuts without its HMM (`jieba.cut(text, HMM=False)`, rjieba's `hmm=False`): over each
run of Han characters, the maximum-probability route through the words of jieba's dictionary, compiled.

rjieba itself cut at 2.3-2.6 M characters/s a core (387 ns a token of a Chinese model): 3.9x create's one pass
without segmenting (benchmarks/bench_words.py). The same route over a trie in compiled code takes a fraction of
that. The dictionary is jieba's own dict.txt (the `jieba` package, MIT), read once per process. Scores are
jieba's: log(frequency) - log(total), summed in float64, ties going to the longer word; a character that starts
no dictionary word is a word by itself. jieba also routes ASCII letters and digits that touch Han characters
through the dictionary ("T恤"); here only Han runs are, so such a rare word splits at its first Han character.
"""

import functools
import math

import numpy as np

from xlnet_data.common import compiled

_CODE_BITS = 21  # every code point fits
_ROOT_CODES = 0x32400  # past the last Han code point: the root's edges are indexed by code point directly
_WORD_BIT = 1 << _CODE_BITS
_SIZE_SHIFT = _CODE_BITS + 1  # 5 bits: log2 of the child's table size, plus one; 0 for a word no longer word goes on
_BASE_SHIFT = _SIZE_SHIFT + 5  # the child's table's first slot
_FIBONACCI = np.uint64(11400714819323198485)  # 2**64 / golden ratio: multiplicative hashing


@compiled.jit(inline="always")
def _table_size(fanout):
    """Slots for a node's edges: one for a single edge (most nodes past a word's second character), else a power
    of two at least 1.5 times as many."""
    if fanout <= 1:
        return fanout
    size = 2
    while size < fanout + fanout // 2:
        size *= 2
    return size


@compiled.jit(inline="always")
def _first_probe(code_point, size):
    return np.int64((np.uint64(code_point) * _FIBONACCI) >> np.uint64(40)) & (size - 1)


@compiled.jit()
def _fill(parents, code_points, children, log_freq):
    """The trie as one array of slots, two int64 each: an edge, and its word's log frequency (float64 bits; NaN: a
    prefix only). An edge packs its code point, whether it ends a word, and where the child's own edges are: each
    node's edges in a small open-addressing table of their own, so that a walk reads one slot a character, near
    its parent's, and stops without reading anything at a node that no word goes on from. The root's table is
    indexed by code point."""
    nodes = log_freq.shape[0]
    fanout = np.zeros(nodes, dtype=np.int64)
    for i in range(parents.shape[0]):
        fanout[parents[i]] += 1
    base = np.zeros(nodes, dtype=np.int64)
    size = np.zeros(nodes, dtype=np.int64)
    end = _ROOT_CODES
    for node in range(1, nodes):
        size[node] = _table_size(fanout[node])
        base[node] = end
        end += size[node]
    slots = np.zeros(2 * end, dtype=np.int64)
    scores = slots.view(np.float64)
    for i in range(parents.shape[0]):
        parent, code_point, child = parents[i], np.int64(code_points[i]), children[i]
        if parent == 0:
            at = code_point
        else:
            at = base[parent] + _first_probe(code_point, size[parent])
            while slots[2 * at] != 0:
                at = base[parent] + ((at - base[parent] + 1) & (size[parent] - 1))
        is_word = log_freq[child] == log_freq[child]
        log2 = 0
        while (1 << log2) < size[child]:
            log2 += 1
        slots[2 * at] = (code_point | (_WORD_BIT if is_word else 0) | ((log2 + 1 if size[child] else 0) << _SIZE_SHIFT)
                         | (base[child] << _BASE_SHIFT))
        scores[2 * at + 1] = log_freq[child]
    return slots


@compiled.jit(inline="always")
def _next(slots, edge, code_point):
    """The slot of the edge on from the node `edge` leads to by `code_point`; -1 where no word goes on so."""
    log2 = (edge >> _SIZE_SHIFT) & 31
    if log2 == 0:
        return -1
    size = np.int64(1) << (log2 - 1)
    base = edge >> _BASE_SHIFT
    at = _first_probe(code_point, size)
    for _ in range(size):
        found = slots[2 * (base + at)]
        if found == 0:
            return -1
        if found & (_WORD_BIT - 1) == code_point:
            return base + at
        at = (at + 1) & (size - 1)
    return -1


@functools.cache
def load_dictionary(path: str):
    """jieba's dict.txt as a trie: (its slots as int64, the same as float64, log of the total frequency)."""
    children, freq, total = {}, [0], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            word, count = line.strip().split(" ")[:2]
            total += int(count)
            node = 0
            for char in word:
                node = children.setdefault((node, ord(char)), len(freq))
                if node == len(freq):
                    freq.append(0)
            freq[node] = int(count)  # jieba: a word listed twice takes its last frequency
    pairs = np.array(list(children), dtype=np.int64).reshape(-1, 2)
    if pairs[:, 1].max() >= _ROOT_CODES:
        raise ValueError(f"{path}: a word of a character past U+{_ROOT_CODES:X}")
    log_freq = np.array([math.log(f) if f else math.nan for f in freq])  # jieba's math.log of each frequency
    slots = _fill(pairs[:, 0], pairs[:, 1], np.fromiter(children.values(), np.int64, len(children)), log_freq)
    return slots, slots.view(np.float64), math.log(total)


@compiled.jit()
def _route_starts(code_points, is_han, slots, scores, log_total, starts):
    """Sets `starts` (False on entry) where a word begins: jieba's route over each Han run; True elsewhere."""
    n = code_points.shape[0]
    score = np.zeros(n + 1)
    last = np.zeros(n + 1, dtype=np.int64)  # the last character of the route's word from each position
    k = 0
    while k < n:
        if not is_han[k]:
            starts[k] = True
            k += 1
            continue
        end = k
        while end < n and is_han[end]:
            end += 1
        score[end] = 0.0
        for idx in range(end - 1, k - 1, -1):
            best, best_x, found = 0.0, idx, False
            at = np.int64(code_points[idx])  # the root's slot of this character (Han: below _ROOT_CODES)
            x = idx
            while at >= 0 and slots[2 * at] != 0:
                edge = slots[2 * at]
                if edge & _WORD_BIT:
                    value = scores[2 * at + 1] - log_total + score[x + 1]
                    if not found or value >= best:  # ties: the longer word, as max over (score, x)
                        best, best_x, found = value, x, True
                x += 1
                if x == end:
                    break
                at = _next(slots, edge, code_points[x])
            if not found:  # no word starts here: the character alone, frequency 1
                best, best_x = score[idx + 1] - log_total, idx
            score[idx], last[idx] = best, best_x
        x = k
        while x < end:
            starts[x] = True
            x = last[x] + 1
        k = end


def char_starts(dictionary, code_points: np.ndarray, is_han: np.ndarray) -> np.ndarray:
    """A bool per code point of a text (uint32) and one past it: True where jieba's no-HMM cut starts a word
    (`is_han`: a bool a code point, those of words.SCRIPTS["zh"], whose runs the route cuts)."""
    starts = np.zeros(code_points.size + 1, dtype=bool)
    _route_starts(code_points, is_han, *dictionary, starts)
    return starts
