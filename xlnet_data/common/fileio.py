"""Local and remote (`gs://` and other tf.io.gfile) paths behind one small surface, with atomic writes.

Local paths use the standard library (faster, no TensorFlow import); a path with a scheme goes
through tf.io.gfile. Writes go to a temporary name in the same directory and are renamed when
complete, so a reader never sees a half-written file under its final name.
"""

import contextlib
import glob as _glob
import io
import os
import uuid

TMP_MARK = ".tmp-"


def is_remote(path):
    return "://" in str(path)


def _gfile():
    import tensorflow as tf  # only remote paths need it
    return tf.io.gfile


def glob(pattern):
    return sorted(_gfile().glob(pattern) if is_remote(pattern) else _glob.glob(pattern))


def exists(path):
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def makedirs(path):
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def remove(path):
    if is_remote(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def size(path):
    return _gfile().stat(path).length if is_remote(path) else os.path.getsize(path)


def modified_ns(path):
    """The file's modification time in nanoseconds (with its size, how a token cache recognises its inputs)."""
    return _gfile().stat(path).mtime_nsec if is_remote(path) else os.stat(path).st_mtime_ns


def open_read(path):
    """A binary file object for reading."""
    return _gfile().GFile(path, "rb") if is_remote(path) else open(path, "rb")


def read_text(path):
    with open_read(path) as f:
        return f.read().decode("utf-8")


def temp_path_for(path):
    """A temporary name beside `path`; files with TMP_MARK in their name are never complete outputs."""
    head, tail = (path.rsplit("/", 1) if "/" in path else ("", path))
    name = f"{TMP_MARK}{uuid.uuid4().hex[:8]}-{tail}"
    return f"{head}/{name}" if head else name


@contextlib.contextmanager
def atomic_write(path):
    """Yields a binary file object; the data appears under `path` only if the block completes."""
    tmp = temp_path_for(path)
    f = _gfile().GFile(tmp, "wb") if is_remote(path) else open(tmp, "wb")
    try:
        with f:
            yield f
        if is_remote(path):
            _gfile().rename(tmp, path, overwrite=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError, Exception):
            remove(tmp)
        raise


def write_array(f, array):
    """Writes a contiguous numpy array's bytes to a file of atomic_write: a local file takes the
    array's buffer as it is (no copy); tf.io.gfile takes only bytes."""
    f.write(memoryview(array).cast("B") if isinstance(f, io.IOBase) else array.tobytes())


def write_text_atomic(path, text):
    with atomic_write(path) as f:
        f.write(text.encode("utf-8"))
