"""Each origin's upstreams on `/metrics` (tier members, mirrors, the home), read at scrape time
from their circuit breakers (kept apart from `metrics`, which owns the registry and registers
this collector)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shardcache.cluster.breaker import BreakerState, Health

UpstreamRows = Callable[[], Iterable[tuple[str, str, Health]]]  # (origin, role, health)
LoneHomes = Callable[[], Mapping[str, str]]  # origin → its one URL (no mirror, no tier)


class UpstreamCollector(Collector):
    """Each upstream's breaker, read at scrape time (`cluster.upstreams`), and the home of
    each origin with one URL: the dashboard's upstream panel then shows every origin, not
    only those with a tier or mirrors."""

    def __init__(self, read: UpstreamRows, lone_homes: LoneHomes) -> None:
        self._read = read
        self._lone_homes = lone_homes

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["origin", "upstream", "role"]
        up = GaugeMetricFamily(
            "shardcache_upstream_up",
            "1 while an upstream (tier member, mirror, home) answers, 0 from its failure until "
            "a probe succeeds (skipped while its circuit breaker is open)",
            labels=labels,
        )
        failures = CounterMetricFamily(
            "shardcache_upstream_failures",
            "Requests to an upstream that failed over to the next one (connect, 5xx, stall, "
            "bytes that failed verification)",
            labels=labels,
        )
        integrity = CounterMetricFamily(
            "shardcache_upstream_integrity_failures",
            "Of an upstream's failures, bodies it sent that failed verification (checksum or "
            "length): it is marked down as for a 5xx and the object fetched again elsewhere",
            labels=labels,
        )
        for origin, role, health in self._read():
            row = [origin, health.upstream, role]
            up.add_metric(row, 1 if health.state is BreakerState.CLOSED else 0)
            failures.add_metric(row, health.failures_total)
            integrity.add_metric(row, health.integrity_failures_total)
        for origin, url in self._lone_homes().items():
            # No breaker: with nothing to fail over to it is never skipped, so always up.
            up.add_metric([origin, url, "home"], 1)
            failures.add_metric([origin, url, "home"], 0)
            integrity.add_metric([origin, url, "home"], 0)
        yield up
        yield failures
        yield integrity
