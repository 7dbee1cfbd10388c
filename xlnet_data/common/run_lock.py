"""One run per folder at a time (create's save_dir, train_gpu's model_dir): an exclusive lock that dies with
its process.

The lock is `fcntl.flock` on a file in the folder (`.create.lock`, `.train.lock`). The kernel releases it
when the holding process ends, however it ends (exit, signal, SIGKILL, crash), so a killed run never leaves
a stale lock; the file itself stays (deleting it would let a third run lock a new file while a second still
holds the old one) and says who holds it now: pid, host and start time. Worker processes do not inherit it.

What is guaranteed: on a local filesystem (and on NFSv4, where Linux maps flock onto the server's
byte-range locks) two runs never write one folder at once. A remote path (`gs://` and other
tf.io.gfile schemes) has no lock to take: there the caller is warned and nothing is excluded.
"""

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import logging
import os
import socket

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError

log = logging.getLogger("xlnet_data")


@dataclasses.dataclass(frozen=True)
class FolderLock:
    """Whose lock it is: its file in the folder, the program that takes it and the flag naming the folder."""

    file_name: str  # ".create.lock"
    program: str  # "create"
    flag: str  # "--save_dir"


class FolderBusy(UserError):
    """Another run holds the folder; the message names it."""


def _holder(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "it has not recorded itself yet"
    except OSError:
        return "unknown holder"


def _lock(fd, path, folder, lock: FolderLock, kind=fcntl.LOCK_EX):
    """Takes the lock on `fd` (of `path`) or raises FolderBusy; False where the filesystem has no locks."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        raise FolderBusy(f"{folder} is in use by another {lock.program} run ({_holder(path)}); wait for it to end, "
                         f"or use another {lock.flag}") from None
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise fileio.naming(err, path) from None
        log.warning("%s: this filesystem has no locks (%s); make sure no other run writes to %s at the same time",
                    path, err.strerror, folder)
        return False
    return True


def refuse_if_busy(folder, lock: FolderLock):
    """Raises FolderBusy if another process holds `folder`'s lock now; creates nothing. For a check
    before any other (what a busy folder holds is in flux); `hold` is the lock itself."""
    path = os.path.join(folder, lock.file_name)
    if fileio.is_remote(folder) or not os.path.exists(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        _lock(fd, path, folder, lock)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(folder, lock: FolderLock):
    """Holds `folder`'s lock for the block (making the folder); raises FolderBusy at once if another
    process holds it. On a remote path, or a filesystem without locks, warns and holds nothing."""
    if fileio.is_remote(folder):
        log.warning("%s is remote: no lock is taken, so make sure no other run writes to it at the same time",
                    folder)
        yield
        return
    fileio.makedirs(folder)
    path = os.path.join(folder, lock.file_name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by worker processes (PEP 446)
    try:
        if _lock(fd, path, folder, lock):
            _note(fd, "")
        yield
    finally:
        os.close(fd)  # releases the lock


def _note(fd, program):
    """Who holds the lock, for the message of a run refused: only a note (on a full disk the lock holds without
    it, and the run's first real output names the file it could not write)."""
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{program}pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)


@contextlib.contextmanager
def share(folder, lock: FolderLock, program: str):
    """A reader's hold on `folder` for the block: `lock` taken shared, so that readers read side by side and a
    `hold` of the same lock (a run that would pull their files away) is refused while they read; FolderBusy at once
    while one holds it. Nothing is held where no lock file can be made (a remote or read-only folder)."""
    path = os.path.join(folder, lock.file_name)
    fd = None
    if not fileio.is_remote(folder) and os.path.isdir(folder):
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
            with contextlib.suppress(OSError):
                fd = os.open(path, flags, 0o644)
                break
    try:
        if fd is not None and _lock(fd, path, folder, lock, fcntl.LOCK_SH):
            _note(fd, f"{program}: ")  # the latest reader's, where several read
        yield
    finally:
        if fd is not None:
            os.close(fd)
