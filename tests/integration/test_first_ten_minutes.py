"""What a new user met in the first ten minutes (issue 11), each as the user met it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import webdataset as wds

from shardcache.loader.sample import write_shard
from shardcache.loader.webdataset import prefetch_ahead
from tests.daemon_process import Daemon
from tests.integration.helpers import run_cli, wait_for
from tests.origin_server import OriginServer
from tests.ports import free_port

SHARD = os.urandom(24 << 20)


def test_a_reader_that_leaves_early_is_a_499_and_its_unwanted_fill_stops(
    origin: OriginServer, start_daemon
) -> None:
    """The README's first try, `curl -sf URL | tar t | head`, stops reading a miss early: a
    499, not an error; the fill nobody else wants stops (issue 23, item 4), and the next
    read fills it again."""
    origin.put("shards_000.tar", SHARD, chunk_delay_s=0.01)  # ~1 s: the reader leaves first
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    subprocess.run(
        f"curl -sf {daemon.url}/web/shards_000.tar | head -c 1000 > /dev/null",
        shell=True,
        check=False,
        timeout=60,
    )
    log = daemon.wait_for_log("GET /web/shards_000.tar 499 miss")
    assert "Traceback" not in log and "unhandled error" not in log and " 500 " not in log
    assert daemon.metric("shardcache_client_disconnects_total", origin="web") == 1
    assert daemon.get_json("/_/status")[1]["cache"]["entries"] == 0  # type: ignore[index]
    with urllib.request.urlopen(daemon.url + "/web/shards_000.tar", timeout=30) as response:
        assert response.headers["X-Shardcache"] == "miss" and response.read() == SHARD
    with urllib.request.urlopen(daemon.url + "/web/shards_000.tar", timeout=30) as response:
        assert response.headers["X-Shardcache"] == "hit" and response.read() == SHARD


def _cli(*args: str, daemon: Daemon) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"SHARDCACHE_URL": daemon.url})


def test_url_maps_plain_paths_and_encodes_keys(start_daemon, tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    write_shard(root / "a b é.tar", 0, 5, 100, seed=1)  # a space and a non-ASCII letter
    daemon: Daemon = start_daemon({"files": f"file://{root}"}, "--readahead", "0")

    mapped = _cli("url", "--pipe", str(root / "a b é.tar"), daemon=daemon)
    expected = f"pipe:curl -s -f {daemon.url}/files/a%20b%20%C3%A9.tar"
    assert mapped.returncode == 0 and mapped.stdout.strip() == expected, mapped
    samples = list(wds.WebDataset(mapped.stdout.strip(), shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"{n:06d}" for n in range(5)]

    local = _cli("url", "/files/x_{000..009}.tar", daemon=daemon)
    assert local.stdout.strip() == f"{daemon.url}/files/x_{{000..009}}.tar"

    for uncovered in ("/tmp/elsewhere/shards_000.tar", "/nosuchorigin/x.tar"):
        refused = _cli("url", uncovered, daemon=daemon)
        assert refused.returncode == 2 and refused.stdout == "", refused
        assert "no configured origin covers" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1


def test_prefetch_ahead_finds_the_daemon_in_the_shard_urls(
    origin: OriginServer, start_daemon, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """No SHARDCACHE_URL, a daemon on another port than the default: the URLs name it."""
    monkeypatch.delenv("SHARDCACHE_URL", raising=False)
    for i in range(4):
        origin.put(f"s_{i:03d}.tar", os.urandom(10_000))
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    shards = [{"url": f"pipe:curl -s -f {daemon.url}/web/s_{i:03d}.tar"} for i in range(4)]
    handed_on = list(prefetch_ahead(3)(iter(shards)))
    assert handed_on == shards
    wait_for("the prefetches", lambda: all(origin.gets[f"s_{i:03d}.tar"] for i in range(1, 4)))
    # Nobody read a shard: only prefetches asked the origin.
    wait_for("3 done", lambda: daemon.metric("shardcache_prefetch_completed_total") >= 3)

    dead = f"http://127.0.0.1:{free_port()}"
    nowhere = [{"url": f"pipe:curl -s -f {dead}/web/s_{i:03d}.tar"} for i in range(20)]
    with caplog.at_level(logging.WARNING, logger="shardcache.webdataset"):
        assert list(prefetch_ahead(3)(iter(nowhere))) == nowhere
    warnings = [r.getMessage() for r in caplog.records if r.name == "shardcache.webdataset"]
    assert len(warnings) == 1 and dead in warnings[0], warnings


def _demo(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardcache",
            "demo",
            "--listen",
            f"127.0.0.1:{port}",
            "--sample-dir",
            str(tmp_path / "sample"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--shards",
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SHARDCACHE_")},
    )


def test_the_demo_prints_its_hints_once_serving_and_they_work(tmp_path: Path) -> None:
    port = free_port()
    demo = _demo(tmp_path, port)
    try:
        assert demo.stdout is not None
        lines = [demo.stdout.readline() for _ in range(4)]
        assert lines[1].startswith("serving them; try"), lines
        # The hints came after the port was bound: the first one works at once.
        curl_line = lines[2].strip()
        listed = subprocess.run(curl_line, shell=True, capture_output=True, text=True, timeout=30)
        assert "000000.txt" in listed.stdout, listed
        loop = lines[3].strip().split(" && ", 1)[1]  # the webdataset install is done here
        counted = subprocess.run(loop, shell=True, capture_output=True, text=True, timeout=60)
        assert counted.stdout.strip() == str(3 * 64), counted  # 64 samples a sample shard
    finally:
        demo.terminate()
        demo.communicate(timeout=30)  # also closes the pipes
    assert demo.returncode == 0


def test_the_demo_on_a_busy_port_shows_the_error_and_no_hints(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        demo = _demo(tmp_path, busy.getsockname()[1])
        out, err = demo.communicate(timeout=60)
    assert demo.returncode == 2 and "cannot listen on" in err, err
    assert "try" not in out, out


def test_cli_output_in_pipes_and_the_prefetch_summary(origin: OriginServer, start_daemon) -> None:
    for i in range(10):
        origin.put(f"s_{i:03d}.tar", os.urandom(50_000))
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "2")

    # `stats --watch | head`: the reader leaves, the command ends quietly.
    piped = subprocess.run(
        f"{sys.executable} -m shardcache stats --watch 0.1 --daemon {daemon.url} | head -1;"
        " echo ${PIPESTATUS[0]}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.stdout.splitlines()[-1] == "0" and piped.stderr == "", piped

    # --wait into a pipe: lines, not a bar redrawn five times a second.
    waited = _cli("prefetch", "--wait", "/web/s_{000..004}.tar", daemon=daemon)
    assert waited.returncode == 0 and "\r" not in waited.stderr, waited.stderr
    assert "prefetch: 5/5 shards (100%)" in waited.stderr
    assert len(waited.stderr.splitlines()) <= 12
    again = _cli("prefetch", "--wait", "/web/s_{000..004}.tar", daemon=daemon)
    assert again.returncode == 0 and "nothing to wait for" in again.stderr
    assert "shard/s" not in again.stderr

    # The summary counts what prefetch fetched apart from what it found done already.
    for i in range(10):
        with urllib.request.urlopen(f"{daemon.url}/web/s_{i:03d}.tar", timeout=30) as response:
            response.read()

    def settled() -> bool:
        queue = daemon.get_json("/_/status")[1]["prefetch"]
        return queue["pending"] == 0 and queue["in_flight"] == 0  # type: ignore[index]

    wait_for("the read-ahead to settle", settled)
    prefetch = daemon.get_json("/_/status")[1]["prefetch"]
    misses = daemon.metric("shardcache_requests_total", origin="web", result="miss")
    assert sum(origin.gets[f"s_{i:03d}.tar"] for i in range(10)) == 10
    assert prefetch["fetched"] == 10 - misses, (prefetch, misses)
    assert prefetch["done"] > prefetch["fetched"]  # read-ahead of shards already cached
    shown = _cli("stats", daemon=daemon).stdout
    assert (
        f"{prefetch['fetched']} fetched (+{prefetch['done'] - prefetch['fetched']} found" in shown
    )


def test_configuration_surprises_are_said(start_daemon, tmp_path: Path) -> None:
    twice = subprocess.run(
        [sys.executable, "-m", "shardcache", "serve", "--cache-dir", str(tmp_path / "c")]
        + ["--origin", f"a=file://{tmp_path}", "--origin", "a=file:///var"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert twice.returncode == 2 and "--origin: origin 'a' is given twice" in twice.stderr

    huge = start_daemon({}, cache_size="100TiB", cache_dir=tmp_path / "huge")
    log = huge.wait_for_log("no origins configured")
    assert "--cache-size 100 TiB is more than the" in log and "has room for" in log

    tiny = start_daemon({"f": f"file://{tmp_path}"}, cache_size="100KB", cache_dir=tmp_path / "t")
    assert "nothing can be cached" in tiny.wait_for_log("--cache-size 97.7 KiB is no more than")
    assert "no origins configured" not in tiny.log()


def test_probes_and_scrapes_log_at_debug_only(origin: OriginServer, start_daemon) -> None:
    origin.put("s.tar", b"s" * 100)
    daemon: Daemon = start_daemon({"web": origin.url}, "--log-level", "info")
    for path in ("/healthz", "/readyz", "/metrics", "/_/status", "/web/s.tar"):
        with urllib.request.urlopen(daemon.url + path, timeout=10) as response:
            response.read()
    log = daemon.wait_for_log("GET /web/s.tar 200")
    for path in ("/healthz", "/readyz", "/metrics", "/_/status"):
        assert f"GET {path} " not in log, log


def test_the_access_line_counts_the_bytes_sent(origin: OriginServer, start_daemon) -> None:
    """Hits and fills leave through sendfile, which aiohttp's byte count never sees."""
    origin.put("s.tar", bytes(61_440))
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    for _ in range(2):  # a miss, then a hit
        with urllib.request.urlopen(daemon.url + "/web/s.tar", timeout=10) as response:
            assert len(response.read()) == 61_440
    daemon.wait_for_log("GET /web/s.tar 200 hit")
    counted = [
        int(line.split()[-2])
        for line in daemon.log().splitlines()
        if "aiohttp.access: GET /web/s.tar 200" in line
    ]
    assert len(counted) == 2 and all(n >= 61_440 for n in counted), counted
