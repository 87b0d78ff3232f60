"""The backends: one per URL scheme behind `base.Origin`, and the receive path they share.

Parts:

- `base`: the `Origin` seam (what the cache needs of a backend), `ObjectInfo`, `Timeouts`,
  `RequestContext` (what a request carries down through the wrappers), the speed floor;
  `http`, `s3` (boto3 signs, the HTTP transport streams), `file`.
- `responses`: what an HTTP answer means (status, Content-Range, redirects, validators; pure
  rules); `pool`: keep-alive connections and TLS; `threads`: blocking I/O on bounded threads.
- `streams`: the bases of the streams (`ChunkStream`, `StreamWrapper`), one hook each.
- The receive path: `receivers` (the pool of receiving processes, which the daemon owns and
  passes to every transport) and `receiver_handle` (one process), `wire` (their messages),
  `receiver` (the receiving process itself) and `landing` (one body written into the fill's
  file, held to its length, its CRC-32C taken as it lands, per span of a block:
  `shardcache.crc_spans`).
- `s3_checksums`: which of S3's published checksums are of the whole object.
- `listing`: listing an origin's keys (the optional `Lister`: S3 and file origins list, HTTP
  origins cannot); `file_listing`: a file origin's directory walked in S3's key order, bounded.

The receive flow of one miss, drawn once (`wire` messages on one socketpair per receiver):

    serving process (event loop)                      receiving process (`receiver`)
    Origin.open (`http`, or `s3` with a presigned URL)
      HttpTransport._send: a turn in its share
        ReceiverPool.ask: the receiver with fewest open
          ReceiverHandle.call ------------ ask ------>  a keep-alive connection (`pool`),
                                                        the request sent on a thread
          RemoteExchange <-------------- answer ------  status and headers only
      `responses` checks them, before any body byte: HttpStream
    Fill: HttpStream.land(fd, spot)
      RemoteExchange.land ----- land + the fill's fd ->  landing.Body.land: receive, pwrite,
      spot advanced, readers woken <---- progress ---    CRC-32C per span of a block
                                   <----- landed ----
      (a stream iterated instead: read -> chunk ... end)
    RemoteExchange.finish ----------- finish ------->  connection kept (body whole) or closed

Each receiver's answers are read on a thread of its own (`ReceiverHandle`), which settles the
awaiting futures on the event loop; a receiver that dies fails only its calls in flight.

What this folder must not know: the cache, fills and their verdicts, other origins (mirrors,
tiers and caps wrap a backend from `cluster/` and `fetch/`; the daemon's `origin_factory`
builds them), metrics libraries. Vendor exceptions from requests (botocore, socket, ssl) become
`shardcache.errors` here and nowhere else (config checks a CA file's loading for itself); only
`s3` imports boto3.
"""
