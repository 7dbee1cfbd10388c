"""Local and remote (`gs://` and other tf.io.gfile) paths behind one small surface, with atomic writes.

Local paths use the standard library (faster, no TensorFlow import); a path with a scheme goes
through tf.io.gfile. Writes go to a temporary name in the same directory and are renamed when
complete, so a reader never sees a half-written file under its final name.
"""

import bz2
import contextlib
import errno
import glob as _glob
import gzip
import io
import lzma
import os
import re
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


# The formats a corpus file may come in, told by their first bytes (not by the file name, so that a
# misnamed file is still read right): gzip, bzip2 (a block or the end-of-stream marker), xz, zstd (whose
# magic number starts with "(" and a byte that cannot follow it in UTF-8: no text file starts so).
_COMPRESSED = (("gzip", re.compile(rb"\x1f\x8b"), lambda raw: gzip.GzipFile(fileobj=raw, mode="rb")),
               ("bzip2", re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"), bz2.BZ2File),
               ("xz", re.compile(rb"\xfd7zXZ\x00"), lzma.LZMAFile),
               ("zstd", re.compile(rb"\x28\xb5\x2f\xfd"), lambda raw: io.BufferedReader(_ZstdReader(raw))))
_ZSTD_CHUNK = 1 << 16


class _ZstdReader(io.RawIOBase):
    """The content of zstd frames one after another, read to their end. A stream that stops inside a frame
    raises EOFError and damaged data an OSError without errno, as gzip, bz2 and lzma do (zstandard's own
    stream reader ends quietly at a truncation). zstandard is optional (the `prepare` extra): without it,
    an OSError (ENOPKG) saying so."""

    def __init__(self, raw):
        super().__init__()
        try:
            import zstandard
        except ImportError:
            raise OSError(errno.ENOPKG, "zstd-compressed; reading it needs the zstandard package: "
                                        "pip install 'xlnet-data[prepare]'", getattr(raw, "name", None)) from None
        self._zstandard = zstandard
        self._raw = raw
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # bytes of a frame were read and its end was not
        self._pending = b""  # read past the end of the last frame: the start of the next one
        self._out, self._offset = b"", 0

    def readable(self):
        return True

    def readinto(self, buffer):
        while self._offset == len(self._out):
            data, self._pending = self._pending or self._raw.read(_ZSTD_CHUNK), b""
            if not data:
                if self._in_frame:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return 0
            try:
                self._out, self._offset = self._frame.decompress(data), 0
            except self._zstandard.ZstdError as err:
                raise OSError(f"invalid zstd data: {err}") from None
            self._in_frame = not self._frame.eof
            if self._frame.eof:
                self._pending = self._frame.unused_data
                self._frame = self._zstandard.ZstdDecompressor().decompressobj()
        count = min(len(buffer), len(self._out) - self._offset)
        buffer[:count] = self._out[self._offset:self._offset + count]
        self._offset += count
        return count


@contextlib.contextmanager
def open_decompressed(path):
    """Yields (file, raw, compression): a binary file object reading `path`'s content, decompressed when
    it is gzip, bzip2, xz or zstd (compression is then "gzip", "bzip2", "xz" or "zstd", else None); `raw`
    is the file as stored, whose tell() is the position in the stored bytes. Each format is read to its
    end marker: a truncated file raises EOFError when its end is reached."""
    with open_read(path) as raw:
        head = raw.read(10)
        raw.seek(0)
        for name, magic, opener in _COMPRESSED:
            if magic.match(head):
                with opener(raw) as f:
                    yield f, raw, name
                return
        yield raw, raw, None


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
    _temporaries_in_progress.add(tmp)
    try:
        try:
            f = _gfile().GFile(tmp, "wb") if is_remote(path) else open(tmp, "wb")
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(path)) from None
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
    finally:
        _temporaries_in_progress.discard(tmp)


_temporaries_in_progress = set()  # this process's atomic_write temporaries, for remove_temporaries_in_progress


def remove_temporaries_in_progress():
    """Deletes the temporary files of this process's unfinished atomic_writes (local ones): for a process that
    is about to end at once, from a signal handler, without unwinding its blocks."""
    for tmp in list(_temporaries_in_progress):
        if not is_remote(tmp):
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_array(f, array):
    """Writes a contiguous numpy array's bytes to a file of atomic_write: a local file takes the
    array's buffer as it is (no copy); tf.io.gfile takes only bytes."""
    f.write(memoryview(array).cast("B") if isinstance(f, io.IOBase) else array.tobytes())


def write_text_atomic(path, text):
    with atomic_write(path) as f:
        f.write(text.encode("utf-8"))
