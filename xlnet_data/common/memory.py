"""Freed memory handed back to the operating system (glibc on Linux; no-ops elsewhere), and a run's peak resident
memory recorded as it goes (PeakRecorder)."""

import ctypes
import functools
import json
import os
import time

from xlnet_data.common import fileio

MMAP_THRESHOLD = 4 << 20  # blocks of this size and more get pages of their own, returned when freed


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_large_blocks_promptly():
    """Makes glibc map blocks of MMAP_THRESHOLD and more apart, and unmap them when freed (M_MMAP_THRESHOLD).

    Without it glibc's adaptive threshold keeps the stream's big arrays in the heap after they are
    released. Not lower: every block mapped apart is fresh pages, zeroed and faulted in on first touch, and
    the encode stage makes ~1 MB temporaries for every 1 MB of text (joined lines, their lower-cased and
    encoded copies, the ids): with a 256 KiB threshold they cost about 17 ns a token (in-process CPU time,
    seq_len 128) that reusing heap blocks saves. The encoded chunks that stay in the heap are handed back
    by return_freed_heap when they are released.
    """
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD


def return_freed_heap():
    """malloc_trim(0): glibc gives back the free pages anywhere in its heap, not only at its top, so that
    the encoded files released into the stream are not held twice at the peak."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


RETURN_EVERY_BYTES = 16 << 20  # freed memory handed back to the system at least this often (see freed)
_freed_since_return = 0


def freed(nbytes):
    """Notes that `nbytes` were released; every RETURN_EVERY_BYTES, return_freed_heap. By size, not per file or
    per chunk: malloc_trim walks the whole heap, so a call after each of 20,000 small files held in memory
    made a run quadratic in the number of files (90 of 119 s at 10,000 files)."""
    global _freed_since_return
    _freed_since_return += nbytes
    if _freed_since_return >= RETURN_EVERY_BYTES:
        _freed_since_return = 0
        return_freed_heap()


def _resident_bytes(pid) -> int:
    """VmRSS of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def resident_with_children() -> int:
    """This process's resident memory and its child processes' (the worker processes), in bytes; 0 where /proc
    cannot tell."""
    children = []
    for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                children += f.read().split()
        except OSError:
            continue
    return _resident_bytes("self") + sum(_resident_bytes(pid) for pid in children)


class PeakRecorder:
    """A run's peak resident memory (its process and workers), sampled whenever `sample` is called (at most every
    SAMPLE_EVERY_S) and written to `path` as JSON (atomically, at most every RECORD_EVERY_S), so that a run the
    kernel kills leaves its last figure for the next run to tell (last_recorded_peak). `close` removes it."""

    SAMPLE_EVERY_S = 0.5
    RECORD_EVERY_S = 2.0

    def __init__(self, path: str):
        self.path, self.peak = path, 0
        self._sampled = self._recorded = 0.0

    def sample(self):
        now = time.monotonic()
        if now - self._sampled < self.SAMPLE_EVERY_S:
            return
        self._sampled = now
        self.peak = max(self.peak, resident_with_children())
        if now - self._recorded >= self.RECORD_EVERY_S:
            self._recorded = now
            fileio.write_text_atomic(self.path, json.dumps({"peak_rss": self.peak, "pid": os.getpid(),
                                                            "time": time.strftime("%Y-%m-%d %H:%M:%S")}))

    def close(self):
        if fileio.exists(self.path):
            fileio.remove(self.path)


def last_recorded_peak(path: str):
    """(peak bytes, pid, time) a PeakRecorder left at `path` (a run that did not end), or None."""
    try:
        found = json.loads(fileio.read_text(path)) if fileio.exists(path) else None
        return int(found["peak_rss"]), int(found["pid"]), str(found["time"])
    except (OSError, ValueError, KeyError, TypeError):  # none, or cut short
        return None
