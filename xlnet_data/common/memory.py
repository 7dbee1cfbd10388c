"""Freed memory handed back to the operating system (glibc on Linux; no-ops elsewhere)."""

import ctypes
import functools

MMAP_THRESHOLD = 4 << 20  # blocks of this size and more get pages of their own, returned when freed


@functools.cache  # return_freed_heap is called every 16 MiB of a stream and after every file
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
