"""The backends: one per URL scheme behind `base.Origin`, and the receive path they share.

Parts:

- `base`: the `Origin` seam (what the cache needs of a backend), `ObjectInfo`, `Timeouts`,
  `RequestContext` (what a request carries down through the wrappers), the speed floor;
  `http`, `s3` (boto3 signs, the HTTP transport streams), `file`.
- `responses`: what an HTTP answer means (status, Content-Range, redirects, validators; pure
  rules); `pool`: keep-alive connections and TLS; `threads`: blocking I/O on bounded threads.
- The receive path: `receivers` (the daemon's pool of receiving processes) and
  `receiver_handle` (one process), `wire` (their messages), `receiver` (the receiving process
  itself) and `landing` (one body written into the fill's file, held to its length, its
  CRC-32C taken as it lands, per span of a block: `shardcache.crc_spans`).
- `s3_checksums`: which of S3's published checksums are of the whole object.
- `listing`: listing an origin's keys (the optional `Lister`: S3 and file origins list, HTTP
  origins cannot); `file_listing`: a file origin's directory walked in S3's key order, bounded.

What this folder must not know: the cache, fills and their verdicts, other origins (mirrors,
tiers and caps wrap a backend from `cluster/` and `fetch/`; the daemon's `origin_factory`
builds them), metrics libraries. Vendor exceptions from requests (botocore, socket, ssl) become
`shardcache.errors` here and nowhere else (config checks a CA file's loading for itself); only
`s3` imports boto3.
"""
