"""Issue 23 item 10: every failure a client sees is counted under its kind and logged at WARNING,
rate-limited per origin and kind, so metrics, `shardcache stats`, the shipped alert and a
`--log-level warning` log all show what loaders see."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.daemon_process import Daemon
from tests.integration.helpers import curl
from tests.integration.test_observability import ALERTS, Prometheus
from tests.origin_server import OriginServer
from tests.tls import self_signed, server_context

MiB = 1024 * 1024
READS = 12
RECORD = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) +([\w.]+): (.*)$")


def _records(daemon: Daemon, at_least: str = "WARNING") -> list[str]:
    """The log's records at `at_least` or above, as "LEVEL logger: message"."""
    levels = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    found = []
    for line in daemon.log().splitlines():
        match = RECORD.match(line)
        if match and levels.index(match.group(1)) >= levels.index(at_least):
            found.append(f"{match.group(1)} {match.group(2)}: {match.group(3)}")
    return found


def _alert_expression(name: str) -> str:
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    (rule,) = [r for r in rules if r["alert"] == name]
    return str(rule["expr"])


def _wait_until(what: str, condition, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[list[Prometheus]]:
    started: list[Prometheus] = []
    yield started
    for server in started:
        server.stop()


def test_a_body_failing_its_checksum_is_counted_shown_alerted_and_logged_once(
    origin: OriginServer, start_daemon, prometheus: list[Prometheus], tmp_path: Path
) -> None:
    origin.put("s.tar", os.urandom(MiB), content_md5=hashlib.md5(b"another body").digest())
    daemon = start_daemon({"web": origin.url}, "--log-level", "warning", "--readahead", "0")
    server = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{daemon.port}")
    prometheus.append(server)
    integrity = 'shardcache_origin_errors_total{origin="web",kind="integrity"}'
    _wait_until("a first scrape", lambda: server.query(integrity))

    for _ in range(READS):
        assert curl(f"{daemon.url}/web/s.tar").exit_code != 0  # every read aborts

    assert daemon.metric("shardcache_origin_errors_total", origin="web", kind="integrity") == READS
    assert daemon.metric("shardcache_requests_total", origin="web", result="miss") == 0
    assert daemon.metric("shardcache_requests_total", origin="web", result="error") == READS
    stats = subprocess.run(
        [sys.executable, "-m", "shardcache", "stats", "--daemon", daemon.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert f"integrity {READS}" in stats.stdout and "none" not in stats.stdout, stats.stdout

    # The shipped alert's expression holds (its `for:` is the operator's to wait out).
    _wait_until(
        "Prometheus to see the failures",
        lambda: [float(s["value"][1]) for s in server.query(integrity)] == [READS],  # type: ignore[index]
    )
    firing = server.query(_alert_expression("ShardcacheOriginErrors"))
    assert [s["metric"]["origin"] for s in firing] == ["web"], firing  # type: ignore[index]

    # At --log-level warning: the failure, once, not once per read.
    warnings = [r for r in _records(daemon) if "s.tar" in r or "integrity" in r]
    assert 1 <= len(warnings) <= 2, warnings
    assert any("md5 from Content-MD5 does not match" in r for r in warnings), warnings
    assert daemon.stop() == 0
    summary = [r for r in _records(daemon) if f"{READS - 1} more integrity failures" in r]
    assert len(summary) == 1, _records(daemon)


def test_sheds_under_a_cap_and_404s_are_not_alerted_as_a_failing_origin(
    origin: OriginServer, start_daemon, prometheus: list[Prometheus], tmp_path: Path
) -> None:
    """Origin `capped`: under `max_requests_per_second = 0.05` and a 2 s read timeout, a read
    whose turn is up to 20 s off is shed at once: the loader gets 503 with Retry-After, and
    no request went to the origin. That is this daemon's cap binding, not the origin failing.
    Origin `plain`: one shard read, two asked that it does not have (404s).

    Found: each shed was counted as an origin error of kind `busy` against a denominator of
    requests sent, so one request sent and four shed made `ShardcacheOriginErrors` ("origin
    fails 400% of requests") fire for a healthy origin, and nothing named the cap; two 404s
    in three requests made it fire for `plain` (found by the new-user pass). Sheds now have
    their own counter, equal to the gate's `shed`, and their own alert."""
    for n in range(5):
        origin.put(f"s{n}.tar", b"s" * 1000)
    config = tmp_path / "capped.toml"
    config.write_text(
        f'[origins.capped]\nurl = "{origin.url}"\nmax_requests_per_second = 0.05\n'
        f'[origins.plain]\nurl = "{origin.url}"\n'
    )
    daemon = start_daemon(
        {}, "--config", str(config), "--origin-read-timeout", "2", "--readahead", "0"
    )
    server = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{daemon.port}")
    prometheus.append(server)
    shed_total = 'shardcache_origin_requests_shed_total{origin="capped"}'
    _wait_until("a first scrape", lambda: server.query(shed_total))

    answers = [curl(f"{daemon.url}/capped/s{n}.tar", "--no-fail") for n in range(5)]
    assert answers[0].status == 200, answers[0]
    shed = [a for a in answers[1:] if a.status == 503]
    assert len(shed) >= 3 and all(a.headers.get("retry-after") for a in shed), answers
    assert sorted(origin.gets) == ["s0.tar"] + [
        f"s{n}.tar" for n in range(1, 5) if answers[n].status == 200
    ]
    assert curl(f"{daemon.url}/plain/s0.tar").exit_code == 0
    for missing in ("gone0.tar", "gone1.tar"):
        assert curl(f"{daemon.url}/plain/{missing}", "--no-fail").status == 404
    status, document = daemon.get_json("/_/status")
    assert status == 200 and document["origins"]["capped"]["gate"]["shed"] == len(shed), document
    assert daemon.metric("shardcache_origin_requests_shed_total", origin="capped") == len(shed)
    stats = subprocess.run(
        [sys.executable, "-m", "shardcache", "stats", "--daemon", daemon.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    gate_line = f"  gate    cap 0.05/s; 0 in use, 0 waiting, {len(shed)} shed, 0 abandoned"
    assert gate_line in stats.stdout.splitlines(), stats.stdout

    _wait_until(
        "Prometheus to see the sheds and the 404s",
        lambda: (
            [float(s["value"][1]) for s in server.query(shed_total)] == [len(shed)]  # type: ignore[index]
            and server.query('shardcache_origin_errors_total{origin="plain",kind="not_found"} == 2')
        ),
    )
    failing = server.query(_alert_expression("ShardcacheOriginErrors"))
    assert failing == [], f"healthy origins alerted as failing: {failing}"
    shedding = server.query(_alert_expression("ShardcacheOriginShedding"))
    assert [s["metric"]["origin"] for s in shedding] == ["capped"], shedding  # type: ignore[index]


def test_a_streamed_through_body_failing_its_checksum_is_counted_once_per_read(
    origin: OriginServer, start_daemon
) -> None:
    """Larger than the cache: each read streams its own origin body through, uncached."""
    origin.put("big.tar", os.urandom(3 * MiB), content_md5=hashlib.md5(b"another").digest())
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_size="2MiB")

    for _ in range(3):
        assert curl(f"{daemon.url}/web/big.tar").exit_code != 0

    assert daemon.metric("shardcache_origin_errors_total", origin="web", kind="integrity") == 3
    assert daemon.metric("shardcache_requests_total", origin="web", result="error") == 3
    assert daemon.metric("shardcache_requests_total", origin="web", result="miss") == 0


@pytest.fixture(params=["untrusted-certificate", "s3-without-credentials"])
def failing_origin(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str, str]]:
    """(origin URL, the error kind, text the log line must have): every read of it fails."""
    if request.param == "untrusted-certificate":
        cert, key = self_signed(tmp_path)
        server = OriginServer(ssl_context=server_context(cert, key))
        server.start()
        server.put("s.tar", b"x" * 1000)
        yield server.url, "tls", "certificate"
        server.stop()
        return
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask for
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    yield "s3://bucket/prefix", "denied", "no AWS credentials"


def test_origin_failures_are_warnings_rate_limited_per_origin_and_kind(
    failing_origin: tuple[str, str, str], start_daemon
) -> None:
    url, kind, text = failing_origin
    daemon = start_daemon({"web": url}, "--log-level", "warning", "--readahead", "0")

    for _ in range(READS):
        assert curl(f"{daemon.url}/web/s.tar", "--no-fail").status == 502

    assert daemon.metric("shardcache_origin_errors_total", origin="web", kind=kind) == READS
    assert daemon.metric("shardcache_requests_total", origin="web", result="error") == READS
    daemon.wait_for_log(text)
    first = [r for r in _records(daemon) if text in r]
    assert len(first) == 1 and first[0].startswith("WARNING"), _records(daemon)
    assert daemon.stop() == 0
    summary = [r for r in _records(daemon) if f"{READS - 1} more {kind} failures" in r]
    assert len(summary) == 1 and summary[0].startswith("WARNING"), _records(daemon)
    assert len(_records(daemon)) <= 4, _records(daemon)  # and the start and stop lines
