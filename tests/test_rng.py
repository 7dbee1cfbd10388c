"""The compiled MT19937 draws exactly what numpy's legacy RandomState and Python's random draw (SPEC §7)."""

import random

import numpy as np
import pytest

from xlnet_data.dataformat.examples import rng
from xlnet_data.dataformat.examples.masking import ngram_cdf


@pytest.mark.parametrize("seed", [0, 1, 101, 12345])
def test_numpy_draws_continue_the_random_state(seed):
    state = np.random.RandomState(seed)
    state.permutation(7)  # the file order is drawn first, by numpy itself
    mt = rng.numpy_state(state)
    for n in [1, 2, 3, 5, 6, 7, 30, 64, 100, 1000, 2**31 + 5]:
        for _ in range(40):
            assert rng.numpy_randint(mt, n) == state.randint(0, n)
    for _ in range(200):
        assert rng.next_double(mt) == state.random_sample()
    pvals = 1.0 / np.arange(1, 6)
    pvals /= pvals.sum(keepdims=True)
    cdf = ngram_cdf()
    for _ in range(200):
        assert np.searchsorted(cdf, rng.next_double(mt), side="right") + 1 == state.choice(np.arange(1, 6), p=pvals)
    assert rng.numpy_randint(mt, 50) == state.choice(50)


@pytest.mark.parametrize("seed", [0, 1, 101, 12345])
def test_python_draws_equal_random_seed(seed):
    reference = random.Random(seed)
    mt = rng.python_state(seed)
    for n in [1, 2, 3, 7, 100, 2**32 - 1, 2**32, 2**33 + 7, 2**40 + 3]:
        for _ in range(30):
            assert rng.python_randbelow(mt, n) == reference.randrange(n)
    for _ in range(100):
        assert rng.next_double(mt) == reference.random()
    cut_points = [5, 9, 17]
    assert cut_points[rng.python_randbelow(mt, 3)] == reference.choice(cut_points)
    assert rng.python_randbelow(mt, 1000 - 1 + 1) == reference.randint(0, 1000 - 1)
