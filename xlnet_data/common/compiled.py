"""The compiled loops' decorator (`@compiled.jit()`) and numba's on-disk cache, keyed on the package's code.

numba checks a cached function only against its own file, but a function that calls compiled functions of
other files (loop._write_steps inlines records.put_record, masking.sample_mask, the rng draws, ...) or reads
their constants (vocab.CLS_ID) has their code built in: after those files change, the cache would go on
running their old code. So the cache lives in a folder named after a hash of every source file of the
package (wherever compiled code is moved, its code is in the key) and numba's version, under
NUMBA_CACHE_DIR, or else the user's cache folder (~/.cache/xlnet-data/numba/<hash>). numba reads its
CACHE_DIR setting when a function is decorated: it is set for that moment only, and the process's (a
caller's own numba functions) is left as it was.
"""

import hashlib
import os

import numba

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _source_files():
    """The package's .py files, relative to it, sorted."""
    found = []
    for folder, dirs, names in os.walk(_PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [os.path.relpath(os.path.join(folder, name), _PACKAGE) for name in names if name.endswith(".py")]
    return sorted(found)


def _cache_dir():
    digest = hashlib.sha256(numba.__version__.encode())
    for name in _source_files():
        with open(os.path.join(_PACKAGE, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read() + b"\0")
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "xlnet-data", "numba")
    return os.path.join(base, digest.hexdigest()[:16])


CACHE_DIR = _cache_dir()


def jit(**options):
    """numba.njit with the on-disk cache in CACHE_DIR."""
    def decorate(function):
        before = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = CACHE_DIR  # numba's cache locator reads it now, for this function
        try:
            return numba.njit(cache=True, **options)(function)
        finally:
            numba.config.CACHE_DIR = before
    return decorate
