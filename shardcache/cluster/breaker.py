"""`CircuitBreaker`: whether one upstream of an origin is worth asking now (pure, clock-injected).

A failing upstream is skipped for a back-off (BASE_S doubling to CAP_S), then one probe is let
through. After bytes that failed verification, only a body that verifies closes it. It never
turns a working origin into an error (the caller asks the home when none is left)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardcache.backoff import doubling_s

BASE_S = 1.0
CAP_S = 30.0
PROBE_S = 60.0  # a probe that never reports back (its request was cancelled) is given up


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
    integrity_failures_total: int = 0  # of failures_total: bytes that failed verification


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
        self._opened_at = -float("inf")  # the last failure that counted (not the same outage)
        self._probe_sent_at: float | None = None
        self._last_error: str | None = None
        self._integrity_failures_total = 0
        self._doubts_bytes = False  # its last failure was bytes that did not verify

    @property
    def state(self) -> BreakerState:
        if self._failures_in_a_row == 0:
            return BreakerState.CLOSED
        if self._clock() < self._open_until:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def is_open(self) -> bool:
        """Whether to skip this upstream while another one may still be asked: open, or
        half-open with its probe under way."""
        state = self.state
        if state is BreakerState.HALF_OPEN and self._probe_sent_at is not None:
            return self._clock() - self._probe_sent_at < PROBE_S
        return state is BreakerState.OPEN

    def sending(self, carries_bytes: bool = True) -> None:
        """A request is about to go to the upstream: when half-open, it is the probe, unless
        the breaker opened on bad bytes and the request carries none (a HEAD)."""
        if self.state is BreakerState.HALF_OPEN and (carries_bytes or not self._doubts_bytes):
            self._probe_sent_at = self._clock()

    def succeeded(
        self, sent_at: float | None = None, proves_bytes: bool = False
    ) -> BreakerState | None:
        """The upstream answered a request sent at `sent_at` (`proves_bytes`: and the body it
        sent verified); return the state it left if that changed, else None. An answer to a
        request sent before the last failure says nothing new (a HEAD sent alongside the GET
        that failed), so it does not close the breaker; nor does any answer but verified
        bytes once bytes it sent failed verification."""
        if sent_at is not None and sent_at < self._opened_at:
            return None
        if self._doubts_bytes and not proves_bytes:
            return None
        before = self.state
        self._failures_in_a_row = 0
        self._open_until = 0.0
        self._probe_sent_at = None
        self._doubts_bytes = False
        return before if before is not BreakerState.CLOSED else None

    def failed(
        self, reason: str, sent_at: float | None = None, is_integrity: bool = False
    ) -> BreakerState | None:
        """A request sent at `sent_at` failed (`is_integrity`: the bytes it sent failed
        verification); return the state the breaker left if it opened just now, else None."""
        self._failures_total += 1
        self._last_error = reason
        if is_integrity:
            self._integrity_failures_total += 1
            self._doubts_bytes = True
        if sent_at is not None and sent_at < self._opened_at:
            return None  # sent before the breaker opened: the same outage, already counted
        before = self.state
        now = self._clock()
        self._failures_in_a_row += 1
        self._opened_at = now
        self._probe_sent_at = None
        backoff = doubling_s(self._failures_in_a_row, self._base_s, self._cap_s)
        self._open_until = max(self._open_until, now + backoff)
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
            self._integrity_failures_total,
        )
