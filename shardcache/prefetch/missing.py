"""Keys that read-ahead found missing at their origin, remembered for a while, so a numbered
run's guesses past a gap or its end are not asked of the origin on every read.

Forgotten after MISSING_FOR_S; at most MAX_MISSING keys, oldest first. Only read-ahead consults
it: a client's own request for the key always goes to the origin."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

MISSING_FOR_S = 60.0
MAX_MISSING = 4096


class MissingKeys:
    """(origin, key) pairs found missing, each until MISSING_FOR_S after it was found."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = MISSING_FOR_S,
        limit: int = MAX_MISSING,
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._limit = limit
        self._until: OrderedDict[tuple[str, str], float] = OrderedDict()

    def add(self, origin: str, key: str) -> None:
        self._until.pop((origin, key), None)
        self._until[(origin, key)] = self._clock() + self._ttl_s
        while len(self._until) > self._limit:
            self._until.popitem(last=False)

    def has(self, origin: str, key: str) -> bool:
        until = self._until.get((origin, key))
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[(origin, key)]
            return False
        return True

    def __len__(self) -> int:
        return len(self._until)


__all__ = ["MISSING_FOR_S", "MissingKeys"]
