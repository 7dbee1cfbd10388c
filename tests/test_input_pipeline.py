"""The training input pipeline: the original's features, exactly, and their invariants."""

import dataclasses
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED, needs_shared

from xlnet_data.dataformat import save_dir
from xlnet_data.dataformat.vocab import CLS_ID, SEP_ID
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import inputs as ip

FEATURE_KEYS = {"input_k", "input_q", "seg_id", "perm_mask", "target", "target_mask", "target_mapping", "label"}

# Model golden -> (create golden whose records it read, InputConfig fields beyond run_config.json).
GOLDEN_INPUTS = {
    "m1_bi_untied": ("g1_blog", dict(bsz_per_host=8, bi_data=True, uncased=True, num_predict=21)),
    "m2_uni_tied": ("g2_multitask", dict(bsz_per_host=4, bi_data=False, uncased=True, num_predict=10)),
    "m3_sharp": ("g5_seq512", dict(bsz_per_host=4, bi_data=True, uncased=False, num_predict=85)),
}


# ----- synthetic records ---------------------------------------------------------------------------

def _example(inputs, targets, seg_id, is_masked, label):
    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    return tf.train.Example(features=tf.train.Features(feature={
        "input": ints(inputs), "is_masked": ints(is_masked), "target": ints(targets),
        "seg_id": ints(seg_id), "label": ints([label])})).SerializeToString()


def _random_record(rng, seq_len, reuse_len, max_masked, first_token=None):
    """A record shaped like create's: mem + A <sep> B <sep> <cls>, next-token targets, some masked."""
    tokens = rng.integers(10, 1000, size=seq_len + 1)
    if first_token is not None:
        tokens[0] = first_token
    inputs, targets = tokens[:-1].copy(), tokens[1:].copy()
    cut = rng.integers(reuse_len + 2, seq_len - 4)
    for pos in (cut, seq_len - 2):
        inputs[pos] = SEP_ID
    inputs[seq_len - 1] = CLS_ID
    targets[seq_len - 2:] = CLS_ID
    seg_id = np.r_[np.zeros(cut + 1), np.ones(seq_len - cut - 2), [2]]
    is_masked = np.zeros(seq_len, dtype=int)
    # Half of the budget in each part; a <sep> may be masked too (the parser must not predict it).
    for lo, hi in ((0, reuse_len), (reuse_len, seq_len)):
        is_masked[rng.choice(np.arange(lo, hi), size=max_masked // 2, replace=False)] = 1
    return inputs, targets, seg_id, is_masked


def _write_records(path, records, gz):
    if gz:
        # A real gzip stream (like the goldens' .tfrecords.gz), not TF's writer option.
        plain = str(path) + ".tmp"
        with tf.io.TFRecordWriter(plain) as writer:
            for record in records:
                writer.write(record)
        with open(plain, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
            dst.write(src.read())
        os.remove(plain)
    else:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for record in records:
                writer.write(record)


SYN = C.InputConfig(seq_len=32, reuse_len=16, perm_size=8, bsz_per_host=4, num_predict=8, bi_data=False,
                    uncased=False)


def _make_record_dir(directory, config, task_passes, num_records, gz, tag, seed=0, max_masked=None):
    """Writes record files and their record_info files; max_masked tokens masked per record (default num_predict).

    Record r of (task, pass) starts with token tag*10000 + task*1000 + pass*100 + r, to check the order.
    """
    rng = np.random.default_rng(seed)
    (directory).mkdir(parents=True, exist_ok=True)
    for task, pass_id in task_passes:
        name = save_dir.RecordSettings.of(config).name(f"{config.split}-{task}-{pass_id}", "tfrecords")
        records = []
        for r in range(num_records):
            first = tag * 10000 + task * 1000 + pass_id * 100 + r
            masked = config.num_predict if max_masked is None else max_masked
            records.append(_example(*_random_record(rng, config.seq_len, config.reuse_len, masked, first_token=first),
                                    label=r % 2))
        _write_records(directory / name, records, gz)
        info = {"filenames": [f"somewhere/else/{name}"], "num_batch": num_records // config.bsz_per_host}
        with open(directory / ("record_info-" + name[:-len("tfrecords")] + "json"), "w") as fp:
            json.dump(info, fp)


def _first_tokens(dataset):
    return [int(v) for batch in dataset for v in batch["input_k"][:, 0].numpy()]


# ----- goldens -------------------------------------------------------------------------------------

def _golden_config(model_case):
    run = json.loads((SHARED / "golden_model" / model_case / "run_config.json").read_text())
    record_case, extra = GOLDEN_INPUTS[model_case]
    config = C.InputConfig(seq_len=run["seq_len"], reuse_len=run["reuse_len"], perm_size=run["perm_size"], **extra)
    assert config.bsz_per_core == run["bsz_per_core"] and config.num_predict == run["num_predict"]
    return config, str(SHARED / "golden" / record_case / "expected" / "tfrecords")


@needs_shared
@pytest.mark.parametrize("model_case", sorted(GOLDEN_INPUTS))
def test_golden_permutation_gives_the_original_features(model_case):
    config, record_dir = _golden_config(model_case)
    golden = np.load(SHARED / "golden_model" / model_case / "features.npz")
    permutation = ip.fixed_permutation(golden["perm_rows_0"], golden["perm_rows_1"])
    batches = list(ip.make_dataset(record_dir, config, permutation=permutation, repeat=False).take(2))
    assert len(batches) == 2
    for step, batch in enumerate(batches):
        assert set(batch) == FEATURE_KEYS
        for key, value in batch.items():
            want = golden[f"{key}_{step}"]
            assert value.dtype.as_numpy_dtype == want.dtype, key
            np.testing.assert_array_equal(value.numpy(), want, err_msg=f"{key}_{step}")


@needs_shared
def test_golden_records_with_random_permutations_keep_the_invariants():
    config, record_dir = _golden_config("m1_bi_untied")
    for batch in ip.make_dataset(record_dir, config, seed=3, repeat=False).take(2):
        _check_invariants(batch, config)


@needs_shared
def test_num_passes_selects_passes_in_the_g6_golden():
    directory = str(SHARED / "golden" / "g6_num_passes" / "expected" / "tfrecords")
    config = C.InputConfig(seq_len=64, reuse_len=32, perm_size=32, bsz_per_host=4, num_predict=10, bi_data=True)
    infos = sorted(Path(directory).glob("record_info-*.json"))
    batches = [json.loads(p.read_text())["num_batch"] for p in infos]
    every = ip.find_records(directory, config)
    two = ip.find_records(directory, dataclasses.replace(config, num_passes=2))
    assert [os.path.basename(f) for f in every.filenames] == [
        f"train-0-{p}.bsz-4.seqlen-64.reuse-32.bi.alpha-6.beta-1.fnp-10.tfrecords.gz" for p in range(3)]
    assert every.num_batch == sum(batches)
    assert two.filenames == every.filenames[:2] and two.num_batch == sum(batches[:2])


# ----- invariants ----------------------------------------------------------------------------------

def _check_invariants(batch, config):
    """What any permutation must give (brute force over one example at a time)."""
    seq_len, reuse_len = config.seq_len, config.reuse_len
    perm_mask = batch["perm_mask"].numpy()
    input_k, input_q = batch["input_k"].numpy(), batch["input_q"].numpy()
    mapping, target, target_mask = (batch[k].numpy() for k in ("target_mapping", "target", "target_mask"))
    for b in range(perm_mask.shape[0]):
        mask, tokens, predicted = perm_mask[b], input_k[b], input_q[b].astype(bool)
        func = (tokens == SEP_ID) | (tokens == CLS_ID)
        assert not (predicted & func).any(), "<sep>/<cls> are never predicted"

        # target_mapping: one-hot rows on the predicted positions, in order, then zero padding.
        n = int(predicted.sum())
        assert n <= config.num_predict
        assert set(np.unique(mapping[b])) <= {0.0, 1.0}
        np.testing.assert_array_equal(mapping[b].sum(axis=1), np.r_[np.ones(n), np.zeros(config.num_predict - n)])
        np.testing.assert_array_equal(mapping[b][:n].argmax(axis=1), np.flatnonzero(predicted))
        np.testing.assert_array_equal(target_mask[b], mapping[b].sum(axis=1))
        assert (target[b][n:] == 0).all()

        # The memory part never sees the rest; the rest sees all of the memory part.
        assert (mask[:reuse_len, reuse_len:] == 1).all()
        assert (mask[reuse_len:, :reuse_len] == 0).all()

        for part in (slice(0, reuse_len), slice(reuse_len, seq_len)):
            m, hidden = mask[part, part], (predicted | func)[part]
            # Ordinary tokens: seen by everyone, and see no masked/functional token.
            assert (m[:, ~hidden] == 0).all()
            assert (m[np.ix_(~hidden, hidden)] == 1).all()
            # Among masked/functional tokens "i sees j" is a strict total order (the
            # factorization order): no one sees a later-permuted one, predicted ones not themselves.
            sub = 1 - m[np.ix_(hidden, hidden)]
            off = ~np.eye(len(sub), dtype=bool)
            np.testing.assert_array_equal((sub + sub.T)[off], 1)
            rank = (sub * off).sum(axis=1)
            assert sorted(rank) == list(range(len(sub)))
            np.testing.assert_array_equal(np.diag(sub), ~predicted[part][hidden])


def _reference_perm_mask(tokens, is_masked, perm, perm_size):
    """perm_mask of one part from the definition: position b*P+o has factorization index b*P+perm[o]."""
    length = len(tokens)
    order = np.array([(i // perm_size) * perm_size + perm[i % perm_size] for i in range(length)])
    func = (tokens == SEP_ID) | (tokens == CLS_ID)
    predicted = is_masked & ~func
    hidden = predicted | func
    mask = np.zeros((length, length), dtype=np.float32)
    for i in range(length):
        for j in range(length):
            if not hidden[j]:
                continue  # ordinary tokens are visible to everyone
            if not hidden[i]:
                mask[i, j] = 1  # ordinary tokens see no masked/functional token
            elif i == j:
                mask[i, j] = float(predicted[i])  # a predicted token may not see itself
            else:
                mask[i, j] = float(order[i] < order[j])
    return mask


def test_injected_permutation_matches_the_definition(tmp_path):
    _make_record_dir(tmp_path, SYN, [(0, 0)], num_records=8, gz=False, tag=1)
    rng = np.random.default_rng(5)
    perms = [rng.permutation(SYN.perm_size), rng.permutation(SYN.perm_size)]
    raw = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(
        str(next(tmp_path.glob("*.tfrecords"))))]
    batch = next(iter(ip.make_dataset(str(tmp_path), SYN, permutation=ip.fixed_permutation(*perms), repeat=False)))
    for b in range(SYN.bsz_per_core):
        feature = raw[b].features.feature
        tokens = np.array(feature["input"].int64_list.value)
        masked = np.array(feature["is_masked"].int64_list.value).astype(bool)
        np.testing.assert_array_equal(batch["input_k"][b], tokens)
        for part, sl in enumerate((slice(0, SYN.reuse_len), slice(SYN.reuse_len, SYN.seq_len))):
            want = _reference_perm_mask(tokens[sl], masked[sl], perms[part], SYN.perm_size)
            np.testing.assert_array_equal(batch["perm_mask"][b].numpy()[sl, sl], want)


def _reference_features(record, perms, config):
    """One example's features as the original's parser builds them: each part's perm_mask, pasted with ones
    (the memory part never sees the rest) and zeros; each part's targets shifted on their own; the predicted
    positions gathered in order and zero-padded to num_predict (all positions without num_predict)."""
    feature = record.features.feature
    tokens, targets, seg_id, masked = (np.array(feature[key].int64_list.value)
                                       for key in ("input", "target", "seg_id", "is_masked"))
    masked = masked.astype(bool)
    seq_len, reuse_len = config.seq_len, config.reuse_len
    parts = (slice(0, reuse_len), slice(reuse_len, seq_len))
    masks = [_reference_perm_mask(tokens[part], masked[part], perm, config.perm_size) for part, perm in zip(parts, perms)]
    rest = seq_len - reuse_len
    perm_mask = np.block([[masks[0], np.ones((reuse_len, rest))], [np.zeros((rest, reuse_len)), masks[1]]])
    new_targets = np.concatenate([np.r_[tokens[part][:1], targets[part][:-1]] for part in parts])
    predicted = masked & (tokens != SEP_ID) & (tokens != CLS_ID)
    features = {"input_k": tokens, "input_q": predicted, "seg_id": seg_id, "perm_mask": perm_mask,
                "label": np.array(feature["label"].int64_list.value)}
    if config.num_predict is None:
        return {**features, "target": new_targets, "target_mask": predicted}
    positions = np.flatnonzero(predicted)
    mapping = np.zeros((config.num_predict, seq_len))
    mapping[np.arange(len(positions)), positions] = 1
    padding = np.zeros(config.num_predict - len(positions))
    return {**features, "target_mapping": mapping, "target": np.r_[new_targets[positions], padding],
            "target_mask": np.r_[np.ones(len(positions)), padding]}


@pytest.mark.parametrize("changes, max_masked", [
    ({}, 8),  # two blocks of perm_size per part, 4 of 16 masked per part
    (dict(perm_size=16, num_predict=2), 2),  # one block per part, 1 masked per part
    (dict(num_predict=32), 32),  # every token masked: no ordinary token in either part
    ({}, 0),  # nothing masked: nothing predicted
])
def test_seeded_features_are_the_originals_for_the_seeds_permutations(tmp_path, changes, max_masked):
    """make_dataset's features, example by example, are the original parser's for the permutations the seed
    draws for that batch (each example its own): what the batched computation (perm_mask gathered from its
    distinct rows, the predictions gathered by segment sums) must give exactly."""
    config = dataclasses.replace(SYN, **changes)
    _make_record_dir(tmp_path, config, [(0, 0)], num_records=12, gz=False, tag=1, max_masked=max_masked)
    raw = [tf.train.Example.FromString(r.numpy())
           for r in tf.data.TFRecordDataset(str(next(tmp_path.glob("*.tfrecords"))))]
    seed, start = 11, 4
    permutation = ip.random_permutation(seed, config.perm_size)
    batches = list(ip.make_dataset(str(tmp_path), config, seed=seed, repeat=False, start=start))
    assert len(batches) == 2
    parse_all_positions = ip.make_batch_parser(dataclasses.replace(config, num_predict=None))
    for k, batch in enumerate(batches):
        indices = tf.range(start + k * config.bsz_per_core, start + (k + 1) * config.bsz_per_core, dtype=tf.int64)
        perms = [permutation(indices, part).numpy() for part in (0, 1)]
        records = [raw[i] for i in indices.numpy()]
        per_position = parse_all_positions(tf.constant([r.SerializeToString() for r in records]), *perms)
        for b, record in enumerate(records):
            want = _reference_features(record, (perms[0][b], perms[1][b]), config)
            for key, value in batch.items():
                np.testing.assert_array_equal(value[b].numpy(), want[key], err_msg=f"batch {k} example {b} {key}")
            want = _reference_features(record, (perms[0][b], perms[1][b]), dataclasses.replace(config, num_predict=None))
            for key in ("target", "target_mask"):
                np.testing.assert_array_equal(per_position[key][b].numpy(), want[key], err_msg=f"{key} without num_predict")


def test_random_permutations_keep_the_invariants_and_are_reproducible(tmp_path):
    _make_record_dir(tmp_path, SYN, [(0, 0)], num_records=16, gz=False, tag=1)
    first = list(ip.make_dataset(str(tmp_path), SYN, seed=7, repeat=False))
    again = list(ip.make_dataset(str(tmp_path), SYN, seed=7, repeat=False))
    other = list(ip.make_dataset(str(tmp_path), SYN, seed=8, repeat=False))
    assert len(first) == 4
    for batch in first:
        _check_invariants(batch, SYN)
        # The model predicts the current token: the record's target shifted by one.
        predicted = batch["target_mapping"].numpy().argmax(axis=2)
        want = np.take_along_axis(batch["input_k"].numpy(), predicted, axis=1) * batch["target_mask"].numpy()
        np.testing.assert_array_equal(batch["target"].numpy(), want)
    masks = np.concatenate([b["perm_mask"].numpy() for b in first])
    np.testing.assert_array_equal(masks, np.concatenate([b["perm_mask"].numpy() for b in again]))
    assert not np.array_equal(masks, np.concatenate([b["perm_mask"].numpy() for b in other]))
    # Different examples (and parts) get different permutations.
    assert len({masks[i, :16, :16].tobytes() for i in range(len(masks))}) > 1


def test_without_num_predict_targets_are_per_position(tmp_path):
    config = dataclasses.replace(SYN, num_predict=None)
    _make_record_dir(tmp_path, SYN, [(0, 0)], num_records=4, gz=False, tag=1)
    # The files are named with fnp-8; look them up with that name, parse without num_predict.
    records = ip.find_records(str(tmp_path), SYN)
    parse = ip.make_parser(config, ip.random_permutation(0, config.perm_size))
    record = next(iter(tf.data.TFRecordDataset(list(records.filenames))))
    features = parse(tf.constant(0, tf.int64), record)
    assert "target_mapping" not in features
    assert features["target"].shape == [32] and features["target_mask"].shape == [32]
    np.testing.assert_array_equal(features["target_mask"], features["input_q"])


def test_more_predictions_than_num_predict_is_a_clear_error():
    rng = np.random.default_rng(0)
    record = _example(*_random_record(rng, SYN.seq_len, SYN.reuse_len, max_masked=8), label=0)
    parse = ip.make_parser(dataclasses.replace(SYN, num_predict=2), ip.random_permutation(0, SYN.perm_size))
    with pytest.raises(tf.errors.InvalidArgumentError, match="more predicted tokens than num_predict"):
        parse(tf.constant(0, tf.int64), tf.constant(record))


# ----- files, passes, order ------------------------------------------------------------------------

def test_dirs_passes_gzip_and_stream_order(tmp_path):
    passes = [(0, 0), (0, 1), (1, 0), (1, 1)]
    _make_record_dir(tmp_path / "a", SYN, passes, num_records=8, gz=True, tag=1)
    _make_record_dir(tmp_path / "b", SYN, passes, num_records=4, gz=False, tag=2, seed=1)
    dirs = f"{tmp_path / 'a'},{tmp_path / 'b'}"

    every = ip.find_records(dirs, SYN)
    assert [Path(f).parent.name for f in every.filenames] == ["a"] * 4 + ["b"] * 4
    assert every.filenames[0].endswith(".tfrecords.gz") and every.filenames[-1].endswith(".tfrecords")
    assert every.num_batch == 4 * 2 + 4 * 1

    config = dataclasses.replace(SYN, num_passes=1)
    chosen = ip.find_records(dirs, config)
    assert ["-0.bsz" in os.path.basename(f) for f in chosen.filenames] == [True] * 4
    assert chosen.num_batch == 2 * 2 + 2 * 1

    # Stream order, file after file, records consecutive, batches of bsz_per_core.
    tokens = _first_tokens(ip.make_dataset(dirs, config, repeat=False))
    want = ([10000 + r for r in range(8)] + [11000 + r for r in range(8)]
            + [20000 + r for r in range(4)] + [21000 + r for r in range(4)])
    assert tokens == want
    # Repeating cycles through the same stream.
    cycled = _first_tokens(ip.make_dataset(dirs, config).take(2 * len(want) // SYN.bsz_per_core))
    assert cycled == want + want


def test_batch_is_per_core_and_drops_the_remainder(tmp_path):
    _make_record_dir(tmp_path, SYN, [(0, 0)], num_records=10, gz=False, tag=1)
    config = dataclasses.replace(SYN, num_core_per_host=2)
    batches = list(ip.make_dataset(str(tmp_path), config, repeat=False))
    assert [b["input_k"].shape[0] for b in batches] == [2] * 5
    config = dataclasses.replace(SYN, bsz_per_host=4)
    assert len(list(ip.make_dataset(str(tmp_path), config, repeat=False))) == 2  # 10 records: 2 batches of 4


def test_the_features_pipeline_runs_without_tf_data_s_autotuning_thread(tmp_path):
    """Freeing an iterator waited for that thread, up to a minute with the CPU idle (TensorFlow 2.21): a training
    run's, each held-out evaluation's. parse_batches, which every features pipeline ends with, leaves it off."""
    _make_record_dir(tmp_path, SYN, [(0, 0)], num_records=4, gz=False, tag=1)
    dataset = ip.make_dataset(str(tmp_path), SYN)
    assert dataset.options().autotune.enabled is False
    assert tf.data.Dataset.range(1).options().autotune.enabled is not False  # TensorFlow's default is on


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="record_info-train-"):
        ip.find_records(str(tmp_path), SYN)
    _make_record_dir(tmp_path, SYN, [(0, 0)], num_records=4, gz=False, tag=1)
    data_file = next(tmp_path.glob("*.tfrecords"))
    data_file.unlink()
    with pytest.raises(FileNotFoundError, match=data_file.name):
        ip.find_records(str(tmp_path), SYN)


@pytest.mark.parametrize("changes, message", [
    (dict(perm_size=12), "must divide"),
    (dict(perm_size=32), "perm_size"),
    (dict(reuse_len=32), "reuse_len"),
    (dict(num_core_per_host=3), "num_core_per_host"),
])
def test_config_rejects_inconsistent_sizes(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SYN, **changes)
