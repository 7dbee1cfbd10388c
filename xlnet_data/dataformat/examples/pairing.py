"""A/B segment pairs: the original's `_split_a_and_b` (with `extend_target`), drawing from Python's `random`.

The original scans the row from the A/B start to the next sentence boundary past `tot_len`, widens a
random B to whole sentences token by token, and trims one token at a time; on a row with few
sentence boundaries (a long line) every step then walks the rest of the row: quadratic time. Here
the row's boundaries are listed once (`row_boundaries`) and every one of those walks is a binary
search or a closed form, with the same results and the same random draws. A reversed row (bi_data) reads its
forward row's list from the other end (`_bound`, `_search`), so that a boundary is held once, in 4 bytes.
"""

import numpy as np

from xlnet_data.common import compiled
from xlnet_data.dataformat.examples.rng import next_double, python_randbelow


@compiled.jit()
def _boundaries_of_chunk(flags, pos, prev, num_rows, row_len, bounds, fill, count_only):
    """The boundaries in a chunk of sentence flags at stream position `pos` (`prev`: the flag before it, -1 at
    the start): counted per row into `fill` where `count_only`; else written at fill[row] (ascending), moved on."""
    row, e = pos // row_len, pos % row_len
    last = prev
    for t in range(flags.shape[0]):
        if row >= num_rows:
            return
        flag = np.int64(flags[t])
        if e > 0 and flag != last:
            if not count_only:
                bounds[fill[row]] = e
            fill[row] += 1
        last = flag
        e += 1
        if e == row_len:
            row, e = row + 1, 0


def row_boundaries(flag_chunks, num_rows, row_len):
    """The sentence boundaries of every row (the stream cut into `num_rows` rows of `row_len` tokens), read
    forwards, from the sentence flags in stream order: `flag_chunks()` yields them in bool chunks, and is read
    twice (to count, then to fill), so that the stream's flags are never held whole.

    Returns (bounds, offsets): row k's boundaries, ascending, are bounds[offsets[k]:offsets[k + 1]]. Position e
    is a boundary when the flag at e differs from the flag at e - 1; the row reversed has a boundary at
    row_len - e for each (split_a_and_b's `reverse`). int32 while a row has fewer than 2**31 tokens: 4 bytes a
    boundary, about 0.15 a token of English.
    """
    dtype = np.int32 if row_len < 1 << 31 else np.int64
    counts = np.zeros(num_rows, dtype=np.int64)
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    bounds = np.empty(0, dtype=dtype)
    for fill in (False, True) if row_len else ():
        if fill:
            offsets[1:] = np.cumsum(counts)
            bounds = np.empty(offsets[-1], dtype=dtype)
            at = offsets[:num_rows].copy()
        else:
            at = counts
        pos, prev = 0, -1
        for flags in flag_chunks():
            _boundaries_of_chunk(flags, pos, prev, num_rows, row_len, bounds, at, not fill)
            pos += flags.shape[0]
            prev = int(flags[-1]) if flags.shape[0] else prev
    return bounds, offsets


@compiled.jit()
def _trim(a_len, b_len, tot_len):
    """The original's trimming loop in closed form: while A + B > tot_len, drop a token from the longer
    side (from B on a tie). Returns (a_len, b_len)."""
    excess = a_len + b_len - tot_len
    if excess <= 0:
        return a_len, b_len
    if a_len > b_len:
        cut = min(a_len - b_len, excess)
        a_len -= cut
        excess -= cut
    elif b_len > a_len:
        cut = min(b_len - a_len, excess)
        b_len -= cut
        excess -= cut
    # equal now: B loses one, then A, then B, ...
    return a_len - excess // 2, b_len - (excess - excess // 2)


@compiled.jit(inline="always")
def _searchsorted(a, v, right):
    """np.searchsorted(a, v, side="right" if right else "left") for an ascending int array, by a binary
    search whose steps add 0 or half rather than branch: which half a position falls in is random, so a
    branch mispredicted about every other step (numba's searchsorted: ~15 steps, four searches a record)."""
    n = a.shape[0]
    if n == 0:
        return 0
    base = 0
    while n > 1:
        half = n >> 1
        probe = a[base + half - 1]
        base += half * ((probe <= v) if right else (probe < v))
        n -= half
    return base + ((a[base] <= v) if right else (a[base] < v))


@compiled.jit(inline="always")
def _bound(bounds, reverse, data_len, j):
    """The row's j-th boundary (ascending): of the row as listed, or of the row read backwards."""
    return data_len - bounds[bounds.shape[0] - 1 - j] if reverse else bounds[j]


@compiled.jit(inline="always")
def _search(bounds, reverse, data_len, v, right):
    """_searchsorted of v in the row's boundaries as _bound gives them. Read backwards, a boundary b <= v
    (b < v) is a listed one >= data_len - v (> data_len - v): all but those below (at or below) it."""
    if reverse:
        return bounds.shape[0] - _searchsorted(bounds, data_len - v, not right)
    return _searchsorted(bounds, v, right)


@compiled.jit()
def split_a_and_b(data_len, bounds, reverse, begin_idx, tot_len, py_mt):
    """Chooses A and B of at most `tot_len` tokens together, from `begin_idx` of one row of `data_len`
    tokens whose sentence boundaries are `bounds` (ascending, see row_boundaries), or, where `reverse`, from
    `begin_idx` of that row read backwards.

    Returns (ok, a_begin, a_end, b_begin, b_end, label). Cut points are the boundaries less than
    `tot_len` after `begin_idx`; with label 1 B is what follows A up to the next boundary, with label 0
    B is a random stretch of the row widened to whole sentences. The longer side is trimmed from its
    end until both fit. `ok` is False when the row has no room left (the original returns None there).
    """
    if begin_idx + tot_len >= data_len:
        return False, 0, 0, 0, 0, 0

    first_cut = _search(bounds, reverse, data_len, begin_idx, True)
    after_cuts = _search(bounds, reverse, data_len, begin_idx + tot_len, False)
    num_cuts = after_cuts - first_cut
    # the first boundary past tot_len
    end_idx = _bound(bounds, reverse, data_len, after_cuts) if after_cuts < bounds.shape[0] else data_len

    a_begin = begin_idx
    if num_cuts == 0 or next_double(py_mt) < 0.5:
        label = 0
        if num_cuts == 0:
            a_end = end_idx
        else:
            a_end = _bound(bounds, reverse, data_len, first_cut + python_randbelow(py_mt, num_cuts))
        b_len = max(1, tot_len - (a_end - a_begin))
        # random.randint(0, data_len - 1 - b_len); `- 1` leaves room for the extended target
        b_begin = python_randbelow(py_mt, data_len - b_len)
        b_end = b_begin + b_len
        # widen B to its sentence's start (a boundary, or 0) and its end (a boundary, or data_len - 1;
        # every boundary is below data_len)
        before = _search(bounds, reverse, data_len, b_begin, True)
        b_begin = _bound(bounds, reverse, data_len, before - 1) if before > 0 else 0
        after = _search(bounds, reverse, data_len, b_end, False)
        b_end = _bound(bounds, reverse, data_len, after) if after < bounds.shape[0] else data_len - 1
    else:
        label = 1
        a_end = _bound(bounds, reverse, data_len, first_cut + python_randbelow(py_mt, num_cuts))
        b_begin = a_end
        b_end = end_idx

    a_len, b_len = _trim(a_end - a_begin, b_end - b_begin, tot_len)  # the LM objective reads left to right
    a_end, b_end = a_begin + a_len, b_begin + b_len

    if a_end >= data_len or b_end >= data_len:  # no token left for the extended target
        return False, 0, 0, 0, 0, 0
    return True, a_begin, a_end, b_begin, b_end, label
