"""One `create` run per save_dir at a time: an exclusive lock that dies with its process.

The lock is `fcntl.flock` on `save_dir/.create.lock`. The kernel releases it when the holding process
ends, however it ends (exit, signal, SIGKILL, crash), so a killed run never leaves a stale lock; the
file itself stays (deleting it would let a third run lock a new file while a second still holds the
old one) and says who holds it now: pid, host and start time. Worker processes do not inherit it.

What is guaranteed: on a local filesystem (and on NFSv4, where Linux maps flock onto the server's
byte-range locks) two runs never write one save_dir at once. A remote path (`gs://` and other
tf.io.gfile schemes) has no lock to take: there the caller is warned and nothing is excluded.
"""

import contextlib
import datetime
import errno
import fcntl
import logging
import os
import re
import socket

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError
from xlnet_data.dataformat import save_dir

log = logging.getLogger("xlnet_data")

LOCK_FILE = ".create.lock"
_TEMP_NAME = re.compile(re.escape(fileio.TMP_MARK) + r"[0-9a-f]{8}-(?P<final>.+)")


class SaveDirBusy(UserError):
    """Another run holds the save_dir; the message names it."""


def _holder(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "it has not recorded itself yet"
    except OSError:
        return "unknown holder"


def _lock(fd, path, folder, program):
    """Takes the lock on `fd` (of `path`) or raises SaveDirBusy; False where the filesystem has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SaveDirBusy(f"{folder} is in use by another {program} run ({_holder(path)}); wait for it to end, "
                          "or use another --save_dir") from None
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise fileio.naming(err, path) from None
        log.warning("%s: this filesystem has no locks (%s); make sure no other run writes to %s at the same time",
                    path, err.strerror, folder)
        return False
    return True


def refuse_if_busy(folder, program="create"):
    """Raises SaveDirBusy if another process holds `folder`'s lock now; creates nothing. For a check
    before any other (what a busy save_dir holds is in flux); `hold` is the lock itself."""
    path = os.path.join(folder, LOCK_FILE)
    if fileio.is_remote(folder) or not os.path.exists(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        _lock(fd, path, folder, program)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(folder, program="create"):
    """Holds `folder`'s lock for the block (making the folder); raises SaveDirBusy at once if another
    process holds it. On a remote path, or a filesystem without locks, warns and holds nothing."""
    if fileio.is_remote(folder):
        log.warning("%s is remote: no lock is taken, so make sure no other run writes to it at the same time",
                    folder)
        yield
        return
    fileio.makedirs(folder)
    path = os.path.join(folder, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by worker processes (PEP 446)
    try:
        if _lock(fd, path, folder, program):
            started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
            except OSError as err:
                raise fileio.naming(err, path) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def remove_stale_temporaries(folder):
    """Removes the temporary files (fileio.temp_path_for names) of save_dir outputs that an interrupted
    run left in `folder`, `folder/tfrecords` and `folder/token_cache`; returns how many. Call it holding
    the lock: then no other run is writing, so each such file is a dead run's. Other files are left alone."""
    removed = 0
    for directory in (folder, os.path.join(folder, save_dir.TFRECORDS), os.path.join(folder, save_dir.TOKEN_CACHE)):
        if fileio.is_remote(directory) or not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            match = _TEMP_NAME.fullmatch(name)
            if match and save_dir.is_create_output(match["final"]):
                os.remove(os.path.join(directory, name))
                removed += 1
    if removed:
        log.info("%s: removed %d temporary file(s) left by an interrupted run", folder, removed)
    return removed
