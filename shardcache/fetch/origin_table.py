"""`OriginTable`: the configured origins, each with everything kept for it (backend, gate, how it
is shown); the one owner of the set of origins.

A reload (`replace`) builds the table again, carrying over the slot of a kept backend; retired
clients close once unused, or after RETIRE_WAIT_S. Knows nothing of the cache."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field

from shardcache.config import OriginSpec
from shardcache.errors import OriginThrottled
from shardcache.fetch.gate import NO_CAPS, GateCaps, OriginGate
from shardcache.observer import Observer
from shardcache.origins.base import Origin

log = logging.getLogger("shardcache.origin")
RETIRE_WAIT_S = 60.0  # a replaced origin's requests still running then are stopped


@dataclass(frozen=True, slots=True)
class ConfiguredOrigin:
    """One origin as the daemon configured it: the backend built from `spec`, and how it is
    shown (`shown_url`: credentials masked, for `/_/status` and `/_/origins`; `home_label`:
    the upstream label of an origin with one URL, for the upstream metrics)."""

    origin: Origin
    spec: OriginSpec | None = None  # None: built by hand (tests), not from configuration
    shown_url: str = ""
    home_label: str = ""

    @property
    def has_upstreams(self) -> bool:
        return self.spec is not None and self.spec.has_upstreams

    @property
    def caps(self) -> GateCaps:
        """The operator's caps on requests to it (none for an origin built by hand)."""
        if self.spec is None:
            return NO_CAPS
        return GateCaps(self.spec.max_requests, self.spec.max_requests_per_second)


@dataclass(eq=False, slots=True)
class OriginSlot:
    """One origin, everything kept for it (`gate`: every request to it waits there), and a
    count of the fills and requests using it."""

    configured: ConfiguredOrigin
    gate: OriginGate
    users: int = 0
    is_idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.is_idle.set()

    @property
    def origin(self) -> Origin:
        return self.configured.origin

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
        origins: Mapping[str, Origin | ConfiguredOrigin],
        observer: Observer,
        retire_wait_s: float = RETIRE_WAIT_S,
    ) -> None:
        """Take ownership of `origins`: this table closes them (`replace`, `aclose`). A bare
        `Origin` stands for one configured by hand, with nothing shown of it."""
        self._observer = observer
        self._retire_wait_s = retire_wait_s
        self._slots = {
            name: self._new_slot(_configured(origin)) for name, origin in origins.items()
        }
        self._retiring: dict[OriginSlot, asyncio.Task[None]] = {}

    def _new_slot(self, configured: ConfiguredOrigin, gate: OriginGate | None = None) -> OriginSlot:
        name = configured.origin.name
        return OriginSlot(configured, gate or OriginGate(name, configured.caps, self._observer))

    @property
    def origins(self) -> dict[str, Origin]:
        """The current backends by name (a copy)."""
        return {name: slot.origin for name, slot in self._slots.items()}

    @property
    def specs(self) -> dict[str, OriginSpec]:
        """What the current backends were built from, by name (a reload keeps a backend whose
        spec did not change)."""
        return {
            name: slot.configured.spec
            for name, slot in self._slots.items()
            if slot.configured.spec is not None
        }

    def gate_status(self) -> dict[str, dict[str, object]]:
        """Each current origin's gate as `/_/status` shows it (`OriginGate.status`)."""
        return {name: slot.gate.status() for name, slot in self._slots.items()}

    def shown_urls(self) -> dict[str, str]:
        """Name -> URL as `/_/status` and `/_/origins` show it (credentials masked)."""
        return {name: slot.configured.shown_url for name, slot in self._slots.items()}

    def has_upstreams(self, name: str) -> bool:
        """Whether origin `name` has a tier or mirrors (the routes' loop guard)."""
        slot = self._slots.get(name)
        return slot is not None and slot.configured.has_upstreams

    def lone_homes(self) -> dict[str, str]:
        """Origin -> its upstream label, for the origins with one URL (no mirror, no tier)."""
        return {
            name: slot.configured.home_label
            for name, slot in self._slots.items()
            if not slot.configured.has_upstreams
        }

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, name: str) -> OriginSlot | None:
        return self._slots.get(name)

    def slot_of(self, origin: Origin) -> OriginSlot | None:
        """The slot of `origin`, current or retiring (a fill may outlive a reload)."""
        for slot in [*self._slots.values(), *self._retiring]:
            if slot.origin is origin:
                return slot
        return None

    def gate_of(self, origin: Origin) -> OriginGate | None:
        """The gate every request to `origin` waits at: its slot's, current or retiring, else
        (a backend a reload replaced and closed while a reader given it looked its key up)
        the gate of the origin of that name now; None: no such origin."""
        slot = self.slot_of(origin) or self._slots.get(origin.name)
        return None if slot is None else slot.gate

    def using(self, origin: Origin) -> contextlib.AbstractContextManager[object]:
        """Hold `origin` open while a fill or request uses it (`replace` closes a replaced
        one only after)."""
        slot = self.slot_of(origin)
        return contextlib.nullcontext() if slot is None else slot.using()

    @contextlib.asynccontextmanager
    async def one_request(
        self, origin: Origin, max_wait_s: float, is_get: bool = False
    ) -> AsyncIterator[None]:
        """Hold `origin` open for one request that is no fill's (a client's HEAD of a miss, a
        listing), sent in its turn at the origin's gate, which hears whether the origin
        refused it as one too many. `is_get`: a GET with a body (a listing, a bucket's
        location), which holds one of the origin's requests at once (`max_requests`) until it
        ends. Raises OriginShed when the turn or the place is too far off."""
        slot = self.slot_of(origin)
        if slot is None:
            yield
            return
        with slot.using():
            sent_at = await slot.gate.enter(max_wait_s, takes_place=is_get)
            try:
                try:
                    yield
                except OriginThrottled:
                    slot.gate.throttled(sent_at)
                    raise
                slot.gate.answered()
            finally:
                if is_get:
                    slot.gate.give_place_back()

    def replace(self, origins: Mapping[str, Origin | ConfiguredOrigin]) -> None:
        """Make `origins` the whole table; retire (then close) the slots of those replaced.
        A backend kept from the current table keeps its slot (its gate, its users)."""
        slots: dict[str, OriginSlot] = {}
        for name, given in origins.items():
            configured = _configured(given)
            slot = self._slots.get(name)
            if slot is None or slot.origin is not configured.origin:
                # The same store keeps its gate, under the new caps: the requests the replaced
                # backend still has open hold their places in it, and its pace goes on.
                kept = self._gate_for(name, configured)
                slot = self._new_slot(configured, kept)
                if kept is None:
                    self._observer.origin_request_limit(name, 0)  # a new gate: unlimited
            else:
                slot.configured = configured  # the same backend; how it is shown may change
            if slot.gate.caps != configured.caps:
                slot.gate.recap(configured.caps)
            slots[name] = slot
        replaced = [slot for slot in self._slots.values() if slot not in slots.values()]
        self._slots = slots
        for slot in replaced:
            task = asyncio.create_task(self._close_when_idle(slot), name="retire origin")
            self._retiring[slot] = task

    def _gate_for(self, name: str, configured: ConfiguredOrigin) -> OriginGate | None:
        """The gate of the current slot of `name` when it asks the same store, else of a
        retiring one that does (an origin removed, or moved, then put back while its requests
        still run: they hold their places there); None: a new gate."""
        current = self._slots.get(name)
        if current is not None and _same_store(current, configured):
            return current.gate
        for slot in reversed(self._retiring):
            if slot.origin.name == configured.origin.name and _same_store(slot, configured):
                return slot.gate
        return None

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


def _same_store(slot: OriginSlot, configured: ConfiguredOrigin) -> bool:
    """Whether `configured` asks the store `slot` asked (its caps may differ)."""
    old, new = slot.configured.spec, configured.spec
    return old is not None and new is not None and old.url == new.url


def _configured(origin: Origin | ConfiguredOrigin) -> ConfiguredOrigin:
    return origin if isinstance(origin, ConfiguredOrigin) else ConfiguredOrigin(origin)


async def _close(origin: Origin) -> None:
    """Close one origin's client; a failure is logged, and must not stop the others."""
    try:
        await origin.aclose()
    except Exception:
        log.exception("closing origin %s failed", origin.name)
