"""`LogLimit`: a warning that recurs (every request's, while a disk is broken) logged at most
once an interval, the repeats meanwhile at DEBUG and counted in the next WARNING.

For the parts below `observability/` (whose `FailureLog` does this per origin for failures
clients see); no timer and no event loop: the count waits for the next warning of its kind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

LOG_LIMIT_INTERVAL_S = 60.0


@dataclass(slots=True)
class _Kind:
    warned_at: float
    suppressed: int = 0


class LogLimit:
    """At most one WARNING per kind of problem per `interval_s`."""

    def __init__(
        self,
        interval_s: float = LOG_LIMIT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._kinds: dict[str, _Kind] = {}

    def warning(self, logger: logging.Logger, kind: str, message: str, *args: object) -> None:
        """Log `message % args` to `logger`: a WARNING when no warning of `kind` went out in
        the last interval (saying how many were held back since the one before), else DEBUG."""
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen.warned_at < self._interval_s:
            seen.suppressed += 1
            logger.debug(message, *args)
            return
        self._kinds[kind] = _Kind(now)
        if seen is not None and seen.suppressed:
            logger.warning(
                message + " (%d more like it in the %.0f s before, logged at DEBUG)",
                *args,
                seen.suppressed,
                now - seen.warned_at,
            )
        else:
            logger.warning(message, *args)
