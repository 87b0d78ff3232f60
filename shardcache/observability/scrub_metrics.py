"""The online scrub's families on `/metrics`, read at scrape time from the daemon's `Scrubber`
(kept apart from `metrics`, which owns the registry and registers this collector)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class ScrubGauges:
    """The online scrub's totals (`shardcache.cache.scrub`), read at scrape time."""

    rate_bytes_per_s: int
    checked_bytes: int
    checked_entries: int
    corrupt: int
    passes: int
    last_full_pass_at: float | None
    skipped: int = 0


class ScrubCollector(Collector):
    def __init__(self, read: Callable[[], ScrubGauges]) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        state = self._read()
        yield CounterMetricFamily(
            "shardcache_scrub_bytes",
            "Bytes of cached entries the scrub re-read and hashed",
            value=state.checked_bytes,
        )
        yield CounterMetricFamily(
            "shardcache_scrub_entries",
            "Cached entries the scrub checked (by digest, or by length when none was kept)",
            value=state.checked_entries,
        )
        yield CounterMetricFamily(
            "shardcache_scrub_corrupt",
            "Cached entries the scrub found damaged (digest mismatch, wrong size, read error) "
            "and dropped, to be refetched on their next read",
            value=state.corrupt,
        )
        yield CounterMetricFamily(
            "shardcache_scrub_skipped",
            "Cached entries the scrub could not read for want of resources (EMFILE, ENOMEM, "
            "EACCES…): not damage, not checked either; read again next pass",
            value=state.skipped,
        )
        yield CounterMetricFamily(
            "shardcache_scrub_passes",
            "Background scrub passes completed over every entry",
            value=state.passes,
        )
        yield GaugeMetricFamily(
            "shardcache_scrub_rate_bytes_per_second",
            "The background scrub's read rate bound (--scrub-rate; 0: off)",
            value=state.rate_bytes_per_s,
        )
        if state.last_full_pass_at is not None:
            yield GaugeMetricFamily(
                "shardcache_scrub_last_pass_timestamp_seconds",
                "When the last background scrub pass ended (Unix time)",
                value=state.last_full_pass_at,
            )
