"""A progress bar on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """A one-line progress bar on a stream (stderr), redrawn at most every 0.1 s."""

    def __init__(self, total: int, label: str, enabled: bool, stream: Any = None,
                 width: int = 30) -> None:
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.width, self.done, self._last, self._t0 = width, 0, 0.0, time.perf_counter()

    def update(self, k: int = 1) -> None:
        self.done += k
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last >= 0.1 or self.done >= self.total:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(frac * self.width)
        self.stream.write(f"\r{self.label} [{bar:<{self.width}}] {frac:4.0%} "
                          f"{self.done}/{self.total} {now - self._t0:5.1f}s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()


def progress_wanted(flag: bool | None, stream: Any = None) -> bool:
    """--progress / --no-progress; by default only when stderr is a terminal."""
    if flag is not None:
        return flag
    stream = stream if stream is not None else sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
