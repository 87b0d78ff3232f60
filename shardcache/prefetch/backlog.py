"""The backlog: what the prefetch queue holds, by lane, by key and by batch.

A key is queued once; an unfinished batch stays in the table while any entry of it is pending,
so an entry's batch id always finds it. Must not know: fills, the cache, the look-ahead budget,
slots, how an item is started."""

from __future__ import annotations

import collections
import itertools

from shardcache.prefetch.lanes import (
    NO_BATCH,
    Batch,
    Item,
    Lane,
    PendingKey,
    entry_batch,
    entry_key,
)


class Backlog:
    def __init__(self) -> None:
        self.lookahead = Lane(is_warming=False)
        self.warming = Lane(is_warming=True)
        self.lanes = (self.lookahead, self.warming)
        self.queued: set[tuple[str, str]] = set()  # pending or running
        self._order = itertools.count()  # ties between deadlines go to the earlier post
        self._batch_ids = itertools.count(1)
        self.batches: dict[int, Batch] = {}

    @property
    def pending_count(self) -> int:
        return sum(len(lane.pending) for lane in self.lanes)

    def new_batch(self, total: int, is_warming: bool) -> Batch:
        """A new batch of `total` entries, in the table before its first entry is pushed."""
        batch = Batch(next(self._batch_ids), total=total, is_warming=is_warming)
        self.batches[batch.id] = batch
        self._forget_old_batches()
        return batch

    def push(
        self, lane: Lane, deadline: float, origin: str, key: str, batch_id: int, is_readahead: bool
    ) -> None:
        lane.push((deadline, next(self._order), origin, key, batch_id, is_readahead))
        self.queued.add((origin, key))

    def item(self, entry: PendingKey) -> Item:
        """The item a pending entry stands for: its batch is in the table while it is pending
        (an unfinished batch is never forgotten)."""
        _, _, origin, key, batch_id, is_readahead = entry
        batch = self.batches.get(batch_id) if batch_id != NO_BATCH else None
        return Item(origin, key, batch, is_readahead)

    def forget(self, item: Item) -> None:
        self.queued.discard((item.origin, item.key))
        if item.batch is not None:
            item.batch.total -= 1

    def forget_entries(self, entries: list[PendingKey]) -> None:
        """`forget` for dropped pending entries, in bulk: a clear of 200,000 of them took
        250 ms of the event loop one call at a time."""
        self.queued.difference_update(map(entry_key, entries))
        for batch_id, gone in collections.Counter(map(entry_batch, entries)).items():
            batch = self.batches.get(batch_id)
            if batch is not None:
                batch.total -= gone

    def _forget_old_batches(self, keep: int = 256) -> None:
        """Keep the newest `keep` batches and every unfinished one (a `--wait` still follows
        it, and Ctrl-C must be able to drop it); unfinished ones are bounded by the queue."""
        for batch_id in list(self.batches)[:-keep]:  # ids ascend in insertion order
            if self.batches[batch_id].is_finished:
                del self.batches[batch_id]
