"""Issue 47: the permutation features made on the device (pretrain_torch/device_features.py) from what the host
ships (examples.shipped: rev_index, seq_len ints a row) are the host-made ones (examples.features, which
test_torch_examples holds to train_gpu's parser and the original's features) to the bit: on every create golden's
records, on random shapes from the seeded permutation stream (and test_torch_examples holds them to the model
goldens' features.npz)."""

import secrets

import numpy as np
import pytest
import torch
from conftest import GOLDEN, needs_shared
from test_cache_input import CASES, golden_config, input_config

from xlnet_data.dataformat import record_reader
from xlnet_data.dataformat.vocab import CLS_ID, SEP_ID
from xlnet_data.pretrain import config as C
from xlnet_data.pretrain import layout
from xlnet_data.pretrain_torch import device_features as DF
from xlnet_data.pretrain_torch import examples as E


def stacked(payloads):
    parsed = [record_reader.parse_example(payload) for payload in payloads]
    return {name: np.stack([example[name] for example in parsed]) for name in E.RECORD_FEATURES}


def assert_device_made_equal(records, indices, config, permutation, what):
    """on_device(shipped) against features: the same keys, dtypes, shapes and values; only rev_index shipped in
    their place."""
    host = E.features(records, indices, config, permutation)
    shipped = E.shipped(records, indices, config, permutation)
    assert set(shipped) == set(host) - {"perm_mask", "target_mapping"} | {"rev_index"}, what
    assert shipped["rev_index"].dtype == np.int32 and shipped["rev_index"].shape == host["input_k"].shape, what
    device = DF.on_device(shipped, torch.device("cpu"), config.num_predict)
    assert device.keys() == host.keys(), what
    for key, value in host.items():
        got = device[key].numpy()
        assert got.dtype == value.dtype and got.shape == value.shape, f"{what} {key}"
        np.testing.assert_array_equal(got, value, err_msg=f"{what} {key}")


@needs_shared
@pytest.mark.parametrize("case", CASES)
def test_device_made_features_are_the_hosts_on_every_create_golden(case):
    """Every record of the golden's expected records, a step at a time, each example its seeded permutation."""
    data = input_config(golden_config(case, "unused"))
    permutation = E.seeded_permutation(5, data.perm_size)
    first = 0
    for path in layout.find_records(str(GOLDEN / case / "expected" / "tfrecords"), data).filenames:
        payloads = [payload for _, _, payload in record_reader.read_records(path)]
        for start in range(0, len(payloads), data.bsz_per_host):
            rows = slice(start, start + data.bsz_per_host)
            indices = first + np.arange(len(payloads))[rows]
            assert_device_made_equal(stacked(payloads[rows]), indices, data, permutation, f"{path} records {rows}")
        first += len(payloads)


RUN_SEED = secrets.randbits(32)  # fresh random shapes each run; the message names it


@pytest.mark.parametrize("draw", range(8))
def test_device_made_features_are_the_hosts_on_random_shapes(draw):
    """Random seq_len, reuse_len, perm_size, bi_data, num_predict (or none), masks with <sep>/<cls>, stream
    indices anywhere (2**40 too) of a random seed's permutation stream."""
    seed = RUN_SEED + draw
    rng = np.random.default_rng(seed)
    reuse_len = 2 * int(rng.integers(1, 9))
    seq_len = reuse_len + 2 * int(rng.integers(1, 9))
    perm_size = int(rng.choice([d for d in range(1, reuse_len + 1) if reuse_len % d == 0 and seq_len % d == 0]))
    n = 2 * int(rng.integers(1, 4))
    is_masked = (rng.random((n, seq_len)) < rng.random()).astype(np.int64)
    # At least one prediction (InputConfig's rule), at least the most masked row's (a sparse mask can leave none).
    num_predict = None if draw % 4 == 0 else max(1, int(is_masked.sum(1).max()) + int(rng.integers(0, 3)))
    config = C.InputConfig(seq_len=seq_len, reuse_len=reuse_len, perm_size=perm_size, bsz_per_host=n,
                           num_predict=num_predict, bi_data=bool(rng.integers(2)))
    inputs = rng.integers(10, 1000, (n, seq_len))
    inputs[rng.random((n, seq_len)) < 0.1] = SEP_ID
    inputs[:, -1] = CLS_ID
    records = {"input": inputs, "target": rng.integers(10, 1000, (n, seq_len)),
               "seg_id": rng.integers(0, 2, (n, seq_len)), "is_masked": is_masked, "label": np.zeros((n, 1), int)}
    indices = rng.integers(0, 2**40, n)
    assert_device_made_equal(records, indices, config, E.seeded_permutation(int(rng.integers(2**62)), perm_size),
                             f"seed {seed}: {config}")


def test_the_host_ships_seq_len_ints_a_row():
    """At XLNet-Base's shape a row copied is 8.7 KiB (4 vectors of seq_len and the targets) instead of 1.2 MB."""
    config = C.InputConfig(seq_len=512, reuse_len=256, perm_size=256, bsz_per_host=2, num_predict=85, bi_data=True)
    rng = np.random.default_rng(0)
    is_masked = np.zeros((2, 512), int)
    is_masked[:, rng.permutation(512)[:80]] = 1
    records = {"input": rng.integers(10, 1000, (2, 512)), "target": rng.integers(10, 1000, (2, 512)),
               "seg_id": np.zeros((2, 512), int), "is_masked": is_masked, "label": np.zeros((2, 1), int)}
    permutation = E.seeded_permutation(0, 256)
    shipped = sum(value.nbytes for value in E.shipped(records, np.arange(2), config, permutation).values()) / 2
    host = sum(value.nbytes for value in E.features(records, np.arange(2), config, permutation).values()) / 2
    assert shipped == 4 * 512 * 4 + 2 * 85 * 4 + 4 and host > 1.2e6
