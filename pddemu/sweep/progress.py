"""A progress bar across a sweep's points, with the time left estimated from the points run.

On a terminal it redraws one line; elsewhere (a log, CI) it writes a line whenever a count
changes. The estimate is (wall time so far ÷ points run so far) × points left, which accounts
for points running side by side; points skipped on resume count as done but not in the rate.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24


def duration_text(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    def __init__(self, label: str = "sweep", stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.total = 0
        self.skipped = 0
        self.ran = 0
        self.failed = 0
        self.running = 0
        self._counts: tuple[int, ...] = ()

    def add(self, points: int, skipped: int) -> None:
        """`points` more to show, `skipped` of them already finished."""
        self.total += points
        self.skipped += skipped
        self.show()

    def point_done(self, failed: bool) -> None:
        self.ran += 1
        self.failed += failed
        self.running = max(0, self.running - 1)
        self.show()

    def line(self) -> str:
        done = self.skipped + self.ran
        filled = BAR_WIDTH * done // self.total if self.total else 0
        elapsed = time.monotonic() - self.started
        left = self.total - done
        if left == 0:
            eta = "done"
        elif self.ran:
            eta = f"ETA {duration_text(elapsed / self.ran * left)}"
        else:
            eta = "ETA ?"
        return (
            f"[{self.label}] [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{self.total} "
            f"points ({self.skipped} skipped, {self.failed} failed), {self.running} running, "
            f"{duration_text(elapsed)} elapsed, {eta}"
        )

    def show(self) -> None:
        if self.tty:
            self.stream.write("\r" + self.line() + "\033[K")
            self.stream.flush()
            return
        counts = (self.total, self.skipped, self.ran, self.failed, self.running)
        if counts != self._counts:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._counts = counts

    def tick(self) -> None:
        """Refresh the clock on a terminal (elsewhere a line per change is enough)."""
        if self.tty:
            self.show()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
