"""`OriginGate`: where every request to one origin waits, kept in its `OriginTable` slot: one FIFO
queue paced at the lower of the operator's cap and the throttling curve, and an optional cap on
requests at once, which a GET holds until its body ends. Requests continuing an answer go first,
never shed; any other whose turn or place is too far off is shed (`OriginShed`, Retry-After).
One that stops waiting leaves nothing booked. How it behaves: docs/architecture.md."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardcache.errors import OriginShed
from shardcache.fetch.throttle import ThrottleCurve
from shardcache.observer import NullObserver, Observer
from shardcache.origins.base import OriginStream
from shardcache.origins.streams import StreamWrapper


@dataclass(frozen=True, slots=True)
class GateCaps:
    """An operator's fixed caps on one origin (`max_requests`, `max_requests_per_second`)."""

    max_requests: int | None = None
    max_requests_per_second: float | None = None


NO_CAPS = GateCaps()


class OriginGate:
    def __init__(
        self,
        origin: str,
        caps: GateCaps = NO_CAPS,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        observer = observer or NullObserver()
        self.origin = origin
        self.caps = caps
        self.throttling = ThrottleCurve(
            origin, lambda limit: observer.origin_request_limit(origin, limit), clock
        )
        self.shed_requests = 0
        self.abandoned_waits = 0  # requests that stopped waiting here: never sent
        self._observer = observer
        self._clock = clock
        self._last_went = -math.inf  # when the last paced request went
        self._queue: collections.deque[asyncio.Event] = collections.deque()
        self._urgent = 0  # the urgent ones, all at the front of the queue
        self._in_use = 0  # places held (by GETs whose bodies have not ended), under any caps
        # Those waiting for a place, each handed one directly; the urgent ones at the front.
        self._place_queue: collections.deque[tuple[asyncio.Future[None], bool]] = (
            collections.deque()
        )
        self._urgent_for_places = 0

    @property
    def rate(self) -> float | None:
        """Requests a second allowed now (the lower of the cap and the throttling curve);
        None while unlimited."""
        rates = [r for r in (self.caps.max_requests_per_second, self.throttling.rate) if r]
        return min(rates) if rates else None

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return len(self._queue)

    @property
    def waiting_for_place(self) -> int:
        """GETs waiting for one of the `max_requests` places."""
        return len(self._place_queue)

    def status(self) -> dict[str, object]:
        """The caps, and what waits here now or was sent away, for `/_/status`."""
        return {
            "max_requests": self.caps.max_requests,
            "max_requests_per_second": self.caps.max_requests_per_second,
            "in_use": self._in_use,
            "waiting": self.waiting,
            "waiting_for_place": self.waiting_for_place,
            "shed": self.shed_requests,
            "abandoned": self.abandoned_waits,
        }

    def recap(self, caps: GateCaps) -> None:
        """A reload changed the caps on the same store: the places held stay counted against
        the new `max_requests` (a lower one admits nobody until enough came back), and the
        requests waiting go by the new caps (a lifted one lets them go at once)."""
        self.caps = caps
        self._hand_places()
        self._wake()

    async def turn(self, max_wait_s: float = math.inf, is_urgent: bool = False) -> float:
        """Wait for the request's turn (at once while unlimited and nobody waits); return the
        time it was sent, for `throttled()`.

        Raises OriginShed when the turn is more than `max_wait_s` away: at once when the
        queue says so at the current rate, else when `max_wait_s` has passed. An urgent
        request waits ahead of the others, in order among the urgent ones, and is never shed.
        """
        if self.rate is not None or self._queue:
            await self._wait_turn(math.inf if is_urgent else max_wait_s, is_urgent)
        sent_at = self._clock()
        self.throttling.sent(sent_at)
        return sent_at

    async def enter(
        self, max_wait_s: float = math.inf, is_urgent: bool = False, takes_place: bool = False
    ) -> float:
        """A place (`takes_place`: a GET), then a turn, both within one wait of `max_wait_s`;
        return when the request was sent (for `throttled()`). A GET's place is the caller's
        to give back, or to let `holding` give back. Raises OriginShed, and keeps no place,
        when either is too far off."""
        if not takes_place:
            return await self.turn(max_wait_s, is_urgent)
        began, place_wait_s = self._clock(), max_wait_s
        while True:
            is_capped = self.caps.max_requests is not None
            await self.take_place(place_wait_s, is_urgent)
            try:
                waited_s = self._clock() - began if is_capped else 0.0  # no cap: no wait
                sent_at = await self.turn(max(0.0, max_wait_s - waited_s), is_urgent)
            except BaseException:
                self.give_place_back()
                raise
            cap = self.caps.max_requests
            if cap is None or self._in_use <= cap:
                return sent_at
            # A reload lowered the cap while this one waited for its turn, unsent: it gives
            # its place back and waits for one under the new cap.
            self.give_place_back()
            place_wait_s = max(0.0, max_wait_s - (self._clock() - began))

    async def take_place(self, max_wait_s: float = math.inf, is_urgent: bool = False) -> None:
        """Take one of the requests at once a GET holds until its body ends (`holding`); the
        caller gives it back. Taken at once while there is no cap, but counted all the same,
        so that a reload that sets one counts the bodies begun without it.
        Raises OriginShed when none came free within `max_wait_s`; an urgent request waits for
        one unshed, ahead of the others (in order among the urgent ones)."""
        cap = self.caps.max_requests
        ahead = self._urgent_for_places if is_urgent else len(self._place_queue)
        if (cap is None or self._in_use < cap) and ahead == 0:
            self._in_use += 1
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._place_queue.insert(ahead, (handed, is_urgent))
        self._urgent_for_places += is_urgent
        try:
            if is_urgent or math.isinf(max_wait_s):
                await handed  # never shed: the client's answer is under way
            else:
                async with asyncio.timeout(max_wait_s):
                    await handed
        except TimeoutError:
            self._leave_place_queue(handed, is_urgent)
            self._shed(self._places_message(max_wait_s), max_wait_s, "busy")
        except asyncio.CancelledError:
            self._leave_place_queue(handed, is_urgent)
            self._abandoned()
            raise

    def give_place_back(self) -> None:
        """A place comes back: the next waiting for one is handed it (while the cap, perhaps
        lowered by a reload since, has one free)."""
        self._in_use -= 1
        self._hand_places()

    def _hand_places(self) -> None:
        """Hand the free places to those waiting, first in the queue first (all of them once
        a reload lifted the cap: each gives its place back all the same)."""
        cap = self.caps.max_requests
        while self._place_queue and (cap is None or self._in_use < cap):
            handed, was_urgent = self._place_queue.popleft()
            self._urgent_for_places -= was_urgent
            if not handed.done():
                handed.set_result(None)
                self._in_use += 1

    def _leave_place_queue(self, handed: asyncio.Future[None], is_urgent: bool) -> None:
        """A waiter stopped waiting: out of the queue, or, when a place was handed to it as it
        stopped, the place goes on to the next."""
        if (handed, is_urgent) in self._place_queue:
            self._place_queue.remove((handed, is_urgent))
            self._urgent_for_places -= is_urgent
        elif handed.done() and not handed.cancelled():
            self.give_place_back()

    def holding(self, stream: OriginStream) -> OriginStream:
        """`stream`, which gives its place back once, when its body was read to its end,
        landed, failed or closed (the place `take_place` took for it)."""
        return _PlacedStream(stream, self)

    def throttled(self, sent_at: float) -> None:
        """The origin refused a request sent at `sent_at` as one too many."""
        was_throttled = self.throttling.is_throttled
        if self.throttling.throttled(sent_at):
            if not was_throttled:
                self._went(self._clock())  # paced from the first refusal on
            self._wake()

    def answered(self) -> None:
        """The origin answered a request without refusing it."""
        if self.throttling.answered():
            self._wake()

    async def _wait_turn(self, max_wait_s: float, is_urgent: bool) -> None:
        began = self._clock()
        rate = self.rate
        ahead = self._urgent if is_urgent else len(self._queue)
        if rate is not None:
            expected_s = max(0.0, self._next_at(rate) - began) + ahead / rate
            if expected_s > max_wait_s:
                self._shed_turn(expected_s)
        me = asyncio.Event()
        self._queue.insert(ahead, me)
        self._urgent += is_urgent
        try:
            while True:
                now = self._clock()
                rate = self.rate
                if self._queue[0] is me and (rate is None or now >= self._next_at(rate)):
                    break
                left_s = began + max_wait_s - now
                if left_s <= 0:
                    self._shed_turn(len(self._queue) / rate if rate else 1.0)
                # The first in the queue paces; the others wait to become first.
                wait_s = self._next_at(rate) - now if self._queue[0] is me and rate else left_s
                timeout_s = min(wait_s, left_s)
                me.clear()
                # Not `asyncio.wait_for`: on Python 3.11 it swallows a cancellation that
                # comes as `me` is set (the one ahead left), and a request whose reader left
                # would take its turn for nobody.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if math.isinf(timeout_s) else timeout_s):
                        await me.wait()
        except asyncio.CancelledError:
            self._abandoned()
            raise
        finally:
            self._queue.remove(me)
            self._urgent -= is_urgent
            if self._queue:
                self._queue[0].set()  # the next one paces now
        self._went(self._clock())
        self.throttling.report()

    def _next_at(self, rate: float) -> float:
        return self._last_went + 1 / rate

    def _went(self, at: float) -> None:
        self._last_went = max(self._last_went, at)

    def _wake(self) -> None:
        """The rate changed: the first waiting request recomputes its turn."""
        if self._queue:
            self._queue[0].set()

    def _places_message(self, waited_s: float) -> str:
        """Why no place came: all were in use, and whether GETs holding them still wait for
        their turn under the rate cap (then that cap binds, not `max_requests`)."""
        message = (
            f"origin {self.origin}: all {self.caps.max_requests} of its max_requests stayed in "
            f"use for {waited_s:g} s"
        )
        if self.waiting and self.caps.max_requests_per_second:
            message += (
                f"; {self.waiting} requests wait for their turn under its "
                f"max_requests_per_second = {self.caps.max_requests_per_second:g}, which binds"
            )
        return message

    def _shed_turn(self, wait_s: float) -> None:
        rate, cap = self.rate, self.caps.max_requests_per_second
        if self.throttling.is_throttled and (cap is None or (rate is not None and rate < cap)):
            message = f"origin {self.origin} is throttling us: the next turn is"
            kind = "throttled"  # passed on as such: a daemon reading through this one slows
        elif cap is not None:
            message = (
                f"origin {self.origin}: under its max_requests_per_second = {cap:g}, the "
                "next turn is"
            )
            kind = "busy"
        else:  # unlimited again, and the requests ahead did not go within its wait
            message = f"origin {self.origin}: the requests ahead did not go; the next turn is"
            kind = "busy"
        self._shed(f"{message} {wait_s:.0f} s off ({len(self._queue)} waiting)", wait_s, kind)

    def _shed(self, message: str, wait_s: float, kind: str) -> None:
        self.shed_requests += 1
        self._observer.origin_request_shed(self.origin)
        raise OriginShed(message, max(1.0, wait_s), kind)

    def _abandoned(self) -> None:
        self.abandoned_waits += 1
        self._observer.origin_wait_abandoned(self.origin)


class _PlacedStream(StreamWrapper):
    """A stream that gives its request's place back once: when its body was read to its end,
    landed, failed or closed, whichever comes first (`ended`)."""

    def __init__(self, inner: OriginStream, gate: OriginGate | None) -> None:
        super().__init__(inner)
        self._gate = gate

    def ended(self) -> None:
        if self._gate is not None:  # the next request may go
            self._gate.give_place_back()
            self._gate = None


__all__ = ["NO_CAPS", "GateCaps", "OriginGate"]
