"""What the running daemon reads out of its parts: the `/_/status` document's inputs and the cache
and scrub gauges Prometheus reads at scrape time.

Here, not in `observability/`, because it reads every part. It reads, never changes, what it is
given; `origins` is the daemon's `OriginTable`, so each reading sees the current origins."""

from __future__ import annotations

import time
from dataclasses import dataclass

from shardcache import __version__
from shardcache.cache.entry import AdmissionState
from shardcache.cache.scrub import Scrubber
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.cluster.breaker import Health
from shardcache.cluster.upstreams import FailoverOrigin
from shardcache.fetch.origin_table import OriginTable
from shardcache.observability.cache_metrics import CacheGauges
from shardcache.observability.metrics import Metrics
from shardcache.observability.scrub_metrics import ScrubGauges
from shardcache.observability.status import build_status
from shardcache.origins.base import Origin
from shardcache.origins.receivers import ReceiverPool
from shardcache.prefetch.queue import PrefetchQueue
from shardcache.serving.connections import ConnectionGuard
from shardcache.serving.hit_lane import HitLane


@dataclass(frozen=True, slots=True)
class Readouts:
    """The started parts, and what the status document says about the daemon itself."""

    listen: str
    cache_dir: str
    eviction: str  # the `--eviction` setting, beside the policy it resolved to
    started_at: float  # time.monotonic() when the daemon was built
    metrics: Metrics
    store: Store
    cache: ShardCache
    prefetch: PrefetchQueue
    scrub: Scrubber
    guard: ConnectionGuard
    lane: HitLane
    receivers: ReceiverPool
    origins: OriginTable  # the daemon's, replaced whole on reload: each reading is current

    def status(self) -> dict[str, object]:
        """The `/_/status` document (on a worker thread: the store's usage reads its index)."""
        usage = self.store.usage()
        return build_status(
            version=__version__,
            uptime_s=time.monotonic() - self.started_at,
            listen=self.listen,
            snapshot=self.metrics.snapshot(self.origins.origins),
            cache={
                "dir": self.cache_dir,
                "size_bytes": usage.size_bytes,
                "entry_bytes": usage.entry_bytes,
                "capacity_bytes": usage.capacity_bytes,
                "entries": usage.entries,
                "reserved_bytes": usage.reserved_bytes,
                "eviction": _eviction_status(self.eviction, self.store.admission_state()),
            },
            prefetch=self.prefetch.status(),
            origins=self.origins.shown_urls(),
            upstreams=_upstreams_status(upstream_rows(self.origins.origins)),
            scrub=self.scrub.status(),
            receivers=self.receivers.status(),
            unusable_checksums=self.cache.checksum_trust.status(),
            gates=self.origins.gate_status(),
        )

    def cache_gauges(self) -> CacheGauges:
        """The store's use, the prefetch queue's progress and the open client connections."""
        usage = self.store.usage()
        state = self.store.admission_state()
        return CacheGauges(
            usage.size_bytes,
            usage.capacity_bytes,
            usage.entries,
            self.prefetch.depth,
            self.prefetch.in_flight,
            self.prefetch.completed,
            self.prefetch.failed,
            self.cache.unread_bytes,
            self.guard.open_count,
            self.lane.answered,
            state.policy,
            state.bypassed,
            state.transient_bytes,
            state.transient_kept,
            state.transient_dropped,
            int(not state.is_serving),
            [(p.job, p.predicted_hit_ratio, p.measured_hit_ratio) for p in state.plans],
            prefetch_concurrency=self.prefetch.limit,
            prefetch_waiting_for_readers=int(self.prefetch.waiting_for is not None),
            prefetch_held=list(self.prefetch.held_by().items()),
        )

    def scrub_gauges(self) -> ScrubGauges:
        stats = self.scrub.stats
        return ScrubGauges(
            self.scrub.rate_bytes_per_s,
            stats.checked_bytes,
            stats.checked_entries,
            stats.corrupt,
            stats.passes,
            stats.last_full_pass_at,
            stats.skipped,
        )


def upstream_rows(origins: dict[str, Origin]) -> list[tuple[str, str, Health]]:
    """(origin, role, health) of every upstream of the origins that have several."""
    rows: list[tuple[str, str, Health]] = []
    for name, origin in origins.items():
        if isinstance(origin, FailoverOrigin):
            rows += [(name, role, health) for role, health in origin.health()]
    return rows


def _upstreams_status(rows: list[tuple[str, str, Health]]) -> dict[str, list[dict[str, object]]]:
    by_origin: dict[str, list[dict[str, object]]] = {}
    for origin, role, health in rows:
        by_origin.setdefault(origin, []).append(
            {
                "url": health.upstream,
                "role": role,
                "state": health.state.value,
                "failures": health.failures_total,
                "integrity_failures": health.integrity_failures_total,
                "failures_in_a_row": health.failures_in_a_row,
                "retry_in_s": health.retry_in_s,
                "last_error": health.last_error,
            }
        )
    return by_origin


def _eviction_status(setting: str, state: AdmissionState) -> dict[str, object]:
    return {
        "setting": setting,
        "policy": state.policy,
        "bypassed": state.bypassed,
        "transient_bytes": state.transient_bytes,
        "transient_area_bytes": state.transient_area_bytes,
        "transient_kept": state.transient_kept,
        "transient_dropped": state.transient_dropped,
        "resident_set_serving": state.is_serving,
        "plans": [
            {
                "job": plan.job,
                "epoch": plan.epoch,
                "position": plan.position,
                "length": plan.length,
                "reads": plan.reads,
                "measured_hit_ratio": _rounded(plan.measured_hit_ratio),
                "predicted_hit_ratio": _rounded(plan.predicted_hit_ratio),
                "seconds_per_shard": _rounded(plan.pace_s),
            }
            for plan in state.plans
        ],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
