"""The local runner: a plan's encode stage and units in parallel worker processes, with one progress line for all."""

import ctypes
import logging
import multiprocessing
import os
import signal
import threading

from xlnet_data.common.progress import Progress
from xlnet_data.common.vocab import load_sentencepiece
from xlnet_data.datagen import token_cache, units
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import Plan

_counters = None  # shared by the workers: [lines, tokens, records, bytes read]
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def release_freed_memory_promptly():
    """Makes glibc return freed blocks of 256 KiB and more to the OS at once (Linux only; a no-op elsewhere).

    Without it glibc's adaptive threshold keeps the encoded chunks of a file in the heap after
    the encode stage has written and released them, so the stream is held twice at the peak.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _init_worker(counters):
    global _counters
    _counters = counters
    release_freed_memory_promptly()
    logging.basicConfig(level=logging.INFO, format="%(levelname).1s %(message)s")


class _WorkerStopped(BaseException):
    """SIGTERM in a worker while it runs a job: unwinds the job, so that its temporary file is removed."""


_in_job = False  # whether this worker is running a job (else a SIGTERM has nothing to clean up)


def _exit_on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent's terminate() may send another while we clean up
    if _in_job:
        raise _WorkerStopped  # unwinds the job: its temporary file is removed (fileio.atomic_write)
    os._exit(128 + signum)


def _as_job(run, job):
    """Runs one job; after a SIGTERM has unwound it, the process ends at once. os._exit, not sys.exit: an
    exiting worker would wait for the pool's queue threads, which a terminating parent no longer serves."""
    global _in_job
    _in_job = True
    try:
        return run(*job)
    except _WorkerStopped:
        os._exit(128 + signal.SIGTERM)
    finally:
        _in_job = False


def _stop_with_parent(parent_pid):
    """SIGTERM when the parent process ends, however it ends (Linux; elsewhere the parent's own
    SIGINT/SIGTERM handling stops the pool, but a SIGKILLed parent leaves the workers running)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent ended before prctl: the signal will never come
        os._exit(128 + signal.SIGTERM)


def _init_worker_process(parent_pid, counters):
    """A worker process stops with its parent: Ctrl-C (SIGINT to the whole process group) is left to the
    parent, which terminates the pool (SIGTERM); SIGTERM unwinds the current unit and exits quietly.
    The signals were blocked since the process started (see _start_pool); one that came meanwhile is
    handled when they are unblocked here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _stop_with_parent(parent_pid)
    _init_worker(counters)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _start_pool(context, num_workers, counters):
    """A pool of worker processes, started with SIGINT and SIGTERM blocked (the workers inherit the mask
    and unblock them once their handlers are set: no signal can interrupt their start-up)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return context.Pool(num_workers, initializer=_init_worker_process,
                            initargs=(os.getpid(), counters))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _count_input(lines, tokens, nbytes):
    with _counters.get_lock():
        _counters[0] += lines
        _counters[1] += tokens
        _counters[3] += nbytes


def _count_records(records):
    with _counters.get_lock():
        _counters[2] += records


def _encode_task(config, task, files, key, encode_threads):
    sp = load_sentencepiece(config.sp_path)
    return token_cache.encode_task(config, task, files, key, sp, on_progress=_count_input,
                                   encode_threads=encode_threads)


def _run_unit(config, unit, key):
    sp = load_sentencepiece(config.sp_path)
    return units.run_unit(config, unit, key, sp, on_records=_count_records)


def _encode_task_job(job):
    return _as_job(_encode_task, job)


def _run_unit_job(job):
    return _as_job(_run_unit, job)


def run_local(config: CreateConfig, plan: Plan, num_workers=None):
    """Runs the plan, `num_workers` processes at a time (default: the CPU count): first the encode stage (each
    task with units to run, SentencePiece's threads sharing out the cores), then the (task, pass) units.
    Returns their UnitResults."""
    todo = plan.units
    if not todo:
        return []
    context = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads
    counters = context.Array("q", 4)
    progress = Progress(plan.input_bytes)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    num_workers = min(len(todo), num_workers or cores)
    encode_jobs = plan.encode_jobs()
    encode_threads = max(1, cores // max(1, min(num_workers, len(encode_jobs))))
    encode_jobs = [(config, task, files, key, encode_threads) for task, files, key in encode_jobs]
    unit_jobs = [(config, unit, plan.token_caches[unit.task]) for unit, _ in todo]
    done = []
    stop = threading.Event()

    def report():
        while not stop.wait(0.5):
            progress.update(counters[0], counters[1], counters[2], counters[3], len(done), len(todo))

    # The pool starts before any thread of ours: its workers and threads begin with the signals blocked.
    pool = _start_pool(context, num_workers, counters) if num_workers > 1 else None
    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        if pool is None:
            _init_worker(counters)
            for job in encode_jobs:
                _encode_task_job(job)
            for job in unit_jobs:
                done.append(_run_unit_job(job))
        else:
            with pool:  # a signal to this process (see stopping.py) leaves the `with`, which terminates the pool
                pool.map(_encode_task_job, encode_jobs, chunksize=1)
                for result in pool.imap_unordered(_run_unit_job, unit_jobs):
                    done.append(result)  # as each finishes, so that the progress line counts units
    finally:
        stop.set()
        reporter.join()
        progress.close()
    return sorted(done, key=lambda result: (result.unit.task, result.unit.pass_id))
