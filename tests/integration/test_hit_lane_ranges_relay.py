"""The hit lane's ranges and relayed requests, attacked at their edges: a range the lane answers
is the 206 (or 200, or 416) aiohttp's handler gives, byte for byte, and rot inside it is found;
a request the lane relays to aiohttp holds the connection's later requests until its response
ended, whatever that response is, then the lane reads on in order."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.disk_helpers import MiB, entry_files, flip_byte
from tests.integration.helpers import curl, sha256, wait_for
from tests.integration.test_hit_lane import (
    LANE,
    SIGNED,
    Answer,
    Connection,
    _cached,
    _file_of,
    _without_date,
    request,
    s3_lake,
)
from tests.origin_server import Behaviour, OriginServer
from tests.s3_stores import client_for

SIZE = 65_536 + 17


def _range_forms(size: int) -> list[str]:
    """`Range` values at and around an object's edges (and the spellings a parser may differ
    on); each is sent as one field."""
    return [
        "bytes=0-0",
        f"bytes={size - 1}-{size - 1}",
        f"bytes={size - 1}-",
        f"bytes={size}-",  # just past the end: 416
        f"bytes={size - 2}-{size + 100}",
        f"bytes=-{size + 5}",  # a suffix longer than the object: all of it, as a 206
        "bytes=-0",  # 416
        "bytes=-1",
        "bytes=0-" + "9" * 30,
        "9" * 25 + "-",
        "bytes=" + "9" * 25 + "-",
        "BYTES=0-9",
        " bytes = 0 - 9 ",
        "bytes=\t0-9",
        "",
        "bytes=",
        "bytes=-",
        "bytes=1-0",
        "bytes=0-9,",
        "bytes=+1-9",
        "bytes=0x1-9",
        "bits=0-9",
        "bytes=\xa00-9",  # a latin-1 byte aiohttp does not read as a space
        "bytes=0-9\x85",
    ]


def _compare(daemon: Daemon, fields: tuple[str, ...]) -> tuple[Answer, Answer]:
    """The same request on a fresh connection, as the lane may answer it, then with a field the
    lane never takes (so aiohttp's handler answers)."""
    lane, other = Connection(daemon), Connection(daemon)
    try:
        return lane.get("/o/r.tar", *fields), other.get("/o/r.tar", *fields, "X-Probe: 1")
    finally:
        lane.close()
        other.close()


def test_every_range_form_at_the_edges_is_the_answer_aiohttp_gives(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(SIZE)
    _cached(daemon, origin, "r.tar", data)
    cases = [(f"Range: {form}",) for form in _range_forms(SIZE)]
    cases += [("Range: bytes=0-9", "Range: bytes=20-29"), ("Range: bytes=5-4", "Range: bytes=1-2")]
    differences = []
    lane_answers = 0
    for fields in cases:
        before = daemon.metric(LANE)
        by_lane, by_handler = _compare(daemon, fields)
        lane_answers += daemon.metric(LANE) - before
        if (by_lane.status_line, _without_date(by_lane), by_lane.body) != (
            by_handler.status_line,
            _without_date(by_handler),
            by_handler.body,
        ):
            differences.append((fields, by_lane.status_line, by_handler.status_line))
        content_range = by_handler.field("content-range")
        if by_handler.status_line.startswith("HTTP/1.1 206"):
            assert content_range is not None
            first, last = map(int, content_range.split()[1].split("/")[0].split("-"))
            assert by_handler.body == data[first : last + 1], fields
        elif by_handler.status_line.startswith("HTTP/1.1 200"):
            assert by_handler.body == data, fields
    assert differences == []
    assert lane_answers >= 10  # the forms it takes were the lane's, not all relayed


def test_s3_signed_ranges_are_the_lanes_and_the_s3_answer_aiohttp_gives(
    s3_client, s3_env, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    bucket, key = "lane-range-bucket", "shards/s-000001.tar"
    daemon, data = s3_lake(s3_client, s3_env, start_daemon, tmp_path, bucket, key)
    client = client_for(daemon.url)
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data  # the miss

    def lane_answers(fields: tuple[str, ...]) -> Answer | None:
        before = daemon.metric(LANE)
        connection = Connection(daemon)
        try:
            answer = connection.get(f"/{bucket}/{key}", *SIGNED, *fields)
        finally:
            connection.close()
        return answer if daemon.metric(LANE) == before + 1 else None

    wait_for("an S3-addressed hit the lane answers", lambda: lane_answers(()) is not None)

    def comparable(answer: Answer) -> tuple[str, list[tuple[str, str]], bytes]:
        fields = [(k, "ID" if k == "x-amz-request-id" else v) for k, v in _without_date(answer)]
        return answer.status_line, fields, answer.body

    for wanted in ["bytes=0-0", "bytes=-1", "bytes=199990-", "bytes=-300000", "bytes=5-4"]:
        by_lane = lane_answers((f"Range: {wanted}",))
        assert by_lane is not None, wanted
        other = Connection(daemon)
        try:
            by_handler = other.get(f"/{bucket}/{key}", *SIGNED, f"Range: {wanted}", "X-Probe: 1")
        finally:
            other.close()
        assert comparable(by_lane) == comparable(by_handler), wanted
    assert lane_answers(("Range: bytes=200000-",)) is None  # a 416, S3's XML by aiohttp
    before = daemon.metric(LANE)
    got = client.get_object(Bucket=bucket, Key=key, Range="bytes=10-19")
    assert got["Body"].read() == data[10:20] and got["ContentRange"] == "bytes 10-19/200000"
    assert daemon.metric(LANE) == before + 1


def test_rot_outside_a_range_spares_it_and_rot_inside_aborts_it(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0", "--verify-hits-window", "0")
    data = os.urandom(4 * MiB + 5)
    before = set(entry_files(daemon.cache_dir))
    _cached(daemon, origin, "rot.tar", data)
    flip_byte(_file_of(daemon, before), 3 * MiB + 1)
    lanes = daemon.metric(LANE)

    connection = Connection(daemon)
    try:  # the first MiB's blocks are sound: its 206 is whole, and the lane's
        clean = connection.get("/o/rot.tar", "Range: bytes=0-1048575")
        assert clean.status_line == "HTTP/1.1 206 Partial Content"
        assert clean.body == data[:MiB]
        assert daemon.metric(LANE) == lanes + 1
        assert daemon.metric("shardcache_hit_corrupt_total", origin="o") == 0
        connection.send(request("/o/rot.tar", connection.host, f"Range: bytes={3 * MiB}-"))
        _, _, body = connection.read_until_closed().partition(b"\r\n\r\n")
    finally:
        connection.close()
    assert len(body) < len(data) - 3 * MiB, "a rotten range ended cleanly"
    assert daemon.metric("shardcache_hit_corrupt_total", origin="o") == 1
    again = curl(f"{daemon.url}/o/rot.tar")
    assert again.exit_code == 0 and again.sha256 == sha256(data)
    assert again.headers["x-shardcache"] == "miss"


def _waiting_bytes(connection: Connection) -> bytes:
    """What the daemon has sent on `connection` and the test has not read as an answer (yet):
    what the last read took beyond its answer, then what the socket holds."""
    try:
        peeked = connection._socket.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        peeked = b""
    return connection._buffer + peeked


@pytest.mark.parametrize(
    "settings", [(), ("--log-level", "warning", "--log-format", "json")], ids=["info", "warning"]
)
def test_lane_hits_pipelined_behind_a_relayed_slow_miss_wait_for_it_then_come_in_order(
    start_daemon: Callable[..., Daemon], origin: OriginServer, settings: tuple[str, ...]
) -> None:
    daemon = start_daemon({"o": origin.url}, *settings)
    hits = {f"h{n}.tar": os.urandom(30_000 + n) for n in range(2)}
    for key, data in hits.items():
        _cached(daemon, origin, key, data)
    slow = os.urandom(100_000)
    origin.put("slow.tar", slow)
    release = threading.Event()
    origin.behaviour["slow.tar"] = Behaviour(hold=release)
    lanes = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        connection.send(
            request("/o/h0.tar", connection.host)
            + request("/o/slow.tar", connection.host)
            + request("/o/h1.tar", connection.host, "Range: bytes=0-9")
            + request("/o/h0.tar", connection.host)
        )
        first = connection.read()
        wait_for("the miss at the origin", lambda: origin.gets["slow.tar"] >= 1)
        waiting = _waiting_bytes(connection)  # the miss's head may be out, nothing after it
        assert waiting.count(b"HTTP/1.1 ") <= 1, "an answer overtook the relayed miss"
        assert not waiting or waiting.startswith(b"HTTP/1.1 200 OK"), waiting[:200]
        head = waiting.partition(b"\r\n\r\n")[0]
        assert b"\r\n\r\n" not in waiting or b"x-shardcache: miss" in head.lower(), head
        release.set()
        miss, ranged, last = connection.read(), connection.read(), connection.read()
        assert first.body == hits["h0.tar"]
        assert miss.field("x-shardcache") == "miss" and miss.body == slow
        assert ranged.status_line == "HTTP/1.1 206 Partial Content"
        assert ranged.body == hits["h1.tar"][:10] and last.body == hits["h0.tar"]
        assert daemon.metric(LANE) == lanes + 3
        assert connection.get("/o/slow.tar").body == slow  # still the same connection
    finally:
        release.set()
        connection.close()


def test_the_lane_reads_on_after_relayed_404_304_and_error_answers(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(20_000)
    _cached(daemon, origin, "k.tar", data)
    origin.put("bad.tar", b"x" * 10)
    origin.behaviour["bad.tar"] = Behaviour(status=500)
    etag = curl(f"{daemon.url}/o/k.tar").headers["etag"]
    lanes = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        connection.send(request("/o/absent.tar", connection.host, method="HEAD"))
        assert connection.read("HEAD").status_line.split()[1] == "404"
        assert connection.get("/o/k.tar").body == data
        assert daemon.metric(LANE) == lanes + 1
        not_modified = connection.get("/o/k.tar", f"If-None-Match: {etag}")
        assert not_modified.status_line.split()[1] == "304"
        assert connection.get("/o/k.tar", "Range: bytes=-3").body == data[-3:]
        assert daemon.metric(LANE) == lanes + 2
        failed = connection.get("/o/bad.tar")
        assert failed.status_line.split()[1].startswith("5"), failed.status_line
        if (failed.field("connection") or "").lower() == "close":
            assert connection.read_until_closed() == b""
        else:
            assert connection.get("/o/k.tar").body == data
            assert daemon.metric(LANE) == lanes + 3
    finally:
        connection.close()


def test_clients_leaving_mid_relayed_miss_leave_the_lane_answering(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(20_000)
    _cached(daemon, origin, "k.tar", data)
    release = threading.Event()
    connections = []
    try:
        for n in range(20):
            origin.put(f"s{n}.tar", os.urandom(1000))
            origin.behaviour[f"s{n}.tar"] = Behaviour(hold=release)
            connection = Connection(daemon)
            connection.send(request(f"/o/s{n}.tar", connection.host))
            connections.append(connection)
        wait_for("every miss at the origin", lambda: sum(origin.gets.values()) >= 20)
        for connection in connections:
            connection.close()
        release.set()
        wait_for(
            "every client counted as gone",
            lambda: daemon.metric("shardcache_client_disconnects_total", origin="o") >= 20,
        )
    finally:
        release.set()
        for connection in connections:
            connection.close()
    lanes = daemon.metric(LANE)
    fresh = Connection(daemon)
    try:
        assert fresh.get("/o/k.tar").body == data
    finally:
        fresh.close()
    assert daemon.metric(LANE) == lanes + 1


def test_sigterm_during_a_relayed_miss_ends_it_whole_and_never_half_answers_what_follows(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    hit = os.urandom(30_000)
    _cached(daemon, origin, "h.tar", hit)
    slow = os.urandom(300_000)
    origin.put("slow.tar", slow)
    release = threading.Event()
    origin.behaviour["slow.tar"] = Behaviour(hold=release)
    connection = Connection(daemon)
    try:
        connection.send(
            request("/o/slow.tar", connection.host) + request("/o/h.tar", connection.host)
        )
        wait_for("the miss at the origin", lambda: origin.gets["slow.tar"] >= 1)
        os.kill(daemon.process.pid, signal.SIGTERM)
        daemon.wait_for_log("shutting down")
        release.set()
        received = connection.read_until_closed()
    finally:
        release.set()
        connection.close()
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and rest[: len(slow)] == slow
    after = rest[len(slow) :]
    if after:  # what followed is answered whole (by whom it may be) or not at all
        next_head, _, body = after.partition(b"\r\n\r\n")
        fields = dict(line.split(": ", 1) for line in next_head.decode("latin-1").split("\r\n")[1:])
        assert len(body) == int(fields["Content-Length"]), next_head
        if next_head.startswith(b"HTTP/1.1 200"):
            assert body == hit
    assert daemon.process.wait(30) == 0


def test_the_end_of_input_behind_a_relayed_miss_is_aiohttps_a_client_that_left(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """A flood pipelined behind a relayed miss the origin holds, then the end of the client's
    input. The end goes to aiohttp at once, as it would without the lane: a client that left
    must let go of what it waits for (a turn at a cap, a fill only it wants), and the end of
    input is all that tells. So the connection closes; whatever came before is whole and in
    order, never a clean short body, and the object is served whole after."""
    daemon = start_daemon({"o": origin.url})
    hits = [os.urandom(1000 + n) for n in range(3)]
    for n, data in enumerate(hits):
        _cached(daemon, origin, f"h{n}.tar", data)
    slow = os.urandom(100_000)
    origin.put("slow.tar", slow)
    release = threading.Event()
    origin.behaviour["slow.tar"] = Behaviour(hold=release)
    connection = Connection(daemon)
    try:
        host = connection.host
        flood = b"".join(request(f"/o/h{n % 3}.tar", host) for n in range(1500))
        assert len(flood) > 65536
        connection.send(request("/o/slow.tar", host) + flood)
        connection.shut_write()
        release.set()  # the miss may or may not have reached the origin by the end of input
        received = connection.read_until_closed()  # closed: the client's end was a departure
    finally:
        release.set()
        connection.close()
    expected = [slow] + [hits[n % 3] for n in range(1500)]
    position = 0
    for body in expected:  # every whole answer in order; a partial one only last
        head_end = received.find(b"\r\n\r\n", position)
        if head_end < 0:
            break
        length = int(received[position:head_end].split(b"Content-Length: ")[1].split(b"\r\n")[0])
        got = received[head_end + 4 : head_end + 4 + length]
        if len(got) < length:
            break  # the connection ended inside this answer: short against its Content-Length
        assert got == body
        position = head_end + 4 + length
    assert curl(f"{daemon.url}/o/slow.tar").sha256 == sha256(slow)  # still served whole
