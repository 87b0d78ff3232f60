"""Every Prometheus metric shardcache exports, declared once against an injected registry.

Metric names are API (dashboards and alerts outside this repo use them): `shardcache_` prefix,
base units, `_total` on counters, labels only from bounded sets (origin names and fixed enums,
never keys or client addresses). Label sets are touched at start-up so series exist at zero;
cache and prefetch state gauges are read at scrape time through callbacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from shardcache import __version__
from shardcache.checksums import ALGORITHMS
from shardcache.observability.cache_metrics import CacheCollector, CacheGauges
from shardcache.observability.receiver_metrics import ReceiverCollector
from shardcache.observability.scrub_metrics import ScrubCollector, ScrubGauges
from shardcache.observability.stall import StallClock
from shardcache.observability.status import Snapshot
from shardcache.observability.upstream_metrics import LoneHomes, UpstreamCollector, UpstreamRows

RESULTS = ("hit", "miss", "coalesced", "error")
SOURCES = ("cache", "origin")
CLIENT_TIMEOUT_PHASES = ("idle", "header", "body", "send")
CLIENT_REFUSAL_REASONS = (
    "unauthorized",
    "cross_site",
    "connection_limit",
    "client_connection_limit",
)
ORIGIN_ERROR_KINDS = (
    "not_found",
    "timeout",
    "unavailable",
    "throttled",
    "busy",
    "tls",
    "denied",
    "changed",
    "integrity",
)
# From 100 µs (a hit's first byte) to 5 minutes (a multi-GB miss).
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """All metric families; implements `observer.Observer` for the cache core."""

    def __init__(self, registry: CollectorRegistry, origins: Iterable[str]) -> None:
        self.registry = registry
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # `_child`'s
        self.requests = Counter(
            "shardcache_requests",
            "Shard requests by result",
            ["origin", "result"],
            registry=registry,
        )
        self.response_bytes = Counter(
            "shardcache_response_bytes",
            "Body bytes sent to clients by where they came from",
            ["origin", "source"],
            registry=registry,
        )
        self.ttfb = Histogram(
            "shardcache_time_to_first_byte_seconds",
            "Request start to first body byte",
            ["result"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "shardcache_request_duration_seconds",
            "Request start to last body byte",
            ["result"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.client_wait = Counter(
            "shardcache_client_wait_seconds",
            "Time clients waited for bytes not yet on local disk, added up over every stream",
            ["origin"],
            registry=registry,
        )
        self.loader_stall = Counter(
            "shardcache_loader_stall_seconds",
            "Wall-clock time during which at least one client waited for bytes not yet on "
            "local disk (the union of the waits): the loader-stall figure",
            ["origin"],
            registry=registry,
        )
        self._stall_clocks: dict[str, StallClock] = {}
        self.origin_requests = Counter(
            "shardcache_origin_requests",
            "Requests made to origins by outcome",
            ["origin", "status"],
            registry=registry,
        )
        self.origin_errors = Counter(
            "shardcache_origin_errors",
            "Origin failures by kind: failed requests, and objects that failed verification",
            ["origin", "kind"],
            registry=registry,
        )
        self.origin_retries = Counter(
            "shardcache_origin_retries", "Origin retries", ["origin"], registry=registry
        )
        self.origin_throttled_total = Counter(
            "shardcache_origin_throttled",
            "Origin answers refusing a request as one too many (429, 503 SlowDown)",
            ["origin"],
            registry=registry,
        )
        self.origin_request_limit_gauge = Gauge(
            "shardcache_origin_request_limit",
            "Requests a second the origin gets while it throttles us (0: unlimited)",
            ["origin"],
            registry=registry,
        )
        self.origin_waits_abandoned = Counter(
            "shardcache_origin_waits_abandoned",
            "Requests that stopped waiting at the origin's gate (their fill was stopped) and "
            "were never sent",
            ["origin"],
            registry=registry,
        )
        self.origin_requests_shed = Counter(
            "shardcache_origin_requests_shed",
            "Requests the origin's gate turned away, their turn or place further off than they "
            "may wait (503 with Retry-After), never sent: a cap binding, not the origin failing",
            ["origin"],
            registry=registry,
        )
        self.origin_bytes_total = Counter(
            "shardcache_origin_bytes", "Body bytes read from origins", ["origin"], registry=registry
        )
        self.origin_fetch = Histogram(
            "shardcache_origin_fetch_duration_seconds",
            "Whole-object fetch time from origins",
            ["origin"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.evictions = Counter("shardcache_cache_evictions", "Entries evicted", registry=registry)
        self.evicted_bytes = Counter(
            "shardcache_cache_evicted_bytes", "Bytes evicted", registry=registry
        )
        self.prefetch_late_total = Counter(
            "shardcache_prefetch_late",
            "Clients that asked before their prefetch finished",
            ["origin"],
            registry=registry,
        )
        self.prefetch_wasted_total = Counter(
            "shardcache_prefetch_wasted",
            "Prefetched entries removed before any read",
            ["origin"],
            registry=registry,
        )
        self.checksum_unusable_total = Counter(
            "shardcache_checksum_unusable",
            "Kinds of published checksum set aside as never matching (see /_/status)",
            ["origin", "algorithm"],
            registry=registry,
        )
        self.hit_corrupt_total = Counter(
            "shardcache_hit_corrupt",
            "Hits whose cached bytes failed their block check: aborted, the entry dropped",
            ["origin"],
            registry=registry,
        )
        self.hit_checked_bytes_total = Counter(
            "shardcache_hit_checked_bytes",
            "Bytes of cached entries read and hashed to check hits (verify_hits)",
            registry=registry,
        )
        self.client_disconnects = Counter(
            "shardcache_client_disconnects",
            "Shard responses the client left before their end (logged as 499)",
            ["origin"],
            registry=registry,
        )
        self.client_timeouts = Counter(
            "shardcache_client_timeouts",
            "Client connections closed for sending or reading too slowly, by phase",
            ["phase"],
            registry=registry,
        )
        self.client_refused = Counter(
            "shardcache_client_refused",
            "Client requests or connections refused: no admin token, sent by a web page, or the "
            "connection limit",
            ["reason"],
            registry=registry,
        )
        for phase in CLIENT_TIMEOUT_PHASES:
            self.client_timeouts.labels(phase)
        for reason in CLIENT_REFUSAL_REASONS:
            self.client_refused.labels(reason)
        self.build_info = Gauge(
            "shardcache_build_info",
            "Always 1; the version as a label",
            ["version"],
            registry=registry,
        )
        self.build_info.labels(__version__).set(1)
        # Every family labelled by origin, found, not listed: a new one is forgotten too.
        self._by_origin: list[MetricWrapperBase] = [
            family
            for family in vars(self).values()
            if isinstance(family, MetricWrapperBase) and "origin" in family._labelnames
        ]
        self.touch(origins)

    def touch(self, origins: Iterable[str]) -> None:
        """Create every labelled series at zero, so rates and ratios exist before traffic."""
        for origin in origins:
            for result in RESULTS:
                self.requests.labels(origin, result)
            for source in SOURCES:
                self.response_bytes.labels(origin, source)
            for kind in ORIGIN_ERROR_KINDS:
                self.origin_errors.labels(origin, kind)
            self.origin_requests.labels(origin, "ok")
            self.client_wait.labels(origin)
            self.loader_stall.labels(origin)
            self.client_disconnects.labels(origin)
            self.hit_corrupt_total.labels(origin)
            self.origin_retries.labels(origin)
            self.origin_throttled_total.labels(origin)
            self.origin_request_limit_gauge.labels(origin)
            self.origin_waits_abandoned.labels(origin)
            self.origin_requests_shed.labels(origin)
            self.origin_bytes_total.labels(origin)
            self.origin_fetch.labels(origin)
            self.prefetch_late_total.labels(origin)
            self.prefetch_wasted_total.labels(origin)
            for algorithm in ALGORITHMS:
                self.checksum_unusable_total.labels(origin, algorithm)
        for result in RESULTS:
            self.ttfb.labels(result)
            self.duration.labels(result)

    # -- what serving reports of each object request -----------------------------------------

    def request_counted(self, origin: str, result: str) -> None:
        """A shard request ended as `result` (hit, miss, coalesced, error)."""
        self._child(self.requests, origin, result).inc()

    def first_byte(self, result: str, seconds: float) -> None:
        self._child(self.ttfb, result).observe(seconds)

    def body_sent(self, origin: str, source: str, size_bytes: int) -> None:
        self._child(self.response_bytes, origin, source).inc(size_bytes)

    def request_finished(self, result: str, seconds: float) -> None:
        self._child(self.duration, result).observe(seconds)

    def client_left(self, origin: str) -> None:
        """A client left a shard response before its end (logged as 499)."""
        self._child(self.client_disconnects, origin).inc()

    def client_timed_out(self, phase: str) -> None:
        """A client connection closed for being too slow in `phase` (CLIENT_TIMEOUT_PHASES)."""
        self._child(self.client_timeouts, phase).inc()

    def client_refusal(self, reason: str) -> None:
        """A request or connection refused for `reason` (CLIENT_REFUSAL_REASONS)."""
        self._child(self.client_refused, reason).inc()

    def hit_corrupt(self, origin: str) -> None:
        """A hit whose cached bytes failed their block check."""
        self._child(self.hit_corrupt_total, origin).inc()

    def hit_checked(self, size_bytes: int) -> None:
        """Bytes of a cached entry read and hashed to check a hit (`verify_hits`)."""
        self.hit_checked_bytes_total.inc(size_bytes)

    def _child(self, family: MetricWrapperBase, *values: str) -> Any:
        """`family.labels(*values)`, kept: a 64 KiB hit reports four series, and `labels`
        validates and converts its values each call. `forget` drops what it kept."""
        key = (id(family), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*values)
        return child

    def forget(self, origins: Iterable[str]) -> None:
        """Drop every series labelled with one of `origins` (removed or renamed by a reload):
        without this each rename left its old series in /metrics for the daemon's life. A
        request of the old origin still in flight may bring one back until the next reload."""
        gone = set(origins)
        if not gone:
            return
        self._children.clear()
        for family in self._by_origin:
            names = family._labelnames  # prometheus_client keeps them only here
            at = names.index("origin")
            stale = {
                tuple(sample.labels[name] for name in names)
                for metric in family.collect()
                for sample in metric.samples
                if sample.labels.get("origin") in gone
            }
            for values in stale:
                if values[at] in gone:
                    family.remove(*values)
        for origin in gone:
            self._stall_clocks.pop(origin, None)

    def snapshot(self, origins: Iterable[str]) -> Snapshot:
        """Return the current counter values for `/_/status`."""
        value = self.registry.get_sample_value
        origins = list(origins)
        return Snapshot(
            requests={
                (o, r): value("shardcache_requests_total", {"origin": o, "result": r}) or 0
                for o in origins
                for r in RESULTS
            },
            response_bytes={
                (o, s): value("shardcache_response_bytes_total", {"origin": o, "source": s}) or 0
                for o in origins
                for s in SOURCES
            },
            origin_errors={
                (o, k): value("shardcache_origin_errors_total", {"origin": o, "kind": k}) or 0
                for o in origins
                for k in ORIGIN_ERROR_KINDS
            },
            origin_retries={
                o: value("shardcache_origin_retries_total", {"origin": o}) or 0 for o in origins
            },
            origin_bytes={
                o: value("shardcache_origin_bytes_total", {"origin": o}) or 0 for o in origins
            },
            origin_throttled={
                o: value("shardcache_origin_throttled_total", {"origin": o}) or 0 for o in origins
            },
            origin_request_limit={
                o: value("shardcache_origin_request_limit", {"origin": o}) or 0 for o in origins
            },
            client_wait_s={
                o: value("shardcache_client_wait_seconds_total", {"origin": o}) or 0
                for o in origins
            },
            loader_stall_s={
                o: value("shardcache_loader_stall_seconds_total", {"origin": o}) or 0
                for o in origins
            },
            evictions=value("shardcache_cache_evictions_total") or 0,
        )

    def watch_cache(self, read: Callable[[], CacheGauges]) -> None:
        self.registry.register(CacheCollector(read))

    def watch_scrub(self, read: Callable[[], ScrubGauges]) -> None:
        self.registry.register(ScrubCollector(read))

    def watch_receivers(self, read: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(ReceiverCollector(read))

    def watch_upstreams(self, read: UpstreamRows, lone_homes: LoneHomes) -> None:
        self.registry.register(UpstreamCollector(read, lone_homes))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- observer.Observer -----------------------------------------------------------------

    def origin_request(self, origin: str, status: str) -> None:
        self.origin_requests.labels(origin, status).inc()
        if status != "ok":
            self.origin_errors.labels(origin, status).inc()

    def origin_failed(self, origin: str, kind: str) -> None:
        self.origin_errors.labels(origin, kind).inc()

    def origin_retry(self, origin: str) -> None:
        self.origin_retries.labels(origin).inc()

    def origin_throttled(self, origin: str) -> None:
        self.origin_throttled_total.labels(origin).inc()

    def origin_request_limit(self, origin: str, limit: int) -> None:
        self.origin_request_limit_gauge.labels(origin).set(limit)

    def origin_wait_abandoned(self, origin: str) -> None:
        self.origin_waits_abandoned.labels(origin).inc()

    def origin_request_shed(self, origin: str) -> None:
        self.origin_requests_shed.labels(origin).inc()

    def origin_bytes(self, origin: str, size_bytes: int) -> None:
        self.origin_bytes_total.labels(origin).inc(size_bytes)

    def fetch_finished(self, origin: str, duration_s: float) -> None:
        self.origin_fetch.labels(origin).observe(duration_s)

    def waited(self, origin: str, seconds: float) -> None:
        """A client waited `seconds`, just now, for bytes not yet on local disk."""
        if seconds <= 0:
            return
        self.client_wait.labels(origin).inc(seconds)
        now = time.monotonic()
        clock = self._stall_clocks.setdefault(origin, StallClock())
        self.loader_stall.labels(origin).inc(clock.add(now - seconds, now))

    def evicted(self, size_bytes: int, was_pinned: bool) -> None:
        self.evictions.inc()
        self.evicted_bytes.inc(size_bytes)

    def prefetch_late(self, origin: str) -> None:
        self.prefetch_late_total.labels(origin).inc()

    def prefetch_wasted(self, origin: str) -> None:
        self.prefetch_wasted_total.labels(origin).inc()

    def checksum_unusable(self, origin: str, algorithm: str) -> None:
        self.checksum_unusable_total.labels(origin, algorithm).inc()
