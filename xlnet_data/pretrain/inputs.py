"""The training input: records -> the permutation-LM features XLNet trains on.

This is the original `data_utils.get_input_fn` (and its parser `_convert_example`) in TF2:
the records of one or more record dirs are read in stream order, and each
example gets, per part (the first `reuse_len` positions, then the rest), a local
permutation of block size `perm_size` from which `perm_mask`, `target_mask`,
`input_k`, `input_q` and the next-token `target` are built; with `num_predict`
the predicted positions are gathered into a padded `target_mapping`.

Convention: every feature is batch-major, exactly as the original parser
emits it (ints int32, floats float32):

    input_k        [bsz, seq_len]            int32   token ids
    input_q        [bsz, seq_len]            float32 1 where the token is predicted
    seg_id         [bsz, seq_len]            int32
    perm_mask      [bsz, seq_len, seq_len]   float32 [b, i, j] = 1: i may not attend to j
    target         [bsz, num_predict]        int32   (or [bsz, seq_len] without num_predict)
    target_mask    [bsz, num_predict]        float32 (or [bsz, seq_len])
    target_mapping [bsz, num_predict, seq_len] float32 one-hot rows, zero rows pad
    label          [bsz, 1]                  int32

The model (`xlnet_data.pretrain.modeling`) transposes to time-major itself.

Differences from the original, all deliberate:
- `num_passes` really selects passes 0..num_passes-1 (the original parses the
  pass id from the wrong field count and never skips a file);
- no file shuffling and no `cache()` by default: examples stay in stream order
  (memory needs consecutive batches) and a large corpus is not held in RAM;
- the permutation is injectable, and by default it is drawn statelessly from
  (seed, index of the batch's first example, part), a row per example, so a run
  is reproducible (and a resumed one, which starts on a batch boundary).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

from xlnet_data.dataformat.vocab import CLS_ID, SEP_ID
from xlnet_data.pretrain import cache_input
from xlnet_data.pretrain.config import InputConfig
from xlnet_data.pretrain.layout import find_records, position_tables

# (indices in the stream of a batch's consecutive examples [n] int64 tensor, part 0 = first
# reuse_len positions / 1 = the rest) -> a permutation of range(perm_size) per example [n, perm_size].
PermutationFn = Callable[[tf.Tensor, int], tf.Tensor]


def _read_records(filenames: Sequence[str]) -> tf.data.Dataset:
    """Serialized records of all files, in order; gzip is decided per file by its `.gz` suffix."""
    datasets = [
        tf.data.TFRecordDataset(list(group), compression_type="GZIP" if gz else "")
        for gz, group in itertools.groupby(filenames, key=lambda name: name.endswith(".gz"))
    ]
    dataset = datasets[0]
    for more in datasets[1:]:
        dataset = dataset.concatenate(more)
    return dataset


def random_permutation(seed: int, perm_size: int) -> PermutationFn:
    """The default permutation: uniform, one row per example, drawn statelessly from (seed, index of
    the batch's first example, part).

    Stateless so that the same seed gives the same features on every run and
    every number of parallel map calls; one draw per batch, not per example, so
    that no op runs per example.
    """

    def permutation(example_indices: tf.Tensor, part: int) -> tf.Tensor:
        op_seed = tf.stack([tf.cast(seed, tf.int64), tf.cast(example_indices[0], tf.int64) * 2 + part])
        shape = tf.stack([tf.size(example_indices), perm_size])
        return tf.argsort(tf.random.stateless_uniform(shape, seed=op_seed), axis=-1)

    return permutation


def _local_perm_features(inputs: tf.Tensor, targets: tf.Tensor, is_masked: tf.Tensor, perms: Sequence[tf.Tensor],
                         config: InputConfig) -> dict[str, tf.Tensor]:
    """The original's `_local_perm` of both parts at once, for a batch ([bsz, seq_len] int32 inputs and
    targets, bool is_masked; `perms` the two parts' [bsz, perm_size] shuffles): perm_mask, target (per
    position), predicted (bool), input_q.

    Within a part, position b*perm_size + j gets the factorization-order index b*perm_size + perm[j] (the
    same shuffle in every block, as the original's tf.random_shuffle of the rows), ordinary tokens the
    part's smallest index (everyone sees them, they see no masked token), and a predicted token may not
    see itself. The original builds each part's mask, "i may not attend to j" = (i's own index <= j's
    index) and j is masked or functional, then pastes them with ones (the memory part never sees the
    rest) and zeros (the rest sees all of it). Here the rest's indices are offset by seq_len, which gives
    those two blocks from the same comparison; and "j is masked or functional" needs no test, as an
    ordinary j has its part's smallest index, below every i's own index in its part.

    perm_mask is built by rows: row i is (threshold_i <= index_j for every j), and all ordinary tokens of
    a part share one threshold, so only 2 + (masked or functional tokens) rows differ. Those are compared
    (about a sixth of the [seq_len, seq_len] comparisons) and the mask is gathered from them, one copy per
    row: the broadcast comparison of every pair and its cast to float were most of the input pipeline's
    time at seq_len 512.
    """
    tables = position_tables(config)
    perm = tf.cast(tf.concat(list(perms), axis=1), tf.int32)
    index = tables["offset"] + tables["block_start"] + tf.gather(perm, tables["perm_column"], axis=1)

    functional = tf.logical_or(tf.equal(inputs, SEP_ID), tf.equal(inputs, CLS_ID))
    # Predicted tokens: masked ones that are not <sep>/<cls>; `hidden` ones (masked or functional) keep
    # their permutation index, the others get their part's smallest.
    predicted = tf.logical_and(is_masked, tf.logical_not(functional))
    hidden = tf.logical_or(is_masked, functional)
    rev_index = tf.where(hidden, index, tables["offset"] - 1)
    # i may not attend to j when threshold_i <= rev_index_j: a predicted token's threshold is its own
    # index (it does not see itself), any other token's its index + 1.
    threshold = rev_index + 1 - tf.cast(predicted, tf.int32)

    # Row 0 / 1: the ordinary tokens of the memory part / the rest; row 2 + k: the k-th hidden token.
    row = tf.where(hidden, tf.cumsum(tf.cast(hidden, tf.int32), axis=1) + 1, tables["part"])
    bsz = tf.shape(inputs)[0]
    num_rows = tf.reduce_max(row) + 1
    segment = row + tf.range(bsz)[:, None] * num_rows
    row_threshold = tf.reshape(tf.math.unsorted_segment_max(threshold, segment, bsz * num_rows), [bsz, num_rows])
    rows = tf.cast(row_threshold[:, :, None] <= rev_index[:, None, :], tf.float32)
    perm_mask = tf.gather(rows, row, batch_dims=1)

    target = tf.gather(tf.concat([targets, inputs], axis=1), tables["shift_source"], axis=1)
    return {"perm_mask": perm_mask, "target": target, "predicted": predicted,
            "input_q": tf.cast(predicted, tf.float32)}


def make_batch_parser(config: InputConfig):
    """The per-batch function (serialized records [n], the two parts' permutations [n, perm_size] each) ->
    feature dict (see the module doc), all examples of a batch in one set of ops."""
    seq_len, num_predict = config.seq_len, config.num_predict
    record_spec = {
        "input": tf.io.FixedLenFeature([seq_len], tf.int64),
        "target": tf.io.FixedLenFeature([seq_len], tf.int64),
        "seg_id": tf.io.FixedLenFeature([seq_len], tf.int64),
        "label": tf.io.FixedLenFeature([1], tf.int64),
        "is_masked": tf.io.FixedLenFeature([seq_len], tf.int64),
    }

    def parse(records: tf.Tensor, perm_0: tf.Tensor, perm_1: tf.Tensor) -> dict[str, tf.Tensor]:
        example = tf.io.parse_example(records, record_spec)
        inputs = tf.cast(example["input"], tf.int32)
        local = _local_perm_features(inputs, tf.cast(example["target"], tf.int32),
                                     tf.cast(example["is_masked"], tf.bool), (perm_0, perm_1), config)
        features = {
            "input_k": inputs,
            "input_q": local["input_q"],
            "seg_id": tf.cast(example["seg_id"], tf.int32),
            "label": tf.cast(example["label"], tf.int32),
            "perm_mask": local["perm_mask"],
        }
        if num_predict is None:
            features["target"] = local["target"]
            features["target_mask"] = local["input_q"]
            return features
        # The predicted positions in order, padded to num_predict: row k of target_mapping is one-hot on
        # the k-th predicted position (a zero row when there are fewer).
        predicted = local["predicted"]
        rank = tf.cumsum(tf.cast(predicted, tf.int32), axis=1) - 1  # which prediction a position is
        # The original would fail here with a shape error; say why instead.
        with tf.control_dependencies([tf.debugging.assert_less_equal(
                tf.reduce_max(rank[:, -1] + 1), num_predict, message="an example has more predicted tokens than num_predict")]):
            bsz = tf.shape(predicted)[0]
            # Prediction k of example b is slot b * num_predict + k; positions not predicted go to one spare slot.
            slot = tf.where(predicted, rank + tf.range(bsz)[:, None] * num_predict, bsz * num_predict)

        def by_slot(values):  # [bsz, seq_len] -> [bsz, num_predict]: the value of each prediction, 0 for padding
            return tf.reshape(tf.math.unsorted_segment_sum(values, slot, bsz * num_predict + 1)[:-1], [bsz, num_predict])

        predicted_position = by_slot(tf.broadcast_to(tf.range(1, seq_len + 1), tf.shape(slot))) - 1  # -1: padding
        features["target_mapping"] = tf.one_hot(predicted_position, seq_len, dtype=tf.float32)  # -1: a zero row
        features["target"] = by_slot(local["target"])
        features["target_mask"] = tf.cast(predicted_position >= 0, tf.float32)
        return features

    return parse


def make_parser(config: InputConfig, permutation: PermutationFn):
    """The per-example function (example index, serialized record) -> feature dict (one example of
    make_batch_parser's batch)."""
    parse_batch = make_batch_parser(config)

    def parse(example_index: tf.Tensor, record: tf.Tensor) -> dict[str, tf.Tensor]:
        indices = tf.reshape(example_index, [1])
        features = parse_batch(record[None], permutation(indices, 0), permutation(indices, 1))
        return {key: value[0] for key, value in features.items()}

    return parse


def record_batches(record_info_dir: str, config: InputConfig, *, seed: int = 0,
                   permutation: Optional[PermutationFn] = None, repeat: bool = True, start: int = 0,
                   feed: Optional[cache_input.CacheFeed] = None) -> tf.data.Dataset:
    """What make_dataset parses, batch by batch: (serialized records [bsz_per_core], the two parts'
    permutations [bsz_per_core, perm_size] each), the permutations drawn for the batch's example indices.

    Parsing is row by row, so these rows can be regrouped before parsing (replica_batches splits the
    cores' batches into the replicas' this way) and give the same rows of features, without moving the
    features (perm_mask is seq_len^2 floats a row). Arguments as make_dataset's; `feed`: how a cache-backed
    source is generated (pretrain/cache_input.py).
    """
    records = find_records(record_info_dir, config)
    if not records.filenames and not records.cache_units:
        raise FileNotFoundError(f"no record files selected in {record_info_dir} (num_passes={config.num_passes})")
    if permutation is None:
        permutation = random_permutation(seed, config.perm_size)
    if records.cache_units:  # made from the token cache: the same records, from `start` on
        dataset = cache_input.generated_records(records.cache_units, config.bsz_per_host, repeat=repeat, start=start,
                                                feed=feed).enumerate(start)
    else:
        dataset = _read_records(records.filenames)
        if repeat:
            dataset = dataset.repeat()
        dataset = dataset.enumerate().skip(start)
    dataset = dataset.batch(config.bsz_per_core, drop_remainder=True)
    perm_shape = [config.bsz_per_core, config.perm_size]

    def with_permutations(indices, records):
        return (records, tf.ensure_shape(permutation(indices, 0), perm_shape),
                tf.ensure_shape(permutation(indices, 1), perm_shape))

    return dataset.map(as_written(with_permutations))


def as_written(fn):
    """A tf.data map function traced as written: its branches and loops are on Python values, never tensors, so
    AutoGraph's conversion (by default on every map function) would trace the same ops, at ~1.5 s of CPU a process
    (as the trainer's steps are traced: trainer.py)."""
    return tf.autograph.experimental.do_not_convert(fn)


# tf.data's autotuning model thread left off: freeing an iterator (a run's, each held-out evaluation's) waited for it
# with the CPU idle, up to its optimisation period (a minute), in TensorFlow 2.21 (gdb: ~RootDataset::Iterator waits
# on Model::OptimizeLoop). AUTOTUNE then means as many parallel calls as cores and prefetch's own growing buffer.
_WITHOUT_MODEL_THREAD = tf.data.Options()
_WITHOUT_MODEL_THREAD.autotune.enabled = False


def parse_batches(dataset: tf.data.Dataset, config: InputConfig) -> tf.data.Dataset:
    """record_batches' elements (or rows of them regrouped) -> feature batches (see the module doc).

    Everything per batch (a few dozen ops), nothing per example; parallel, in order, prefetched.
    """
    parse = make_batch_parser(config)
    dataset = dataset.map(as_written(parse), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(_WITHOUT_MODEL_THREAD)


def make_dataset(record_info_dir: str, config: InputConfig, *, seed: int = 0,
                 permutation: Optional[PermutationFn] = None, repeat: bool = True, start: int = 0) -> tf.data.Dataset:
    """Batches of training features (see the module doc), `config.bsz_per_core` examples each.

    record_info_dir: comma-separated record dirs (the original's `record_info_dir`).
    seed: seeds the default permutation (ignored when `permutation` is given).
    permutation: (example indices of a batch, part) -> a permutation of range(perm_size) per example;
      example indices count records from the start of the stream (repeats included).
    repeat: cycle through the records forever, as the original does.
    start: the index of the first example to use (to resume a run where it stopped); the
      skipped records are read but not parsed, and indices (so permutations) stay those of
      the whole stream.

    Batches keep the records' order, so batch k+1 continues the rows of batch k
    (with several cores, replica c gets batches c, c + n, ...) and memory carries over.
    """
    return parse_batches(record_batches(record_info_dir, config, seed=seed, permutation=permutation, repeat=repeat,
                                        start=start), config)


def fixed_permutation(first_part: np.ndarray, second_part: np.ndarray) -> PermutationFn:
    """A permutation function giving every example the same permutation per part.

    This is how the model goldens were made: features.npz `perm_rows_0` is the
    permutation of the first reuse_len positions, `perm_rows_1` that of the rest.
    """
    tables = (tf.constant(np.asarray(first_part, dtype=np.int64)),
              tf.constant(np.asarray(second_part, dtype=np.int64)))

    def permutation(example_indices: tf.Tensor, part: int) -> tf.Tensor:
        return tf.tile(tables[part][None], tf.stack([tf.size(example_indices), 1]))

    return permutation
