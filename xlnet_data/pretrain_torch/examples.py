"""The original's training examples in numpy: the records' int features -> the permutation-LM features XLNet
trains on, a batch of examples at once, with no framework (the data is made on the host's cores, beside the step).

This is train_gpu's parser (pretrain/inputs.py, the original's `_convert_example` and `_local_perm`) computed the
same way, feature for feature: the same dtypes, shapes and batch-major layout (see inputs.py's module doc):

    input_k [n, seq_len] int32, input_q [n, seq_len] float32, seg_id [n, seq_len] int32, label [n, 1] int32,
    perm_mask [n, seq_len, seq_len] float32, target / target_mask [n, num_predict] int32 / float32 (per position
    without num_predict), target_mapping [n, num_predict, seq_len] float32

Everything comes from each position's rank in the factorization order (`ranks`): perm_mask[b, i, j] is the
comparison threshold_i <= rev_index_j of two [n, seq_len] vectors of ranks, and target_mapping comes from input_q.
The trainer ships `shipped`'s features instead (rev_index in place of perm_mask and target_mapping: seq_len ints a
row, not seq_len + num_predict rows of seq_len floats) and the device makes the two (device_features.expand).

The permutations: a PermutationFn maps (indices of examples in the stream [n] int64, part: 0 for the first
reuse_len positions, 1 for the rest) to a permutation of range(perm_size) per example [n, perm_size].
`seeded_permutation` is the default: a pure function of (seed, index, part), so the examples of a stream do not
depend on how it is cut into batches or replicas, and a resumed run draws exactly the permutations it would have.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat.vocab import CLS_ID, SEP_ID
from xlnet_data.pretrain.config import InputConfig
from xlnet_data.pretrain.layout import position_tables

PermutationFn = Callable[[np.ndarray, int], np.ndarray]  # (example indices [n] int64, part) -> [n, perm_size]

# The record features the examples are made from (record_reader.parse_example's names), all int64.
RECORD_FEATURES = ("input", "target", "seg_id", "is_masked", "label")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


class TooManyPredictionsError(UserError, ValueError):
    """An example with more predicted tokens than num_predict: records made with another --num_predict."""


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 (wrapping arithmetic): a bijection, so distinct inputs never tie."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


def seeded_permutation(seed: int, perm_size: int) -> PermutationFn:
    """The default permutation stream: example `index`'s permutation of part `part` is the argsort of the perm_size
    keys splitmix64(((2 * index + part) * perm_size + j) XOR splitmix64(seed)), j = 0..perm_size-1.

    A pure function of (seed, index, part): the same whatever batch, replica or resumed run asks for it. The keys
    of one seed are distinct (splitmix64 is a bijection), so the argsort has no ties to break.
    """
    key = _splitmix64(np.array([seed], dtype=np.uint64))  # an array: numpy warns on a scalar's wrapping
    columns = np.arange(perm_size, dtype=np.uint64)

    def permutation(example_indices: np.ndarray, part: int) -> np.ndarray:
        indices = np.asarray(example_indices, dtype=np.int64).astype(np.uint64)
        counters = (indices[:, None] * np.uint64(2) + np.uint64(part)) * np.uint64(perm_size) + columns
        return np.argsort(_splitmix64(counters ^ key), axis=1).astype(np.int64)

    return permutation


def fixed_permutation(first_part, second_part) -> PermutationFn:
    """Every example gets the same permutation per part (as inputs.fixed_permutation: the model goldens' features.npz
    `perm_rows_0` / `perm_rows_1`)."""
    parts = (np.asarray(first_part, dtype=np.int64), np.asarray(second_part, dtype=np.int64))

    def permutation(example_indices: np.ndarray, part: int) -> np.ndarray:
        return np.broadcast_to(parts[part], (len(example_indices), len(parts[part])))

    return permutation


@functools.lru_cache(maxsize=8)
def _tables(config: InputConfig) -> dict[str, np.ndarray]:
    return position_tables(config)


def ranks(perms: tuple[np.ndarray, np.ndarray], config: InputConfig) -> np.ndarray:
    """Each position's index in the factorization order [n, seq_len] int32, from the two parts' permutations
    ([n, perm_size] each): position b*perm_size + j of a part gets b*perm_size + perm[j] (the same shuffle in every
    block, as the original's), the rest's indices offset by seq_len (after every index of the memory part)."""
    tables = _tables(config)
    perm = np.concatenate([np.asarray(p, dtype=np.int32) for p in perms], axis=1)
    return tables["offset"] + tables["block_start"] + perm[:, tables["perm_column"]]


def _slots(predicted: np.ndarray):
    """(example, position, slot) of every predicted position [n, seq_len] bool: slot k is an example's k-th."""
    rows, positions = np.nonzero(predicted)  # row-major: each example's positions in order
    return rows, positions, (np.cumsum(predicted, axis=1) - 1)[rows, positions]


def shipped(records: Mapping[str, np.ndarray], indices: np.ndarray, config: InputConfig,
            permutation: PermutationFn) -> dict[str, np.ndarray]:
    """What the host makes and ships to the device for n examples: `features` without perm_mask and target_mapping
    (seq_len x seq_len and num_predict x seq_len per row), and `rev_index` [n, seq_len] int32 in their place, from
    which the device makes both (device_features.expand; seq_len ints a row). rev_index is the original's: each
    position's rank in the factorization order where it is hidden (masked or functional), else its part's
    smallest rank less one. TooManyPredictionsError when an example predicts more than num_predict tokens."""
    inputs = np.asarray(records["input"], dtype=np.int32)
    indices = np.asarray(indices, dtype=np.int64)
    perms = (permutation(indices, 0), permutation(indices, 1))
    tables = _tables(config)
    index = ranks(perms, config)

    functional = (inputs == SEP_ID) | (inputs == CLS_ID)
    is_masked = np.asarray(records["is_masked"]) != 0
    # Predicted: masked tokens that are not <sep>/<cls>. Hidden ones (masked or functional) keep their rank, the
    # others get their part's smallest: everyone sees them, and they see no hidden token of their part.
    predicted = is_masked & ~functional
    hidden = is_masked | functional
    rev_index = np.where(hidden, index, tables["offset"] - 1).astype(np.int32)

    # The model's target: the next token of the previous position, each part's first position its own input.
    target = np.concatenate([np.asarray(records["target"], dtype=np.int32), inputs], axis=1)[:, tables["shift_source"]]
    input_q = predicted.astype(np.float32)
    out = {
        "input_k": inputs,
        "input_q": input_q,
        "seg_id": np.asarray(records["seg_id"], dtype=np.int32),
        "label": np.asarray(records["label"], dtype=np.int32).reshape(len(inputs), 1),
        "rev_index": rev_index,
    }
    if config.num_predict is None:
        return {**out, "target": target, "target_mask": input_q}
    # The predicted positions in order, padded to num_predict.
    counts = predicted.sum(axis=1)
    if counts.size and counts.max() > config.num_predict:
        b = int(np.argmax(counts > config.num_predict))
        raise TooManyPredictionsError(
            f"example {int(indices[b])} of the stream predicts {int(counts[b])} tokens, more than "
            f"num_predict={config.num_predict}: give the num_predict the records were made with")
    rows, positions, slots = _slots(predicted)
    predicted_target = np.zeros((len(inputs), config.num_predict), np.int32)
    predicted_target[rows, slots] = target[rows, positions]
    target_mask = np.zeros((len(inputs), config.num_predict), np.float32)
    target_mask[rows, slots] = 1
    return {**out, "target": predicted_target, "target_mask": target_mask}


def features(records: Mapping[str, np.ndarray], indices: np.ndarray, config: InputConfig,
             permutation: PermutationFn) -> dict[str, np.ndarray]:
    """The training features (see the module doc) of n examples, all made on the host: `records` holds their int
    features (RECORD_FEATURES: [n, seq_len] each, label [n, 1]), `indices` their indices in the stream [n] (what the
    permutation is drawn for). TooManyPredictionsError when an example predicts more than num_predict tokens."""
    out = shipped(records, indices, config, permutation)
    rev_index = out.pop("rev_index")
    tables = _tables(config)
    predicted = out["input_q"] != 0
    hidden = rev_index >= tables["offset"]
    # i may not attend to j when threshold_i <= rev_index_j: a predicted token's threshold is its own rank (it does
    # not see itself), any other's its rank + 1. The rest's ranks are above the memory part's, which gives the two
    # off-diagonal blocks (the memory part never sees the rest, the rest sees all of it) from the same comparison.
    threshold = rev_index + 1 - predicted
    # All ordinary tokens of a part share one threshold, so only 2 + (hidden tokens) rows of the mask differ: those
    # are compared (90 of 512 rows on g5's records) and the mask gathered from them, a row copy each (1.9x faster
    # than comparing every pair into float32 at seq_len 512). Row 0 / 1: the ordinary tokens of the memory part /
    # the rest; row 2 + k: the k-th hidden token.
    n = len(rev_index)
    row = np.where(hidden, np.cumsum(hidden, axis=1) + 1, tables["part"])
    row_threshold = np.zeros((n, int(row.max(initial=1)) + 1), np.int32)
    row_threshold[np.arange(n)[:, None], row] = threshold  # a row's tokens share its threshold
    rows = np.less_equal(row_threshold[:, :, None], rev_index[:, None, :],
                         out=np.empty((n, row_threshold.shape[1], config.seq_len), np.float32))
    out["perm_mask"] = rows[np.arange(n)[:, None], row]
    if config.num_predict is None:
        return out
    # Row k of target_mapping is one-hot on the k-th predicted position.
    examples, positions, slots = _slots(predicted)
    target_mapping = np.zeros((n, config.num_predict, config.seq_len), np.float32)
    target_mapping[examples, slots, positions] = 1
    return {**out, "target_mapping": target_mapping}
