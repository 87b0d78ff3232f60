"""`CircuitBreaker`: whether one upstream of an origin is worth asking now (pure, clock-injected).

An upstream that fails (cannot connect, answers 5xx, stalls) is skipped for a back-off period,
BASE_S doubling with each failure in a row up to CAP_S, so every fill does not pay its connect
timeout or its stall again; when the period ends the next request to it is the probe: a success
closes the breaker, a failure opens it again for twice as long. Skipping is the caller's choice:
`upstreams` asks healthy upstreams first and broken ones only when no healthy one is left, so a
breaker never turns a working origin into an error.

It knows nothing of HTTP or of origins; `transition` tells the caller when the state changed, so
that a change is logged once, not per request.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

BASE_S = 1.0
CAP_S = 30.0


class BreakerState(enum.Enum):
    CLOSED = "up"  # healthy: asked in its turn
    OPEN = "down"  # failed: skipped until the back-off ends
    HALF_OPEN = "probing"  # the back-off ended: the next request decides


@dataclass(frozen=True, slots=True)
class Health:
    """One upstream's health as `/_/status` and the metrics show it."""

    upstream: str
    state: BreakerState
    failures_in_a_row: int
    failures_total: int
    retry_in_s: float  # 0 unless open
    last_error: str | None


class CircuitBreaker:
    def __init__(
        self,
        upstream: str,
        clock: Callable[[], float] = time.monotonic,
        base_s: float = BASE_S,
        cap_s: float = CAP_S,
    ) -> None:
        """`upstream` names it in logs, metrics and status (a URL without credentials)."""
        self.upstream = upstream
        self._clock = clock
        self._base_s = base_s
        self._cap_s = cap_s
        self._failures_in_a_row = 0
        self._failures_total = 0
        self._open_until = 0.0
        self._failed_at = -float("inf")
        self._last_error: str | None = None

    @property
    def state(self) -> BreakerState:
        if self._failures_in_a_row == 0:
            return BreakerState.CLOSED
        if self._clock() < self._open_until:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def is_open(self) -> bool:
        """Whether to skip this upstream while another one may still be asked."""
        return self.state is BreakerState.OPEN

    def succeeded(self, sent_at: float | None = None) -> BreakerState | None:
        """The upstream answered a request sent at `sent_at`; return the state it left if that
        changed, else None. An answer to a request sent before the last failure says nothing
        new (a HEAD sent alongside the GET that failed), so it does not close the breaker."""
        if sent_at is not None and sent_at < self._failed_at:
            return None
        before = self.state
        self._failures_in_a_row = 0
        self._open_until = 0.0
        return before if before is not BreakerState.CLOSED else None

    def failed(self, reason: str) -> BreakerState | None:
        """The upstream failed; return the state it left if it opened just now, else None."""
        before = self.state
        self._failures_in_a_row += 1
        self._failures_total += 1
        self._last_error = reason
        self._failed_at = self._clock()
        backoff = min(self._cap_s, self._base_s * 2 ** (self._failures_in_a_row - 1))
        self._open_until = max(self._open_until, self._clock() + backoff)
        return before if before is not BreakerState.OPEN else None

    @property
    def backoff_s(self) -> float:
        return max(0.0, self._open_until - self._clock())

    def health(self) -> Health:
        state = self.state
        return Health(
            self.upstream,
            state,
            self._failures_in_a_row,
            self._failures_total,
            round(self.backoff_s, 3) if state is BreakerState.OPEN else 0.0,
            self._last_error,
        )
