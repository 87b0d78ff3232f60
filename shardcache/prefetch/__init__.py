"""Prefetch: fetching the shards loaders will read next, ahead of them.

Parts, top down (each imports only those below it; `tests/unit/test_layering.py` checks):

- `queue`: `PrefetchQueue`, the facade: the order (earliest deadline first, across every
  loader), warming, dropping, and the status `/_/prefetch` shows.
- `dispatch`: `Dispatcher`, each prefetch from its lane to its fill's end, driving the three
  steps: sized (`ShardCache.size_prefetch`, a HEAD), admitted to the look-ahead budget, started
  (`ShardCache.start_prefetch`, its hold becoming the pin), followed, its ending told to the
  queue. The cache never calls back up into this folder.
- `sweep`: `PinSweep`, ending the look-ahead pins no loader will read, on a period and when the
  budget starts a wait (the ledger in `pins` says which, pure).
- `read_ahead`: `ReadAhead`, which keys follow a client's read: the plans' next keys, or a
  guess along a numbered run cut at the first key the origin lacked (`missing`).
- `backlog`: `Backlog`, what the queue holds now: both lanes, the keys queued or running, and
  the batches by id (an unfinished one is never forgotten).
- `tally`: `Tally`, how the items ended (done, fetched, failed, the recent failures), for the
  queue and for each batch.
- `slots`: `Slots`, how many prefetches run at once in each lane, fixed or tuned every window
  on the bytes the followed fills received; `tuning`: `ConcurrencyTuner`, the rule (pure).
- `budget`: `LookaheadBudget`, the prefetched-but-unread bytes allowed ahead of the loaders:
  admission in the queue's order and the wait's reason; the bytes themselves, held and pinned,
  are the cache's unread ledger's (`cache.unread`), which wakes the waits.
- `lanes`: what the queue holds: batches, items, and the lanes they wait in (GC-light entries);
  `item_state`: an item's lifecycle from its lane to its fill (the transition table).

What this folder must not know: HTTP (the routes and their request bodies are the serving
side's, `serving/targets`: the queue takes validated (origin, key) pairs), how an origin is
reached or a fill is made (it asks `ShardCache` to start fills and follows them), metrics
libraries, the daemon. Its clock is handed in.
"""
