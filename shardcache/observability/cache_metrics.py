"""The cache's and the prefetch queue's state on `/metrics`, read at scrape time through the
daemon's callback (`daemon.readouts`), so the gauges are never stale: the store's use, the
queue's progress, the plans' hit ratios and who holds the look-ahead budget (kept apart from
`metrics`, which owns the registry and registers this collector). What it must not know: where
the figures come from (the daemon reads them into a `CacheGauges`), the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PLAN_SERIES = 32  # per-plan series exported at most: job names must not blow up the series count


@dataclass(frozen=True, slots=True)
class CacheGauges:
    """State read at scrape time: the store's use and the prefetch queue's progress."""

    size_bytes: int
    capacity_bytes: int
    entries: int
    prefetch_queue_depth: int = 0
    prefetch_in_flight: int = 0
    prefetch_completed: int = 0
    prefetch_failed: int = 0
    prefetch_unread_bytes: int = 0
    client_connections: int = 0
    hit_lane_answers: int = 0  # hits answered in front of aiohttp (`serving.hit_lane`)
    eviction_policy: str = "lru"
    admission_bypassed: int = 0
    transient_bytes: int = 0
    transient_kept: int = 0
    transient_dropped: int = 0
    resident_set_stale: int = 0
    # (job, predicted hit ratio for the rest of its plan, measured so far), active plans
    plans: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    prefetch_concurrency: int = 0
    prefetch_waiting_for_readers: int = 0  # 1 while look-ahead waits for the budget
    # (job, unread bytes it holds), largest first (`PrefetchQueue.held_by`)
    prefetch_held: list[tuple[str, int]] = field(default_factory=list)


class CacheCollector(Collector):
    """Reads cache state at scrape time, so the gauges are never stale."""

    def __init__(self, read: Callable[[], CacheGauges]) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        state = self._read()
        yield GaugeMetricFamily(
            "shardcache_cache_size_bytes", "Bytes the cache holds on disk", value=state.size_bytes
        )
        yield GaugeMetricFamily(
            "shardcache_cache_capacity_bytes",
            "The configured cache bound",
            value=state.capacity_bytes,
        )
        yield GaugeMetricFamily(
            "shardcache_cache_entries", "Entries in the cache", value=state.entries
        )
        yield GaugeMetricFamily(
            "shardcache_prefetch_queue_depth",
            "Prefetches waiting to start",
            value=state.prefetch_queue_depth,
        )
        yield GaugeMetricFamily(
            "shardcache_prefetch_in_flight", "Prefetches running", value=state.prefetch_in_flight
        )
        yield GaugeMetricFamily(
            "shardcache_prefetch_concurrency",
            "Prefetches allowed at once now (tuned to the origin unless fixed)",
            value=state.prefetch_concurrency,
        )
        yield GaugeMetricFamily(
            "shardcache_prefetch_unread_bytes",
            "Prefetched bytes no client has read yet (pinned against eviction)",
            value=state.prefetch_unread_bytes,
        )
        yield GaugeMetricFamily(
            "shardcache_prefetch_waiting_for_readers",
            "1 while look-ahead waits for loaders to read what was prefetched (the budget)",
            value=state.prefetch_waiting_for_readers,
        )
        held = GaugeMetricFamily(
            "shardcache_prefetch_held_bytes",
            "Prefetched, unread bytes by the job holding them (the largest holders only)",
            labels=["job"],
        )
        for job, held_bytes in state.prefetch_held[:PLAN_SERIES]:
            held.add_metric([job], held_bytes)
        yield held
        yield GaugeMetricFamily(
            "shardcache_client_connections",
            "Client connections open (--max-connections bounds them)",
            value=state.client_connections,
        )
        yield CounterMetricFamily(
            "shardcache_hit_lane_requests",
            "GET hits answered by the hit lane, in front of aiohttp's request handling",
            value=state.hit_lane_answers,
        )
        # Counters the prefetch queue keeps itself, exported as counters at scrape time.
        yield CounterMetricFamily(
            "shardcache_prefetch_completed",
            "Prefetches that finished",
            value=state.prefetch_completed,
        )
        yield CounterMetricFamily(
            "shardcache_prefetch_failed", "Prefetches that failed", value=state.prefetch_failed
        )
        policy = GaugeMetricFamily(
            "shardcache_eviction_policy",
            "The eviction policy in use (1 for the one named by the label)",
            labels=["policy"],
        )
        for name in ("plan", "scan-resistant", "lru"):  # every series from start-up
            policy.add_metric([name], int(name == state.eviction_policy))
        yield policy
        yield CounterMetricFamily(
            "shardcache_admission_bypassed",
            "Fills streamed through uncached: evicting would have thrown away entries in use",
            value=state.admission_bypassed,
        )
        yield GaugeMetricFamily(
            "shardcache_transient_bytes",
            "Look-ahead prefetches held outside the resident set (unread or read once)",
            value=state.transient_bytes,
        )
        transient = CounterMetricFamily(
            "shardcache_transient_settled",
            "Look-ahead prefetches read once, then kept (admitted) or dropped",
            labels=["outcome"],
        )
        transient.add_metric(["kept"], state.transient_kept)
        transient.add_metric(["dropped"], state.transient_dropped)
        yield transient
        yield GaugeMetricFamily(
            "shardcache_plans_active", "Loaders' plans in use", value=len(state.plans)
        )
        predicted = GaugeMetricFamily(
            "shardcache_plan_predicted_hit_ratio",
            "Of the keys a plan still reads, the share cached now (the newest plans only)",
            labels=["plan"],
        )
        measured = GaugeMetricFamily(
            "shardcache_plan_measured_hit_ratio",
            "Hits among the reads of a plan so far (the newest plans only)",
            labels=["plan"],
        )
        for job, predicted_ratio, measured_ratio in state.plans[-PLAN_SERIES:]:
            if predicted_ratio is not None:
                predicted.add_metric([job], predicted_ratio)
            if measured_ratio is not None:
                measured.add_metric([job], measured_ratio)
        yield predicted
        yield measured
        yield GaugeMetricFamily(
            "shardcache_resident_set_stale",
            "1 when the cached entries stopped serving hits (the workload moved on)",
            value=state.resident_set_stale,
        )
