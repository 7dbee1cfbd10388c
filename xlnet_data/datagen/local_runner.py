"""The local runner: a plan's encode stage and units in parallel worker processes, with one progress line for all.

The workers are processes this runner starts, feeds and stops itself, each over a pipe of its own. Nothing
is shared between them and no lock is held across processes: a worker that ends at any instant (a signal,
the OOM killer) cannot leave the others or the parent waiting on a lock it held, as a worker of
multiprocessing.Pool could.
"""

import ctypes
import logging
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import wait

from xlnet_data.common import fileio
from xlnet_data.common.progress import Progress
from xlnet_data.common.vocab import load_sentencepiece
from xlnet_data.datagen import token_cache, units
from xlnet_data.datagen.config import CreateConfig
from xlnet_data.datagen.plan import Plan

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_STOP_GRACE_SECONDS = 10  # after SIGTERM, how long a worker may take to remove its temporary file before SIGKILL
_report = None  # where a job's counts go: (lines, tokens, records, bytes read) -> None


def release_freed_memory_promptly():
    """Makes glibc return freed blocks of 256 KiB and more to the OS at once (Linux only; a no-op elsewhere).

    Without it glibc's adaptive threshold keeps the encoded chunks of a file in the heap after
    the encode stage has written and released them, so the stream is held twice at the peak.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _init_process():
    release_freed_memory_promptly()
    logging.basicConfig(level=logging.INFO, format="%(levelname).1s %(message)s")


def _encode_task(config, task, files, key, encode_threads):
    sp = load_sentencepiece(config.sp_path)
    return token_cache.encode_task(config, task, files, key, sp, encode_threads=encode_threads,
                                   on_progress=lambda lines, tokens, nbytes: _report(lines, tokens, 0, nbytes))


def _run_unit(config, unit, key):
    sp = load_sentencepiece(config.sp_path)
    return units.run_unit(config, unit, key, sp, on_records=lambda records: _report(0, 0, records, 0))


# ---- a worker process ----

def _exit_on_sigterm(signum, frame):
    """Ends the worker at once, its temporary files removed. Not by raising an exception to unwind the job: one
    raised while the job is in a C callback (numba's compiled-code cache) would be printed and ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent may send another meanwhile
    fileio.remove_temporaries_in_progress()
    os._exit(128 + signum)


def _stop_with_parent(parent_pid):
    """SIGTERM when the parent process ends, however it ends (Linux; elsewhere the parent's own
    SIGINT/SIGTERM handling stops the workers, but a SIGKILLed parent leaves them running)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent ended before prctl: the signal will never come
        os._exit(128 + signal.SIGTERM)


def _worker_main(conn, parent_pid):
    """A worker: runs the jobs `(function, args)` that come over `conn` and sends back `("done", result)` or
    `("failed", exception)`, with `("counts", ...)` messages meanwhile; ends at None or when the pipe closes.

    Ctrl-C (SIGINT to the whole process group) is left to the parent, which stops the workers with SIGTERM;
    SIGTERM ends the process, its temporary files removed. The signals were blocked since the process started
    (see _Workers.start); one that came meanwhile is handled when they are unblocked here.
    """
    global _report
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _stop_with_parent(parent_pid)
    _init_process()
    _report = lambda *counts: conn.send(("counts", counts))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            job = None
        if job is None:
            os._exit(0)  # nothing to flush: every output was written and closed by its job
        function, args = job
        try:
            reply = ("done", function(*args))
        except Exception as err:  # the parent raises it
            reply = ("failed", err)
        try:
            conn.send(reply)
        except Exception:  # an exception that does not pickle: its text, then
            conn.send(("failed", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))


class WorkerDied(RuntimeError):
    """A worker process ended in the middle of a job without a reply (killed, out of memory)."""

    def __init__(self, process):
        process.join(1)  # its exit status, which comes a moment after its pipe closes
        code = process.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code and code < 0 else f"ended with status {code}"
        super().__init__(f"a worker process (pid {process.pid}) {how} in the middle of its work (out of memory? "
                         "see `dmesg`); complete units are kept: run the same command again to do the rest")


class _Workers:
    """`num_workers` worker processes; `run(jobs)` shares jobs out, `stop()` ends them whatever they are doing."""

    def __init__(self, num_workers, on_counts):
        self.on_counts = on_counts
        context = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads
        # Started with SIGINT and SIGTERM blocked: the workers inherit the mask and unblock the signals once
        # their handlers are set, so no signal can interrupt their start-up.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        self.workers = []
        try:
            for _ in range(num_workers):
                parent_end, worker_end = context.Pipe()
                process = context.Process(target=_worker_main, args=(worker_end, os.getpid()), daemon=True)
                process.start()
                worker_end.close()
                self.workers.append((process, parent_end))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def run(self, function, jobs, on_done, poll_seconds=0.5):
        """Runs function(*job) for every job on the workers, calling on_done(result) as each finishes (in any
        order) and on_counts() at least every `poll_seconds`; raises the first job's exception."""
        todo = list(reversed(jobs))
        idle = [conn for _, conn in self.workers]
        busy = {}  # conn -> its process
        processes = dict((conn, process) for process, conn in self.workers)
        while todo or busy:
            while idle and todo:
                conn = idle.pop()
                conn.send((function, todo.pop()))
                busy[conn] = processes[conn]
            sentinels = {process.sentinel: conn for conn, process in busy.items()}
            for ready in wait([*busy, *sentinels], timeout=poll_seconds):
                conn = sentinels.get(ready, ready)
                if conn not in busy:
                    continue  # its reply was read in this round already
                try:
                    kind, value = conn.recv()
                except EOFError:
                    raise WorkerDied(busy[conn]) from None
                if kind == "counts":
                    self.on_counts(*value)
                    continue
                del busy[conn]
                idle.append(conn)
                if kind == "failed":
                    raise value
                on_done(value)
            self.on_counts()

    def stop(self, graceful):
        """Ends the workers: with a None each when `graceful`, else SIGTERM (each removes its temporary files
        and ends), then SIGKILL for any still there after _STOP_GRACE_SECONDS."""
        for process, conn in self.workers:
            if graceful:
                try:
                    conn.send(None)
                except OSError:
                    pass
            elif process.exitcode is None:
                process.terminate()
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        for process, conn in self.workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()
            conn.close()


def run_local(config: CreateConfig, plan: Plan, num_workers=None):
    """Runs the plan, `num_workers` processes at a time (default: the CPU count): first the encode stage (each
    task with units to run, SentencePiece's threads sharing out the cores), then the (task, pass) units.
    Returns their UnitResults."""
    global _report
    todo = plan.units
    if not todo:
        return []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    num_workers = min(len(todo), num_workers or cores)
    encode_jobs = plan.encode_jobs()
    encode_threads = max(1, cores // max(1, min(num_workers, len(encode_jobs))))
    encode_jobs = [(config, task, files, key, encode_threads) for task, files, key in encode_jobs]
    unit_jobs = [(config, unit, plan.token_caches[unit.task]) for unit, _ in todo]
    progress = Progress(plan.input_bytes)
    counts = [0, 0, 0, 0]  # lines, tokens, records, bytes read
    done = []

    def on_counts(*more):
        for i, n in enumerate(more):
            counts[i] += n
        progress.update(*counts, len(done), len(todo))

    try:
        if num_workers == 1:
            _init_process()
            _report = on_counts
            for job in encode_jobs:
                _encode_task(*job)
            for job in unit_jobs:
                done.append(_run_unit(*job))
        else:
            workers = _Workers(num_workers, on_counts)
            try:
                workers.run(_encode_task, encode_jobs, on_done=lambda result: None)
                workers.run(_run_unit, unit_jobs, on_done=done.append)
            except BaseException:  # a signal (see stopping.py), a failed job: stop the others now
                workers.stop(graceful=False)
                raise
            workers.stop(graceful=True)
    finally:
        _report = None
        progress.close()
    return sorted(done, key=lambda result: (result.unit.task, result.unit.pass_id))
