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


def test_the_series_serving_reports_into_come_back_after_a_forget() -> None:
    """Serving's reports keep the labelled series they use (`Metrics._child`); a forget must
    drop those too, or a renamed-back origin's requests would count into a removed series
    that /metrics no longer shows."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, ["o"])
    metrics.request_counted("o", "hit")
    metrics.body_sent("o", "cache", 10)
    metrics.forget(["o"])
    metrics.request_counted("o", "hit")
    metrics.body_sent("o", "cache", 5)
    labels = {"origin": "o", "result": "hit"}
    assert registry.get_sample_value("shardcache_requests_total", labels) == 1
    sent = {"origin": "o", "source": "cache"}
    assert registry.get_sample_value("shardcache_response_bytes_total", sent) == 5
