"""The cache: what is on local disk, and how a miss becomes an entry there.

Parts, top down (each imports only those below it; `tests/unit/test_layering.py` checks):

- `shard_cache`: `ShardCache`, the facade: hit, join a fill in flight, or start one; prefetch
  fills and what they leave unread. `fill_runner`: `FillRunner`, the tasks fills run as, which
  no client owns; a fill nobody wants stopped, one with bad bytes from an upstream fetched
  again. `lease`: `Lease`, the answer to a read (an entry, a fill to
  tail, or a stream through) its reader holds until it closes it.
  `purge`: deleting entries and keeping none of their fills in flight (the race with commit).
- `flights`: single flight, at most one `Fill` per key. `fill`: one download into a partial
  file that readers tail, verified, then committed; `fill_state` its lifecycle (the transition
  table); `body_check`: what its body is verified against and the digests kept with it (the
  CRC-32C per block from the landings' spans); `fill_readers`: who holds it and its file, and
  how they wait (the reader that left included); `passthrough`: the streams of a fill that is
  not cached (not admitted, no room), each verifying itself.
- `scrub`, `scrub_check`, `verify`: every entry's bytes checked against the digest kept for
  it, by the daemon's paced scrub or offline (`shardcache verify`); `catalog`: what the cache
  holds by origin and glob, for `ls` and `purge`. All over the store. `hit_check`: a hit's
  blocks checked against the CRC-32C per block (`blocks`) kept at commit, once a window
  however many readers send them.
- `unread`: `UnreadLedger`, the one owner of look-ahead bytes: held for prefetches about to
  start, then pinned in the store until a client reads them (what the budget counts); one
  condition wakes whoever waits on them.
- `store`: `Store`, the space: reservations before a fill writes, commit and abort, lookups,
  and the directory's health (`problem()`). `walks`: `Walks` (`store.walks`), the index read
  whole: the scrub's, listing's and `verify`'s walks.
- `evictor`: makes room for a reservation and owns what eviction spares (pins, the books of
  the policy's transient area, batched access times); `eviction`: the policies as objects told
  the store's events (LRU, scan-resistant, plan-aware); `transient`: the look-ahead books.
- `directory`: the layout on disk (`v1/`), its lock, partial files, free space, health.
- `index`: the diskcache adapter, the only module that imports diskcache or touches its
  private `_sql` and `_disk` (its schema test: `tests/unit/cache/test_index.py`), and
  `map_store_errors`, the edge where SQLite and OS errors become `CacheError`.
- `blocks`: the per-block CRC-32C digests (taken by the fill, checked by hits).
- `entry`, `space`: values (entry metadata, reservations, listed rows) and the pure
  arithmetic of room (`CacheFull` and `NotAdmitted` are in `errors`, with the whole tree).
- `admission`, `plans`: what the policies decide from (pure): the scan-resistant admission
  filter's ghost list, and the loaders' posted read plans (next use of each key).

What this folder must not know: HTTP (no aiohttp, no status codes but the errors' own), how an
origin is reached (it gets `Origin`s and their limits from the daemon, and asks them through
`fetch/`), the prefetch queue's order, metrics libraries (it reports through
`observer.Observer`). Nothing here builds its own I/O: the store's directory, the origins, the
clock and the observer are handed in.

The miss pipeline, drawn once:

    GET /<origin>/<key>             (serving)
      -> ShardCache.open            lookup in the Store: a hit leaves with its fd (sendfile)
      -> Flights.join_or_start      a fill in flight for the key? join it (coalesced)
      -> Fill                       HEAD/first response: size, validators, checksums
           -> Store.reserve         Evictor makes room by the policy, or NotAdmitted/CacheFull:
                                    the object streams through uncached (passthrough)
           -> SegmentedDownload     parallel ranged GETs into the partial file; readers tail it
           -> verify                length, ETag/checksums (second opinion on a mismatch)
           -> Store.commit          fsync, Index adopts the file by rename, row indexed
      -> readers' last byte         only once the fill is VERIFIED; a failed fill aborts them
"""
