"""Single-flight: at most one `Fill` per cache key is in flight; later requests join it.

`join_or_start` has no await between lookup and insert (atomic on the event loop). The order
at a fill's end is (1) commit to the store, (2) `ended()`, which counts it for the re-check
(`look`); a purged fill is `detach`ed: no request joins it any more, but shutdown still
cancels it."""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shardcache.cache.fill import Fill

T = TypeVar("T")
RECENT_FILLS = 65536  # keys whose finished fills are counted; a forgotten one costs a second look


class Flights:
    def __init__(self) -> None:
        self._fills: dict[str, Fill] = {}
        self._detached: set[Fill] = set()  # running for their readers, joined by no one
        # How many fills have ended per cache key (recent keys only): a caller that awaited
        # something notices that a fill came and went meanwhile.
        self._ended: collections.OrderedDict[str, int] = collections.OrderedDict()

    def get(self, key: str) -> Fill | None:
        return self._fills.get(key)

    async def look(self, key: str, lookup: Callable[[], Awaitable[T | None]]) -> Fill | T | None:
        """The fill in flight for `key`, else what `lookup()` finds (the committed entry),
        else None: then the caller may `join_or_start` one, in the same step.

        The cache is re-checked inside the flight, as groupcache's `load` does. The race, in
        steps: (1) no fill in flight; (2) `lookup()` runs on a thread; (3) meanwhile a fill (a
        prefetch, say) starts, commits and ends; (4) the lookup's "not cached" is stale, and
        starting a fill now would fetch the object twice: look again instead."""
        in_flight = self._fills.get(key)
        while in_flight is None:
            mark = self.mark(key)
            found = await lookup()
            if found is not None:
                return found
            if not self.ended_since(key, mark):
                return None
            in_flight = self._fills.get(key)
        return in_flight

    def mark(self, key: str) -> int:
        """A token for `ended_since`: how many fills of `key` have ended so far."""
        return self._ended.get(key, 0)

    def ended_since(self, key: str, mark: int) -> bool:
        """Whether a fill of `key` ended after `mark` was taken (then look at the cache again)."""
        return self._ended.get(key, 0) != mark

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

    def ended(self, fill: Fill) -> None:
        """`fill`'s task ended (committed, failed or stopped): forget it, and count it for
        the re-check (`look`, `ended_since`)."""
        self.finish(fill)
        key = fill.cache_key
        self._ended[key] = self._ended.pop(key, 0) + 1
        if len(self._ended) > RECENT_FILLS:
            self._ended.popitem(last=False)

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
