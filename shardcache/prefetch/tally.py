"""The tally: how the prefetch queue's items ended, counted once, for the queue and its batch.

Every item ends once: done (with the bytes the prefetch itself fetched, when it did) or failed
(kept among the recent failures `/_/prefetch` shows, and logged at WARNING, rate-limited per
origin and kind). What this module must not know: how an item ran or why it ended (the queue
says), the lanes, the look-ahead budget, the cache.
"""

from __future__ import annotations

import collections
import logging

from shardcache.errors import ShardcacheError
from shardcache.observability.logs import FailureLog
from shardcache.prefetch.lanes import Item

log = logging.getLogger("shardcache.prefetch")
RECENT_FAILURES = 20


class Tally:
    def __init__(self) -> None:
        self._failures = FailureLog(log)  # failed keys: WARNING, rate-limited
        self.completed = 0  # every item that ended without an error …
        self.fetched = 0  # … of which the prefetch itself fetched from the origin
        self.failed = 0
        self.bytes_done = 0
        self.recent_failures: collections.deque[dict[str, str]] = collections.deque(
            maxlen=RECENT_FAILURES
        )

    def done(self, item: Item, size_bytes: int, is_fetched: bool) -> None:
        self.completed += 1
        self.fetched += is_fetched
        self.bytes_done += size_bytes
        if item.batch is not None:
            item.batch.done += 1
            item.batch.bytes_done += size_bytes

    def failure(self, item: Item, exc: ShardcacheError) -> None:
        self.failed += 1
        failure = {"url": f"/{item.origin}/{item.key}", "error": str(exc), "kind": exc.kind}
        self.recent_failures.append(failure)
        if item.batch is not None:
            item.batch.failed += 1
            item.batch.failures.append(failure)
        # Rate-limited per origin and kind: a reload that removes an origin, or an origin
        # that is down, fails every queued key of it at once.
        self._failures.failed(
            item.origin, exc.kind, "prefetch of /%s/%s failed: %s", item.origin, item.key, exc
        )

    def close(self) -> None:
        """Log the counts of failures not yet summarized."""
        self._failures.close()
