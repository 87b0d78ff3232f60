"""Waiting for a process the suite started (the daemon, moto, SeaweedFS, Prometheus, Chromium,
an app thread) until it answers: many tries within one deadline, and a loud failure after it.

On a loaded two-core machine one try can be refused, reset, answered 503 or time out before a
byte comes back (a `TimeoutError` that urllib does not wrap in `URLError`); each of those is a
failed try, retried until the deadline. A deadline that passes, or a process that exits first,
fails with the last try's error and the tail of the process's log.
"""

from __future__ import annotations

import http.client
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

# Generous for a loaded 2-core machine: a daemon that starts in 1 s alone took 20 s under a
# full suite; a deadline only costs time when something is really broken.
START_TIMEOUT_S = 60.0
TRY_TIMEOUT_S = 5.0
# What one failed try may raise: OSError covers refused, reset, timed out and URLError
# (HTTPError for a 503 too); HTTPException covers a status line cut short.
RETRIED: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)


def log_tail(path: Path | None, lines: int = 60) -> str:
    """The last `lines` lines of `path` (empty when there is no log, or none yet)."""
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def answers_200(url: str, try_timeout_s: float = TRY_TIMEOUT_S) -> Callable[[], bool]:
    """A probe for `wait_until_ready`: True when GET `url` answers 200; raises what urllib
    raises otherwise (an HTTPError for a 503, which is retried like any OSError)."""

    def probe() -> bool:
        with urllib.request.urlopen(url, timeout=try_timeout_s) as response:
            response.read()
            return bool(response.status == 200)

    return probe


def wait_until_ready(
    what: str,
    probe: Callable[[], bool],
    *,
    process: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    log: Path | None = None,
    timeout_s: float = START_TIMEOUT_S,
    interval_s: float = 0.05,
) -> None:
    """Return once `probe()` returns True; try again after a False or a RETRIED error.

    Raises AssertionError, naming `what`, the last error and `log`'s tail, when `process`
    exits first or `timeout_s` passes. The caller stops the process it started.
    """
    deadline = time.monotonic() + timeout_s
    last_error = "no try answered yet"
    tries = 0
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"{what} exited {process.returncode} before it was ready "
                f"(last try: {last_error}):\n{log_tail(log)}"
            )
        tries += 1
        try:
            if probe():
                return
            last_error = "the probe answered not ready"
        except RETRIED as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{what} not ready after {timeout_s:.0f} s and {tries} tries "
                f"(last try: {last_error}):\n{log_tail(log)}"
            )
        time.sleep(interval_s)
