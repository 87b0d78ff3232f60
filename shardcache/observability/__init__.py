"""What the daemon tells people about itself: Prometheus metrics, the `/_/status` document,
the loader-stall clock and the logs.

Parts:

- `metrics`: `Metrics`, every family declared once against an injected registry; it
  implements `observer.Observer`, which the core reports through. `cache_metrics`,
  `receiver_metrics`, `scrub_metrics`, `upstream_metrics`: families read at scrape time from
  the parts that own the figures (`cache_metrics`: the store's use and the prefetch queue's).
- `status`: the `/_/status` document built from one snapshot of the metrics (so the page,
  `shardcache stats` and Prometheus agree); `stall`: the wall-clock time some loader waited.
- `logs`: text and JSON formatters, the access line, `FailureLog` (failures clients see, at
  WARNING, rate-limited), redaction of credentials from what is logged.

With `daemon.lifecycle` (which makes the registry), the only importer of prometheus_client.
What this folder must not know: how the figures come about (fills, queues and origins report
through `observer.Observer`, or are read at scrape time by the daemon's `readouts`), the
routes, the cache's internals. Serving reports through `Metrics` methods too, never a
family's `.labels()`.
"""
