"""The prefetch queue: fetch the shards a loader will read next, ahead of it, within a budget.

- Order: first in, first fetched (a POSTed list is in the order the loader needs it).
- Concurrency: at most `concurrency` prefetches at once. Client misses never wait here: they go
  straight to `ShardCache.open`, and a client asking for a key being prefetched joins that fill.
- Look-ahead: a new prefetch starts only while prefetched-but-unread bytes plus its size stay
  within `max_unread_bytes` (the size comes from a HEAD first). Unread entries are pinned in the
  store, so later prefetches can never evict them before the loader reads them (no thrash).
- Read-ahead: `on_client_read()` queues the next `readahead` keys in a numbered run; a missing one
  ends the run quietly (the end of the dataset, not a failure).
- Warming (`{"warm": true}`, what `shardcache prefetch` sends): fill the cache in the given order
  like client misses would, nothing pinned and no look-ahead budget, so warming more than a
  quarter of the cache completes instead of waiting for a loader that is not there yet.
- A wait on the budget is said once in the log and shown in the queue's status and its batches'.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shardcache.cache import PrefetchOutcome, ShardCache
from shardcache.errors import BadRequest, OriginNotFound, QueueFull, ShardcacheError
from shardcache.fill import Fill
from shardcache.keys import validate_key
from shardcache.patterns import MAX_EXPANSION, count, expand, next_keys
from shardcache.units import format_size

log = logging.getLogger("shardcache.prefetch")
RECENT_FAILURES = 20
MAX_PENDING = 2 * MAX_EXPANSION  # queued items at most: each costs memory and a HEAD
# Characters the names of one request may add up to, counted before expanding: 100,000 names
# of 4,000 characters each were 400 MB of strings before the key-length check saw one.
MAX_EXPANDED_CHARS = 16 << 20


def _shown(text: str, limit: int = 100) -> str:
    """`text` as an error message quotes it: a 4,000-character key is not echoed whole."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"


def parse_targets(body: object, origins: set[str]) -> list[tuple[str, str]]:
    """Return the (origin, key) list a `POST /_/prefetch` body names, patterns expanded.

    The body is `{"urls": ["/NAME/KEY", …]}` and/or `{"origin": "NAME", "keys": ["KEY", …]}`.
    Raises BadRequest naming the first thing wrong, so that a bad body queues nothing.
    """
    if not isinstance(body, dict) or not ({"urls", "keys"} & body.keys()):
        raise BadRequest('expected {"urls": ["/NAME/KEY", …]} or {"origin": "NAME", "keys": […]}')
    unknown = body.keys() - {"urls", "origin", "keys", "warm"}
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    targets: list[tuple[str, str]] = []
    listed = sum(len(v) for v in (body.get("urls"), body.get("keys")) if isinstance(v, list))
    if listed > MAX_EXPANSION:  # before any of them is looked at
        raise BadRequest(f"more than {MAX_EXPANSION} keys in one request")

    expanded_chars = 0

    def add(origin: str, pattern: str, where: str) -> None:
        nonlocal expanded_chars
        if origin not in origins:
            raise BadRequest(f"{where}: no origin named {origin!r}")
        try:
            expanded_chars += count(pattern) * len(pattern)  # an upper bound per name
            if expanded_chars > MAX_EXPANDED_CHARS:
                raise BadRequest(
                    f"the names would take more than {MAX_EXPANDED_CHARS >> 20} MiB; "
                    "post fewer or shorter ones"
                )
            for key in expand(pattern):
                targets.append((origin, validate_key(key)))
        except ShardcacheError as exc:
            raise BadRequest(f"{where}: {exc}") from None
        if len(targets) > MAX_EXPANSION:
            raise BadRequest(f"more than {MAX_EXPANSION} keys in one request")

    urls = body.get("urls", [])
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise BadRequest('"urls" must be a list of strings like "/NAME/KEY"')
    for url in urls:
        origin, slash, pattern = url.removeprefix("/").partition("/")
        if not url.startswith("/") or not slash:
            raise BadRequest(f"urls: {_shown(url)} is not a local path like /NAME/KEY")
        add(origin, pattern, f"urls: {_shown(url)}")
    if "keys" in body:
        keys, origin = body["keys"], body.get("origin")
        if not isinstance(origin, str):
            raise BadRequest('"keys" needs "origin": "NAME"')
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise BadRequest('"keys" must be a list of strings')
        for key in keys:
            add(origin, key, f"keys: {_shown(key)}")
    if not targets:
        raise BadRequest("nothing to prefetch")
    return targets


def _in_batch(item: Item, batch_id: int | None) -> bool:
    """Whether `item` is one `clear(batch_id)` drops (every item when `batch_id` is None)."""
    return batch_id is None or (item.batch is not None and item.batch.id == batch_id)


class _Dropped(Exception):
    """The item the dispatcher was sizing or waiting for budget was dropped meanwhile."""


@dataclass
class Batch:
    """One POST's worth of work, so `shardcache prefetch --wait` can follow its own progress."""

    id: int
    total: int
    is_warming: bool = False
    done: int = 0
    failed: int = 0
    not_cached: int = 0  # done, but streamed through: larger than the cache, or no room
    bytes_done: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    pinned: set[str] = field(default_factory=set)  # look-ahead: its shards pinned until read

    @property
    def is_finished(self) -> bool:
        return self.done + self.failed >= self.total

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "bytes_done": self.bytes_done,
            "failures": self.failures,
            "is_finished": self.is_finished,
            "warm": self.is_warming,
            "not_cached": self.not_cached,
        }


@dataclass(frozen=True, slots=True)
class Item:
    origin: str
    key: str
    batch: Batch | None = None
    is_readahead: bool = False

    @property
    def is_warming(self) -> bool:
        return self.batch is not None and self.batch.is_warming


class _Lane:
    """One dispatcher's queue. Look-ahead items may wait for the budget; warming items never
    do, and have a lane of their own so that they never wait behind one that does."""

    def __init__(self, is_warming: bool) -> None:
        self.is_warming = is_warming
        self.pending: collections.deque[Item] = collections.deque()
        self.current: Item | None = None  # being sized (HEAD) or admitted
        self.is_current_dropped = False
        self.has_work = asyncio.Event()


@dataclass(frozen=True, slots=True)
class Submitted:
    queued: int
    cached: int
    in_flight: int
    batch: int


class PrefetchQueue:
    def __init__(
        self, cache: ShardCache, concurrency: int, max_unread_bytes: int, readahead: int
    ) -> None:
        self.cache = cache
        self.concurrency = concurrency
        self.max_unread_bytes = max_unread_bytes
        self.readahead = readahead
        self._lookahead = _Lane(is_warming=False)
        self._warming = _Lane(is_warming=True)
        self._lanes = (self._lookahead, self._warming)
        self._queued: set[tuple[str, str]] = set()  # pending or running
        self._running = 0  # admitted and fetching
        self._slots = asyncio.Semaphore(concurrency)
        self._dispatchers: list[asyncio.Task[None]] = []
        self._fetches: set[asyncio.Task[None]] = set()
        self._batch_ids = itertools.count(1)
        self._batches: dict[int, Batch] = {}
        self.waiting_for: str | None = None  # why look-ahead is not moving, while it is not
        self.completed = 0  # every item that ended without an error …
        self.fetched = 0  # … of which the prefetch itself fetched from the origin
        self.failed = 0
        self.bytes_done = 0
        self.recent_failures: collections.deque[dict[str, str]] = collections.deque(
            maxlen=RECENT_FAILURES
        )

    # -- submitting ----------------------------------------------------------------------

    async def submit(self, targets: list[tuple[str, str]], warm: bool = False) -> Submitted:
        """Queue `targets` (origin, key) in order; already cached or queued ones are counted.

        `warm`: fill the cache, nothing pinned and no look-ahead budget (see the module doc).

        The caller validates keys and origins first, so that a bad body queues nothing.
        Raises QueueFull when the queue would hold more than MAX_PENDING items.
        """
        if self._pending_count + len(targets) > MAX_PENDING:
            raise QueueFull(
                f"the prefetch queue holds {self._pending_count} items; {len(targets)} more "
                f"would pass its bound of {MAX_PENDING}"
            )
        urls = [self.cache.cache_key(origin, key)[1] for origin, key in targets]
        cached = await asyncio.to_thread(
            lambda: {url for url in urls if self.cache.store.peek(url) is not None}
        )
        batch = Batch(next(self._batch_ids), total=0, is_warming=warm)
        queued = in_flight = 0
        for (origin, key), url in zip(targets, urls, strict=True):
            if url in cached:
                continue
            batch.total += 1
            if self.cache.flights.get(url) is not None or (origin, key) in self._queued:
                in_flight += 1
            else:
                queued += 1
            self._push(Item(origin, key, batch))
        self._batches[batch.id] = batch
        self._forget_old_batches()
        return Submitted(queued, len(cached), in_flight, batch.id)

    def on_client_read(self, origin: str, key: str) -> None:
        """Queue the next keys of a numbered run a client has started reading."""
        if self._pending_count >= MAX_PENDING:
            return  # best effort: a full queue takes no read-ahead
        for successor in next_keys(key, self.readahead):
            if (origin, successor) not in self._queued:
                self._push(Item(origin, successor, is_readahead=True))

    @property
    def _pending_count(self) -> int:
        return sum(len(lane.pending) for lane in self._lanes)

    def _push(self, item: Item) -> None:
        lane = self._warming if item.is_warming else self._lookahead
        lane.pending.append(item)
        self._queued.add((item.origin, item.key))
        lane.has_work.set()

    def clear(self, batch_id: int | None = None) -> tuple[int, int]:
        """Drop every queued item, or those of one batch, including one a dispatcher is sizing
        or holding for budget; release the look-ahead budget their fetched shards hold (they
        stay cached, unpinned). Return (items dropped, bytes released)."""
        dropped = 0
        for lane in self._lanes:
            keep: collections.deque[Item] = collections.deque()
            for item in lane.pending:
                if _in_batch(item, batch_id):
                    dropped += 1
                    self._forget(item)
                else:
                    keep.append(item)
            lane.pending = keep
            current = lane.current
            if current is not None and not lane.is_current_dropped and _in_batch(current, batch_id):
                lane.is_current_dropped = True  # its dispatcher drops it when it can
                self._forget(current)
                dropped += 1
        released = 0
        if batch_id is None:
            released = self.cache.release_unread()
        elif (batch := self._batches.get(batch_id)) is not None:
            released = self.cache.release_unread(batch.pinned)
        self.cache.unread_changed.set()  # wake a dispatcher waiting for budget
        return dropped, released

    def _forget(self, item: Item) -> None:
        self._queued.discard((item.origin, item.key))
        if item.batch is not None:
            item.batch.total -= 1

    def _forget_old_batches(self, keep: int = 256) -> None:
        """Keep the newest `keep` batches and every unfinished one (a `--wait` still follows
        it, and Ctrl-C must be able to drop it); unfinished ones are bounded by the queue."""
        for batch_id in list(self._batches)[:-keep]:  # ids ascend in insertion order
            if self._batches[batch_id].is_finished:
                del self._batches[batch_id]

    # -- status --------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return self._pending_count + sum(lane.current is not None for lane in self._lanes)

    @property
    def in_flight(self) -> int:
        return self._running

    def status(self) -> dict[str, object]:
        return {
            "pending": self.depth,
            "in_flight": self.in_flight,
            "done": self.completed,
            "fetched": self.fetched,  # the rest of "done" was cached or fetched by a client
            "waiting_for": self.waiting_for,
            "failed": self.failed,
            "bytes_done": self.bytes_done,
            "unread_bytes": self.cache.unread_bytes,
            "max_unread_bytes": self.max_unread_bytes,
            "concurrency": self.concurrency,
            "readahead": self.readahead,
            "recent_failures": list(self.recent_failures),
        }

    def batch(self, batch_id: int) -> Batch | None:
        return self._batches.get(batch_id)

    def batch_status(self, batch_id: int) -> dict[str, object] | None:
        """A batch's progress, with why the queue waits when it does (a look-ahead batch)."""
        batch = self._batches.get(batch_id)
        if batch is None:
            return None
        document = batch.as_dict()
        document["waiting_for"] = None if batch.is_warming else self.waiting_for
        return document

    # -- running -------------------------------------------------------------------------

    def start(self) -> None:
        self._dispatchers = [
            asyncio.create_task(self._dispatch(lane), name=f"prefetch dispatcher {name}")
            for lane, name in zip(self._lanes, ("look-ahead", "warming"), strict=True)
        ]

    async def aclose(self) -> None:
        self.clear()
        tasks = [*self._dispatchers, *self._fetches]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _next(self, lane: _Lane) -> Item:
        while not lane.pending:
            lane.has_work.clear()
            await lane.has_work.wait()
        return lane.pending.popleft()

    async def _dispatch(self, lane: _Lane) -> None:
        """Start one lane's prefetches strictly in its order: wait for a free slot (the slots
        are shared), size the object (HEAD), wait for look-ahead budget, start the fill; then
        go on to the next item. An item dropped meanwhile is let go, uncounted."""
        while True:
            await self._slots.acquire()
            item = await self._next(lane)
            lane.current, lane.is_current_dropped = item, False
            try:
                outcome, fill = await self.cache.start_prefetch(
                    item.origin, item.key, self._admission(lane), pin=not lane.is_warming
                )
            except _Dropped:
                self._slots.release()
                continue
            except ShardcacheError as exc:
                if not lane.is_current_dropped:
                    self._finish_item(item, exc)
                self._slots.release()
                continue
            finally:
                lane.current = None
            if fill is None:
                if outcome is PrefetchOutcome.NOT_ADMITTED and item.batch is not None:
                    item.batch.not_cached += 1
                if not lane.is_current_dropped:
                    self._finish_item(item, None)
                self._slots.release()
                continue
            if item.batch is not None and not lane.is_warming:
                item.batch.pinned.add(fill.cache_key)
            task = asyncio.create_task(self._follow(item, fill, outcome))
            self._fetches.add(task)
            task.add_done_callback(self._fetches.discard)

    async def _admit(self, size_bytes: int) -> None:
        """Wait until `size_bytes` more unread bytes fit the look-ahead budget (a shard larger
        than the whole budget is admitted alone). A wait is logged once, and shown in the
        status until it ends: a loader reading what was prefetched, or an emptied queue, ends
        it."""
        lane = self._lookahead
        while (
            self.cache.unread_bytes
            and self.cache.unread_bytes + size_bytes > self.max_unread_bytes
            and not lane.is_current_dropped
        ):
            if self.waiting_for is None:
                self.waiting_for = (
                    f"the look-ahead budget: {format_size(self.cache.unread_bytes)} prefetched "
                    f"and not read yet, of {format_size(self.max_unread_bytes)} "
                    "(--prefetch-max-bytes); loaders reading them free it"
                )
                log.info("prefetch waits for %s", self.waiting_for)
            self.cache.unread_changed.clear()
            await self.cache.unread_changed.wait()
        self.waiting_for = None

    def _admission(self, lane: _Lane) -> Callable[[int], Awaitable[None]]:
        """A lane's current item's admission: the look-ahead budget (warming needs none, it
        pins nothing), then a last look whether it was dropped while it was sized or waited."""

        async def admit(size_bytes: int) -> None:
            if not lane.is_warming:
                await self._admit(size_bytes)
            if lane.is_current_dropped:
                raise _Dropped

        return admit

    async def _follow(self, item: Item, fill: Fill, outcome: PrefetchOutcome) -> None:
        self._running += 1
        try:
            outcome = await self.cache.finish_prefetch(fill, outcome)
        except ShardcacheError as exc:
            self._finish_item(item, exc)
        else:
            is_fetched = outcome is PrefetchOutcome.FETCHED
            size = fill.info.size_bytes if fill.info and is_fetched else 0
            if outcome is PrefetchOutcome.TOO_LARGE and item.batch is not None:
                item.batch.not_cached += 1
            self._finish_item(item, None, size, is_fetched)
        finally:
            self._running -= 1
            self._slots.release()

    def _finish_item(
        self,
        item: Item,
        error: ShardcacheError | None,
        size_bytes: int = 0,
        is_fetched: bool = False,
    ) -> None:
        self._queued.discard((item.origin, item.key))
        if isinstance(error, OriginNotFound) and item.is_readahead:
            self._end_of_run(item)
        elif error is not None:
            self._record_failure(item, error)
        else:
            self.completed += 1
            self.fetched += is_fetched
            self.bytes_done += size_bytes
            if item.batch is not None:
                item.batch.done += 1
                item.batch.bytes_done += size_bytes

    def _end_of_run(self, item: Item) -> None:
        """A read-ahead key does not exist: drop the queued keys after it in the same run."""
        beyond = {(item.origin, key) for key in next_keys(item.key, self.readahead)}
        lane = self._lookahead  # read-ahead is look-ahead
        keep: collections.deque[Item] = collections.deque()
        for pending in lane.pending:
            if pending.is_readahead and (pending.origin, pending.key) in beyond:
                self._queued.discard((pending.origin, pending.key))
            else:
                keep.append(pending)
        lane.pending = keep
        log.debug("read-ahead stops at %s/%s: not at the origin", item.origin, item.key)

    def _record_failure(self, item: Item, exc: ShardcacheError) -> None:
        self.failed += 1
        failure = {"url": f"/{item.origin}/{item.key}", "error": str(exc), "kind": exc.kind}
        self.recent_failures.append(failure)
        if item.batch is not None:
            item.batch.failed += 1
            item.batch.failures.append(failure)
        log.warning("prefetch of /%s/%s failed: %s", item.origin, item.key, exc)
