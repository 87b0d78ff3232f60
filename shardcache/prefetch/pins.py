"""Look-ahead pins: who asked for each prefetched, unread shard, and when its pin ends.

A pin ends when read, when its batch is dropped, when no plan reads it any more, when its job
goes quiet, or at a bound (`--prefetch-pin-max-seconds`): a pin no loader will read must not
hold the budget for ever. Pure: the clock and the plans' readers are handed in."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from shardcache.cache.plans import Reader

SILENT_PACES = 8.0  # a job this many of its shards late has stopped reading
MIN_SILENT_S = 10.0  # …but never sooner than this: a pause to checkpoint is not an end
BOUND_SLACK = 4.0  # a pin lasts this many times the wait its job's pace predicts…
MIN_BOUND_S = 30.0  # …and at least this long
READ_AHEAD = "read-ahead"  # the holder of a pin that read-ahead asked for

Ending = Literal["unplanned", "silent", "bound"]


@dataclass(slots=True)
class Pin:
    holder: str  # "batch N", or READ_AHEAD; the job's name once a plan reads it
    pinned_at: float
    until: float
    job: str | None = None  # the job whose plan reads it, once seen
    shape: tuple[str, str] | None = None  # (prefix, suffix) of its origin's cache keys


def unwanted(reader: Reader | None, covered: bool, planned_before: bool) -> Ending | None:
    """Why a look-ahead shard no loader will read should not be pinned (or, still queued, not
    fetched), or None while one will: no plan reads it where one did (`planned_before`: its
    job was seen, or read-ahead asked for it) or where plans cover its origin (`covered`);
    or the job whose plan reads it stopped reading (quiet for SILENT_PACES of its pace)."""
    if reader is None:
        return "unplanned" if planned_before or covered else None
    pace = reader.pace_s
    if pace is not None and reader.quiet_s > max(SILENT_PACES * pace, MIN_SILENT_S):
        return "silent"
    return None


class PinLedger:
    """Every look-ahead pin's holder and end (see the module doc)."""

    def __init__(self, max_pin_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_pin_s = max_pin_s
        self._clock = clock
        self._pins: dict[str, Pin] = {}

    def add(self, url: str, holder: str, shape: tuple[str, str] | None = None) -> None:
        """Pinned `url` for `holder`; `shape`: the (prefix, suffix) around the key in its
        origin's cache keys, to ask whether plans cover that origin."""
        now = self._clock()
        self._pins[url] = Pin(holder, now, now + self.max_pin_s, shape=shape)

    def __contains__(self, url: object) -> bool:
        return url in self._pins

    def shapes(self) -> dict[str, tuple[str, str] | None]:
        """Each pin's cache key and the shape of its origin's keys (`add`)."""
        return {url: pin.shape for url, pin in self._pins.items()}

    def expired(
        self,
        unread: Mapping[str, int],
        reader_of: Callable[[str], Reader | None],
        is_covered: Callable[[str], bool] = lambda url: False,
    ) -> list[tuple[str, Ending]]:
        """The pins to end now, each with why; forget the pins read or released meanwhile
        (those not in `unread`). `reader_of(url)`: the plan that reads it soonest, if any;
        `is_covered(url)`: whether plans cover its origin (then one no plan reads is
        unplanned: no loader of this origin will read it)."""
        now = self._clock()
        ended: list[tuple[str, Ending]] = []
        for url, pin in list(self._pins.items()):
            if url not in unread:
                del self._pins[url]
                continue
            reader = reader_of(url)
            if reader is not None and pin.job != reader.job:
                pin.job = reader.job
                pin.until = min(pin.pinned_at + self.max_pin_s, now + self._bound_s(reader))
            # Read-ahead pins only ever what a plan reads next.
            planned_before = pin.job is not None or pin.holder == READ_AHEAD
            why = unwanted(reader, reader is None and is_covered(url), planned_before)
            if why is not None:
                ended.append((url, why))
            elif now >= pin.until:
                ended.append((url, "bound"))
        for url, _ in ended:
            del self._pins[url]
        return ended

    def _bound_s(self, reader: Reader) -> float:
        if reader.pace_s is None:  # not two reads yet: no pace to go by
            return self.max_pin_s
        return max(MIN_BOUND_S, BOUND_SLACK * (reader.seconds_until + reader.pace_s))

    def forget(self, urls: list[str] | None = None) -> None:
        """Drop the ledger's entries for `urls` (every one when None): released elsewhere."""
        if urls is None:
            self._pins.clear()
            return
        for url in urls:
            self._pins.pop(url, None)

    def held(self, unread: Mapping[str, int]) -> dict[str, int]:
        """Unread bytes by holder (a job's name once a plan reads the shard), largest first;
        pins this ledger does not know (none today) count as "other"."""
        holders: dict[str, int] = {}
        for url, size in unread.items():
            pin = self._pins.get(url)
            holder = "other" if pin is None else pin.job or pin.holder
            holders[holder] = holders.get(holder, 0) + size
        return dict(sorted(holders.items(), key=lambda pair: -pair[1]))


__all__ = ["READ_AHEAD", "Ending", "Pin", "PinLedger", "unwanted"]
