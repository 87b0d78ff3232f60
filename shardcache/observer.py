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
        """The origin's limit on requests at once changed (0: unlimited)."""

    def origin_bytes(self, origin: str, size_bytes: int) -> None: ...

    def fetch_finished(self, origin: str, duration_s: float) -> None: ...

    def evicted(self, size_bytes: int, was_pinned: bool) -> None: ...

    def prefetch_late(self, origin: str) -> None:
        """A client asked for a key whose prefetch had not finished."""

    def prefetch_wasted(self, origin: str) -> None:
        """A prefetched entry left the cache before any client read it."""


class NullObserver:
    def origin_request(self, origin: str, status: str) -> None:
        return None

    def origin_retry(self, origin: str) -> None:
        return None

    def origin_throttled(self, origin: str) -> None:
        return None

    def origin_request_limit(self, origin: str, limit: int) -> None:
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
