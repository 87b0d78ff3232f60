"""Attacks on a purge during a fill (issue 34, item 5): purge twice, purge then an immediate
GET while the purged fill still runs (a new fetch, the new bytes, never the old fill's), many
readers of the purged fill (each gets it whole), a purge racing the commit."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import os
import threading
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, run_cli, wait_for
from tests.integration.test_purge_during_fill import (
    SIZE,
    TOKEN,
    _cached_keys,
    _delete,
    _held_read,
    _start,
)
from tests.origin_server import OriginServer

AUTH = f"Authorization: Bearer {TOKEN}"


def _body(response: http.client.HTTPResponse) -> bytes | None:
    """The whole body, or None when the response ended early (a visible failure)."""
    try:
        return response.read()
    except http.client.IncompleteRead:
        return None


def test_purge_twice_then_an_immediate_get_fetches_the_new_bytes_while_the_old_fill_runs(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = _start(start_daemon, origin)
    old, new = os.urandom(SIZE), os.urandom(SIZE)
    with _held_read(daemon, origin, "v.tar", old) as read:
        joined = []
        for _ in range(3):  # more readers of the fill, before the purge
            connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
            connection.request("GET", "/web/v.tar", headers={"Authorization": f"Bearer {TOKEN}"})
            response = connection.getresponse()
            assert response.getheader("X-Shardcache") == "coalesced"
            joined.append((connection, response))
        first = _delete(daemon, "/_/cache/web/v.tar")
        assert first[0] == 200 and first[1]["fill_not_kept"] is True, first
        second = _delete(daemon, "/_/cache/web/v.tar")
        assert second[0] in (200, 404), second  # nothing left to purge, never a 500
        origin.put("v.tar", new)  # the object changed: the next read must see it
        fresh = curl(f"{daemon.url}/web/v.tar", "-H", AUTH)
        assert fresh.exit_code == 0 and fresh.body == new, "a read after the purge got old bytes"
        assert fresh.headers["x-shardcache"] == "miss"
        read.release.set()
        bodies = [_body(response) for response in [read.response, *(r for _, r in joined)]]
        for connection in [read.connection, *(c for c, _ in joined)]:
            connection.close()
    # The purged fill's readers get the old version whole, or fail visibly (its checksum HEAD
    # meets the new version: "changed during the fill"), never a byte of the new one.
    assert all(body == old or body is None for body in bodies), "a spliced or new body"
    wait_for("the new version cached", lambda: _cached_keys(daemon) == ["v.tar"])
    hit = curl(f"{daemon.url}/web/v.tar", "-H", AUTH)
    assert hit.headers["x-shardcache"] == "hit" and hit.body == new
    assert "Traceback" not in daemon.log()


def test_purges_racing_commits_never_leave_a_stale_hit(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = _start(start_daemon, origin)
    wrong = 0
    for round_ in range(12):
        key = f"race-{round_}.tar"
        old, new = os.urandom(SIZE // 4), os.urandom(SIZE // 4)
        origin.put(key, old)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            read = pool.submit(curl, f"{daemon.url}/web/{key}", "-H", AUTH)
            purge = pool.submit(_delete, daemon, f"/_/cache/web/{key}")
            got, (status, _) = read.result(), purge.result()
        assert got.exit_code == 0 and got.body == old and status in (200, 404)
        origin.put(key, new)
        if status == 200:  # the purge reached the fill or its entry: nothing old stays
            after = curl(f"{daemon.url}/web/{key}", "-H", AUTH)
            wrong += after.body != new
        purged = _delete(daemon, f"/_/cache/web/{key}")
        assert purged[0] in (200, 404)
        final = curl(f"{daemon.url}/web/{key}", "-H", AUTH)
        wrong += final.body != new
        assert hashlib.sha256(final.body).digest() == hashlib.sha256(new).digest()
    assert wrong == 0
    assert "Traceback" not in daemon.log()


def test_a_fill_purged_before_its_lying_mirror_is_caught_starts_no_kept_second_fetch(
    start_daemon: Callable[..., Daemon], origin: OriginServer, tmp_path: Path
) -> None:
    home = origin
    liar = OriginServer()
    liar.start()
    try:
        data = os.urandom(SIZE)
        home.put("m.tar", data)
        release = threading.Event()
        liar.put("m.tar", os.urandom(SIZE), claims_etag=home.etags["m.tar"], no_md5=True)
        liar.put(
            "m.tar",
            liar.objects["m.tar"],
            hold=release,
            claims_etag=home.etags["m.tar"],
            no_md5=True,
        )
        config = tmp_path / "origins.toml"
        config.write_text(f'[origins.web]\nurls = ["{liar.url}", "{home.url}"]\n')
        daemon = start_daemon(
            {},
            "--config",
            str(config),
            "--readahead",
            "0",
            env={"SHARDCACHE_ADMIN_TOKEN": TOKEN},
            token=TOKEN,
        )
        connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
        connection.request("GET", "/web/m.tar", headers={"Authorization": f"Bearer {TOKEN}"})
        response = connection.getresponse()
        assert response.getheader("X-Shardcache") == "miss"
        status, answer = _delete(daemon, "/_/cache/web/m.tar")
        assert status == 200 and answer["fill_not_kept"] is True, answer
        release.set()
        assert _body(response) is None  # the liar's bytes: a visible failure
        connection.close()
        read = curl(f"{daemon.url}/web/m.tar", "-H", AUTH)  # a reader's own fetch
        assert read.exit_code == 0 and read.body == data
        assert "fetching it again" not in daemon.log(), "a purged object was fetched again"
        assert read.headers["x-shardcache"] == "miss" and home.gets["m.tar"] == 1
        assert "Traceback" not in daemon.log()
    finally:
        liar.stop()


def test_a_purge_of_a_prefetchs_fill_in_flight_keeps_and_pins_nothing(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = _start(start_daemon, origin)
    release = threading.Event()
    data = os.urandom(SIZE)
    origin.put("p.tar", data, hold=release)
    env = {"SHARDCACHE_ADMIN_TOKEN": TOKEN}
    queued = run_cli("prefetch", "--lookahead", "/web/p.tar", "--daemon", daemon.url, env=env)
    assert queued.returncode == 0, queued.stderr
    wait_for("the prefetch's GET held", lambda: origin.gets["p.tar"] == 1)
    purged = run_cli("purge", "web", "p*", "--daemon", daemon.url, env=env)
    assert purged.returncode == 0, purged
    assert "1 fill in flight" in purged.stdout, purged.stdout
    release.set()
    wait_for("the prefetch settled", lambda: daemon.get_json("/_/prefetch")[1]["in_flight"] == 0)
    status = daemon.get_json("/_/prefetch")[1]
    assert status["unread_bytes"] == 0, status
    assert _cached_keys(daemon) == []
    read = curl(f"{daemon.url}/web/p.tar", "-H", AUTH)
    assert read.exit_code == 0 and read.body == data and read.headers["x-shardcache"] == "miss"
    assert "Traceback" not in daemon.log()


def test_a_purge_of_the_second_fetch_after_a_lying_mirror_is_not_kept(
    start_daemon: Callable[..., Daemon], origin: OriginServer, tmp_path: Path
) -> None:
    home, liar = origin, OriginServer()
    liar.start()
    try:
        data = os.urandom(SIZE)
        release = threading.Event()
        home.put("q.tar", data, hold=release)
        liar.put("q.tar", os.urandom(SIZE), claims_etag=home.etags["q.tar"], no_md5=True)
        config = tmp_path / "origins.toml"
        config.write_text(f'[origins.web]\nurls = ["{liar.url}", "{home.url}"]\n')
        daemon = start_daemon(
            {},
            "--config",
            str(config),
            "--readahead",
            "0",
            env={"SHARDCACHE_ADMIN_TOKEN": TOKEN},
            token=TOKEN,
        )
        lied = curl(f"{daemon.url}/web/q.tar", "-H", AUTH)
        assert lied.exit_code != 0  # the liar's bytes: a visible failure
        wait_for("the second fetch held at the home", lambda: home.gets["q.tar"] == 1)
        status, answer = _delete(daemon, "/_/cache/web/q.tar")
        assert status == 200 and answer["fill_not_kept"] is True, answer
        release.set()
        read = curl(f"{daemon.url}/web/q.tar", "-H", AUTH)
        assert read.exit_code == 0 and read.body == data
        assert read.headers["x-shardcache"] == "miss"  # its own fetch, not the purged one
        wait_for("the read's fill cached", lambda: _cached_keys(daemon) == ["q.tar"])
        assert home.gets["q.tar"] == 2
        assert "Traceback" not in daemon.log()
    finally:
        liar.stop()
