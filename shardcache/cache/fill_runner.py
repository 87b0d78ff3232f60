"""`FillRunner`: every fill runs as a task this object owns, so a client that disconnects never
cancels a download other clients (or the cache) still want; one nobody wants any more is stopped
(`fill` gives the rule, `_drop_unwanted` the race with a joining reader), and one whose bytes
from a tier member or mirror failed verification is fetched once more from the next upstream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shardcache.cache.fill import Fill, FillFactory, FillState
from shardcache.cache.flights import Flights
from shardcache.errors import FillAbandoned, UnknownOrigin
from shardcache.fetch.origin_table import OriginTable
from shardcache.origins.base import Origin

log = logging.getLogger("shardcache.cache")

# A fill whose last reader leaves with at most this much still to come from the origin (and
# at most 1/8 of the object), its checksums already learned (no HEAD to ask under a cap),
# finishes and is cached anyway. A tar reader (WebDataset) stops at the end-of-archive
# blocks, before the record padding after them (up to 10 KiB): its `curl`, writing the
# padding into the closed pipe, exits a few KiB from the end, and stopping the fill there
# saved nothing but made the shard a miss again next epoch. A reader that leaves early
# (`| head`, a timeout) still stops it.
FINISH_LEFT_BYTES = 1 << 20


class FillRunner:
    def __init__(
        self,
        flights: Flights,
        fills: FillFactory,
        origins: OriginTable,
        cache_key: Callable[[str, str], tuple[Origin, str]],
    ) -> None:
        """`cache_key(origin name, key)`: the origin as configured now and the cache key (a
        second fetch asks the origin a reload may have replaced)."""
        self.flights = flights
        self._fills = fills
        self._origins = origins
        self._cache_key = cache_key
        self._tasks: set[asyncio.Task[None]] = set()
        self._is_closing = False  # `aclose` began: no fill is fetched again

    def new_fill(self, origin: Origin, key: str, url: str) -> Fill:
        """A fill of `key` from `origin`, cached as `url`, not started (`spawn`)."""
        gate = self._origins.gate_of(origin)  # this backend's, also mid-reload
        return self._fills.new(url, origin, key, gate, self._drop_unwanted)

    def _drop_unwanted(self, fill: Fill) -> None:
        """Stop a fill whose last reader let go and that nothing wants cached (`fill`'s
        rule), or close the stream of an object streamed through that nobody took.

        No reader is stranded on a stopped fill. The race, in steps on the event loop:
        (1) reader A starts the fill and holds it (`open`: join and `hold` in one step);
        (2) reader B joins it and holds it, in one step too; (3) A lets go: B holds it, it
        goes on; (4) B lets go: nothing holds it, and this runs in that same step, taking it
        out of the flights before it is cancelled; (5) reader C comes: it finds no fill in
        flight and starts its own. A joiner is either counted before (4), and the fill goes
        on, or comes after (4), and cannot find it."""
        if fill.state.is_fetching:
            size = 0 if fill.info is None else fill.info.size_bytes
            if size and fill.has_checksums and fill.is_kept:
                if size - fill.received_bytes <= min(FINISH_LEFT_BYTES, size // 8):
                    return  # nearly all here, no HEAD to ask: it finishes and is cached
            self.flights.finish(fill)
            fill.stop(FillAbandoned(f"{fill.cache_key}: every reader left"))
            return
        task = asyncio.create_task(fill.discard_passthrough(), name=f"drop {fill.cache_key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def spawn(self, fill: Fill) -> None:
        """Run `fill` as a task this runner owns (no client's task: see the module)."""
        task = asyncio.create_task(self._run(fill), name=f"fill {fill.cache_key}")
        fill.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, fill: Fill) -> None:
        try:
            with self._origins.using(fill.origin):
                await fill.run()
        finally:
            self.flights.ended(fill)  # counted for the re-check (`Flights.look`)
            # A purged fill (`do_not_keep`) is not fetched again: the purge said it is not kept.
            if (
                fill.check.blamed
                and fill.is_kept
                and not fill.is_second_fetch
                and not self._is_closing
            ):
                self._fetch_again(fill)  # in the same step: no reader starts a fill between
        if fill.is_second_fetch and fill.state is FillState.PASSTHROUGH:
            await fill.discard_passthrough()  # no starter to take its stream

    def _fetch_again(self, failed: Fill) -> None:
        """Fetch again, from byte 0 and as a new fill, an object whose body failed
        verification with bytes from a tier member or mirror (`BodyCheck.blamed`). Those upstreams
        are marked down by now, so its first GET goes to the next one; nothing of the failed
        body is kept (a resume there would splice two upstreams' bytes). The failed fill's
        readers had its bytes and got a visible failure; this one is kept for the cache even
        with no reader (`keep_unread`, unpinned), so the next read is a hit, and readers that
        come meanwhile join it. Once: a second fetch that fails too starts no third."""
        log.info(  # the breaker logged the upstream going down, once
            "%s failed verification with bytes from %s; fetching it again from the next upstream",
            failed.cache_key,
            ", ".join(failed.check.blamed),
        )
        try:  # the origin as configured now: a reload may have replaced the failed fill's
            origin, url = self._cache_key(failed.origin.name, failed.origin_key)
        except UnknownOrigin:
            return
        if url != failed.cache_key:  # its home changed: another object for the cache
            return
        fill, joined = self.flights.join_or_start(
            url, lambda: self.new_fill(origin, failed.origin_key, url)
        )
        if joined:  # a reader started one already: it asks the same upstreams
            return
        fill.is_second_fetch = True
        fill.readers.keep_unread()
        self.spawn(fill)

    async def aclose(self) -> None:
        """Cancel every fill still downloading (its partial file is removed), let verified
        ones finish committing, and wait for all of them."""
        self._is_closing = True
        for fill in self.flights:
            if not fill.state.is_body_complete:
                fill.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


__all__ = ["FINISH_LEFT_BYTES", "FillRunner"]
