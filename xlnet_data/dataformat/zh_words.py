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
_NODE_BITS = 20  # nodes of jieba's dictionary: 584k
_ROOT_CODES = 0x32400  # the first character's node is looked up directly (one cache miss fewer a character)
_FIBONACCI = np.uint64(11400714819323198485)  # 2**64 / golden ratio: multiplicative hashing


@compiled.jit(inline="always")
def _slot(key, bits):
    return np.int64((np.uint64(key) * _FIBONACCI) >> np.uint64(64 - bits))


@compiled.jit()
def _fill(table, roots, parents, code_points, children, bits):
    """The trie's edges into an open-addressing table of (parent, code point, child) packed in an int64 each, the
    root's into `roots` by code point."""
    mask = table.shape[0] - 1
    for i in range(parents.shape[0]):
        if parents[i] == 0 and code_points[i] < roots.shape[0]:
            roots[code_points[i]] = children[i]
            continue
        key = (np.int64(parents[i]) << _CODE_BITS) | np.int64(code_points[i])
        at = _slot(key, bits)
        while table[at] != -1:
            at = (at + 1) & mask
        table[at] = (key << _NODE_BITS) | children[i]


@compiled.jit(inline="always")
def _child(table, roots, bits, node, code_point):
    """The trie node after `node` and `code_point`, -1 where no dictionary word goes on so."""
    if node == 0 and code_point < roots.shape[0]:
        return roots[code_point]
    key = (np.int64(node) << _CODE_BITS) | np.int64(code_point)
    mask = table.shape[0] - 1
    at = _slot(key, bits)
    while table[at] != -1:
        if table[at] >> _NODE_BITS == key:
            return table[at] & ((1 << _NODE_BITS) - 1)
        at = (at + 1) & mask
    return -1


@functools.cache
def load_dictionary(path: str):
    """jieba's dict.txt as a trie: (edge table, root edges, the table's bits, log frequency of each node's word
    (NaN: only a prefix of words), log of the total frequency)."""
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
    if len(freq) >= 1 << _NODE_BITS:
        raise ValueError(f"{path}: {len(freq)} trie nodes, more than {1 << _NODE_BITS}")
    bits = max(1, (2 * len(children)).bit_length())  # a load of 0.25-0.5 (0.28 for jieba's)
    table, roots = np.full(1 << bits, -1, dtype=np.int64), np.full(_ROOT_CODES, -1, dtype=np.int64)
    pairs = np.array(list(children), dtype=np.int64).reshape(-1, 2)
    _fill(table, roots, pairs[:, 0], pairs[:, 1], np.fromiter(children.values(), np.int64, len(children)), bits)
    log_freq = np.array([math.log(f) if f else math.nan for f in freq])  # jieba's math.log of each frequency
    return table, roots, bits, log_freq, math.log(total)


@compiled.jit()
def _route_starts(code_points, is_han, table, roots, bits, log_freq, log_total, starts):
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
            best, best_x, found, node = 0.0, idx, False, 0
            for x in range(idx, end):
                node = _child(table, roots, bits, node, code_points[x])
                if node < 0:
                    break
                if log_freq[node] == log_freq[node]:  # a word (not NaN)
                    value = log_freq[node] - log_total + score[x + 1]
                    if not found or value >= best:  # ties: the longer word, as max over (score, x)
                        best, best_x, found = value, x, True
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
