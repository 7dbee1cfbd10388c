"""Local and remote (`gs://` and other tf.io.gfile) paths behind one small surface, with atomic writes.

Local paths use the standard library (faster, no TensorFlow import); a path with a scheme goes
through tf.io.gfile. Writes go to a temporary name in the same directory and are renamed when
complete, so a reader never sees a half-written file under its final name.
"""

import contextlib
import glob as _glob
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


def naming(err: OSError, path) -> OSError:
    """`err` with `path` as its file name when it has none (a failed write or close names no file)."""
    if err.filename is not None:
        return err
    named = OSError(err.errno, err.strerror or str(err), str(path))  # the errno's subclass, e.g. PermissionError
    named.__traceback__ = err.__traceback__
    return named


@contextlib.contextmanager
def atomic_write(path):
    """Yields a binary file object; the data appears under `path` only if the block completes.

    On any exception (a signal's included) the temporary file is removed; an OSError that names no
    file (disk full on a write or on close) is raised naming `path`.
    """
    tmp = temp_path_for(path)
    try:
        f = _gfile().GFile(tmp, "wb") if is_remote(path) else open(tmp, "wb")
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        with f:
            yield f
        if is_remote(path):
            _gfile().rename(tmp, path, overwrite=True)
        else:
            os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError, Exception):
            remove(tmp)
        if isinstance(err, OSError):
            raise naming(err, path) from None
        raise


def write_text_atomic(path, text):
    with atomic_write(path) as f:
        f.write(text.encode("utf-8"))
