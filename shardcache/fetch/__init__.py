"""How one object is asked of an origin: in segments, at a pace the origin accepts, with the
checksums it publishes weighed before its bytes are trusted.

Parts:

- `policy`: `FetchPolicy`, retries and back-off, the timeouts and speed floor, the segment plan:
  one frozen value the daemon builds; the one read timeout is its `timeouts.read_s`.
- `segments`: `SegmentedDownload`, one object as byte-range segments over several connections,
  claimed in order so the bytes a reader needs next land first; the retry of a segment whose
  connection dropped, resumed from where it stopped.
- `origin_table`: `OriginTable`, the configured origins with the state kept per origin (its
  gate), built and retired as one unit on reload.
- `gate`: `OriginGate`, where every request to one origin waits its turn: one queue paced at
  the lower of the operator's cap and the throttling curve, an optional cap on requests at
  once, one shed exception (`OriginShed`, with its Retry-After).
- `throttle`: `ThrottleCurve`, requests a second once an origin throttles (429, 503
  SlowDown): cut on refusals, grown back on a cubic curve.
- `checksum_trust`, `second_opinion`: which kinds of published checksum an origin has shown it
  cannot get right, and the second hash of a body that failed one.

What this folder must not know: the cache's index and space, HTTP serving, metrics libraries
(it reports through `observer.Observer`), and which backend an origin is (it sees `Origin`).
"""
