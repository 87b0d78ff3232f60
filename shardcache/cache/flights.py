"""Single-flight: at most one `Fill` per cache key is in flight; later requests join it.

`join_or_start` is synchronous (no await between the lookup and the insert), which is what makes
it atomic on the event loop. An entry leaves the map when its fill finishes, before any
follow-up request could start a duplicate: the order is (1) commit to the store, (2) `finish()`.
"""

from __future__ import annotations

from collections.abc import Callable

from shardcache.cache.fill import Fill


class Flights:
    def __init__(self) -> None:
        self._fills: dict[str, Fill] = {}

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
        if self._fills.get(fill.cache_key) is fill:
            del self._fills[fill.cache_key]

    def __len__(self) -> int:
        return len(self._fills)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._fills.values()))
