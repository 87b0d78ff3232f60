"""The hit lane (issue 36, 64 KiB hits): a plain GET of a remembered, checked entry is answered
in front of aiohttp, and the answer is the one aiohttp's handler gives (status, fields in order,
body, metrics, access line); every other request, and every request after it on the same
connection, is aiohttp's. A body that fails after its head still aborts the connection."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.disk_helpers import MiB, entry_files, flip_byte
from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer
from tests.s3_stores import client_for

LANE = "shardcache_hit_lane_requests_total"


class Answer:
    """One HTTP/1.1 answer read off a raw connection."""

    def __init__(self, status_line: str, fields: list[tuple[str, str]], body: bytes) -> None:
        self.status_line = status_line
        self.fields = fields
        self.body = body

    def field(self, name: str) -> str | None:
        return next((v for k, v in self.fields if k.lower() == name.lower()), None)


class Connection:
    """A keep-alive client on a plain socket: the bytes sent are exactly the test's."""

    def __init__(self, daemon: Daemon) -> None:
        self._socket = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
        self._buffer = b""
        self.host = f"127.0.0.1:{daemon.port}"

    def send(self, data: bytes) -> None:
        self._socket.sendall(data)

    def get(self, path: str, *fields: str) -> Answer:
        self.send(request(path, self.host, *fields))
        return self.read()

    def read(self, method: str = "GET") -> Answer:
        while b"\r\n\r\n" not in self._buffer:
            self._more()
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        fields = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines)]
        length = next((int(v) for k, v in fields if k.lower() == "content-length"), 0)
        length = 0 if method == "HEAD" else length
        while len(self._buffer) < length:
            self._more()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return Answer(status_line, fields, body)

    def shut_write(self) -> None:
        """Half-close: the client sends nothing more and still reads."""
        self._socket.shutdown(socket.SHUT_WR)

    def read_until_closed(self) -> bytes:
        """Everything until the daemon closes the connection (an abort included)."""
        data = self._buffer
        self._buffer = b""
        while True:
            try:
                chunk = self._socket.recv(1 << 20)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def _more(self) -> None:
        chunk = self._socket.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        self._buffer += chunk

    def close(self) -> None:
        self._socket.close()


def request(path: str, host: str, *fields: str, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _cached(daemon: Daemon, origin: OriginServer, key: str, data: bytes) -> None:
    """`key` cached and its index row remembered (a miss, then a hit through aiohttp)."""
    origin.put(key, data)
    assert curl(f"{daemon.url}/o/{key}").headers["x-shardcache"] == "miss"
    wait_for("the commit", lambda: curl(f"{daemon.url}/o/{key}").headers["x-shardcache"] == "hit")


def _without_date(answer: Answer) -> list[tuple[str, str]]:
    return [(k, v) for k, v in answer.fields if k.lower() != "date"]


def test_a_lane_hit_is_the_answer_aiohttp_gives_field_for_field(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(64 * 1024 + 3)
    _cached(daemon, origin, "shards/a.tar", data)
    connection = Connection(daemon)
    before = daemon.metric(LANE)
    hits_before = daemon.metric("shardcache_requests_total", origin="o", result="hit")

    lane = connection.get("/o/shards/a.tar", "User-Agent: curl/8.1.2", "Accept: */*")
    assert daemon.metric(LANE) == before + 1
    other = Connection(daemon)
    handler = other.get("/o/shards/a.tar", "X-Probe: 1")  # a field the lane does not take
    assert daemon.metric(LANE) == before + 1

    assert lane.status_line == handler.status_line == "HTTP/1.1 200 OK"
    assert _without_date(lane) == _without_date(handler)
    assert lane.field("x-shardcache") == "hit" and lane.field("date")
    assert hashlib.sha256(lane.body).hexdigest() == sha256(data) == sha256(handler.body)
    assert daemon.metric("shardcache_requests_total", origin="o", result="hit") == hits_before + 2
    assert daemon.metric("shardcache_response_bytes_total", origin="o", source="cache") >= 2 * len(
        data
    )
    lines = [line for line in daemon.log().splitlines() if "GET /o/shards/a.tar 200 hit" in line]
    assert any(f" {len(data)} " in line for line in lines[-2:]), lines[-2:]
    connection.close()
    other.close()


def test_keep_alive_and_pipelined_requests_are_answered_in_order_around_relayed_ones(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    objects = {f"shards/{n}.tar": os.urandom(50_000 + n) for n in range(3)}
    for key, data in objects.items():
        _cached(daemon, origin, key, data)
    before = daemon.metric(LANE)
    connection = Connection(daemon)
    for round_ in range(10):
        for key, data in objects.items():
            assert connection.get(f"/o/{key}").body == data, (round_, key)
    assert daemon.metric(LANE) == before + 30

    # Three requests in one write, the second a HEAD (relayed to aiohttp): answered in order
    # on the same connection, the GETs around it by the lane.
    keys = list(objects)
    connection.send(
        request(f"/o/{keys[0]}", connection.host)
        + request(f"/o/{keys[1]}", connection.host, method="HEAD")
        + request(f"/o/{keys[2]}", connection.host)
    )
    first, head, third = connection.read(), connection.read("HEAD"), connection.read()
    assert first.body == objects[keys[0]] and third.body == objects[keys[2]]
    assert head.status_line == "HTTP/1.1 200 OK" and head.body == b""
    assert head.field("content-length") == str(len(objects[keys[1]]))
    assert daemon.metric(LANE) == before + 32
    ranged = connection.get(f"/o/{keys[0]}", "Range: bytes=5-9", 'If-Range: "nope"')  # relayed
    assert ranged.status_line == "HTTP/1.1 200 OK" and ranged.body == objects[keys[0]]
    assert connection.get(f"/o/{keys[1]}").body == objects[keys[1]]  # the lane's again
    assert daemon.metric(LANE) == before + 33
    connection.close()


def test_a_keep_alive_client_that_heads_then_gets_or_misses_then_hits_stays_in_the_lane(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """What the aws CLI (HeadObject, then the GET on the same connection) and a long-lived
    boto3 client (epoch 0's misses, then hits) send: the GETs that are hits are the lane's."""
    daemon = start_daemon({"o": origin.url}, "--readahead", "0")
    shards = {f"epoch/{n}.tar": os.urandom(30_000 + n) for n in range(4)}
    for key, data in shards.items():
        origin.put(key, data)
    connection = Connection(daemon)
    try:
        for key in shards:  # epoch 0: misses, each relayed
            assert connection.get(f"/o/{key}").field("x-shardcache") == "miss"
        wait_for("the commits", lambda: daemon.metric("shardcache_cache_entries") == 4)
        before = daemon.metric(LANE)
        for key, data in shards.items():  # epoch 1: HEAD then GET, as the aws CLI reads
            connection.send(request(f"/o/{key}", connection.host, method="HEAD"))
            assert connection.read("HEAD").field("content-length") == str(len(data))
            answer = connection.get(f"/o/{key}")
            assert answer.body == data and answer.field("x-shardcache") == "hit"
        assert daemon.metric(LANE) == before + 4
    finally:
        connection.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /_/prefetch HTTP/1.1\r\nHost: H\r\nContent-Length: 2\r\n\r\n[]",
        b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nX-A: b\nX-B: c\r\n\r\n",  # a bare LF
        b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["a-body", "bare-lf", "chunked"],
)
def test_after_a_request_the_lane_cannot_frame_the_connection_is_aiohttps_for_good(
    start_daemon: Callable[..., Daemon], origin: OriginServer, raw: bytes
) -> None:
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(10_000)
    _cached(daemon, origin, "k.tar", data)
    connection = Connection(daemon)
    try:
        connection.send(raw.replace(b"Host: H\r\n", f"Host: {connection.host}\r\n".encode()))
        assert connection.read().status_line.startswith("HTTP/1.")  # a 400 says 1.0
        before = daemon.metric(LANE)
        try:
            later = connection.get("/o/k.tar")
        except ConnectionError:
            later = None  # aiohttp closed it after its answer
        assert later is None or later.body == data
        assert daemon.metric(LANE) == before
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b'GET /o/k.tar HTTP/1.1\r\nHost: H\r\nRange: bytes=0-9\r\nIf-Range: "no"\r\n\r\n', 200),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nRange: bytes=99999-\r\n\r\n", 416),
        (b'GET /o/k.tar HTTP/1.1\r\nHost: H\r\nIf-None-Match: "x"\r\n\r\n', 200),
        (b"GET /o/k.tar?x=1 HTTP/1.1\r\nHost: H\r\n\r\n", 200),
        (b"GET /o/k%2Etar HTTP/1.1\r\nHost: H\r\n\r\n", 200),
        (b"GET /o/./k.tar HTTP/1.1\r\nHost: H\r\n\r\n", 400),
        (b"GET /o/k.tar HTTP/1.0\r\nHost: H\r\n\r\n", 200),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nConnection: close\r\n\r\n", 200),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nHost: H\r\n\r\n", 400),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nAccept: a,\r\n b\r\n\r\n", 400),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403),
        (b"GET /k.tar HTTP/1.1\r\nHost: o.localhost\r\n\r\n", 200),  # a virtual-hosted bucket
        (b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nAuthorization: Bearer t\r\n\r\n", 200),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nX-Amz-Tagging: a=b\r\n\r\n", 200),
        (b"get /o/k.tar HTTP/1.1\r\nHost: H\r\n\r\n", 400),
        (b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n", 400),
        (b"GET /nope/k.tar HTTP/1.1\r\nHost: H\r\n\r\n", 404),
    ],
)
def test_what_the_lane_does_not_take_gets_aiohttps_answer(
    start_daemon: Callable[..., Daemon], origin: OriginServer, raw: bytes, status: int
) -> None:
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(10_000)
    _cached(daemon, origin, "k.tar", data)
    before = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        connection.send(raw.replace(b"Host: H\r\n", f"Host: {connection.host}\r\n".encode()))
        answer = connection.read()
    finally:
        connection.close()
    assert answer.status_line.split()[1] == str(status), (answer.status_line, answer.body[:200])
    if status == 200:
        assert answer.body == data
    assert daemon.metric(LANE) == before


def _file_of(daemon: Daemon, before: set[Path]) -> Path:
    """The committed entry's file (a hit may come from a fill whose body is complete before
    its file is moved into the index)."""
    wait_for("the commit", lambda: len(set(entry_files(daemon.cache_dir)) - before) == 1)
    (path,) = set(entry_files(daemon.cache_dir)) - before
    return path


def test_a_file_cut_short_under_the_lane_aborts_the_body_and_the_next_read_refetches(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--verify-hits", "off", "--scrub-rate", "0")
    data = os.urandom(3 * MiB)
    before = set(entry_files(daemon.cache_dir))
    _cached(daemon, origin, "cut.tar", data)
    path = _file_of(daemon, before)
    os.truncate(path, MiB)  # the row still says 3 MiB
    lanes = daemon.metric(LANE)

    connection = Connection(daemon)
    connection.send(request("/o/cut.tar", connection.host))
    received = connection.read_until_closed()
    connection.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"Content-Length: %d" % len(data) in head
    assert len(body) < len(data), "a short body ended cleanly"
    assert daemon.metric(LANE) == lanes + 1
    assert daemon.metric("shardcache_requests_total", origin="o", result="error") == 1
    again = curl(f"{daemon.url}/o/cut.tar")
    assert again.exit_code == 0 and again.sha256 == sha256(data)
    assert again.headers["x-shardcache"] == "miss"


def test_rot_found_by_the_lanes_block_check_aborts_the_hit_and_drops_the_entry(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0", "--verify-hits-window", "0")
    data = os.urandom(2 * MiB + 5)
    before = set(entry_files(daemon.cache_dir))
    _cached(daemon, origin, "rot.tar", data)
    flip_byte(_file_of(daemon, before), MiB + 1)
    lanes = daemon.metric(LANE)

    connection = Connection(daemon)
    connection.send(request("/o/rot.tar", connection.host))
    _, _, body = connection.read_until_closed().partition(b"\r\n\r\n")
    connection.close()
    assert len(body) < len(data), "a rotten hit ended cleanly"
    assert daemon.metric(LANE) == lanes + 1
    assert daemon.metric("shardcache_hit_corrupt_total", origin="o") == 1
    again = curl(f"{daemon.url}/o/rot.tar")
    assert again.exit_code == 0 and again.sha256 == sha256(data)
    assert again.headers["x-shardcache"] == "miss"


def test_a_client_that_stops_reading_a_lane_body_is_closed_after_the_send_timeout(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--client-send-timeout", "2")
    data = os.urandom(48 * MiB)
    _cached(daemon, origin, "big.tar", data)
    lanes = daemon.metric(LANE)
    stalled = socket.create_connection(("127.0.0.1", daemon.port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(request("/o/big.tar", f"127.0.0.1:{daemon.port}"))
    wait_for("the lane to take it", lambda: daemon.metric(LANE) == lanes + 1)
    wait_for(
        "the send timeout",
        lambda: daemon.metric("shardcache_client_timeouts_total", phase="send") == 1,
        timeout_s=60,
    )
    # Meanwhile and after, other clients are served whole.
    assert curl(f"{daemon.url}/o/big.tar").sha256 == sha256(data)
    stalled.close()

    leaver = Connection(daemon)
    leaver.send(request("/o/big.tar", leaver.host))
    leaver.close()  # at once: the body is cut off in its first megabytes
    wait_for(
        "the departure counted",
        lambda: daemon.metric("shardcache_client_disconnects_total", origin="o") >= 1,
    )
    assert curl(f"{daemon.url}/o/big.tar").sha256 == sha256(data)


SIGNED = (
    "Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261129/us-east-1/s3/aws4_request, "
    "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=" + "0" * 64,
    "X-Amz-Date: 20261129T000000Z",
    "X-Amz-Content-SHA256: UNSIGNED-PAYLOAD",
    "User-Agent: Boto3/1.35.0 md/Botocore#1.35.0",
    "x-amz-checksum-mode: ENABLED",
)


def s3_lake(  # type: ignore[no-untyped-def]
    s3_client, s3_env, start_daemon: Callable[..., Daemon], tmp_path: Path, bucket: str, key: str
) -> tuple[Daemon, bytes]:
    """200,000 random bytes uploaded as `bucket`/`key` (as users upload, `upload_file`) and a
    daemon whose origin `lake` is the bucket under `key`'s folder."""
    try:  # the stores are shared by the session
        s3_client.create_bucket(Bucket=bucket)
    except s3_client.exceptions.BucketAlreadyOwnedByYou:
        pass
    data = os.urandom(200_000)
    (tmp_path / "upload").write_bytes(data)
    s3_client.upload_file(str(tmp_path / "upload"), bucket, key)
    prefix = key.rpartition("/")[0]
    daemon = start_daemon({"lake": f"s3://{bucket}/{prefix}"}, "--readahead", "0", env=s3_env)
    return daemon, data


def test_s3_addressed_hits_by_the_buckets_own_names_are_the_lanes_and_s3s_answer(
    s3_client, s3_env, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    bucket, key = "lane-bucket", "datasets/laion/shards_000001.tar"
    daemon, data = s3_lake(s3_client, s3_env, start_daemon, tmp_path, bucket, key)
    client = client_for(daemon.url)
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data  # the miss
    wait_for(
        "a hit through aiohttp",
        lambda: (
            client.get_object(Bucket=bucket, Key=key)["ResponseMetadata"]["HTTPHeaders"][
                "x-shardcache"
            ]
            == "hit"
        ),
    )
    answers: list[Answer] = []

    def answered_by_the_lane() -> bool:
        # A row is remembered once a hit through aiohttp read it; a late index write (the
        # checksums a store gives beside its GET) forgets it until the next such hit.
        before = daemon.metric(LANE)
        connection = Connection(daemon)
        try:
            answers.append(connection.get(f"/{bucket}/{key}", *SIGNED))
        finally:
            connection.close()
        return daemon.metric(LANE) == before + 1

    wait_for("an S3-addressed hit the lane answers", answered_by_the_lane)
    by_lane = answers[-1]
    before = daemon.metric(LANE)
    other = Connection(daemon)
    try:
        by_handler = other.get(f"/{bucket}/{key}", *SIGNED, "X-Probe: 1")
    finally:
        other.close()
    assert daemon.metric(LANE) == before
    assert by_lane.body == by_handler.body == data

    def comparable(answer: Answer) -> list[tuple[str, str]]:
        return [(k, "ID" if k == "x-amz-request-id" else v) for k, v in _without_date(answer)]

    assert comparable(by_lane) == comparable(by_handler)
    request_id = by_lane.field("x-amz-request-id")
    assert (
        request_id and len(request_id) == 16 and request_id != by_handler.field("x-amz-request-id")
    )
    assert by_lane.field("x-amz-checksum-type") == "FULL_OBJECT"

    # boto3 itself, its checksum validation on: one keep-alive connection, answered by the lane
    before = daemon.metric(LANE)
    for _ in range(5):
        got = client.get_object(Bucket=bucket, Key=key)
        assert got["Body"].read() == data
    assert daemon.metric(LANE) >= before + 5


def test_a_connection_the_lane_keeps_busy_outlives_aiohttps_keep_alive_timer(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """aiohttp times a connection's keep-alive from its start until it sees a request, and it
    never sees the lane's: only the guard's idle clock, which the lane's answers reset, may
    close it."""
    daemon = start_daemon({"o": origin.url}, "--client-idle-timeout", "1")
    data = os.urandom(5000)
    _cached(daemon, origin, "busy.tar", data)
    before = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        deadline = time.monotonic() + 3.5  # past aiohttp's 2 s (twice the idle timeout)
        answered = 0
        while time.monotonic() < deadline:
            assert connection.get("/o/busy.tar").body == data, f"closed after {answered}"
            answered += 1
            time.sleep(0.2)  # a reader's pace, well inside the 1 s idle timeout
    finally:
        connection.close()
    assert daemon.metric(LANE) == before + answered


def test_the_first_hit_after_a_fill_is_the_lanes(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """A committed fill's index row is remembered as it is written: the second read of a
    shard (the first hit) needs no SQLite, and the lane answers it."""
    daemon = start_daemon({"o": origin.url}, "--readahead", "0")
    data = os.urandom(70_000)
    origin.put("fresh.tar", data)
    assert curl(f"{daemon.url}/o/fresh.tar").headers["x-shardcache"] == "miss"
    wait_for("the commit", lambda: daemon.metric("shardcache_cache_entries") == 1)
    before = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        answer = connection.get("/o/fresh.tar")
    finally:
        connection.close()
    assert answer.body == data and answer.field("x-shardcache") == "hit"
    assert daemon.metric(LANE) == before + 1


@pytest.mark.parametrize(
    "wanted", ["bytes=10-19", "bytes=-5", "bytes=65000-", "bytes=0-0", "bytes=0-1,4-5", "bytes=9-2"]
)
def test_a_range_of_a_hit_is_the_lanes_and_the_answer_aiohttp_gives(
    start_daemon: Callable[..., Daemon], origin: OriginServer, wanted: str
) -> None:
    """What s3fs, parquet readers and the CRT ask: ranges of a cached object, answered by the
    lane as aiohttp's handler answers them (a multi-range or an invalid one: the whole)."""
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(65_536 + 17)
    _cached(daemon, origin, "r.tar", data)
    before = daemon.metric(LANE)
    lane, other = Connection(daemon), Connection(daemon)
    try:
        by_lane = lane.get("/o/r.tar", f"Range: {wanted}")
        assert daemon.metric(LANE) == before + 1
        by_handler = other.get("/o/r.tar", f"Range: {wanted}", "X-Probe: 1")
        assert daemon.metric(LANE) == before + 1
    finally:
        lane.close()
        other.close()
    assert by_lane.status_line == by_handler.status_line
    assert _without_date(by_lane) == _without_date(by_handler)
    assert by_lane.body == by_handler.body
    content_range = by_lane.field("content-range")
    if content_range is None:
        assert by_lane.body == data
    else:
        first, last = map(int, content_range.split()[1].split("/")[0].split("-"))
        assert by_lane.body == data[first : last + 1]
    line = [ln for ln in daemon.log().splitlines() if "GET /o/r.tar" in ln][-2]
    assert f" {by_lane.status_line.split()[1]} hit {len(by_lane.body)} " in line, line
