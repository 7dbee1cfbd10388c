"""Span n-gram masking: the original's `_sample_mask`, drawing from numpy's legacy generator.

About `mask_beta` of every `mask_alpha` tokens are masked, in spans of n = 1..max_gram drawn with
p(n) ∝ 1/n, each placed at a word start inside a context of n * alpha // beta tokens; random single
tokens then top the count up to the goal.

`word_spans=False` keeps the original's quirk (xlnet#220): its inner loop tests the span's first
piece, so a span is n *pieces* from a word start and can end inside a word. `word_spans=True` takes
n whole words, as the paper describes, and tops up with whole words too, so no span cuts a word
(unless no whole word fits the last few masks, which needs a part without any one-piece word).

Which tokens start a word is given per position (`starts`): the original's piece-id table looked up
(vocab.start_piece_table), or the word starts a segmenter found (create --word_boundaries; dataformat/words.py).
"""

import numpy as np

from xlnet_data.common import compiled
from xlnet_data.dataformat.examples.rng import next_double, numpy_randint

MAX_GRAM = 5


def ngram_cdf(max_gram=MAX_GRAM):
    """The cumulative n-gram distribution exactly as numpy's `choice(ngrams, p=pvals)` builds it."""
    pvals = 1.0 / np.arange(1, max_gram + 1)
    pvals /= pvals.sum(keepdims=True)
    cdf = pvals.cumsum()
    cdf /= cdf[-1]
    return cdf


@compiled.jit()
def _word_end(starts, beg):
    """The position after the word that starts at `beg`."""
    end = beg + 1
    while end < starts.shape[0] and not starts[end]:
        end += 1
    return end


@compiled.jit()
def sample_mask(starts, mask, goal, mask_alpha, mask_beta, cdf, np_mt, word_spans):
    """Sets exactly `goal` entries of `mask` (all False on entry) for a segment whose tokens start a word where
    `starts`, in text order.

    For backward rows pass both reversed (`starts[::-1]`, `mask[::-1]`): the original flips the segment
    back to text order before sampling.
    """
    seg_len = starts.shape[0]
    num_predict = 0
    cur_len = 0
    while cur_len < seg_len:
        if num_predict >= goal:
            break
        # choice(ngrams, p=pvals), i.e. np.searchsorted(cdf, u, side="right") + 1 (cdf[-1] is 1.0 > u), by a
        # scan of the five entries: numba's searchsorted of one value cost more than the rest of a span.
        u = next_double(np_mt)
        n = 1
        while n < cdf.shape[0] and cdf[n - 1] <= u:
            n += 1
        n = min(n, goal - num_predict)
        ctx_size = (n * mask_alpha) // mask_beta
        l_ctx = numpy_randint(np_mt, ctx_size)
        r_ctx = ctx_size - l_ctx

        beg = cur_len + l_ctx
        while beg < seg_len and not starts[beg]:
            beg += 1
        if beg >= seg_len:
            break

        end = beg + 1
        if word_spans:
            words = 1
            while end < seg_len:
                if starts[end]:
                    if words == n or num_predict + (_word_end(starts, end) - beg) > goal:
                        break
                    words += 1
                end += 1
            if end - beg > goal - num_predict:  # not even one whole word fits: skip it
                cur_len = end
                continue
        else:
            # The original tests the piece at beg (always a start piece) here, so it counts pieces.
            count = 1
            while end < seg_len:
                count += 1
                if count > n:
                    break
                end += 1
            if end >= seg_len:
                break

        for k in range(beg, end):  # not mask[beg:end] = True: a slice assignment costs ~70 ns here
            mask[k] = True
        num_predict += end - beg
        cur_len = end + r_ctx

    misses = 0
    while num_predict < goal:
        i = numpy_randint(np_mt, seg_len)
        if mask[i]:
            continue
        if not word_spans:
            mask[i] = True
            num_predict += 1
            continue
        end = _word_end(starts, i)
        whole = starts[i] and not mask[i:end].any() and end - i <= goal - num_predict
        misses = 0 if whole else misses + 1
        if not whole and misses < 64 * seg_len:
            continue
        if not whole:  # no whole word fits the remainder: take the first free pieces
            end = i + 1
        mask[i:end] = True
        num_predict += end - i
