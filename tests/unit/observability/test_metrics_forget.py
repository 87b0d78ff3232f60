"""A reload that removes or renames an origin takes its series out of /metrics (each rename
left its old series there for the daemon's life); the other origins' series are untouched."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from shardcache.observability.metrics import Metrics


def _origins_in(registry: CollectorRegistry) -> set[str]:
    text = generate_latest(registry).decode()
    return {
        line.split('origin="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if 'origin="' in line and not line.startswith("#")
    }


def test_forgetting_an_origin_drops_every_series_it_labels_and_only_those() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, ["old", "kept"])
    for origin in ("old", "kept"):
        metrics.origin_request(origin, "503")
        metrics.origin_failed(origin, "timeout")
        metrics.origin_bytes(origin, 1000)
        metrics.fetch_finished(origin, 0.5)
        metrics.checksum_unusable(origin, "crc32c-parts")
        metrics.waited(origin, 0.25)
    assert _origins_in(registry) == {"old", "kept"}

    metrics.touch(["new"])
    metrics.forget(["old"])

    assert _origins_in(registry) == {"kept", "new"}
    assert registry.get_sample_value("shardcache_origin_bytes_total", {"origin": "kept"}) == 1000
    assert (
        registry.get_sample_value(
            "shardcache_origin_requests_total", {"origin": "kept", "status": "503"}
        )
        == 1
    )
    metrics.forget([])  # nothing gone: nothing changes
    assert _origins_in(registry) == {"kept", "new"}
