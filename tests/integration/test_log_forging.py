"""Issue 23 item 9: text from clients and origins cannot forge or garble a log line.

The daemon runs at debug level (every log call site on) behind an admin token, with a file
origin and a raw-socket HTTP origin whose answers carry control characters (a status line, an
`X-Shardcache-Error` header). Every route is driven with keys, job names and headers full of
C0, DEL, C1 (U+0085), U+2028/U+2029 and CR LF; then the whole log file must hold no raw control
character besides the newline ending each record, every line must parse as a log record, and
the hostile text must be in the log (escaped), so the call sites were reached.
"""

from __future__ import annotations

import json
import re
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon

TOKEN = "forging-test-token-0123456789"
# ESC (a terminal sequence), BEL, DEL, NEL (U+0085), LINE/PARAGRAPH SEPARATOR, then CR LF and a
# line that would pass for a record of its own.
HOSTILE = "\x1b[2J\x07\x7f\x85\u2028\u2029\r\n2030-01-01 00:00:00,000 ERROR   shardcache: FORGED"
# aiohttp's routes match no CR or LF in a path (such a path is a 404 before any handler), so
# keys in paths carry the other characters.
PATH_HOSTILE = HOSTILE.replace("\r\n", "\t")
OBS_TEXT = "\x85\u2028\u2029 FORGED"  # what an HTTP parser lets through in a header value
FORGED = "FORGED"
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
TEXT_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: "
)


def _quoted(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class _RawHandler(socketserver.BaseRequestHandler):
    """Answers from an origin that puts control characters where http.client reads text."""

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            data += chunk
        path = data.split(b" ", 2)[1]
        hostile = PATH_HOSTILE.encode("utf-8")
        if b"/status" in path:  # a status line http.client cannot read: quoted in the error
            answer = b"HTTP/1.1 2" + hostile + b"\r\n\r\n"
        else:  # a 500 naming its kind, as a shardcache upstream does
            answer = (
                b"HTTP/1.1 500 Internal\r\nX-Shardcache-Error: "
                + hostile
                + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        self.request.sendall(answer)


@pytest.fixture
def raw_origin() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _RawHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _send(daemon: Daemon, head: str, body: bytes = b"") -> int:
    """Send one raw request (the path as given, percent-escapes and all); return its status."""
    request = head.encode("latin-1") + b"Connection: close\r\n"
    if body:
        request += b"Content-Length: %d\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(request + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def _drive_every_route(daemon: Daemon) -> None:
    key = _quoted(PATH_HOSTILE)
    auth = f"Authorization: Bearer {TOKEN}\r\n"
    get = "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    assert _send(daemon, get.format(f"/files/{key}")) == 404  # unauthenticated, missing
    assert _send(daemon, f"HEAD /files/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\n") == 404
    assert _send(daemon, get.format(f"/web/status/{key}")) == 502
    assert _send(daemon, get.format(f"/web/kind/{key}")) == 502
    assert _send(daemon, get.format(f"/{key}/{key}")) in (400, 404)
    assert _send(daemon, get.format(f"/files/a/..%2F{key}")) in (400, 404)
    assert _send(daemon, get.format(f"/_/{key}")) in (401, 404)
    assert _send(daemon, get.format(f"/_/{key}") + auth) == 404
    delete = f"DELETE /_/cache/files/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    assert _send(daemon, delete + auth) == 404
    # aiohttp refuses C0 and DEL in a header value (400), not obs-text: C1, U+2028, U+2029.
    for hostile in (PATH_HOSTILE, OBS_TEXT):
        value = hostile.encode("utf-8").decode("latin-1")
        for name in ("Range", "Authorization", "X-Shardcache-Tier-Request", "User-Agent"):
            status = _send(daemon, get.format("/files/x.tar") + f"{name}: {value}\r\n")
            assert status in (200, 400, 401, 416), (name, status)
    encoded = get.format("/_/prefetch").replace("GET", "POST") + auth
    value = OBS_TEXT.encode("utf-8").decode("latin-1")
    assert _send(daemon, encoded + f"Content-Encoding: {value}\r\n", b"{}") == 415
    urls = [f"/files/{HOSTILE}", f"/web/kind/{HOSTILE}", f"/web/status/{HOSTILE}"]
    posted = json.dumps({"urls": urls}).encode()
    assert _send(daemon, encoded, posted) == 202
    plan = json.dumps({"job": HOSTILE, "epoch": 0, "urls": urls}).encode()
    assert _send(daemon, encoded.replace("/_/prefetch", "/_/plan"), plan) in (200, 202, 400)
    assert _send(daemon, encoded, json.dumps({"urls": [HOSTILE]}).encode()) == 400
    deadline = time.monotonic() + 20
    while daemon.get_json("/_/prefetch")[1].get("failed", 0) < len(urls):
        assert time.monotonic() < deadline, daemon.get_json("/_/prefetch")
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"GET /files/\x1b\x85\xe2\x80\xa8 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.recv(65536)  # aiohttp refuses or answers it; either way one log line


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_hostile_text_from_clients_and_origins_is_escaped_in_every_log_line(
    start_daemon, raw_origin: str, tmp_path: Path, log_format: str
) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "x.tar").write_bytes(b"x" * 100)
    daemon = start_daemon(
        {"files": f"file://{root}", "web": raw_origin},
        "--admin-token",
        TOKEN,
        "--origin-retries",
        "0",
        "--readahead",
        "0",
        "--log-format",
        log_format,
        token=TOKEN,
    )
    _drive_every_route(daemon)
    assert daemon.stop() == 0
    raw = daemon.log_path.read_bytes()
    text = raw.decode("utf-8")  # strict: a record never carries undecodable bytes
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    bad = [(n, line) for n, line in enumerate(lines) if RAW_CONTROL.search(line)]
    assert bad == [], f"{len(bad)} lines with raw control characters: {bad[:5]}"
    if log_format == "json":
        unparsed = []
        for line in lines:
            try:
                json.loads(line)
            except ValueError:
                unparsed.append(line)
    else:
        unparsed = [line for line in lines if not TEXT_RECORD.match(line)]
    assert unparsed == [], f"lines that are no log record: {unparsed[:5]}"
    assert not [line for line in lines if line.startswith(("2030-", '{"time": "2030-'))]
    # The hostile text reached the log from the routes above (escaped, never as a line).
    assert text.count(FORGED) >= 8, text[-3000:]
