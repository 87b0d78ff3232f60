"""The HTTP side of the daemon: the aiohttp application, its routes and what every request
goes through.

Parts, top down:

- `server`: the application and its routes (health, metrics, the `/_/` catch-all); `objects`:
  the object path (`GET|HEAD /NAME/KEY`): the lease, the body, and the abort after the first
  byte; `object_headers`: its status and headers, the 304 or 412, the range; `admin`: the
  `/_/` routes (purge, ls, prefetch, plans, verify, origins, status) and their request bodies.
- `middleware`: what every request passes before its handler (the Host check, the admin
  token, the connection guard's clocks, JSON errors); `server_state`: `ServingContext`, the
  one typed object the handlers reach the daemon through (one `AppKey`, built by the daemon),
  and the `ServerState` they read.
- `hit_lane`: a plain GET of a remembered, checked entry answered on the connection's protocol
  in front of aiohttp (the same answer, cheaper); anything else goes to aiohttp for good;
  `hit_answer`: one such answer, its head and body; `lane_requests`: which heads it takes.
- `body`: response bodies on the socket: `os.sendfile` from cache files and from fills being
  tailed, pass-through streams; any failure after the first byte aborts the connection.
- `ranges`: one `Range` header parsed (pure); `conditionals`: the RFC 9110 §13 preconditions
  (If-Match, If-None-Match, the dates, If-Range), pure; `access`: who may do what (the admin
  token); `connections`: how many client connections, and how long each may sit idle.
- `s3_api`: the S3-compatible read API (an S3 client's request served through the object
  path; listings, bucket operations); `s3_errors`: which requests are an S3 client's, S3's
  XML errors and `x-amz-request-id`; `s3_names`: `s3://BUCKET/KEY` to an origin and its key.
- `status_page`, `status_page_html`: `GET /_/`, a page that reads only the `/_/status`
  document; `targets`: the (origin, key) pairs a prefetch or plans body names, bounded before
  they are expanded.

With the daemon (and `observability.logs`, the access line), the only importer of
`aiohttp.web`. What this folder must not know: how a miss is filled or verified (it asks
`cache.ShardCache` and sends what it gets), how origins are reached, how the daemon is wired
(it is handed a `ServingContext`). Each module's longer account is in docs/architecture.md.
"""
