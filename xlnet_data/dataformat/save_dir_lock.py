"""A save_dir's locks, for its writer and its readers alike (common/run_lock.py): create's lock, the stale
temporary files of killed runs, which only its holder may remove, and the peak memory the last create recorded; and
the readers' lock (the trainers and dump hold it shared while they read a save_dir), which create takes whole before
it removes records (--overwrite)."""

import contextlib
import logging
import os
import re

from xlnet_data.common import fileio, memory, run_lock
from xlnet_data.common.run_lock import FolderLock
from xlnet_data.dataformat import save_dir

log = logging.getLogger("xlnet_data")

SAVE_DIR_LOCK = FolderLock(".create.lock", "create", "--save_dir")
READERS_LOCK = FolderLock(".read.lock", "reader (train_gpu, train_torch, dump) or create --overwrite", "--save_dir")


def reading(tfrecords_dirs, program):
    """The readers' lock of the save_dir of each tfrecords dir, held shared for the block (run_lock.share); only
    where create ran (its lock file is there): a folder of records from elsewhere (the goldens) is left as it is."""
    held = contextlib.ExitStack()
    try:
        for folder in sorted({save_dir.save_dir_of(d) for d in tfrecords_dirs}):
            if os.path.exists(os.path.join(folder, SAVE_DIR_LOCK.file_name)):
                held.enter_context(run_lock.share(folder, READERS_LOCK, program))
    except BaseException:
        held.close()
        raise
    return held


PEAK_FILE = ".create.peak.json"  # the running create's peak resident memory (common/memory.PeakRecorder)


def peak_path(folder):
    return os.path.join(folder, PEAK_FILE)


def tell_last_peak(folder):
    """Logs the peak memory that a run on `folder` which did not end (killed: by the kernel, out of memory?)
    recorded last, if one did."""
    found = memory.last_recorded_peak(peak_path(folder))
    if found:
        peak, pid, when = found
        log.warning("%s: the last create run here (pid %d) did not end; its peak resident memory was %.0f MB at "
                    "%s (its last record): if the kernel killed it for memory, --num_workers lower or a machine "
                    "with more memory; this run goes on from its complete caches and units", folder, pid,
                    peak / 1e6, when)
_TEMP_NAME = re.compile(re.escape(fileio.TMP_MARK) + r"[0-9a-f]{8}-(?P<final>.+)")


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
