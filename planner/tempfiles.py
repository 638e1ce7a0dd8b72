"""Temporary files a killed process leaves behind (issue 22, item 11).

Every write fitcheck makes goes through a temporary file renamed into place; the temporary
file is removed when the write fails or the process is interrupted. Two things could still
leave one behind: SIGTERM (or SIGHUP), whose default action ends Python without running
``finally`` blocks, and SIGKILL, after which nothing runs. ``exit_on_terminate`` turns the
first into SystemExit (exit 143 / 129, as the shell reports a signal), so the cleanup runs;
``sweep`` removes the second kind on the next write into the same folder: files named as
fitcheck names its temporary files there, untouched for ``STALE_S``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

STALE_S = 3600.0
"""A temporary file this old is no write in progress (a write takes milliseconds)."""


def exit_on_terminate() -> None:
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) where their action is the default,
    so ``finally`` blocks remove temporary files (the main thread only)."""
    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None:
            continue
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, stop)
        except ValueError:  # not the main thread: leave it
            pass


def sweep(folder: str, ours: Callable[[str], bool], now: float | None = None) -> list[str]:
    """Remove the files in ``folder`` that ``ours(name)`` recognizes as fitcheck's temporary
    files and that are older than STALE_S; the names removed. Errors are ignored (another
    process may be sweeping too)."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for e in entries:
        try:
            if ours(e.name) and e.is_file(follow_symlinks=False) \
                    and now - e.stat(follow_symlinks=False).st_mtime > STALE_S:
                os.unlink(e.path)
                removed.append(e.name)
        except OSError:
            pass
    return removed
