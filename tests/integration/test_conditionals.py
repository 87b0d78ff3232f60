"""HTTP conditionals (RFC 9110 §13) on GET and HEAD of objects, on hits, misses and ranges, over
an HTTP, an S3 (moto) and a file origin; the origin's Last-Modified passed on.

S3 runs on moto only: what is tested is the daemon's answer to a client's preconditions, and
that an S3 object's LastModified reaches it; SeaweedFS would add nothing but a second store.
A miss whose precondition fails must start no GET: `shardcache_origin_requests_total`
counts the GETs the daemon opened.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer
from tests.s3_stores import client_for, env_for

KiB = 1024
MODIFIED = 1_700_000_000  # Tue, 14 Nov 2023 22:13:20 GMT
MODIFIED_TEXT = email.utils.formatdate(MODIFIED, usegmt=True)
EARLIER = email.utils.formatdate(MODIFIED - 3600, usegmt=True)
LATER = email.utils.formatdate(MODIFIED + 3600, usegmt=True)


@dataclass
class Served:
    """A daemon in front of one origin, and how to put an object into that origin."""

    daemon: Daemon
    name: str
    put: Callable[[str, bytes], None]
    modified: Callable[[str], float]  # the origin's own Last-Modified of a key
    origin_gets: Callable[[], int] | None = None  # the origin's own count, where it keeps one

    def url(self, key: str) -> str:
        return f"{self.daemon.url}/{self.name}/{key}"

    def gets(self) -> float:
        """GETs the daemon opened to its origin so far (the test origin's count agrees)."""
        opened = self.daemon.metric(
            "shardcache_origin_requests_total", origin=self.name, status="ok"
        )
        if self.origin_gets is not None:
            assert self.origin_gets() == opened
        return opened


@pytest.fixture(params=["http", "s3", "file"])
def served(request: pytest.FixtureRequest, start_daemon, tmp_path: Path) -> Served:
    kind = request.param
    if kind == "http":
        origin: OriginServer = request.getfixturevalue("origin")
        daemon = start_daemon({"web": origin.url}, "--readahead", "0")

        def put_http(key: str, data: bytes) -> None:
            origin.put(key, data, last_modified=MODIFIED_TEXT)

        return Served(
            daemon, "web", put_http, lambda key: MODIFIED, lambda: sum(origin.gets.values())
        )
    if kind == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        client = client_for(endpoint)
        bucket = f"conditionals-{os.getpid()}-{len(os.listdir(tmp_path.parent))}"
        client.create_bucket(Bucket=bucket)
        daemon = start_daemon({"lake": f"s3://{bucket}"}, "--readahead", "0", env=env_for(endpoint))

        def put_s3(key: str, data: bytes) -> None:
            client.put_object(Bucket=bucket, Key=key, Body=data)

        def modified_s3(key: str) -> float:
            return float(client.head_object(Bucket=bucket, Key=key)["LastModified"].timestamp())

        return Served(daemon, "lake", put_s3, modified_s3)
    root = tmp_path / "files"
    root.mkdir()
    daemon = start_daemon({"files": f"file://{root}"}, "--readahead", "0")

    def put_file(key: str, data: bytes) -> None:
        (root / key).write_bytes(data)
        os.utime(root / key, (MODIFIED, MODIFIED))

    return Served(daemon, "files", put_file, lambda key: MODIFIED)


def _validators(served: Served, key: str) -> tuple[str, str]:
    """The ETag and Last-Modified a HEAD shows (a HEAD of a miss fetches nothing)."""
    head = curl(served.url(key), "-I")
    assert head.status == 200, head
    return head.headers["etag"], head.headers["last-modified"]


def _hit(served: Served, key: str) -> None:
    """Wait until `key` is committed: its fill's last reader may finish before the index."""
    wait_for("a hit", lambda: curl(served.url(key)).headers.get("x-shardcache") == "hit")


def test_if_range_with_another_etag_sends_the_whole_object(served: Served) -> None:
    data = os.urandom(300 * KiB)
    served.put("s.tar", data)
    stale = ("-H", "Range: bytes=0-99", "-H", 'If-Range: "deadbeef"')
    miss = curl(served.url("s.tar"), *stale)
    assert (miss.status, miss.headers["x-shardcache"]) == (200, "miss")
    assert miss.body == data and "content-range" not in miss.headers
    _hit(served, "s.tar")
    hit = curl(served.url("s.tar"), *stale)
    assert (hit.status, hit.headers["x-shardcache"], hit.body) == (200, "hit", data)
    etag, modified = _validators(served, "s.tar")
    for if_range in (etag, modified):  # the current ETag, or exactly Last-Modified
        fresh = curl(served.url("s.tar"), "-H", "Range: bytes=0-99", "-H", f"If-Range: {if_range}")
        assert (fresh.status, fresh.body) == (206, data[:100])
    weak = curl(served.url("s.tar"), "-H", "Range: bytes=0-99", "-H", f"If-Range: W/{etag}")
    assert (weak.status, weak.body) == (200, data)  # §13.1.5: weak tags never match
    dated = curl(served.url("s.tar"), "-H", "Range: bytes=0-99", "-H", f"If-Range: {LATER}")
    assert (dated.status, dated.body) == (200, data)
    head = curl(served.url("s.tar"), "-I", *stale)
    assert head.status == 200 and "content-range" not in head.headers


def test_if_none_match_current_etag_is_304_and_a_miss_fetches_nothing(served: Served) -> None:
    data = os.urandom(200 * KiB)
    served.put("s.tar", data)
    etag, modified = _validators(served, "s.tar")
    miss = curl(served.url("s.tar"), "-H", f"If-None-Match: {etag}")
    assert (miss.status, miss.body) == (304, b"")
    assert (miss.headers["etag"], miss.headers["last-modified"]) == (etag, modified)
    ranged = curl(served.url("s.tar"), "-H", f"If-None-Match: {etag}", "-H", "Range: bytes=5-9")
    assert (ranged.status, ranged.body) == (304, b"")
    assert served.gets() == 0, "a 304 for a miss started a GET"
    other = curl(served.url("s.tar"), "-H", 'If-None-Match: "other", W/"another"')
    assert (other.status, other.headers["x-shardcache"], other.body) == (200, "miss", data)
    _hit(served, "s.tar")
    hit = curl(served.url("s.tar"), "-H", f'If-None-Match: "x", {etag}')
    assert (hit.status, hit.headers["x-shardcache"], hit.body) == (304, "hit", b"")
    assert (hit.headers["etag"], hit.headers["last-modified"]) == (etag, modified)
    starred = curl(served.url("s.tar"), "-I", "-H", "If-None-Match: *")
    assert starred.status == 304
    ranged = curl(served.url("s.tar"), "-H", 'If-None-Match: "other"', "-H", "Range: bytes=5-9")
    assert (ranged.status, ranged.body) == (206, data[5:10])


def test_if_match_another_etag_is_412_and_a_miss_fetches_nothing(served: Served) -> None:
    data = os.urandom(200 * KiB)
    served.put("s.tar", data)
    miss = curl(served.url("s.tar"), "--no-fail", "-H", 'If-Match: "nope"')
    assert miss.status == 412
    assert "error" in json.loads(miss.body)
    assert curl(served.url("s.tar"), "-I", "-H", 'If-Match: "nope"').status == 412
    assert served.gets() == 0, "a 412 for a miss started a GET"
    etag, _ = _validators(served, "s.tar")
    matching = curl(served.url("s.tar"), "-H", f"If-Match: {etag}")
    assert (matching.status, matching.headers["x-shardcache"], matching.body) == (200, "miss", data)
    _hit(served, "s.tar")
    hit = curl(served.url("s.tar"), "--no-fail", "-H", 'If-Match: "nope"', "-H", "Range: bytes=0-9")
    assert (hit.status, hit.headers["x-shardcache"]) == (412, "hit")
    assert "error" in json.loads(hit.body)
    starred = curl(served.url("s.tar"), "-H", "If-Match: *", "-H", "Range: bytes=0-9")
    assert (starred.status, starred.body) == (206, data[:10])


def test_last_modified_and_the_date_preconditions(served: Served) -> None:
    data = os.urandom(100 * KiB)
    served.put("s.tar", data)
    _, modified = _validators(served, "s.tar")
    when = email.utils.parsedate_to_datetime(modified).timestamp()
    assert when == served.modified("s.tar")
    assert curl(served.url("s.tar"), "-H", f"If-Modified-Since: {modified}").status == 304
    assert curl(served.url("s.tar"), "-H", f"If-Unmodified-Since: {modified}", "-I").status == 200
    early = email.utils.formatdate(when - 1, usegmt=True)
    refused = curl(served.url("s.tar"), "--no-fail", "-H", f"If-Unmodified-Since: {early}")
    assert refused.status == 412
    assert served.gets() == 0, "a 304 or 412 for a miss started a GET"
    miss = curl(served.url("s.tar"), "-H", f"If-Modified-Since: {early}")
    assert (miss.status, miss.headers["x-shardcache"], miss.body) == (200, "miss", data)
    assert miss.headers["last-modified"] == modified
    _hit(served, "s.tar")
    hit = curl(
        served.url("s.tar"), "-H", f"If-Unmodified-Since: {modified}", "-H", "Range: bytes=1-2"
    )
    assert (hit.status, hit.headers["x-shardcache"], hit.body) == (206, "hit", data[1:3])
    assert hit.headers["last-modified"] == modified
    assert curl(served.url("s.tar"), "-H", f"If-Modified-Since: {modified}").status == 304
    refused = curl(
        served.url("s.tar"),
        "--no-fail",
        "-H",
        f"If-Unmodified-Since: {early}",
        "-H",
        "Range: bytes=1-2",
    )
    assert (refused.status, refused.headers["x-shardcache"]) == (412, "hit")
    # If-None-Match decides alone when present: If-Modified-Since is ignored (§13.2.2).
    both = curl(
        served.url("s.tar"), "-H", 'If-None-Match: "other"', "-H", f"If-Modified-Since: {modified}"
    )
    assert (both.status, both.body) == (200, data)


def test_aws_s3_cp_reads_through_the_daemon(start_daemon, tmp_path: Path) -> None:
    """`aws s3 cp` HEADs the object and needs its LastModified (else `fatal error:
    'LastModified'`); a file origin named like the bucket answers for it."""
    root = tmp_path / "files"
    root.mkdir()
    data = os.urandom(300 * KiB)
    (root / "s.tar").write_bytes(data)
    daemon = start_daemon({"bucket": f"file://{root}"}, "--readahead", "0")
    target = tmp_path / "copy.tar"
    env = {**os.environ, **env_for(daemon.url)}
    done = subprocess.run(
        ["aws", "s3", "cp", "--only-show-errors", "s3://bucket/s.tar", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == data


def test_an_origin_refusing_head_gets_its_conditionals_answered_from_the_get(
    origin: OriginServer, start_daemon
) -> None:
    """No validators before the GET (the HEAD is refused): the GET's own answer decides."""
    data = os.urandom(100 * KiB)
    origin.put("s.tar", data, head_status=405, last_modified=MODIFIED_TEXT)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    url = f"{daemon.url}/web/s.tar"
    answer = curl(url, "-H", f"If-None-Match: {origin.etags['s.tar']}")
    assert (answer.status, answer.body) == (304, b"")
    assert answer.headers["last-modified"] == MODIFIED_TEXT
    refused = curl(url, "--no-fail", "-H", 'If-Match: "nope"')
    assert refused.status == 412
    whole = curl(url, "-H", "Range: bytes=0-99", "-H", 'If-Range: "deadbeef"')
    assert (whole.status, whole.body) == (200, data)


def test_a_field_on_several_lines_is_one_list(origin: OriginServer, start_daemon) -> None:
    """RFC 9110 §5.3 and §5.6.1.2, as curl sends them: a list field's lines are one list
    (empty elements skipped); two If-Range lines are no validator, so the whole object."""
    data = os.urandom(100 * KiB)
    origin.put("s.tar", data, last_modified=MODIFIED_TEXT)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    url, etag = f"{daemon.url}/web/s.tar", origin.etags["s.tar"]
    for attempt in ("miss", "hit"):
        lines = curl(url, "-H", 'If-None-Match: "x"', "-H", f"If-None-Match: {etag}")
        assert (lines.status, lines.body) == (304, b""), attempt
        empty = curl(url, "-H", f"If-None-Match: , ,{etag}")
        assert (empty.status, empty.body) == (304, b""), attempt
        matching = curl(url, "-H", 'If-Match: "nope"', "-H", f"If-Match: {etag}", "-r", "0-9")
        assert (matching.status, matching.body) == (206, data[:10]), attempt
        for second in (etag, '"old"'):
            two = curl(url, "-r", "0-9", "-H", f"If-Range: {etag}", "-H", f"If-Range: {second}")
            assert (two.status, two.body) == (200, data), attempt
        if attempt == "miss":
            wait_for("a hit", lambda: curl(url).headers.get("x-shardcache") == "hit")


def test_a_hostile_precondition_is_answered_at_once(origin: OriginServer, start_daemon) -> None:
    """8,000 spaces between two letters in If-None-Match and If-Match (just under aiohttp's
    line limit): answered within 100 ms (best of 3) with the daemon's 412, not after seconds
    of parsing on the event loop (4.5 s, and /healthz 4.5 s behind it, before)."""
    origin.put("s.tar", os.urandom(10 * KiB))
    daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    value = "x" + " " * 8000 + "x"
    answers = [
        _timed_get(daemon.port, "/web/s.tar", {"If-None-Match": value, "If-Match": value})
        for _ in range(3)
    ]
    assert {status for status, _ in answers} == {412}
    best_s = min(took_s for _, took_s in answers)
    assert best_s < 0.1, f"best of 3: {best_s * 1000:.0f} ms"


def _timed_get(port: int, path: str, headers: dict[str, str]) -> tuple[int, float]:
    """One GET on a new connection: its status and how long the answer took."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        began = time.monotonic()
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - began
    finally:
        connection.close()
