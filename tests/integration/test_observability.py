"""Metrics, status and the shipped dashboard and alerts, against a real Prometheus server.

Debian's `prometheus` package (server and promtool) must be installed; `scripts/test` installs it.
Prometheus scrapes the daemon every second; the test drives hits, misses, coalesced requests,
prefetches (completed, late, wasted), evictions and origin errors, then runs every PromQL
expression in deploy/grafana/shardcache.json and deploy/prometheus/alerts.yml through the
Prometheus HTTP API and requires each to return data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer
from tests.ports import free_port
from tests.readiness import answers_200, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "shardcache.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
MiB = 1024 * 1024
# Counted when a response\'s headers go out (its result counts once it ends).
FIRST_BYTES = "shardcache_time_to_first_byte_seconds_count"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is required: apt-get install prometheus (scripts/test does this)"
    return path


class Prometheus:
    def __init__(self, workdir: Path, target: str) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self._log = (workdir / "prometheus.log").open("wb")
        shutil.copy(ALERTS, workdir / "alerts.yml")
        (workdir / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "rule_files: [alerts.yml]\n"
            "scrape_configs:\n  - job_name: shardcache\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.process = subprocess.Popen(
            [
                _tool("prometheus"),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        try:
            wait_until_ready(
                "prometheus",
                answers_200(f"http://127.0.0.1:{self.port}/-/ready"),
                process=self.process,
                log=workdir / "prometheus.log",
            )
        except AssertionError:
            self.stop()
            raise

    def api(self, path: str, **params: str) -> dict[str, object]:
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        with urllib.request.urlopen(url, timeout=10) as response:
            document = json.loads(response.read())
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str) -> list[dict[str, object]]:
        data = self.api("query", query=expr)
        return data["result"]  # type: ignore[index,return-value]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)
        self._log.close()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    started: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        server = Prometheus(tmp_path / "prometheus", target)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _requests_seen(prometheus: Prometheus) -> float:
    """The daemon's requests as Prometheus last scraped them (-1 before a first scrape)."""
    total = prometheus.query('sum(shardcache_requests_total{job="shardcache"})')
    return float(total[0]["value"][1]) if total else -1  # type: ignore[index]


def _dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$instance", ".*").replace("$__rate_interval", "1m")
            queries.append((f"panel {panel['title']!r} {target['refId']}", expr))
    return queries


def _alert_signals() -> list[tuple[str, str, str]]:
    """(alert, full expression, the expression without its threshold comparisons)."""
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    comparison = re.compile(r"\s*(?:==|!=|>=|<=|>|<)\s*[0-9.]+(?![\w.])")
    return [(r["alert"], r["expr"], comparison.sub("", r["expr"])) for r in rules]


async def _concurrent_gets(url: str, count: int) -> list[str]:
    async with aiohttp.ClientSession() as session:

        async def one() -> str:
            async with session.get(url) as response:
                await response.read()
                return response.headers["X-Shardcache"]

        return await asyncio.gather(*(one() for _ in range(count)))


def _wait_prefetch(daemon, done: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        status = daemon.get_json("/_/prefetch")[1]
        if status["done"] >= done and status["in_flight"] == 0:
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def _post_prefetch(daemon, paths: list[str]) -> None:
    request = urllib.request.Request(
        daemon.url + "/_/prefetch", method="POST", data=json.dumps({"urls": paths}).encode()
    )
    urllib.request.urlopen(request, timeout=10).close()


def test_counters_status_dashboard_and_alerts_against_prometheus(
    origin: OriginServer, start_daemon, prometheus_for, tmp_path: Path
) -> None:
    for i in range(10):
        origin.put(f"s_{i}.tar", b"s" * MiB)
    hold, late_hold = threading.Event(), threading.Event()
    origin.put("hold.tar", b"h" * 2 * MiB, hold=hold)
    for name in ("p_0", "p_1", "p_3"):
        origin.put(f"{name}.tar", b"p" * (MiB // 2))
    origin.put("p_2.tar", b"q" * (MiB // 2), hold=late_hold)
    mirrored = tmp_path / "mirrored.toml"  # an origin with upstreams: a dead one, then `web`
    mirrored.write_text(f'[origins.mirrored]\nurls = ["http://127.0.0.1:9", "{origin.url}"]\n')
    daemon = start_daemon(
        {"web": origin.url, "down": "http://127.0.0.1:9"},
        "--config",
        str(mirrored),
        "--readahead",
        "0",
        "--origin-retries",
        "0",
        "--prefetch-max-bytes",
        "4MiB",
        "--eviction",
        "plan",  # plain LRU until the plan posted at the end: its evictions are counted below
        cache_size="8MiB",
    )
    prometheus = prometheus_for(f"127.0.0.1:{daemon.port}")

    for i in range(10):  # 10 misses; the 8 MiB cache evicts the oldest
        assert curl(f"{daemon.url}/web/s_{i}.tar").headers["x-shardcache"] == "miss"
    for i in (9, 8):  # 2 hits
        assert curl(f"{daemon.url}/web/s_{i}.tar").headers["x-shardcache"] == "hit"
    results: list[str] = []
    runner = threading.Thread(
        target=lambda: results.extend(
            asyncio.run(_concurrent_gets(f"{daemon.url}/web/hold.tar", 8))
        )
    )
    runner.start()
    wait_for("the 7 joiners", lambda: daemon.metric(FIRST_BYTES, result="coalesced") >= 7)
    hold.set()
    runner.join(30)
    assert sorted(results) == ["coalesced"] * 7 + ["miss"]  # 1 miss, 7 coalesced
    assert curl(f"{daemon.url}/web/missing.tar", "--no-fail").status == 404  # an error
    assert curl(f"{daemon.url}/down/x.tar", "--no-fail").status == 502  # an origin error
    origin.put("m.tar", b"m" * 1000)
    assert curl(f"{daemon.url}/mirrored/m.tar").exit_code == 0  # failed over from the dead one

    _post_prefetch(daemon, ["/web/p_0.tar", "/web/p_1.tar"])  # 2 completed
    _wait_prefetch(daemon, done=2)
    assert curl(f"{daemon.url}/web/p_0.tar").headers["x-shardcache"] == "hit"
    _post_prefetch(daemon, ["/web/p_2.tar"])  # the loader asks before it finished: late
    wait_for("the prefetch's GET", lambda: origin.gets["p_2.tar"])
    late: list[str] = []
    asker = threading.Thread(
        target=lambda: late.append(curl(f"{daemon.url}/web/p_2.tar").headers["x-shardcache"])
    )
    asker.start()
    wait_for("the late read", lambda: daemon.metric("shardcache_prefetch_late_total", origin="web"))
    late_hold.set()
    asker.join(30)
    assert late == ["coalesced"]
    _post_prefetch(daemon, ["/web/p_3.tar"])  # purged before any read: wasted
    _wait_prefetch(daemon, done=4)
    assert curl(f"{daemon.url}/_/cache/web/p_3.tar", "-X", "DELETE").status == 200

    # Counter semantics: exactly what the test did.
    expected = {"hit": 3, "miss": 11, "coalesced": 8, "error": 1}
    for result, count in expected.items():
        assert daemon.metric("shardcache_requests_total", origin="web", result=result) == count
    assert daemon.metric("shardcache_requests_total", origin="down", result="error") == 1
    from_cache = 2 * MiB + MiB // 2
    from_origin = 10 * MiB + 8 * 2 * MiB + MiB // 2
    assert (
        daemon.metric("shardcache_response_bytes_total", origin="web", source="cache") == from_cache
    )
    assert (
        daemon.metric("shardcache_response_bytes_total", origin="web", source="origin")
        == from_origin
    )
    assert daemon.metric("shardcache_origin_errors_total", origin="down", kind="unavailable") == 1
    assert daemon.metric("shardcache_prefetch_completed_total") == 4
    assert daemon.metric("shardcache_prefetch_wasted_total", origin="web") == 1
    assert daemon.metric("shardcache_cache_evictions_total") >= 2
    status = daemon.get_json("/_/status")[1]
    # …and the one read through `mirrored`, a miss of 1,000 bytes
    assert status["requests"] == {"hit": 3, "miss": 12, "coalesced": 8, "error": 2}
    assert status["hit_ratio"]["requests"] == round(3 / 25, 4)
    assert status["hit_ratio"]["bytes"] == round(from_cache / (from_cache + from_origin + 1000), 4)
    upstreams = status["origins"]["mirrored"]["upstreams"]
    assert [u["role"] for u in upstreams] == ["mirror", "home"]
    assert upstreams[0]["failures"] == 1 and upstreams[1]["failures"] == 0
    assert status["cache"]["eviction"]["policy"] == "lru"  # no plan yet
    # A loader's plan of four shards: predicted = the share of them cached now.
    planned = [f"s_{i}.tar" for i in (6, 7, 8, 9)]
    cached = [curl(f"{daemon.url}/web/{k}", "-I").headers["x-shardcache"] for k in planned]
    plan = {"job": "trainer-0", "epoch": 0, "urls": [f"/web/{key}" for key in planned]}
    request = urllib.request.Request(
        daemon.url + "/_/plan", method="POST", data=json.dumps(plan).encode()
    )
    urllib.request.urlopen(request, timeout=10).close()
    assert daemon.metric("shardcache_plans_active") == 1
    assert daemon.metric("shardcache_eviction_policy", policy="plan") == 1
    predicted = daemon.metric("shardcache_plan_predicted_hit_ratio", plan="trainer-0")
    assert predicted == cached.count("hit") / 4
    first = curl(f"{daemon.url}/web/s_6.tar").headers["x-shardcache"]
    measured = daemon.metric("shardcache_plan_measured_hit_ratio", plan="trainer-0")
    assert measured == (1.0 if first == "hit" else 0.0)

    # Wait until Prometheus holds the final figures, and the scrapes rate() needs.
    wait_for("Prometheus to see the final counters", lambda: _requests_seen(prometheus) == 26)
    empty: list[str] = []

    def every_query_has_data() -> bool:
        empty[:] = [name for name, expr in _dashboard_queries() if not prometheus.query(expr)]
        empty.extend(alert for alert, _, signal in _alert_signals() if not prometheus.query(signal))
        return not empty

    with contextlib.suppress(AssertionError):
        wait_for("data for every dashboard query and alert signal", every_query_has_data)
    assert empty == [], f"dashboard queries or alert signals without data: {empty}"
    for _, expr, _ in _alert_signals():
        prometheus.query(expr)  # the full expression must evaluate (it need not fire)
    rules = prometheus.api("rules")["groups"][0]["rules"]  # type: ignore[index]
    assert len(rules) == 6 and all(r["health"] == "ok" for r in rules), rules


def _dashboard_panels() -> list[tuple[str, str | None, list[str]]]:
    """(title, its "no value" text or None, its PromQL expressions) of every graph panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (
            panel["title"],
            panel.get("fieldConfig", {}).get("defaults", {}).get("noValue"),
            [
                t["expr"].replace("$instance", ".*").replace("$__rate_interval", "1m")
                for t in panel["targets"]
            ],
        )
        for panel in dashboard["panels"]
        if panel.get("targets")
    ]


def test_every_panel_has_data_or_says_why_on_a_plain_daemon(
    start_daemon, prometheus_for, tmp_path: Path
) -> None:
    """A first daemon as most users run it: one file origin, no tier, no mirrors, no plans.
    Every dashboard panel shows data, or (plans) a text saying why it has none: the origin's
    one URL is its home upstream, up; the plan panel says "no plans posted"."""
    root = tmp_path / "shards"
    root.mkdir()
    for i in range(3):
        (root / f"s_{i}.tar").write_bytes(bytes([i]) * 100_000)
    daemon = start_daemon({"files": f"file://{root}"}, "--readahead", "0")
    prometheus = prometheus_for(f"127.0.0.1:{daemon.port}")
    for i in (0, 1, 2, 0):
        assert curl(f"{daemon.url}/files/s_{i}.tar").exit_code == 0
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        scrape = response.read().decode()
    home = f'{{origin="files",role="home",upstream="file://{root}"}}'
    assert f"shardcache_upstream_up{home} 1.0" in scrape.splitlines()
    assert f"shardcache_upstream_failures_total{home} 0.0" in scrape.splitlines()
    assert "shardcache_plan_predicted_hit_ratio{" not in scrape  # no plan: no series

    wait_for("Prometheus to see the reads", lambda: _requests_seen(prometheus) == 4)
    upstream = prometheus.query('shardcache_upstream_up{origin="files"}')
    assert [u["metric"]["upstream"] for u in upstream] == [f"file://{root}"]  # type: ignore[index]
    silent: list[str] = []

    def every_panel_speaks() -> bool:  # rate() has data after two more scrapes
        silent.clear()
        for title, no_value, expressions in _dashboard_panels():
            empty = [expr for expr in expressions if not prometheus.query(expr)]
            if empty and not no_value:
                silent.append(f"{title!r}: {empty}")
        return not silent

    with contextlib.suppress(AssertionError):
        wait_for("data or a text on every panel", every_panel_speaks)
    assert silent == [], f"panels with no data and nothing saying why: {silent}"
    texts = {title: text for title, text, _ in _dashboard_panels() if text}
    assert texts == {"Plans: predicted vs measured hit ratio": "no plans posted"}


def test_promtool_checks_rules_and_a_scrape(origin: OriginServer, start_daemon) -> None:
    promtool = _tool("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = subprocess.run(
        [promtool, "check", "config", str(ROOT / "deploy" / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert config.returncode == 0, config.stdout + config.stderr
    origin.put("a.tar", b"a" * 1000)
    daemon = start_daemon({"web": origin.url})
    curl(f"{daemon.url}/web/a.tar")
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as response:
        scrape = response.read()
    linted = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert b"shardcache_build_info{version=" in scrape


def test_stats_command_prints_a_table_and_json(origin: OriginServer, start_daemon) -> None:
    origin.put("a.tar", b"a" * 1000)
    daemon = start_daemon({"web": origin.url})
    curl(f"{daemon.url}/web/a.tar")
    curl(f"{daemon.url}/web/a.tar")
    import sys

    table = subprocess.run(
        [sys.executable, "-m", "shardcache", "stats", "--daemon", daemon.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    as_json = subprocess.run(
        [sys.executable, "-m", "shardcache", "stats", "--json", "--daemon", daemon.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert table.returncode == 0 and "hit ratio      50.0% of requests" in table.stdout
    assert "scrub          32 MiB/s, " in table.stdout  # the default rate, on
    assert json.loads(as_json.stdout)["requests"]["hit"] == 1
    down = subprocess.run(
        [sys.executable, "-m", "shardcache", "stats", "--daemon", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert down.returncode == 2 and "cannot reach the shardcache daemon" in down.stderr


def test_the_loader_stall_counts_concurrent_waits_once(origin: OriginServer, start_daemon) -> None:
    """Four clients wait together for the same cold shard: the per-stream sum counts the wait
    four times, the loader-stall figure (the union of the waits) once."""
    hold = threading.Event()
    origin.put("slow.tar", b"s" * MiB, hold=hold)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    results: list[str] = []
    readers = [
        threading.Thread(
            target=lambda: results.append(
                curl(f"{daemon.url}/web/slow.tar").headers["x-shardcache"]
            )
        )
        for _ in range(4)
    ]
    began = time.monotonic()
    for reader in readers:
        reader.start()
    wait_for("the 3 joiners", lambda: daemon.metric(FIRST_BYTES, result="coalesced") >= 3)
    time.sleep(1.0)  # the wait measured below
    hold.set()
    for reader in readers:
        reader.join(30)
    held = time.monotonic() - began
    assert sorted(results) == ["coalesced"] * 3 + ["miss"]
    stall = daemon.metric("shardcache_loader_stall_seconds_total", origin="web")
    summed = daemon.metric("shardcache_client_wait_seconds_total", origin="web")
    assert 1.0 <= stall <= held
    assert summed >= 3 * 1.0 + stall * 0.9  # three waited at least the second, one the whole
    assert summed > 2.5 * stall
    status = daemon.get_json("/_/status")[1]
    assert status["loader_stall_s"] == pytest.approx(stall, abs=0.01)
