"""Progress of a long run: a live line on a terminal, a log line every so often otherwise."""

import sys
import time


def format_count(n):
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """Renders counters (lines, tokens encoded, records, input bytes read, units done) of create's two stages: the
    share done is the mean of the encode stage's (input bytes read) and the units' (units done), so that it reaches
    100% with the last unit and not when the last byte is read."""

    def __init__(self, total_bytes, stream=sys.stderr, log_every=30.0, redraw_every=0.25):
        self.total_bytes = max(1, total_bytes)
        self.stream = stream
        self.live = stream.isatty()
        self.log_every = log_every
        self.redraw_every = redraw_every
        self.start = self._last = time.time()

    def line(self, lines, tokens, records, bytes_done, units_done, units):
        elapsed = max(1e-9, time.time() - self.start)
        rate = tokens / elapsed
        fraction = (min(1.0, bytes_done / self.total_bytes) + units_done / max(1, units)) / 2
        eta = elapsed * (1 - fraction) / fraction if fraction > 0 else 0
        return (f"units {units_done}/{units} | lines {format_count(lines)} | encoded {format_count(tokens)} tokens | "
                f"records {format_count(records)} | {format_count(rate)} tokens/s | {100 * fraction:.0f}% | "
                f"ETA {format_duration(eta)}")

    def update(self, *counters):
        now = time.time()
        if self.live:
            if now - self._last >= self.redraw_every:
                self.stream.write("\r\033[K" + self.line(*counters))
                self.stream.flush()
                self._last = now
        elif now - self._last >= self.log_every:
            self.stream.write(self.line(*counters) + "\n")
            self.stream.flush()
            self._last = now

    def close(self, *final_counters):
        """Ends the line; given the final counters, it shows them first (the line then agrees with the summary)."""
        if final_counters:
            self.stream.write(("\r\033[K" if self.live else "") + self.line(*final_counters) + "\n")
        elif self.live:
            self.stream.write("\n")
        self.stream.flush()


class CountProgress:
    """A line every `log_every` seconds (redrawn on a terminal) while items are counted: done of total (when
    known), rate, share and ETA. Nothing for work that ends sooner."""

    def __init__(self, what, total=None, stream=sys.stderr, log_every=15.0, redraw_every=0.5):
        self.what, self.total, self.stream = what, total, stream
        self.live = stream.isatty()
        self.every = redraw_every if self.live else log_every
        self.start = time.time()
        self._last, self._shown, self.done = self.start + log_every - self.every, False, 0

    def line(self):
        elapsed = max(1e-9, time.time() - self.start)
        text = f"{self.what} {format_count(self.done)}"
        if self.total:
            fraction = min(1.0, self.done / self.total)
            eta = elapsed * (1 - fraction) / fraction if fraction > 0 else 0
            text += f" of {format_count(self.total)} ({100 * fraction:.0f}%, ETA {format_duration(eta)})"
        return f"{text} | {format_count(self.done / elapsed)}/s | {format_duration(elapsed)}"

    def update(self, more=1):
        self.done += more
        now = time.time()
        if now - self._last >= self.every:  # the first line only after log_every: quick work stays silent
            self.stream.write(("\r\033[K" if self.live else "") + self.line() + ("" if self.live else "\n"))
            self.stream.flush()
            self._last, self._shown = now, True

    def close(self):
        if self._shown:
            self.stream.write(("\r\033[K" if self.live else "") + self.line() + "\n")
            self.stream.flush()
