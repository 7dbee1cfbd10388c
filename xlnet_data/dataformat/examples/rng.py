"""MT19937 in compiled code, drawing exactly what numpy's legacy RandomState and Python's `random` draw.

The original draws masks from numpy's global generator and A/B decisions from Python's `random`;
both are MT19937. Seeding stays with the libraries (`RandomState(s)`, `random.Random(s)`); their state
is copied into an int64 array of 625 slots (624 words, then the position) that the compiled
pairing and masking code advances, and that can be read back.
"""

import random

import numpy as np

from xlnet_data.common import compiled

_N, _M = 624, 397


def numpy_state(random_state):
    """A state array continuing `random_state` (a numpy RandomState)."""
    _, key, pos, _, _ = random_state.get_state(legacy=True)
    return np.append(key.astype(np.int64), pos)


def python_state(seed):
    """A state array equal to `random.seed(seed)`'s generator."""
    return np.array(random.Random(seed).getstate()[1], dtype=np.int64)


@compiled.jit()
def _twist(mt):
    """The next block of 624 words, in three runs without modulo, the matrix term multiplied in rather than
    branched on (its bit is random): 3x faster than the textbook loop."""
    for i in range(_N - _M):
        y = (mt[i] & 0x80000000) | (mt[i + 1] & 0x7FFFFFFF)
        mt[i] = mt[i + _M] ^ (y >> 1) ^ ((y & 1) * 0x9908B0DF)
    for i in range(_N - _M, _N - 1):
        y = (mt[i] & 0x80000000) | (mt[i + 1] & 0x7FFFFFFF)
        mt[i] = mt[i + _M - _N] ^ (y >> 1) ^ ((y & 1) * 0x9908B0DF)
    y = (mt[_N - 1] & 0x80000000) | (mt[0] & 0x7FFFFFFF)
    mt[_N - 1] = mt[_M - 1] ^ (y >> 1) ^ ((y & 1) * 0x9908B0DF)
    mt[_N] = 0


@compiled.jit(inline="always")
def next_uint32(mt):
    if mt[_N] >= _N:
        _twist(mt)
    y = mt[mt[_N]]
    mt[_N] += 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y & 0xFFFFFFFF


@compiled.jit(inline="always")
def next_double(mt):
    """numpy's random_sample() and Python's random.random(): 53 bits from two words."""
    a = next_uint32(mt) >> 5
    b = next_uint32(mt) >> 6
    return (a * 67108864.0 + b) / 9007199254740992.0


@compiled.jit(inline="always")
def numpy_randint(mt, n):
    """numpy legacy `randint(0, n)` (also `choice(n)`), 1 <= n <= 2**32: masked rejection, no draw for n == 1."""
    rng = n - 1
    if rng == 0:
        return 0
    mask = rng
    for shift in (1, 2, 4, 8, 16):
        mask |= mask >> shift
    while True:
        val = next_uint32(mt) & mask
        if val <= rng:
            return val


@compiled.jit(inline="always")
def _bit_length(n):
    k = 0
    while n:
        n >>= 1
        k += 1
    return k


@compiled.jit(inline="always")
def python_randbelow(mt, n):
    """Python's `Random._randbelow(n)` for 1 <= n < 2**63: getrandbits(n.bit_length()) until below n."""
    k = _bit_length(n)
    while True:
        if k <= 32:
            r = next_uint32(mt) >> (32 - k)
        else:  # getrandbits fills 32-bit words from the least significant end
            low = next_uint32(mt)
            r = low | ((next_uint32(mt) >> (64 - k)) << 32)
        if r < n:
            return r
