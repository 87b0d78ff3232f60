"""Origins that answer in ways the fill must not trust (found by attacking issue 9's fixes):
each test fails on the code before its fix."""

from __future__ import annotations

import hashlib
import os
import socket
import threading

import pytest

from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer

MiB = 1024 * 1024


def test_a_chunked_206_longer_than_its_range_is_refused_when_streamed_through(
    origin: OriginServer, start_daemon
) -> None:
    """A 6 MiB object behind a 4 MiB cache (streamed through), no checksum published, and a
    chunked 206 that runs 1 MiB past its Content-Range: never a success."""
    data = os.urandom(6 * MiB)
    origin.put("big.tar", data, overlong=MiB, no_md5=True)
    daemon = start_daemon({"web": origin.url}, "--origin-retries", "1", cache_size="4MiB")

    result = curl(f"{daemon.url}/web/big.tar")

    assert result.exit_code != 0, "the overlong body must fail the transfer"
    assert "longer than announced" in daemon.log()
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("last_modified", [None, "Sat, 21 Nov 2026 00:00:00 GMT"])
def test_an_object_without_an_etag_is_never_spliced(
    origin: OriginServer, start_daemon, last_modified: str | None
) -> None:
    """No ETag, no checksum, at most a Last-Modified that the rewrite keeps (same second, or
    a copy that keeps mtimes); the object is replaced during the fill."""
    old, new = os.urandom(5 * MiB), os.urandom(5 * MiB)
    release = threading.Event()
    origin.put("s.tar", old, no_etag=True, no_md5=True, hold=release, last_modified=last_modified)
    daemon = start_daemon({"web": origin.url}, "--segment-size", "1MiB")
    results = []
    reader = threading.Thread(target=lambda: results.append(curl(f"{daemon.url}/web/s.tar")))
    reader.start()
    wait_for("the fill's first GET", lambda: origin.gets["s.tar"])
    origin.objects["s.tar"] = new  # the next request (a later segment) sees the new version
    origin.behaviour["s.tar"].hold = None
    release.set()
    reader.join(60)

    (result,) = results
    assert result.exit_code != 0 or result.sha256 in (sha256(old), sha256(new))
    again = curl(f"{daemon.url}/web/s.tar")
    assert again.sha256 in (sha256(old), sha256(new))


def test_an_empty_object_is_served_and_cached(origin: OriginServer, start_daemon) -> None:
    """The first request is `Range: bytes=0-…`, which an empty object answers with 416."""
    origin.put("empty.tar", b"")
    daemon = start_daemon({"web": origin.url})

    miss = curl(f"{daemon.url}/web/empty.tar")
    hit = curl(f"{daemon.url}/web/empty.tar")

    assert (miss.exit_code, miss.status, miss.body) == (0, 200, b"")
    assert (hit.status, hit.headers["x-shardcache"], hit.body) == (200, "hit", b"")


def test_a_client_that_leaves_during_a_miss_is_no_error(origin: OriginServer, start_daemon) -> None:
    """`curl … | tar t | head`: the reader goes away mid-body; the fill stops (nobody wants
    it, issue 23 item 4), the next read fetches it again; no traceback."""
    data = os.urandom(4 * MiB)
    origin.put("s.tar", data, chunk_delay_s=0.05, chunk_bytes=64 * 1024)
    daemon = start_daemon({"web": origin.url})

    for _ in range(3):
        with socket.create_connection(("127.0.0.1", daemon.port)) as client:
            client.sendall(b"GET /web/s.tar HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert client.recv(65536)  # headers and some body, then gone
    reads = []

    def a_hit() -> bool:
        reads.append(curl(f"{daemon.url}/web/s.tar"))
        return reads[-1].headers.get("x-shardcache") == "hit"

    wait_for("a read that hits", a_hit)
    assert reads[-1].sha256 == sha256(data)
    log = daemon.log()
    assert "Traceback" not in log and "unhandled error" not in log and '" 500 ' not in log


def test_an_empty_object_that_fails_verification_is_an_error_not_a_200(
    origin: OriginServer, start_daemon, tmp_path
) -> None:
    """An empty response has no last byte to hold back: the verdict comes before headers,
    cached (a fill) or streamed through (a cache too small for even the index)."""
    origin.put("empty.tar", b"", content_md5=hashlib.md5(b"not empty").digest())
    for cache_size in ("1GiB", "1"):
        daemon = start_daemon(
            {"web": origin.url}, cache_dir=tmp_path / cache_size, cache_size=cache_size
        )
        result = curl(f"{daemon.url}/web/empty.tar")
        assert result.exit_code != 0 and result.status == 502, (cache_size, result.status)
        assert "Traceback" not in daemon.log()
