"""A block's sentence flags and its counts, a token at a time in compiled code (corpus.shard_blocks).

With numpy they were four passes over the block's tokens (np.repeat of the line flags, the <unk> count, a gather
from the start-piece table and its count): 4.3-4.5 ns a token in a microbenchmark (lines of 1-30 ids, a
50,000-piece table), 2.1-2.3 here, where the fresh flags array's first touch is most of what is left; create
spends ~160 ns a token on Chinese prose.
"""

import numpy as np

from xlnet_data.common import compiled


@compiled.jit()
def flags_and_counts(ids, lengths, is_text, sent_id, unk_id, start_pieces, count_starts):
    """(each id's sentence flag, the flag the next block starts with, <unk> ids, ids that `start_pieces` marks (where
    `count_starts`, else 0)) of a block of lines of `lengths` ids. Flags start at `sent_id` and flip after every text
    line; a blank line's <eod> takes the flipped flag and flips it back, so it keeps the flag of the sentence
    before it and the next sentence flips."""
    flags = np.empty(ids.shape[0], dtype=np.bool_)
    at = 0
    for line in range(lengths.shape[0]):
        flag = sent_id if is_text[line] else not sent_id
        for _ in range(lengths[line]):  # an id at a time: a slice a line cost more than the ids of short lines
            flags[at] = flag
            at += 1
        if is_text[line]:
            sent_id = not sent_id
    unk = starts = 0
    for k in range(ids.shape[0]):
        if ids[k] == unk_id:
            unk += 1
        if count_starts and start_pieces[ids[k]]:
            starts += 1
    return flags, sent_id, unk, starts
