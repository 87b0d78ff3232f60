"""The composition root: the one place that builds the daemon's parts from `Settings`, wires
them together and runs them on uvloop.

Parts:

- `lifecycle`: `Daemon`, start, drain, stop and reload (SIGHUP) in one visible order, and
  `run`, the process's signal handling around it.
- `wiring`: the store and one backend per configured origin, from `Settings`
  (`origin_factory.make_origin` wraps a backend in its failover chain).
- `buckets`: S3 buckets made origins on an S3 client's first use (`--s3-buckets-on-demand`).
- `readouts`: what `/_/status` and the scrape-time gauges read of the started parts.
- `notify`: sd_notify, so systemd knows when the daemon is ready, reloading or stopping.

Everything below it is handed its I/O (store, origins, clock, observer) from here; nothing
below imports this folder. With `serving/` (and `observability.logs`, the access line), the only
importer of `aiohttp.web`; the only importer of uvloop.
"""
