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
_BASE_SHIFT = _SIZE_SHIFT + 5  # 21 bits: the child's table's first slot
_BASE_MASK = (1 << 21) - 1
_SCORE_SHIFT = _BASE_SHIFT + 21  # 15 bits: the word's log frequency, an index into the table of them
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
def _fill(parents, code_points, children, score_index):
    """The trie as one array of slots, an int64 edge each. An edge packs its code point, whether it ends a word
    and that word's log frequency (`score_index`, -1 for a prefix only: an index into the table of the
    dictionary's few thousand distinct ones), and where the child's own edges are: each node's edges in a small
    open-addressing table of their own, so that a walk reads one slot a character, near its parent's, and stops
    without reading anything at a node that no word goes on from. The root's table is indexed by code point. The
    route is bound by its reads from memory: 8 bytes a slot, not 16 with the score beside it, keep more of the
    trie in the cache."""
    nodes = score_index.shape[0]
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
    if end > _BASE_MASK:
        raise ValueError("the dictionary's trie does not fit 21 bits of slots")
    slots = np.zeros(end, dtype=np.int64)
    for i in range(parents.shape[0]):
        parent, code_point, child = parents[i], np.int64(code_points[i]), children[i]
        if parent == 0:
            at = code_point
        else:
            at = base[parent] + _first_probe(code_point, size[parent])
            while slots[at] != 0:
                at = base[parent] + ((at - base[parent] + 1) & (size[parent] - 1))
        is_word = score_index[child] >= 0
        log2 = 0
        while (1 << log2) < size[child]:
            log2 += 1
        slots[at] = (code_point | (_WORD_BIT | (score_index[child] << _SCORE_SHIFT) if is_word else 0)
                     | ((log2 + 1 if size[child] else 0) << _SIZE_SHIFT) | (base[child] << _BASE_SHIFT))
    return slots


@compiled.jit(inline="always")
def _next(slots, edge, code_point):
    """The slot of the edge on from the node `edge` leads to by `code_point`; -1 where no word goes on so."""
    log2 = (edge >> _SIZE_SHIFT) & 31
    if log2 == 0:
        return -1
    size = np.int64(1) << (log2 - 1)
    base = (edge >> _BASE_SHIFT) & _BASE_MASK
    at = _first_probe(code_point, size)
    for _ in range(size):
        found = slots[base + at]
        if found == 0:
            return -1
        if found & (_WORD_BIT - 1) == code_point:
            return base + at
        at = (at + 1) & (size - 1)
    return -1


@functools.cache
def load_dictionary(path: str):
    """jieba's dict.txt as a trie: (its slots, the distinct log frequencies its edges index, log of the total
    frequency)."""
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
    freq = np.array(freq, dtype=np.int64)
    is_word = freq > 0  # else a prefix only
    distinct, index = np.unique(freq[is_word], return_inverse=True)
    if distinct.size > 1 << 15:
        raise ValueError(f"{path}: more than {1 << 15} distinct frequencies")
    score_index = np.full(freq.size, -1, dtype=np.int64)
    score_index[is_word] = index
    log_scores = np.array([math.log(f) for f in distinct.tolist()])  # jieba's math.log of each frequency
    slots = _fill(pairs[:, 0], pairs[:, 1], np.fromiter(children.values(), np.int64, len(children)), score_index)
    return slots, log_scores, math.log(total)


@compiled.jit()
def _route_run(code_points, begin, end, slots, scores, log_total, score, last, starts):
    """Sets `starts` where a word of jieba's route over the Han run code_points[begin:end] begins (`score`, `last`:
    scratch of at least end - begin + 1)."""
    score[end - begin] = 0.0
    for idx in range(end - 1, begin - 1, -1):
        best, best_x, found = 0.0, idx, False
        at = np.int64(code_points[idx])  # the root's slot of this character (Han: below _ROOT_CODES)
        x = idx
        while at >= 0 and slots[at] != 0:
            edge = slots[at]
            if edge & _WORD_BIT:
                value = scores[edge >> _SCORE_SHIFT] - log_total + score[x + 1 - begin]
                if not found or value >= best:  # ties: the longer word, as max over (score, x)
                    best, best_x, found = value, x, True
            x += 1
            if x == end:
                break
            at = _next(slots, edge, code_points[x])
        if not found:  # no word starts here: the character alone, frequency 1
            best, best_x = score[idx + 1 - begin] - log_total, idx
        score[idx - begin], last[idx - begin] = best, best_x
    x = begin
    while x < end:
        starts[x] = True
        x = last[x - begin] + 1


@compiled.jit()
def _route_starts(code_points, is_han, slots, scores, log_total, starts):
    """Sets `starts` (False on entry) where a word begins: jieba's route over each Han run; True elsewhere."""
    n = code_points.shape[0]
    score = np.empty(n + 1)
    last = np.empty(n + 1, dtype=np.int64)  # the last character of the route's word from each position
    k = 0
    while k < n:
        if not is_han[k]:
            starts[k] = True
            k += 1
            continue
        end = k
        while end < n and is_han[end]:
            end += 1
        _route_run(code_points, k, end, slots, scores, log_total, score, last, starts)
        k = end


def char_starts(dictionary, code_points: np.ndarray, is_han: np.ndarray) -> np.ndarray:
    """A bool per code point of a text (uint32) and one past it: True where jieba's no-HMM cut starts a word
    (`is_han`: a bool a code point, those of words.SCRIPTS["zh"], whose runs the route cuts)."""
    starts = np.zeros(code_points.size + 1, dtype=bool)
    _route_starts(code_points, is_han, *dictionary, starts)
    return starts


@compiled.jit()
def _mark_run(run, size, first_of, slots, scores, log_total, score, last, run_starts, starts):
    run_starts[:size] = False
    _route_run(run, 0, size, slots, scores, log_total, score, last, run_starts)
    for at in range(size):
        if first_of[at] >= 0:
            starts[first_of[at]] = run_starts[at]


@compiled.jit(inline="always")
def _doubled(scratch):
    grown = np.empty(2 * scratch.shape[0], dtype=scratch.dtype)
    grown[:scratch.shape[0]] = scratch
    return grown


@compiled.jit()
def _mark_token_starts(ids, asked, piece_code_points, piece_offsets, piece_lengths, piece_is_han, slots, scores,
                       log_total, starts):
    """Sets starts[i] of each token `asked` (its first character Han) to whether a word begins at that character.
    The Han runs are read from the pieces' code points in turn into scratch the size of the longest run: no array
    the size of the block's text (its page faults and numpy temporaries cost more than the route itself)."""
    capacity = 256
    run = np.empty(capacity, dtype=np.uint32)
    first_of = np.empty(capacity, dtype=np.int64)  # the token whose first character it is, else -1
    run_starts = np.empty(capacity, dtype=np.bool_)
    score = np.empty(capacity + 1)
    last = np.empty(capacity + 1, dtype=np.int64)
    size = 0
    for i in range(ids.shape[0]):
        begin = piece_offsets[ids[i]]
        for j in range(begin, begin + piece_lengths[ids[i]]):
            if not piece_is_han[j]:
                if size:
                    _mark_run(run, size, first_of, slots, scores, log_total, score, last, run_starts, starts)
                    size = 0
                continue
            if size == capacity:
                capacity *= 2
                run, first_of = _doubled(run), _doubled(first_of)
                run_starts = np.empty(capacity, dtype=np.bool_)
                score, last = np.empty(capacity + 1), np.empty(capacity + 1, dtype=np.int64)
            run[size] = piece_code_points[j]
            first_of[size] = i if j == begin and asked[i] else -1
            size += 1
    if size:
        _mark_run(run, size, first_of, slots, scores, log_total, score, last, run_starts, starts)


def mark_token_starts(dictionary, pieces, ids: np.ndarray, asked: np.ndarray, starts: np.ndarray) -> None:
    """Sets `starts` (a bool a token of `ids`) where `asked`: True where a word of jieba's no-HMM cut begins at the
    token's first character (a Han character). `pieces`: a words.PieceTable of words.SCRIPTS["zh"]."""
    _mark_token_starts(ids, asked, pieces.code_points, pieces.offsets, pieces.lengths, pieces.in_script, *dictionary,
                       starts)
