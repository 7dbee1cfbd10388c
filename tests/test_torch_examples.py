"""The PyTorch trainer's examples and data streams (pretrain_torch/examples.py, data.py), made with numpy: feature for
feature train_gpu's parser's (pretrain/inputs.py) for the same permutations, on every create golden; from the token
cache as from the records; each replica's rows as train_gpu's replica_batches; the mixing schedule; a resume."""

import dataclasses
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch
from conftest import GOLDEN, ROOT, SHARED, needs_shared
from test_cache_input import CASES, golden_config, input_config
from test_input_pipeline import GOLDEN_INPUTS

from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import record_reader
from xlnet_data.datagen.job import create_records
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import inputs as ip
from xlnet_data.pretrain import layout, sources, training
from xlnet_data.pretrain.resume import ResumedState
from xlnet_data.pretrain_torch import data as D
from xlnet_data.pretrain_torch import device_features
from xlnet_data.pretrain_torch import examples as E


def tf_permutation(permutation):
    """A numpy PermutationFn as train_gpu's (tensors in and out), to give both pipelines the same permutations."""
    return lambda indices, part: tf.numpy_function(lambda i: permutation(i, part), [indices], tf.int64)


def stacked(payloads):
    parsed = [record_reader.parse_example(payload) for payload in payloads]
    return {name: np.stack([example[name] for example in parsed]) for name in E.RECORD_FEATURES}


def assert_same_features(got, want, what=""):
    assert got.keys() == want.keys(), what
    for key, value in want.items():
        value = value.numpy() if hasattr(value, "numpy") else value
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, f"{what} {key}"
        np.testing.assert_array_equal(got[key], value, err_msg=f"{what} {key}")


# ----- the examples ---------------------------------------------------------------------------------

@needs_shared
@pytest.mark.parametrize("case", CASES)
def test_the_examples_are_train_gpus_parsers_on_every_create_golden(case):
    """The golden's expected records, read with its flags: its first two steps and its last (every record file),
    each example with its own seeded permutation, against inputs.py's batch parser given the same permutations."""
    data = input_config(golden_config(case, "unused"))
    found = layout.find_records(str(GOLDEN / case / "expected" / "tfrecords"), data)
    permutation = E.seeded_permutation(11, data.perm_size)
    parse = ip.make_batch_parser(data)
    first = 0
    for path in found.filenames:
        payloads = [payload for _, _, payload in record_reader.read_records(path)]
        bsz = data.bsz_per_host
        for rows in (slice(0, 2 * bsz), slice(len(payloads) - bsz, len(payloads))):
            indices = first + np.arange(len(payloads))[rows]
            got = E.features(stacked(payloads[rows]), indices, data, permutation)
            want = parse(tf.constant(payloads[rows]), permutation(indices, 0), permutation(indices, 1))
            assert_same_features(got, want, f"{os.path.basename(path)} records {rows}")
        first += len(payloads)


@needs_shared
@pytest.mark.parametrize("model_case", sorted(GOLDEN_INPUTS))
def test_the_model_goldens_permutation_gives_the_originals_features(model_case):
    """features.npz: the original input pipeline's own output for its permutation (fixed_permutation), made on the
    host and on the device."""
    golden = np.load(SHARED / "golden_model" / model_case / "features.npz")
    record_case, extra = GOLDEN_INPUTS[model_case]
    data = dataclasses.replace(input_config(golden_config(record_case, "unused")), **extra,
                               perm_size=int(golden["perm_rows_0"].size))
    (path,) = layout.find_records(str(GOLDEN / record_case / "expected" / "tfrecords"), data).filenames
    payloads = [payload for _, _, payload in record_reader.read_records(path)][:2 * data.bsz_per_host]
    permutation = E.fixed_permutation(golden["perm_rows_0"], golden["perm_rows_1"])
    for step in range(2):
        rows = slice(step * data.bsz_per_host, (step + 1) * data.bsz_per_host)
        got = E.features(stacked(payloads[rows]), np.arange(rows.start, rows.stop), data, permutation)
        assert_same_features(got, {key: golden[f"{key}_{step}"] for key in got}, f"step {step}")
        # and made on the device from what the trainer ships (issue 47; test_torch_device_features)
        shipped = E.shipped(stacked(payloads[rows]), np.arange(rows.start, rows.stop), data, permutation)
        made = device_features.on_device(shipped, torch.device("cpu"), data.num_predict)
        assert_same_features({key: value.numpy() for key, value in made.items()}, {key: golden[f"{key}_{step}"]
                                                                                  for key in made}, f"step {step}")


def test_without_num_predict_the_targets_are_per_position_as_train_gpus():
    rng = np.random.default_rng(3)
    config = C.InputConfig(seq_len=16, reuse_len=8, perm_size=4, bsz_per_host=3, bi_data=False)
    records = {"input": rng.integers(10, 100, (3, 16)), "target": rng.integers(10, 100, (3, 16)),
               "seg_id": rng.integers(0, 2, (3, 16)), "is_masked": rng.integers(0, 2, (3, 16)),
               "label": np.zeros((3, 1), np.int64)}
    records["input"][:, [5, 15]] = [4, 3]  # a <sep> and a <cls>, maybe masked: never predicted
    permutation = E.seeded_permutation(0, 4)
    indices = np.arange(7, 10)
    payloads = [tf.train.Example(features=tf.train.Features(feature={
        name: tf.train.Feature(int64_list=tf.train.Int64List(value=values[b])) for name, values in records.items()}))
        .SerializeToString() for b in range(3)]
    want = ip.make_batch_parser(config)(tf.constant(payloads), permutation(indices, 0), permutation(indices, 1))
    assert_same_features(E.features(records, indices, config, permutation), want)


def test_more_predictions_than_num_predict_is_one_line():
    config = C.InputConfig(seq_len=8, reuse_len=4, perm_size=4, bsz_per_host=1, num_predict=2, bi_data=False)
    records = {"input": np.full((1, 8), 20), "target": np.full((1, 8), 20), "seg_id": np.zeros((1, 8), int),
               "is_masked": np.ones((1, 8), int), "label": np.zeros((1, 1), int)}
    with pytest.raises(UserError, match=r"^example 5 of the stream predicts 8 tokens, more than num_predict=2: give "
                                        "the num_predict the records were made with$"):
        E.features(records, np.array([5]), config, E.seeded_permutation(0, 4))


def test_the_seeded_permutations_are_a_function_of_seed_index_and_part():
    permutation = E.seeded_permutation(7, 16)
    whole = permutation(np.arange(40), 0)
    assert whole.shape == (40, 16) and whole.dtype == np.int64
    np.testing.assert_array_equal(np.sort(whole, axis=1), np.broadcast_to(np.arange(16), (40, 16)))
    # Whichever batch (or replica, or resumed run) asks for an example, it gets the same permutation.
    np.testing.assert_array_equal(permutation(np.array([33, 2, 17]), 0), whole[[33, 2, 17]])
    np.testing.assert_array_equal(E.seeded_permutation(7, 16)(np.array([2**40 + 5]), 1),
                                  permutation(np.array([2**40, 2**40 + 5]), 1)[1:])
    # Another part, another seed: other permutations; examples differ from each other.
    assert not np.array_equal(permutation(np.arange(40), 1), whole)
    assert not np.array_equal(E.seeded_permutation(8, 16)(np.arange(40), 0), whole)
    assert len({row.tobytes() for row in whole}) == 40
    # Roughly uniform: each value lands in each slot about equally often.
    counts = np.zeros((16, 16))
    many = permutation(np.arange(8000), 1)
    np.add.at(counts, (np.broadcast_to(np.arange(16), many.shape), many), 1)
    assert counts.min() > 400 and counts.max() < 600  # 500 expected, sd 22


def test_perm_mask_is_a_comparison_of_the_ranks():
    """What issue 47 builds on the device: perm_mask from the two ranks vectors alone (examples.ranks)."""
    config = C.InputConfig(seq_len=16, reuse_len=8, perm_size=4, bsz_per_host=2, num_predict=4, bi_data=False)
    permutation = E.seeded_permutation(1, 4)
    indices = np.array([0, 1])
    ranks = E.ranks((permutation(indices, 0), permutation(indices, 1)), config)
    assert sorted(ranks[0, :8]) == list(range(8)) and sorted(ranks[0, 8:]) == list(range(16, 24))
    records = {"input": np.full((2, 16), 30), "target": np.full((2, 16), 31), "seg_id": np.zeros((2, 16), int),
               "is_masked": np.zeros((2, 16), int), "label": np.zeros((2, 1), int)}
    records["is_masked"][:, [1, 2, 9]] = 1
    mask = E.features(records, indices, config, permutation)["perm_mask"]
    hidden = ranks[0, [1, 2]]  # two predicted tokens of the memory part: the later one sees the earlier one
    assert mask[0, 1, 2] == float(hidden[0] <= hidden[1]) and mask[0, 2, 1] == float(hidden[1] <= hidden[0])
    assert mask[0, 1, 1] == 1 and mask[0, 0, 1] == 1 and mask[0, 1, 0] == 0


# ----- the streams ----------------------------------------------------------------------------------

def train_config(record_dir, data, **changes):
    return C.TrainConfig(record_info_dir=str(record_dir), model_dir="unused", model=C.XLNetConfig(),
                         run=C.RunConfig(reuse_len=data.reuse_len, bi_data=data.bi_data), data=data, **changes)


@pytest.fixture(scope="module")
def g6_dirs(tmp_path_factory):
    """g6's flags (bi_data, seq 64, two of its passes: two units) on its input: a cache-backed save_dir
    (create --nowrite_records) and one with records."""
    if not GOLDEN.is_dir():
        pytest.skip("../shared (goldens) is absent")
    made = {}
    for kind, write in (("cache", False), ("records", True)):
        folder = tmp_path_factory.mktemp(f"g6_{kind}")
        config = golden_config("g6_num_passes", folder, write_records=write, num_passes=2)
        create_records(config, num_workers=1)
        made[kind] = (str(folder), input_config(config))
    return made


def take(source, steps):
    try:
        return [source.next_batch() for _ in range(steps)]
    finally:
        source.close()


@needs_shared
def test_the_token_cache_gives_the_records_batches_and_resumes_from_its_position(g6_dirs):
    cache, data = g6_dirs["cache"]
    records, _ = g6_dirs["records"]
    cfg = train_config(cache, data, seed=4)
    per_unit = layout.find_records(D.tfrecords_folders(records), data).num_batch // 2
    start = per_unit - 2  # over the end of the first unit into the second
    want = take(D.ReplicaSource(records, cfg, 2, 1, start_step=start), 5)
    cached = D.ReplicaSource(cache, cfg, 2, 1, start_step=start, prefetch=1)
    got = [cached.next_batch() for _ in range(3)]
    position = cached.position()
    cached.close()
    assert position.step == start + 3 and position.generated is not None and position.generated.step <= start + 3
    for step, (a, b) in enumerate(zip(got, want)):
        assert_same_features(a, b, f"step {start + step}")
    resumed = D.ReplicaSource(cache, cfg, 2, 1, start_step=position.step, resume=position.generated)
    for step, (a, b) in enumerate(zip(take(resumed, 2), want[3:])):
        assert_same_features(a, b, f"resumed step {position.step + step}")


# (golden case, num_replicas): g1 bi_data one core, g3 bi_data two cores (TPU layout), g2 uni-directional.
REPLICA_CASES = [("g1_blog", 1), ("g1_blog", 2), ("g3_tpu_cores", 2), ("g3_tpu_cores", 4), ("g2_multitask", 2)]


@needs_shared
@pytest.mark.parametrize("case, num_replicas", REPLICA_CASES)
def test_each_replicas_rows_are_train_gpus_replica_batches(case, num_replicas):
    """Replica r's batch of step s (from start_step on, as a resumed run starts) is train_gpu's replica_batches'
    element s * num_replicas + r, feature for feature, for the same permutations."""
    data = input_config(golden_config(case, "unused"))
    record_dir = str(GOLDEN / case / "expected")
    cfg = train_config(record_dir, data, seed=2)
    permutation = E.seeded_permutation(9, data.perm_size)
    start, steps = 3, 2
    want = iter(sources.replica_batches(str(Path(record_dir, "tfrecords")), cfg, num_replicas, start_step=start,
                                        permutation=tf_permutation(permutation)))
    want = [[next(want) for _ in range(num_replicas)] for _ in range(steps)]
    for replica in range(num_replicas):
        got = take(D.ReplicaSource(record_dir, cfg, num_replicas, replica, start_step=start, permutation=permutation),
                   steps)
        for step in range(steps):
            assert_same_features(got[step], want[step][replica], f"step {start + step} replica {replica}")


@needs_shared
def test_a_resumed_stream_is_the_uninterrupted_one_over_the_end_of_the_records():
    """start_step past a whole cycle of the files (the stream repeats) and into a later file (g6: three)."""
    case = "g6_num_passes"
    data = input_config(golden_config(case, "unused"))
    record_dir = str(GOLDEN / case / "expected")
    cfg = train_config(record_dir, data, seed=1)
    per_file = layout.find_records(D.tfrecords_folders(record_dir), data).num_batch // 3
    whole = D.ReplicaSource(record_dir, cfg, 2, 0, start_step=per_file - 1, workers=2)
    uninterrupted = take(whole, 3)
    for start in (per_file, per_file + 1, 4 * per_file):  # 4 * per_file: the second cycle's second file
        resumed = take(D.ReplicaSource(record_dir, cfg, 2, 0, start_step=start), 1)[0]
        want = uninterrupted[min(start, per_file + 1) - per_file + 1]
        if start == 4 * per_file:  # the same records as step per_file, other permutations (other indices)
            np.testing.assert_array_equal(resumed["input_k"], uninterrupted[1]["input_k"])
            assert not np.array_equal(resumed["perm_mask"], uninterrupted[1]["perm_mask"])
        else:
            assert_same_features(resumed, want, f"step {start}")


@needs_shared
def test_two_mixed_sources_take_train_gpus_schedule_and_batches(g6_dirs):
    """Records and a cache-backed save_dir mixed (--mix_sampling_factor): data.open_sources draws train_gpu's
    source for every step, and the steps from a resume at step 5 give training.open_sources' batches."""
    cache, data = g6_dirs["cache"]
    records, _ = g6_dirs["records"]
    cfg = train_config(f"{records},{cache}", data, seed=6, mix_sampling_factor=0.5, train_steps=40)
    permutation = E.seeded_permutation(3, data.perm_size)
    start = 5
    trainer = types.SimpleNamespace(strategy=tf.distribute.OneDeviceStrategy("/cpu:0"), initial_mems=lambda: None)
    tf_cfg = layout.in_tfrecords_folders(cfg)
    tf_sources, tf_schedule, tf_probs = training.open_sources(tf_cfg, trainer, start, tf_permutation(permutation),
                                                              ResumedState())
    ours, schedule, probs = D.open_sources(cfg, 1, 0, start, permutation)
    try:
        np.testing.assert_array_equal(schedule, tf_schedule)
        np.testing.assert_array_equal(probs, tf_probs)
        assert 0 < schedule[:start + 8].sum() < start + 8  # both sources are read
        assert [s.position().step for s in ours] == [s.position for s in tf_sources]
        for step in range(start, start + 8):
            i = schedule[step]
            assert_same_features(ours[i].next_batch(), next(tf_sources[i].batches), f"step {step} source {i}")
    finally:
        for source in ours:
            source.close()


@needs_shared
def test_damaged_or_missing_records_are_one_line(tmp_path):
    case = "g2_multitask"
    data = input_config(golden_config(case, "unused"))
    shutil.copytree(GOLDEN / case / "expected", tmp_path / "s")
    (path,) = (tmp_path / "s" / "tfrecords").glob("*.tfrecords.gz")
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) // 2])  # cut short: the records before the cut are read, then one line
    source = D.ReplicaSource(str(tmp_path / "s"), train_config(tmp_path / "s", data), 1, 0)
    with pytest.raises(record_reader.RecordError, match=r"^\S*\.tfrecords\.gz: record \d+ \(byte \d+\): the gzip "
                                                        "stream is truncated"):
        for _ in range(200):
            source.next_batch()
    with pytest.raises(record_reader.RecordError, match="the gzip stream is truncated"):
        source.next_batch()  # again, not a wait for batches that will never come
    source.close()
    with pytest.raises(UserError, match="no record_info file matches"):
        D.ReplicaSource(str(tmp_path / "none"), train_config(tmp_path / "none", data), 1, 0)


def test_no_tensorflow_on_the_data_path():
    code = ("import sys, xlnet_data.pretrain_torch.data; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'torch')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["[]"], result.stderr[-2000:]
