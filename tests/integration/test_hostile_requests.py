"""Hostile requests against a running daemon (issue 10, bounded work per request): each is
answered with its 4xx quickly, without the memory or event-loop time it asks for, and the
daemon keeps serving. Each case failed on the code before (a 500, or a daemon killed by OOM)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.origin_server import OriginServer

BRACE_BOMBS = [
    "shards_{000000000..999999999}.tar",  # the range alone was 24 GB once expanded
    "{a,b}" * 21,  # 2 M names through nested products: 29 s on the loop
    "x{1..100000}{1..100000}",
    "{" * 20 + "a" + "}" * 20,  # nesting
    "a" * 5000,  # length
]


def _request(
    daemon: Daemon, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], dict[str, object]]:
    request = urllib.request.Request(daemon.url + path, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


def _rss_bytes(daemon: Daemon) -> int:
    for line in Path(f"/proc/{daemon.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def daemon(origin: OriginServer, start_daemon) -> Daemon:
    origin.put("s_000.tar", b"x" * 1000)
    return start_daemon({"web": origin.url}, "--readahead", "0")


@pytest.mark.parametrize(
    "pattern", BRACE_BOMBS, ids=["range", "products", "two-ranges", "nesting", "length"]
)
def test_brace_bombs_are_refused_at_once(daemon: Daemon, pattern: str) -> None:
    rss_before = _rss_bytes(daemon)
    body = json.dumps({"origin": "web", "keys": [pattern]}).encode()
    began = time.monotonic()
    status, _, answer = _request(daemon, "POST", "/_/prefetch", body)
    elapsed = time.monotonic() - began
    assert status == 400 and "error" in answer, (status, answer)
    assert elapsed < 0.5, f"{elapsed:.2f} s to refuse {pattern[:40]!r}"
    assert _rss_bytes(daemon) - rss_before < 50 << 20
    assert _request(daemon, "GET", "/healthz")[0] == 200


def test_the_prefetch_queue_is_bounded(daemon: Daemon) -> None:
    from shardcache.patterns import MAX_EXPANSION
    from shardcache.prefetch.queue import MAX_PENDING

    body = json.dumps({"origin": "web", "keys": [f"nope/{{1..{MAX_EXPANSION}}}.tar"]}).encode()
    answers = [_request(daemon, "POST", "/_/prefetch", body) for _ in range(3)]
    statuses = [status for status, _, _ in answers]
    assert statuses[:2] == [202, 202] and statuses[2] == 429, statuses
    assert answers[2][1].get("Retry-After") == "5"
    assert MAX_PENDING == 2 * MAX_EXPANSION
    status, _, answer = _request(daemon, "DELETE", "/_/prefetch")
    assert status == 200 and int(answer["dropped"]) > 0  # type: ignore[call-overload]
    assert _request(daemon, "GET", "/healthz")[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/_/prefetch", b"[" * 100_000 + b"]" * 100_000, 400),  # RecursionError
        ("POST", "/_/prefetch", b"{" + b" " * (5 << 20) + b"}", 413),
        ("POST", "/_/prefetch", b"not json", 400),
        ("GET", "/_/nothing-here", None, 404),
        ("PUT", "/web/s_000.tar", b"x", 405),
        ("PATCH", "/web/s_000.tar", b"x", 405),
        ("DELETE", "/web/s_000.tar", None, 405),
    ],
    ids=["deep-json", "huge-body", "not-json", "unknown-path", "put", "patch", "delete-shard"],
)
def test_bad_requests_get_a_json_4xx(
    daemon: Daemon, method: str, path: str, body: bytes | None, status: int
) -> None:
    got, _, answer = _request(daemon, method, path, body)
    assert got == status and "error" in answer, (got, answer)
    assert "Traceback" not in daemon.log() and "unhandled error" not in daemon.log()


def test_control_characters_in_a_path_cannot_forge_a_log_line(daemon: Daemon) -> None:
    status, _, _ = _request(daemon, "GET", "/web/a%0d%0aFAKE%20LINE%20200")
    assert status == 404
    lines = daemon.wait_for_log("a\\x0d\\x0aFAKE LINE 200").splitlines()
    assert not any(line.startswith("FAKE LINE") for line in lines), lines[-3:]


def test_permanent_origin_refusals_are_not_retried(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    origin.put("bad.tar", b"x" * 1000, status=400)
    root = tmp_path / "files"
    root.mkdir()
    daemon = start_daemon({"web": origin.url, "files": f"file://{root}"}, "--origin-retries", "3")
    began = time.monotonic()
    assert _request(daemon, "GET", "/web/bad.tar")[0] == 502
    assert origin.gets["bad.tar"] == 1  # a 400 is the origin's answer, not a blip
    status, _, answer = _request(daemon, "GET", "/files/" + "n" * 300 + ".tar")
    assert status == 404 and "name too long" in str(answer["error"]), answer
    assert time.monotonic() - began < 1.0  # no back-off (0.25 s, 0.5 s, 1 s) was waited


@pytest.mark.parametrize(
    "head",
    [
        b"GET /web/" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",
        b"GET /web/s_000.tar HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        b"GET /web/s_000.tar HTTP/1.1\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(200)),
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 100,  # TLS on the plain port
    ],
    ids=["9kb-url", "100kb-header", "200-headers", "tls-hello"],
)
def test_unparseable_requests_get_a_400_and_one_log_line(daemon: Daemon, head: bytes) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
        sock.sendall(head + b"\r\n")
        answer = sock.recv(65536)
    assert answer.split(b" ", 2)[1] == b"400", answer[:200]
    log = daemon.wait_for_log("unparseable request from 127.0.0.1 answered 400")
    assert "Traceback" not in log and "ERROR" not in log, log[-2000:]
    assert _request(daemon, "GET", "/healthz")[0] == 200
