"""The receiving processes' families on `/metrics` (`origins.receivers`), read at scrape time
(kept apart from `metrics`, which owns the registry and registers this collector)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class ReceiverCollector(Collector):
    """`read()` returns the pool's status (`ReceiverPool.status`)."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        state = self._read()
        yield GaugeMetricFamily(
            "shardcache_receivers",
            "Receiving processes the daemon runs for origin requests (--receivers)",
            value=state["size"],
        )
        yield GaugeMetricFamily(
            "shardcache_receivers_alive",
            "Receiving processes running now (below shardcache_receivers only while one that "
            "died is being replaced)",
            value=state["alive"],
        )
        yield GaugeMetricFamily(
            "shardcache_receiver_requests_in_flight",
            "Origin requests open in the receiving processes (asking, or landing a body)",
            value=state["in_flight"],
        )
        yield CounterMetricFamily(
            "shardcache_receiver_deaths",
            "Receiving processes that died (killed, crashed) and were replaced; their requests "
            "in flight failed and were retried",
            value=state["replaced"],
        )
