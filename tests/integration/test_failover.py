"""Origin failover (issue 14): an origin listing two upstreams, the first of which refuses
connections, answers 5xx, or stalls (before its headers, and mid-body). Every read succeeds
from the second; a resumed object whose ETag differs between the two fails visibly and is
never spliced. Real daemon, real HTTP upstreams, curl as the loader."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, run_cli, wait_for
from tests.origin_server import OriginServer
from tests.ports import free_port

ORIGINS = ("refuses", "fails", "stalls", "stalls-mid")
KEYS = [f"shard-{i}.tar" for i in range(3)]
SIZE = 1 << 20


@pytest.fixture
def servers() -> Iterator[dict[str, OriginServer]]:
    started = {name: OriginServer() for name in ("good", "fails", "stalls", "cuts", "other")}
    for server in started.values():
        server.start()
    yield started
    for server in started.values():
        server.stop()


def test_every_read_succeeds_from_the_next_upstream_and_differing_versions_never_splice(
    servers: dict[str, OriginServer], start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # Each origin its own prefix, so that each has its own home (which names objects in the
    # cache) on the one good server.
    expected = {}
    for origin in ORIGINS:
        for key in KEYS:
            data = os.urandom(SIZE)
            expected[origin, key] = hashlib.sha256(data).hexdigest()
            servers["good"].put(f"{origin}/{key}", data)
            servers["fails"].put(f"{origin}/{key}", data, status=500)
            # before its headers, or mid-body
            stall = {"stall_after": 300_000} if origin == "stalls-mid" else {"delay_s": 60}
            servers["stalls"].put(f"{origin}/{key}", data, **stall)
    # The cut waits a moment, so the daemon has the 400,000 bytes before the connection closes
    # (aiohttp drops what it buffered when a body fails).
    before_cut = threading.Event()
    for key in KEYS:
        servers["cuts"].put(
            f"changed/{key}", os.urandom(SIZE), cut_after=400_000, cuts=1, before_cut=before_cut
        )
        servers["other"].put(f"changed/{key}", os.urandom(SIZE))  # another version, ETag
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    first = {"refuses": closed, "fails": servers["fails"].url}
    first["stalls"] = first["stalls-mid"] = servers["stalls"].url
    config = tmp_path / "c.toml"
    config.write_text(
        "".join(
            f'[origins.{o}]\nurls = ["{first[o]}/{o}", "{servers["good"].url}/{o}"]\n'
            for o in ORIGINS
        )
        + f'[origins.changed]\nurls = ["{servers["cuts"].url}/changed", '
        f'"{servers["other"].url}/changed"]\n'
    )
    flags = ("--config", str(config), "--origin-read-timeout", "1", "--readahead", "0")
    daemon = start_daemon({}, *flags)

    for origin in ORIGINS:
        for key in KEYS:
            result = curl(f"{daemon.url}/{origin}/{key}")
            assert (result.exit_code, result.sha256) == (0, expected[origin, key]), (origin, key)
            assert servers["good"].gets[f"{origin}/{key}"] >= 1
        status = daemon.get_json("/_/status")[1]
        upstreams = status["origins"][origin]["upstreams"]  # type: ignore[index]
        assert upstreams[1]["state"] == "up", upstreams
        assert upstreams[0]["failures"] >= 1 and upstreams[0]["last_error"], upstreams
    assert sum(servers["fails"].gets.values()) == 1  # asked once, then skipped while down
    assert "timed out" in daemon.log() and "no byte for" in daemon.log()  # both stalls seen
    upstream = f"{servers['fails'].url}/fails"
    labels = {"origin": "fails", "upstream": upstream, "role": "mirror"}
    assert daemon.metric("shardcache_upstream_failures_total", **labels) == 1
    stats = run_cli("stats", "--daemon", daemon.url)
    assert stats.returncode == 0, stats.stderr
    assert f"  mirror  {closed}/refuses  " in stats.stdout  # each upstream, with its state
    assert f"  home    {servers['good'].url}/refuses  up" in stats.stdout

    # Cut at byte 400,000 by the first upstream, resumed from the second, which holds
    # another version: the client sees a failure, never a spliced 200.
    threading.Timer(0.5, before_cut.set).start()
    result = curl(f"{daemon.url}/changed/{KEYS[0]}")
    assert result.exit_code != 0
    # The home publishes its MD5, so the cut mirror's other ETag is taken as its own name and
    # the read resumes from the home (If-Match on the home's ETag): the splice fails that MD5
    # before the last byte, so it is never served whole nor kept, and the object is fetched
    # again whole from the home at once (kept: the one more entry).
    assert (
        servers["other"].heads[f"changed/{KEYS[0]}"] + servers["other"].gets[f"changed/{KEYS[0]}"]
        >= 1
    )
    assert daemon.metric("shardcache_origin_errors_total", origin="changed", kind="changed") == 0
    labels = {"origin": "changed", "upstream": f"{servers['cuts'].url}/changed", "role": "mirror"}
    assert daemon.metric("shardcache_upstream_integrity_failures_total", **labels) == 1
    entries = daemon.get_json("/_/status")[1]["cache"]["entries"]  # type: ignore[index]
    assert entries in (len(ORIGINS) * len(KEYS), len(ORIGINS) * len(KEYS) + 1)
    # Asked afresh, the object comes whole from the upstream that answers.
    other = hashlib.sha256(servers["other"].objects[f"changed/{KEYS[0]}"]).hexdigest()
    result = curl(f"{daemon.url}/changed/{KEYS[0]}")
    assert (result.exit_code, result.sha256) == (0, other)


def test_a_tier_member_with_a_tier_of_its_own_refuses_the_loop(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """The easy mistake: one config for nodes and members, so a member lists the tier, itself
    included. It answers tier requests 508 and everyone reads from the origin instead of
    sending requests round the tier."""
    data = os.urandom(300_000)
    origin.put("k.tar", data)
    port = free_port()
    config = tmp_path / "same-for-everyone.toml"
    config.write_text(f'[origins.d]\nurl = "{origin.url}"\ntier = ["http://127.0.0.1:{port}"]\n')
    flags = ("--config", str(config), "--readahead", "0")
    member = start_daemon({}, *flags, cache_dir=tmp_path / "member", port=port)
    node = start_daemon({}, *flags, cache_dir=tmp_path / "node")
    for daemon in (node, member):
        result = curl(f"{daemon.url}/d/k.tar")
        assert (result.exit_code, result.body) == (0, data)
    assert " 508 " in member.log() and "must list neither" in member.log()
    assert origin.gets["k.tar"] == 2  # one fetch by each daemon, no request went round


def test_two_daemons_listed_as_each_others_mirror_do_not_wait_on_each_other(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    data = os.urandom(300_000)
    origin.put("k.tar", data)
    ports = free_port(), free_port()
    daemons = []
    for mine, theirs in (ports, ports[::-1]):
        config = tmp_path / f"{mine}.toml"
        mirror = f"http://127.0.0.1:{theirs}/d"
        config.write_text(f'[origins.d]\nurls = ["{mirror}", "{origin.url}"]\n')
        daemons.append(
            start_daemon({}, "--config", str(config), cache_dir=tmp_path / str(mine), port=mine)
        )
    started = time.monotonic()
    results = []
    threads = [
        threading.Thread(target=lambda d=d: results.append(curl(f"{d.url}/d/k.tar")))
        for d in daemons
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [(r.exit_code, r.body == data) for r in results] == [(0, True)] * 2
    assert time.monotonic() - started < 3  # not the 5 s read timeout of a fill waiting on one


def test_a_member_draining_or_misconfigured_is_skipped_not_obeyed(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """A member that is shutting down answers 503 with Retry-After on the connections it keeps
    open; one that serves the origin under another name answers 404 (no such origin). Neither
    is the object store throttling or a missing object: the node asks the next upstream, and
    no loader sees either."""
    keys = [f"k{i}.tar" for i in range(4)]
    for key in ["warm.tar", *keys]:
        origin.put(key, key.encode() * 50_000)
    hold = threading.Event()
    origin.put("held.tar", b"h" * 2_000_000, hold=hold)
    draining = start_daemon({"d": origin.url}, cache_dir=tmp_path / "draining")
    elsewhere = start_daemon({"other": origin.url}, cache_dir=tmp_path / "elsewhere")
    nodes = []
    for member in (draining, elsewhere):
        config = tmp_path / f"node-{member.port}.toml"
        config.write_text(f'[origins.d]\nurl = "{origin.url}"\ntier = ["{member.url}"]\n')
        nodes.append(start_daemon({}, "--config", str(config), cache_dir=tmp_path / config.stem))
    assert curl(f"{nodes[0].url}/d/warm.tar").exit_code == 0  # a kept-alive connection to it
    held = threading.Thread(target=lambda: curl(f"{draining.url}/d/held.tar"))
    held.start()
    wait_for("the held read", lambda: origin.gets["held.tar"] == 1)
    draining.process.send_signal(signal.SIGTERM)  # it drains the held response meanwhile
    wait_for("the drain", lambda: "shutting down" in draining.log())
    try:
        for node, member in zip(nodes, (draining, elsewhere), strict=True):
            started = time.monotonic()
            for key in keys:
                result = curl(f"{node.url}/d/{key}")
                assert (result.exit_code, result.body) == (0, key.encode() * 50_000), key
            assert time.monotonic() - started < 3  # no retries after a Retry-After
            assert "throttling us" not in node.log()
            status = node.get_json("/_/status")[1]
            upstreams = status["origins"]["d"]["upstreams"]  # type: ignore[index]
            assert {u["url"]: u["state"] for u in upstreams}[member.url] == "down"
        assert "(shutdown)" in nodes[0].log() and "(unknown_origin)" in nodes[1].log()
    finally:
        hold.set()
        held.join(10)
        assert draining.process.wait(30) == 0
