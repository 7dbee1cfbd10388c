"""A/B pairing without rescans: the same pairs and random draws as the original's token-by-token walk."""

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from xlnet_data.dataformat.examples.pairing import row_boundaries, split_a_and_b
from xlnet_data.dataformat.examples.rng import next_uint32, python_state


def walk_split(sent_ids, begin_idx, tot_len, rand):
    """The original's _split_a_and_b (extend_target=True) as it is specified: walks token by token."""
    data_len = len(sent_ids)
    if begin_idx + tot_len >= data_len:
        return None
    end_idx, cut_points = begin_idx + 1, []
    while end_idx < data_len:
        if sent_ids[end_idx] != sent_ids[end_idx - 1]:
            if end_idx - begin_idx >= tot_len:
                break
            cut_points.append(end_idx)
        end_idx += 1
    a_begin = begin_idx
    if not cut_points or rand.random() < 0.5:
        label = 0
        a_end = rand.choice(cut_points) if cut_points else end_idx
        b_len = max(1, tot_len - (a_end - a_begin))
        b_begin = rand.randint(0, data_len - 1 - b_len)
        b_end = b_begin + b_len
        while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
            b_begin -= 1
        while b_end < data_len - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
            b_end += 1
    else:
        label = 1
        a_end = rand.choice(cut_points)
        b_begin, b_end = a_end, end_idx
    while a_end - a_begin + b_end - b_begin > tot_len:
        if a_end - a_begin > b_end - b_begin:
            a_end -= 1
        else:
            b_end -= 1
    if a_end >= data_len or b_end >= data_len:
        return None
    return a_begin, a_end, b_begin, b_end, label


# rows from sentences of random lengths: many short ones, or a few very long ones (long lines)
sentence_lengths = st.lists(st.one_of(st.integers(1, 6), st.integers(1, 400)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(sentence_lengths, min_size=1, max_size=3), tot_len=st.integers(1, 60),
       begin_frac=st.floats(0, 1), seed=st.integers(0, 2**32 - 1), start=st.booleans())
def test_split_matches_the_walk_both_ways(lengths, tot_len, begin_frac, seed, start):
    rows = []
    for row_lengths in lengths:
        flags = np.repeat(np.arange(len(row_lengths)) % 2 == (0 if start else 1), row_lengths)
        rows.append(flags)
    row_len = min(map(len, rows))
    sent_ids = np.stack([r[:row_len] for r in rows])
    bounds, offsets = row_boundaries(lambda: iter(sent_ids), len(rows), row_len)  # a row a chunk
    for k in range(2 * len(rows)):  # each row forwards, then each read backwards from its forward list
        reverse = k >= len(rows)
        row = sent_ids[k % len(rows)][::-1 if reverse else 1]
        row_bounds = bounds[offsets[k % len(rows)]:offsets[k % len(rows) + 1]]
        if not reverse:
            assert list(row_bounds) == [e for e in range(1, row_len) if row[e] != row[e - 1]]
        begin_idx = int(begin_frac * row_len)
        rand, mt = random.Random(seed), python_state(seed)
        expected = walk_split(row, begin_idx, tot_len, rand)
        ok, *got = split_a_and_b(row_len, row_bounds, reverse, begin_idx, tot_len, mt)
        assert (tuple(got) if ok else None) == expected
        assert next_uint32(mt) == rand.getrandbits(32)  # the same number of draws
