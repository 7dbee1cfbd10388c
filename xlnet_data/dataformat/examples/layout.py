"""The token stream laid out in rows: plain batches, or forward rows each followed by their reverse."""

import dataclasses
from typing import Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class Rows:
    """`bsz_per_host` rows over a [num_fwd_rows, row_len] array; row r is `data[source[r]]`, reversed
    where `reverse[r]`. Backward rows stay views, so the bidirectional layout costs no memory."""
    data: np.ndarray        # [num_fwd_rows, row_len] int32
    sent_ids: np.ndarray    # [num_fwd_rows, row_len] bool
    source: np.ndarray      # [bsz_per_host] int64
    reverse: np.ndarray     # [bsz_per_host] bool
    word_starts: Optional[np.ndarray] = None  # [num_fwd_rows, row_len] bool: can start a span (None: by piece id)


def batchify(data, num_rows):
    """The stream cut to a multiple of `num_rows` and reshaped to rows (a view, no copy)."""
    row_len = data.shape[0] // num_rows
    return data[:num_rows * row_len].reshape(num_rows, row_len)


def layout_rows(ids, sent_ids, bsz_per_host, num_core, bi_data, word_starts=None):
    """The original's layout: with `bi_data`, each core's half-batch of forward rows is followed by the
    same rows reversed; otherwise `bsz_per_host` forward rows. `word_starts` (a bool a token, or None) is laid
    out as the ids are."""
    if not bi_data:
        source = np.arange(bsz_per_host)
        return Rows(batchify(ids, bsz_per_host), batchify(sent_ids, bsz_per_host), source,
                    np.zeros(bsz_per_host, dtype=bool),
                    None if word_starts is None else batchify(word_starts, bsz_per_host))
    half = bsz_per_host // num_core // 2
    fwd = np.arange(bsz_per_host // 2).reshape(num_core, 1, half)
    source = np.concatenate([fwd, fwd], axis=1).reshape(-1)
    reverse = np.zeros((num_core, 2, half), dtype=bool)
    reverse[:, 1] = True
    return Rows(batchify(ids, bsz_per_host // 2), batchify(sent_ids, bsz_per_host // 2), source,
                reverse.reshape(-1), None if word_starts is None else batchify(word_starts, bsz_per_host // 2))


def materialize(rows):
    """The rows as full arrays (for tests and small inputs): the original's `data`, `sent_ids`."""
    data = rows.data[rows.source]
    sent_ids = rows.sent_ids[rows.source]
    data[rows.reverse] = data[rows.reverse, ::-1]
    sent_ids[rows.reverse] = sent_ids[rows.reverse, ::-1]
    return data, sent_ids
