"""Single-flight: at most one `Fill` per cache key is in flight; later requests join it.

`join_or_start` has no await between lookup and insert (atomic on the event loop). The order
at a fill's end is (1) commit to the store, (2) `finish()`; a purged fill is `detach`ed: no
request joins it any more, but shutdown still cancels it."""

from __future__ import annotations

from collections.abc import Callable

from shardcache.cache.fill import Fill


class Flights:
    def __init__(self) -> None:
        self._fills: dict[str, Fill] = {}
        self._detached: set[Fill] = set()  # running for their readers, joined by no one

    def get(self, key: str) -> Fill | None:
        return self._fills.get(key)

    def join_or_start(self, key: str, start: Callable[[], Fill]) -> tuple[Fill, bool]:
        """Return the fill for `key`, calling `start()` to make one if none is in flight.

        The bool is True when the caller joined an existing fill (`X-Shardcache: coalesced`);
        when False the caller owns running the new fill.
        """
        fill = self._fills.get(key)
        if fill is not None:
            return fill, True
        fill = self._fills[key] = start()
        return fill, False

    def finish(self, fill: Fill) -> None:
        """Forget `fill` if it is still the one registered for its key."""
        self._detached.discard(fill)
        if self._fills.get(fill.cache_key) is fill:
            del self._fills[fill.cache_key]

    def detach(self, fill: Fill) -> None:
        """Let no request join `fill` from now on (it was purged); it stays in the iteration
        until `finish(fill)`."""
        if self._fills.get(fill.cache_key) is fill:
            del self._fills[fill.cache_key]
            self._detached.add(fill)

    def keys(self) -> list[str]:
        """The cache keys a request would join a fill for (not the detached fills')."""
        return list(self._fills)

    def __len__(self) -> int:
        return len(self._fills) + len(self._detached)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([*self._fills.values(), *self._detached])
