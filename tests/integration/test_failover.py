"""Origin failover (issue 14): an origin listing two upstreams, the first of which refuses
connections, answers 5xx, or stalls (before its headers, and mid-body). Every read succeeds
from the second; a resumed object whose ETag differs between the two fails visibly and is
never spliced. Real daemon, real HTTP upstreams, curl as the loader."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import curl
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
    labels = {"origin": "fails", "upstream": upstream, "role": "origin"}
    assert daemon.metric("shardcache_upstream_failures_total", **labels) == 1

    # Cut at byte 400,000 by the first upstream, resumed from the second, which holds
    # another version: the client sees a failure, never a spliced 200.
    threading.Timer(0.5, before_cut.set).start()
    result = curl(f"{daemon.url}/changed/{KEYS[0]}")
    assert result.exit_code != 0
    assert servers["other"].gets[f"changed/{KEYS[0]}"] == 1  # asked with If-Match: 412
    assert daemon.metric("shardcache_origin_errors_total", origin="changed", kind="changed") >= 1
    entries = daemon.get_json("/_/status")[1]["cache"]["entries"]  # type: ignore[index]
    assert entries == len(ORIGINS) * len(KEYS)  # nothing of "changed" was kept
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
    assert " 508 " in member.log() and "must not list a tier" in member.log()
    assert origin.gets["k.tar"] == 2  # one fetch by each daemon, no request went round
