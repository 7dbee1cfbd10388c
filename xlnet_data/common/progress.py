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
    """Renders counters (lines, tokens, records, input bytes done) against a known total of input bytes."""

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
        fraction = min(1.0, bytes_done / self.total_bytes)
        eta = elapsed * (1 - fraction) / fraction if fraction > 0 else 0
        return (f"units {units_done}/{units} | lines {format_count(lines)} | tokens {format_count(tokens)} | "
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

    def close(self):
        if self.live:
            self.stream.write("\n")
            self.stream.flush()
