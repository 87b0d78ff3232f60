"""The access line's byte count is the body's length: a miss, a hit (sendfile), a range, a HEAD,
a 304 (no body) and an error's JSON. It counted the status line and headers too (1,177,952 for
a 1,177,600-byte shard, 163 for a 304)."""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer

SIZE = 1_177_600
_LINE = re.compile(r"(GET|HEAD) (\S+) (\d{3}) (\S+) (\d+) [\d.]+ms")


def _logged(daemon: Daemon, count: int) -> list[tuple[str, str, int, str, int]]:
    """The access lines for /web/ paths, once `count` of them are written."""
    lines: list[tuple[str, str, int, str, int]] = []

    def found() -> bool:
        lines[:] = [
            (m[1], m[2], int(m[3]), m[4], int(m[5]))
            for m in _LINE.finditer(daemon.log())
            if m[2].startswith("/web/")
        ]
        return len(lines) >= count

    wait_for(f"{count} access lines", found)
    return lines


def test_the_logged_bytes_are_the_body_for_a_miss_a_hit_a_range_a_head_a_304_and_an_error(
    origin: OriginServer, start_daemon
) -> None:
    origin.put("s.tar", os.urandom(SIZE))
    daemon: Daemon = start_daemon({"web": origin.url})
    url = f"{daemon.url}/web/s.tar"
    miss, hit, ranged = curl(url), curl(url), curl(url, "-r", "100-1099")
    assert (miss.headers["x-shardcache"], len(miss.body)) == ("miss", SIZE)
    assert (hit.headers["x-shardcache"], len(hit.body)) == ("hit", SIZE)
    assert (ranged.status, len(ranged.body)) == (206, 1000)
    assert curl(url, "-I").status == 200
    not_modified = curl(url, "-H", f"If-None-Match: {hit.headers['etag']}")
    assert (not_modified.status, not_modified.body) == (304, b"")
    try:
        urllib.request.urlopen(f"{daemon.url}/web/missing.tar", timeout=30)
        raise AssertionError("a missing object answered 2xx")
    except urllib.error.HTTPError as exc:
        error_status, error_body = exc.code, exc.read()
    assert error_status == 404 and error_body.startswith(b"{")

    lines = _logged(daemon, 6)
    assert lines == [
        ("GET", "/web/s.tar", 200, "miss", SIZE),
        ("GET", "/web/s.tar", 200, "hit", SIZE),
        ("GET", "/web/s.tar", 206, "hit", 1000),
        ("HEAD", "/web/s.tar", 200, "hit", 0),
        ("GET", "/web/s.tar", 304, "hit", 0),
        ("GET", "/web/missing.tar", 404, "-", len(error_body)),
    ], lines
