"""Worker processes that their parent starts, feeds and stops itself (create's units, prepare's files).

Each worker has a pipe of its own; nothing else is shared and no lock is held across processes, so a worker
that ends at any instant (a signal, the OOM killer) cannot leave the others or the parent waiting on a lock
it held, as a worker of multiprocessing.Pool can. A worker stops with its parent: on SIGTERM (sent by the
parent, or by the kernel when the parent dies) it removes its unfinished atomic_write files and ends; SIGINT
(Ctrl-C reaches the whole process group) is left to the parent.
"""

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
import types
from multiprocessing.connection import wait

from xlnet_data.common import fileio
from xlnet_data.common.errors import UserError

STOP_GRACE_SECONDS = 10  # after SIGTERM, how long a worker may take to end before SIGKILL
_report = None  # where report() sends a job's counts: over the pipe in a worker, to on_counts in-process


def process_cores() -> int:
    """The cores this process may run on (`taskset`, a cgroup's cpuset, a batch scheduler's allocation), not the
    machine's: the default number of workers and threads of create, prepare and spm_train."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def report(*counts):
    """From inside a job: adds `counts` to the parent's tallies (its on_counts); a no-op outside of a run."""
    if _report is not None:
        _report(*counts)


@contextlib.contextmanager
def reporting_to(on_counts):
    """Within the block, jobs run in this process report() to on_counts (a run without worker processes)."""
    global _report
    _report = on_counts
    try:
        yield
    finally:
        _report = None


class WorkerDied(UserError, RuntimeError):
    """A worker process ended in the middle of a job without a reply (killed, out of memory)."""

    def __init__(self, process):
        process.join(1)  # its exit status, which comes a moment after its pipe closes
        code = process.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code and code < 0 else f"ended with status {code}"
        super().__init__(f"a worker process (pid {process.pid}) {how} in the middle of its work (out of memory? "
                         "see `dmesg`); what is complete is kept: run the same command again to do the rest")


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


def _worker_main(conn, parent_pid, initializer):
    """A worker: runs the jobs `(function, args)` that come over `conn` and sends back `("done", result)` or
    `("failed", exception)`, with `("counts", ...)` messages meanwhile; ends at None or when the pipe closes.
    SIGINT is ignored from the start (see Workers); a SIGTERM before the handler is set ends the process as
    well, with nothing to clean up yet."""
    global _report
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _stop_with_parent(parent_pid)
    if initializer:
        initializer()
    _report = lambda *counts: conn.send(("counts", counts))
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


@contextlib.contextmanager
def _main_left_alone():
    """Within the block, a spawned process does not import the parent's __main__ (multiprocessing's spawn and
    forkserver both would, to unpickle what the main script defined). A worker runs library functions only, so
    it has no need of it; imported, a user's script without an `if __name__ == "__main__":` guard would run
    again in every worker (which would start workers of its own). The spawned process reads sys.modules'
    __main__ while it is being started (multiprocessing.spawn.get_preparation_data, in Process.start), and a
    __main__ with neither __spec__ nor __file__, as in an interactive session, is not imported: the same on
    Linux, macOS and Windows."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class Workers:
    """`num_workers` worker processes (spawned: the parent may hold threads); `run(...)` shares jobs out to them.

    Used as a context manager: leaving the block normally ends them once idle; leaving it by an exception (a
    failed job, a signal turned into one by stopping.stop_on_signals) stops them at once: SIGTERM, then
    SIGKILL for any still there after STOP_GRACE_SECONDS. `initializer` (a module-level function) runs in
    each worker before its first job.
    """

    def __init__(self, num_workers, initializer=None):
        context = multiprocessing.get_context("spawn")
        # Started with SIGINT ignored, which a process inherits through exec (a handler or a blocked mask it
        # does not: spawning even clears the parent's mask): a Ctrl-C while a worker imports its modules would
        # otherwise print a KeyboardInterrupt traceback. The cost: one that comes in these few milliseconds
        # is lost to this process too.
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.workers = []  # (process, the parent's end of its pipe)
        try:
            for _ in range(num_workers):
                parent_end, worker_end = context.Pipe()
                process = context.Process(target=_worker_main, args=(worker_end, os.getpid(), initializer),
                                          daemon=True)
                with _main_left_alone():
                    process.start()
                worker_end.close()
                self.workers.append((process, parent_end))
        except BaseException:
            self._stop(graceful=False)
            raise
        finally:
            signal.signal(signal.SIGINT, handler)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self._stop(graceful=exc_type is None)

    def run(self, function, jobs, on_done, on_counts, poll_seconds=0.5):
        """Runs function(*job) for every job, calling on_done(index of the job, result) as each finishes (in
        any order), on_counts(*counts) for what jobs report(), and on_counts() at least every
        `poll_seconds`. Raises the first failed job's exception, or WorkerDied."""
        todo = list(reversed(list(enumerate(jobs))))
        idle = [conn for _, conn in self.workers]
        busy = {}  # conn -> (its process, the index of its job)
        processes = {conn: process for process, conn in self.workers}
        while todo or busy:
            while idle and todo:
                conn = idle.pop()
                index, job = todo.pop()
                conn.send((function, job))
                busy[conn] = (processes[conn], index)
            sentinels = {process.sentinel: conn for conn, (process, _) in busy.items()}
            for ready in wait([*busy, *sentinels], timeout=poll_seconds):
                conn = sentinels.get(ready, ready)
                if conn not in busy:
                    continue  # its reply was read in this round already
                try:
                    kind, value = conn.recv()
                except EOFError:
                    raise WorkerDied(busy[conn][0]) from None
                if kind == "counts":
                    on_counts(*value)
                    continue
                index = busy.pop(conn)[1]
                idle.append(conn)
                if kind == "failed":
                    raise value
                on_done(index, value)
            on_counts()

    def _stop(self, graceful):
        for process, conn in self.workers:
            if graceful:
                with contextlib.suppress(OSError):
                    conn.send(None)
            elif process.exitcode is None:
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process, conn in self.workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()
            conn.close()
