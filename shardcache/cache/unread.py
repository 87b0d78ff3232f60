"""The unread ledger: the one owner of look-ahead bytes, held (admitted, not started) or pinned.

A pinned entry is pinned in the store from its prefetch's start until a client reads it or it
is released; a `Hold` becomes that pin, or is let go. One condition: every change wakes every
waiter, which re-checks what it waits for. Must not know: the prefetch queue's order or budget
rule (it waits on figures here), fills, the origins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shardcache.cache.store import Store


@dataclass(eq=False, slots=True)
class Hold:
    """Bytes admitted to the look-ahead budget for one prefetch not started yet."""

    size_bytes: int


class UnreadLedger:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._pinned: dict[str, int] = {}  # cache key → size, pinned in the store
        self._holds: set[Hold] = set()
        self._changed = asyncio.Event()  # set once per change, then replaced: a broadcast

    def __contains__(self, url: str) -> bool:
        return url in self._pinned

    @property
    def total_bytes(self) -> int:
        """The pinned, unread bytes (what `/_/prefetch` calls `unread_bytes`)."""
        return sum(self._pinned.values())

    @property
    def held_bytes(self) -> int:
        """The bytes held for prefetches admitted and not started (or not pinned) yet."""
        return sum(hold.size_bytes for hold in self._holds)

    def sizes(self) -> dict[str, int]:
        """Prefetched entries no client has read yet, cache key → size (a copy)."""
        return dict(self._pinned)

    def hold(self, size_bytes: int) -> Hold:
        """Hold `size_bytes` for a prefetch about to start; pass it to `pin`, or `let_go` of
        it."""
        hold = Hold(size_bytes)
        self._holds.add(hold)
        self._notify()  # what the next in line is owed changed
        return hold

    def let_go(self, hold: Hold | None) -> None:
        """Give back `hold` (its prefetch pinned nothing); a hold already gone is ignored."""
        if hold is not None and hold in self._holds:
            self._holds.discard(hold)
            self._notify()

    def pin(self, url: str, size_bytes: int, hold: Hold | None = None) -> None:
        """A look-ahead prefetch of `url` started: pin it until it is read, in place of
        `hold`, in one step (no one sees both or neither)."""
        if hold is not None:
            self._holds.discard(hold)
        self._pinned[url] = size_bytes
        self.store.pin(url)
        self._notify()

    def release(self, urls: Iterable[str] | None = None) -> int:
        """Unpin prefetched-but-unread entries, all or those of `urls` (they stay cached, as
        ordinary entries); return the bytes released. Wakes every waiter even when it frees
        nothing: the queue releases when it drops items, and a dropped item waiting for room
        must stop waiting."""
        chosen = list(self._pinned) if urls is None else [u for u in urls if u in self._pinned]
        released = sum(self._pinned[url] for url in chosen)
        for url in chosen:
            self._unpin(url)
        self._notify()
        return released

    def mark_read(self, url: str) -> None:
        """A prefetched entry was read (or dropped): unpin it, free its look-ahead budget."""
        self._unpin(url)
        self._notify()

    def _unpin(self, url: str) -> None:
        self._pinned.pop(url, None)
        self.store.unpin(url)  # a set operation under an uncontended lock

    async def wait_for(self, ready: Callable[[], bool]) -> None:
        """Return once `ready()` is true, asking it again after every change here (and after
        `release`). `ready` runs on the event loop, between changes: it must not block."""
        while not ready():
            await self._changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


__all__ = ["Hold", "UnreadLedger"]
