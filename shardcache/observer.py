"""`Observer`: the events the cache core reports, so `fill`/`cache` never import metrics.

`metrics.Metrics` implements it against Prometheus; `NullObserver` is for tests and tools.
"""

from __future__ import annotations

from typing import Protocol


class Observer(Protocol):
    def origin_request(self, origin: str, status: str) -> None:
        """One request to the origin ended in `status` ("ok" or an error kind)."""

    def origin_retry(self, origin: str) -> None: ...

    def origin_throttled(self, origin: str) -> None:
        """The origin refused a request as one too many (429, 503 SlowDown)."""

    def origin_request_limit(self, origin: str, limit: int) -> None:
        """The requests a second the origin's throttling allows changed (0: unlimited)."""

    def origin_wait_abandoned(self, origin: str) -> None:
        """A request stopped waiting at the origin's gate (its fill was stopped): never sent."""

    def origin_request_shed(self, origin: str) -> None:
        """The origin's gate turned a request away (its turn or place further off than it may
        wait): never sent, answered 503 with Retry-After (a prefetch's too)."""

    def origin_failed(self, origin: str, kind: str) -> None:
        """An object failed for a reason no one request was counted under (its checksum did
        not match, its HEAD failed): one more origin error of `kind`."""

    def origin_bytes(self, origin: str, size_bytes: int) -> None: ...

    def fetch_finished(self, origin: str, duration_s: float) -> None: ...

    def evicted(self, size_bytes: int, was_pinned: bool) -> None: ...

    def prefetch_late(self, origin: str) -> None:
        """A client asked for a key whose prefetch had not finished."""

    def prefetch_wasted(self, origin: str) -> None:
        """A prefetched entry left the cache before any client read it."""

    def checksum_unusable(self, origin: str, algorithm: str) -> None:
        """A kind of checksum the origin publishes was set aside (`checksum_trust`)."""


class NullObserver:
    def origin_request(self, origin: str, status: str) -> None:
        return None

    def origin_retry(self, origin: str) -> None:
        return None

    def origin_throttled(self, origin: str) -> None:
        return None

    def origin_request_limit(self, origin: str, limit: int) -> None:
        return None

    def origin_wait_abandoned(self, origin: str) -> None:
        return None

    def origin_request_shed(self, origin: str) -> None:
        return None

    def origin_failed(self, origin: str, kind: str) -> None:
        return None

    def origin_bytes(self, origin: str, size_bytes: int) -> None:
        return None

    def fetch_finished(self, origin: str, duration_s: float) -> None:
        return None

    def evicted(self, size_bytes: int, was_pinned: bool) -> None:
        return None

    def prefetch_late(self, origin: str) -> None:
        return None

    def prefetch_wasted(self, origin: str) -> None:
        return None

    def checksum_unusable(self, origin: str, algorithm: str) -> None:
        return None


class FailureTally:
    """An `Observer` for one object's requests that remembers the error kinds they were counted
    under, so that the object's failure is counted once under its kind: by its requests when
    one failed that way, else by `settle` (a checksum that did not match, a HEAD that failed:
    every request was counted "ok", or not at all)."""

    def __init__(self, observer: Observer) -> None:
        self._observer = observer
        self._kinds: set[str] = set()

    def settle(self, origin: str, kind: str) -> None:
        """The object failed with an origin error of `kind`: count it unless a request was."""
        if kind not in self._kinds:
            self._kinds.add(kind)
            self._observer.origin_failed(origin, kind)

    def origin_request(self, origin: str, status: str) -> None:
        self._kinds.add(status)
        self._observer.origin_request(origin, status)

    def origin_retry(self, origin: str) -> None:
        self._observer.origin_retry(origin)

    def origin_throttled(self, origin: str) -> None:
        self._observer.origin_throttled(origin)

    def origin_request_limit(self, origin: str, limit: int) -> None:
        self._observer.origin_request_limit(origin, limit)

    def origin_wait_abandoned(self, origin: str) -> None:
        self._observer.origin_wait_abandoned(origin)

    def origin_request_shed(self, origin: str) -> None:
        self._observer.origin_request_shed(origin)

    def origin_failed(self, origin: str, kind: str) -> None:
        self.settle(origin, kind)

    def origin_bytes(self, origin: str, size_bytes: int) -> None:
        self._observer.origin_bytes(origin, size_bytes)

    def fetch_finished(self, origin: str, duration_s: float) -> None:
        self._observer.fetch_finished(origin, duration_s)

    def evicted(self, size_bytes: int, was_pinned: bool) -> None:
        self._observer.evicted(size_bytes, was_pinned)

    def prefetch_late(self, origin: str) -> None:
        self._observer.prefetch_late(origin)

    def prefetch_wasted(self, origin: str) -> None:
        self._observer.prefetch_wasted(origin)

    def checksum_unusable(self, origin: str, algorithm: str) -> None:
        self._observer.checksum_unusable(origin, algorithm)
