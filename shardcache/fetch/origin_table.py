"""`OriginTable`: the configured origins, each with the state kept for it (its throttling
limiter), built and closed as one unit.

A reload (`replace`) keeps the slot of an origin whose backend it kept, builds a new slot (a
new limiter) for one it added or rebuilt, and retires the slots it replaced: a retired
origin's client is closed once no fill or request uses it any more, or after RETIRE_WAIT_S
(its pooled connections must not stay open until the daemon stops: 60 reloads left 120
sockets in CLOSE_WAIT). Knows nothing of the cache or of configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from shardcache.fetch.limiter import RequestLimiter
from shardcache.observer import Observer
from shardcache.origins.base import Origin

log = logging.getLogger("shardcache.origin")
RETIRE_WAIT_S = 60.0  # a replaced origin's requests still running then are stopped


@dataclass(eq=False, slots=True)
class OriginSlot:
    """One origin and its limiter, with a count of the fills and requests using it."""

    origin: Origin
    limiter: RequestLimiter
    users: int = 0
    is_idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.is_idle.set()

    @contextlib.contextmanager
    def using(self) -> Iterator[Origin]:
        """Hold the origin open for a fill or a request (a reload closes it only after)."""
        self.users += 1
        self.is_idle.clear()
        try:
            yield self.origin
        finally:
            self.users -= 1
            if self.users == 0:
                self.is_idle.set()


class OriginTable:
    def __init__(
        self,
        origins: Mapping[str, Origin],
        observer: Observer,
        retire_wait_s: float = RETIRE_WAIT_S,
    ) -> None:
        """Take ownership of `origins`: this table closes them (`replace`, `aclose`)."""
        self._observer = observer
        self._retire_wait_s = retire_wait_s
        self._slots = {name: self._new_slot(origin) for name, origin in origins.items()}
        self._retiring: dict[OriginSlot, asyncio.Task[None]] = {}

    def _new_slot(self, origin: Origin) -> OriginSlot:
        report = functools.partial(self._observer.origin_request_limit, origin.name)
        return OriginSlot(origin, RequestLimiter(origin.name, report))

    @property
    def origins(self) -> dict[str, Origin]:
        """The current origins by name (a copy)."""
        return {name: slot.origin for name, slot in self._slots.items()}

    def get(self, name: str) -> OriginSlot | None:
        return self._slots.get(name)

    def slot_of(self, origin: Origin) -> OriginSlot | None:
        """The slot of `origin`, current or retiring (a fill may outlive a reload)."""
        for slot in [*self._slots.values(), *self._retiring]:
            if slot.origin is origin:
                return slot
        return None

    def replace(self, origins: Mapping[str, Origin]) -> None:
        """Make `origins` the current ones; retire (then close) the slots of those replaced."""
        slots: dict[str, OriginSlot] = {}
        for name, origin in origins.items():
            slot = self._slots.get(name)
            if slot is None or slot.origin is not origin:
                slot = self._new_slot(origin)
                self._observer.origin_request_limit(name, 0)  # a new limiter: unlimited
            slots[name] = slot
        replaced = [slot for slot in self._slots.values() if slot not in slots.values()]
        self._slots = slots
        for slot in replaced:
            task = asyncio.create_task(self._close_when_idle(slot), name="retire origin")
            self._retiring[slot] = task

    async def _close_when_idle(self, slot: OriginSlot) -> None:
        try:
            async with asyncio.timeout(self._retire_wait_s):
                await slot.is_idle.wait()
        except TimeoutError:
            log.warning(
                "origin %s: a reload replaced it %.0f s ago and %d requests still use it; "
                "stopping them",
                slot.origin.name,
                self._retire_wait_s,
                slot.users,
            )
        await _close(slot.origin)
        del self._retiring[slot]

    async def aclose(self) -> None:
        """Close every origin, current and retiring, now."""
        for task in self._retiring.values():
            task.cancel()
        await asyncio.gather(*self._retiring.values(), return_exceptions=True)
        for slot in [*self._slots.values(), *self._retiring]:
            await _close(slot.origin)
        self._retiring.clear()


async def _close(origin: Origin) -> None:
    """Close one origin's client; a failure is logged, and must not stop the others."""
    try:
        await origin.aclose()
    except Exception:
        log.exception("closing origin %s failed", origin.name)
