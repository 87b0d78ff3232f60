"""`Readers`: who wants one fill's bytes, and the one way they wait for them (`until`).

Holders keep a fill going, the prefetch's keep does too; descriptors handed out keep its data
file open; a reader whose client left (its `left` event, watched by `watching`) stops waiting
with FillAbandoned. It knows the fill's data file, not its download or lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator

from shardcache.cache.entry import Reservation
from shardcache.errors import FillAbandoned


class Readers:
    """The readers of the fill of `what` (its cache key). `on_unwanted()`: the last holder let
    go and the prefetch does not keep it (the fill decides what that stops); `is_finished()`:
    the fill reached a final state (its data file closes with its last descriptor)."""

    def __init__(
        self, what: str, on_unwanted: Callable[[], None], is_finished: Callable[[], bool]
    ) -> None:
        self._what = what
        self._on_unwanted = on_unwanted
        self._is_finished = is_finished
        self._holders = 0  # readers that want the bytes (`hold`), from before they wait
        self._kept_unread = False  # the prefetch queue wants it cached (`keep_unread`)
        self._descriptors = 0  # open file descriptors handed out (`acquire`)
        self.file: Reservation | None = None  # the data file, once the fill reserved one
        self._changed = asyncio.Event()  # replaced on each `wake`: set once, for its waiters

    # -- who wants it ----------------------------------------------------------------------

    @property
    def is_held(self) -> bool:
        """A reader holds it (one that joined a prefetch makes its reservation a read's)."""
        return self._holders > 0

    def hold(self) -> None:
        self._holders += 1

    def let_go(self) -> None:
        self._holders -= 1
        self._tell_if_unwanted()

    def keep_unread(self) -> None:
        """The prefetch queue started or joined this fill: finish it with no reader left."""
        self._kept_unread = True

    def forget_unread(self) -> None:
        """The daemon is stopping: with no reader holding it, the fill stops now."""
        self._kept_unread = False
        self._tell_if_unwanted()

    def _tell_if_unwanted(self) -> None:
        if not (self._holders or self._kept_unread):
            self._on_unwanted()

    # -- descriptors -------------------------------------------------------------------------

    def acquire(self) -> int:
        """The data file's fd for sendfile/pread at explicit offsets; the caller must
        `release()` it. The fd stays valid after commit renames the file."""
        if self.file is None or self.file.fd < 0:  # closed: finished, unread
            raise RuntimeError("fill has no data file")
        self._descriptors += 1
        return self.file.fd

    def release(self) -> None:
        self._descriptors -= 1
        self.close_if_idle()

    def close_if_idle(self) -> None:
        """Close the data file once the fill is finished and no reader holds its fd."""
        if self._descriptors == 0 and self._is_finished() and self.file is not None:
            if self.file.fd >= 0:
                os.close(self.file.fd)
                self.file.fd = -1

    # -- waiting -----------------------------------------------------------------------------

    def wake(self) -> None:
        """Wake every waiter to look again: bytes landed, the state moved, a client left."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def until(self, ready: Callable[[], bool], left: asyncio.Event | None = None) -> None:
        """Return once `ready()`; raise FillAbandoned once `left` is set, even if ready then
        (the reader is gone: nothing is sent to it). A waiter whose `left` nothing watches
        (`watching`) notices it at the next `wake` only."""
        while True:
            if left is not None and left.is_set():
                raise FillAbandoned(f"the reader of {self._what} left")
            if ready():
                return
            await self._changed.wait()

    @contextlib.contextmanager
    def watching(self, left: asyncio.Event | None) -> Iterator[None]:
        """While inside, `left` being set wakes the waiters (one watcher for a response's
        waits, not a wake-up a chunk)."""
        if left is None:
            yield
            return
        watcher = asyncio.ensure_future(left.wait())
        watcher.add_done_callback(lambda done: None if done.cancelled() else self.wake())
        try:
            yield
        finally:
            watcher.cancel()


__all__ = ["Readers"]
