"""Several places one origin's objects can come from: upstream lists with failover, the
shardcache tier that shares a dataset across nodes, and which of them to ask first.

Parts:

- `upstreams`: `FailoverOrigin`, an origin over its tier members, mirrors and home, asked in
  order with resume (Range + If-Match) from the next one mid-object.
- `tier`: `TierMembers`, the tier's member list, static or refreshed from DNS; `Upstream`, one
  place an origin's objects come from (a backend and its breaker).
- `breaker`: `CircuitBreaker`, whether one upstream is worth asking now (pure, clock-injected).
- `rendezvous`: which tier member owns a key (highest-random-weight hashing, pure).

What this folder must not know: the cache, fills and their verdicts (it hands back an
`OriginStream` like any backend, checked by the same rules), metrics libraries (the daemon
reads the breakers' health at scrape time), and how a backend is built (the daemon's wiring
passes in a factory).
"""
