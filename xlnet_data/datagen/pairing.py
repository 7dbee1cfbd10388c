"""A/B segment pairs: the original's `_split_a_and_b` (with `extend_target`), drawing from Python's `random`."""

import numba
import numpy as np

from xlnet_data.datagen.rng import next_double, python_randbelow


@numba.njit(cache=True)
def split_a_and_b(data, sent_ids, begin_idx, tot_len, py_mt, cut_points):
    """Chooses A and B of at most `tot_len` tokens together, from `begin_idx` of one row.

    Returns (ok, a_begin, a_end, b_begin, b_end, label). Cut points are sentence boundaries; with
    label 1 B is what follows A, with label 0 B is a random stretch of the row widened to whole
    sentences. The longer side is trimmed from its end until both fit. `ok` is False when the row
    has no room left (the original returns None there). `cut_points` is scratch of tot_len + 1 slots.
    """
    data_len = data.shape[0]
    if begin_idx + tot_len >= data_len:
        return False, 0, 0, 0, 0, 0

    end_idx = begin_idx + 1
    num_cuts = 0
    while end_idx < data_len:
        if sent_ids[end_idx] != sent_ids[end_idx - 1]:
            if end_idx - begin_idx >= tot_len:
                break
            cut_points[num_cuts] = end_idx
            num_cuts += 1
        end_idx += 1

    a_begin = begin_idx
    if num_cuts == 0 or next_double(py_mt) < 0.5:
        label = 0
        if num_cuts == 0:
            a_end = end_idx
        else:
            a_end = cut_points[python_randbelow(py_mt, num_cuts)]
        b_len = max(1, tot_len - (a_end - a_begin))
        # random.randint(0, data_len - 1 - b_len); `- 1` leaves room for the extended target
        b_begin = python_randbelow(py_mt, data_len - b_len)
        b_end = b_begin + b_len
        while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
            b_begin -= 1
        while b_end < data_len - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
            b_end += 1
    else:
        label = 1
        a_end = cut_points[python_randbelow(py_mt, num_cuts)]
        b_begin = a_end
        b_end = end_idx

    while a_end - a_begin + b_end - b_begin > tot_len:
        if a_end - a_begin > b_end - b_begin:
            a_end -= 1  # trim from the right: the LM objective reads left to right
        else:
            b_end -= 1

    if a_end >= data_len or b_end >= data_len:  # no token left for the extended target
        return False, 0, 0, 0, 0, 0
    return True, a_begin, a_end, b_begin, b_end, label


def new_cut_points(tot_len):
    return np.empty(tot_len + 1, dtype=np.int64)
