"""Prefetch: fetching the shards loaders will read next, ahead of them.

Parts, top down (each imports only those below it; `tests/unit/test_layering.py` checks):

- `queue`: `PrefetchQueue`, the order (earliest deadline first, across every loader), the
  dispatchers, read-ahead, warming, and the counts and batches `/_/prefetch` shows.
- `lanes`: what the queue holds: batches, items, and the lanes they wait in (GC-light entries).
- `tuning`: `ConcurrencyTuner`, how many prefetches run at once, found from what the origin
  delivers (pure).

What this folder must not know: HTTP (the routes and the request bodies are the serving
side's: the queue takes validated (origin, key) pairs), how an origin is reached or a fill is
made (it asks `ShardCache` to start, and follows, fills), metrics libraries, the daemon.
"""
