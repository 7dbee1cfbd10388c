"""Freed memory handed back to the operating system (glibc on Linux; no-ops elsewhere)."""

import ctypes
import functools

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
