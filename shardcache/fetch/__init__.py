"""How one object is asked of an origin: in segments, at a pace the origin accepts, with the
checksums it publishes weighed before its bytes are trusted.

Parts:

- `policy`: `FetchPolicy`, retries and back-off, the timeouts and speed floor, the segment plan:
  one frozen value the daemon builds; the one read timeout is its `timeouts.read_s`.
- `segments`: `SegmentedDownload`, one object as byte-range segments over several connections,
  claimed in order so the bytes a reader needs next land first; the retry of a segment whose
  connection dropped, resumed from where it stopped.
- `origin_table`: `OriginTable`, the configured origins with the state kept per origin (its
  throttling limiter), built and retired as one unit on reload.
- `limiter`: `RequestLimiter`, requests a second once an origin throttles (429, 503 SlowDown):
  cut on refusals, grown back on a cubic curve.
- `capped`: `CappedOrigin`, an operator's fixed caps (requests at once, requests a second).
- `pacer`: `Pacer`, evenly spaced turns at a rate: the limiter and the caps pace through it.
- `checksum_trust`, `second_opinion`: which kinds of published checksum an origin has shown it
  cannot get right, and the second hash of a body that failed one.

What this folder must not know: the cache's index and space, HTTP serving, metrics libraries
(it reports through `observer.Observer`), and which backend an origin is (it sees `Origin`).
"""
