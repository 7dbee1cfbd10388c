"""Stopping on SIGINT and SIGTERM: an exception in the main thread, so that every `finally` runs
(stop_on_signals), or a note that a loop acts on at a safe point (SignalNote).

A command wraps its work in `stop_on_signals()` and turns `Stopped` into one line and the exit status
a shell gives a process killed by that signal (130 for SIGINT, 143 for SIGTERM). Temporary files are
removed on the way out (fileio.atomic_write), worker pools terminated by their context managers.
"""

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so `except Exception` lets it by."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self):
        return signal.Signals(self.signum).name

    @property
    def exit_status(self):
        return 128 + self.signum


def _raise_stopped(signum, frame):
    for s in SIGNALS:  # a second signal, while the first one unwinds, stops at once
        signal.signal(s, signal.SIG_DFL)
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals():
    """Within the block, SIGINT and SIGTERM raise Stopped in the main thread."""
    previous = {s: signal.signal(s, _raise_stopped) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class SignalNote:
    """Within the block, SIGINT and SIGTERM are only noted (`signum`), for a loop that acts on them at a safe
    point (training: a checkpoint between steps, then the end). A second signal goes to the handler that was
    there before (stop_on_signals: Stopped)."""

    def __enter__(self):
        self.signum = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():  # Python handles signals only there
            self._previous = {signum: signal.signal(signum, self._note) for signum in SIGNALS}
        return self

    def _note(self, signum, frame):
        del frame
        self.signum = signum
        for other, handler in self._previous.items():
            signal.signal(other, handler)

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
