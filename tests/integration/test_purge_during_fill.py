"""A purge reaches the fills in flight: they finish for the readers they have, are not kept,
and the purge says so. Before, `DELETE /_/cache/NAME/KEY` of a key being filled answered
`404 not cached`, `shardcache purge` said "0 entries", then the fill committed and the next
read was a hit of the bytes the purge was meant to drop."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import secrets
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, run_cli, wait_for
from tests.origin_server import OriginServer

TOKEN = secrets.token_hex(16)
SIZE = 1 << 20  # one request (below the first segment), held after its headers
NOT_KEPT = "purged while it was filled: not cached"  # the fill's log line


@dataclass
class HeldRead:
    """A client's GET whose fill is in flight: the daemon answered its headers, and the
    origin holds the body until `release` is set."""

    response: http.client.HTTPResponse
    connection: http.client.HTTPConnection
    release: threading.Event

    def finish(self) -> bytes:
        self.release.set()
        body = self.response.read()
        self.connection.close()
        return body


@contextmanager
def _held_read(daemon: Daemon, origin: OriginServer, key: str, data: bytes) -> Iterator[HeldRead]:
    release = threading.Event()
    origin.put(key, data, hold=release)
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    try:
        connection.request("GET", f"/web/{key}", headers={"Authorization": f"Bearer {TOKEN}"})
        response = connection.getresponse()  # the headers: the fill is under way
        assert response.status == 200 and response.getheader("X-Shardcache") == "miss"
        yield HeldRead(response, connection, release)
    finally:
        release.set()
        connection.close()


def _delete(daemon: Daemon, path: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        daemon.url + path, method="DELETE", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _cached_keys(daemon: Daemon) -> list[object]:
    status, page = daemon.get_json("/_/cache?origin=web")
    assert status == 200, page
    return [entry["key"] for entry in page["entries"]]  # type: ignore[attr-defined]


def _start(start_daemon: Callable[..., Daemon], origin: OriginServer) -> Daemon:
    return start_daemon(
        {"web": origin.url},
        "--readahead",
        "0",
        env={"SHARDCACHE_ADMIN_TOKEN": TOKEN},
        token=TOKEN,
    )


def test_deleting_a_key_being_filled_lets_the_reader_finish_and_keeps_nothing(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = _start(start_daemon, origin)
    data = os.urandom(SIZE)
    with _held_read(daemon, origin, "held.tar", data) as read:
        status, answer = _delete(daemon, "/_/cache/web/held.tar")
        assert status == 200, answer
        assert answer == {"deleted": "web/held.tar", "entry_deleted": False, "fill_not_kept": True}
        body = read.finish()
    assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest()  # whole, verified
    daemon.wait_for_log(NOT_KEPT)
    assert _cached_keys(daemon) == []
    again = curl(f"{daemon.url}/web/held.tar", "-H", f"Authorization: Bearer {TOKEN}")
    assert again.exit_code == 0 and again.body == data
    assert again.headers["x-shardcache"] == "miss"
    assert origin.gets["held.tar"] == 2
    # A fill after the purge is kept (its commit may follow the response's last byte).
    wait_for("the refetch cached", lambda: _cached_keys(daemon) == ["held.tar"])
    status, answer = _delete(daemon, "/_/cache/web/held.tar")
    assert (status, answer["entry_deleted"], answer["fill_not_kept"]) == (200, True, False)
    assert _delete(daemon, "/_/cache/web/held.tar")[0] == 404  # neither cached nor filled


def test_purging_a_glob_reaches_its_fills_in_flight(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = _start(start_daemon, origin)
    origin.put("a-0.tar", os.urandom(3000))
    assert curl(f"{daemon.url}/web/a-0.tar", "-H", f"Authorization: Bearer {TOKEN}").exit_code == 0
    first, second, other = os.urandom(SIZE), os.urandom(SIZE), os.urandom(SIZE)
    with (
        _held_read(daemon, origin, "a-1.tar", first) as read_1,
        _held_read(daemon, origin, "a-2.tar", second) as read_2,
        _held_read(daemon, origin, "b-1.tar", other) as read_other,
    ):
        purged = run_cli(
            "purge", "web", "a-*", "--daemon", daemon.url, env={"SHARDCACHE_ADMIN_TOKEN": TOKEN}
        )
        assert purged.returncode == 0, purged
        assert purged.stdout.strip() == (
            "purged 1 entry (2.93 KiB) of origin web matching 'a-*'; "
            "2 fills in flight finish for their readers and are not kept"
        )
        bodies = [read.finish() for read in (read_1, read_2, read_other)]
    assert bodies == [first, second, other]
    wait_for("b-1.tar cached", lambda: _cached_keys(daemon) == ["b-1.tar"])  # not matched
    assert daemon.log().count(NOT_KEPT) == 2
