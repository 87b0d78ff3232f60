"""What an attack on the token, timeouts and bounds found (issue 10, second round), each
reproduced as the attacker did it. Each failed on the code before its fix."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import wait_for
from tests.origin_server import OriginServer

TOKEN = "a-token-for-the-neighbour-tests-0123"


def _raw(daemon: Daemon, request: bytes, timeout_s: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=timeout_s) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return answer


def _gzip_of_zeros(size_bytes: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(size_bytes >> 20)) + packer.flush()


def test_a_compressed_body_is_refused_without_inflating_it(
    origin: OriginServer, start_daemon
) -> None:
    """200 KB of gzip that inflates to 200 MB held the event loop for about a second."""
    daemon: Daemon = start_daemon({"web": origin.url})
    bomb = _gzip_of_zeros(200 << 20)
    slowest = [0.0]
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            began = time.monotonic()
            urllib.request.urlopen(daemon.url + "/healthz", timeout=10).close()
            slowest[0] = max(slowest[0], time.monotonic() - began)
            time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for path in ("/healthz", "/_/prefetch", "/web/x.tar"):
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Encoding: gzip\r\n"
                f"Content-Length: {len(bomb)}\r\nConnection: close\r\n\r\n"
            )
            answer = _raw(daemon, head.encode() + bomb)
            status = answer.split(b" ", 2)[1]
            assert status in (b"405", b"415"), answer[:200]  # never inflated, never a 5xx
    finally:
        stop.set()
        prober.join(30)
    assert slowest[0] < 0.25, f"/healthz took {slowest[0]:.2f} s during the bombs"
    prefetch = _raw(
        daemon,
        b"POST /_/prefetch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 20\r\nConnection: close\r\n\r\n" + bomb[:20],
    )
    assert prefetch.startswith(b"HTTP/1.1 415") and b'"error"' in prefetch


def test_origin_credentials_and_locations_stay_out_of_error_answers(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    root = tmp_path / "secret-root-path"
    root.mkdir()
    credentialed = origin.url.replace("http://", "http://alice:hunter2secret@") + "/pre"
    daemon: Daemon = start_daemon(
        {"cred": credentialed, "files": f"file://{root}"},
        listen_host="0.0.0.0",
        env={"SHARDCACHE_ADMIN_TOKEN": TOKEN},
        token=TOKEN,
    )

    def error_of(path: str, token: str | None = None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(daemon.url + path, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        with caught.value as answer:
            return answer.code, json.loads(answer.read())["error"]

    for path in ("/cred/missing.tar", "/files/missing.tar"):
        status, message = error_of(path)
        assert status == 404 and "not found at the origin" in message, message
        assert "hunter2secret" not in message and "alice" not in message
        assert str(root) not in message and "/pre/" not in message
        # With the token the details come back, credentials still masked.
        status, message = error_of(path, TOKEN)
        assert status == 404 and "hunter2secret" not in message
    assert "alice:***@" in error_of("/cred/missing.tar", TOKEN)[1]
    prefetch = urllib.request.Request(
        daemon.url + "/_/prefetch",
        data=json.dumps({"origin": "cred", "keys": ["missing.tar"]}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    urllib.request.urlopen(prefetch, timeout=10).close()
    wait_for("the prefetch's failure", lambda: daemon.get_json("/_/prefetch")[1]["failed"] == 1)
    for document in ("/_/prefetch", "/_/status"):
        text = json.dumps(daemon.get_json(document)[1])
        assert "hunter2secret" not in text, text
    assert "hunter2secret" not in daemon.log()


def test_a_malformed_authorization_line_does_not_log_the_token(
    origin: OriginServer, start_daemon
) -> None:
    daemon: Daemon = start_daemon({"web": origin.url}, env={"SHARDCACHE_ADMIN_TOKEN": TOKEN})
    for line in (
        f"Authorization: Bearer {TOKEN}\n",  # a bare LF
        f"Authorization: Bearer {TOKEN}\x0b\r\n",  # a control character
        f"Authorization : Bearer {TOKEN}\r\n",  # a space before the colon
    ):
        request = f"GET /_/status HTTP/1.1\r\nHost: 127.0.0.1\r\n{line}Connection: close\r\n\r\n"
        assert _raw(daemon, request.encode()).split(b" ", 2)[1] == b"400"
    log = daemon.wait_for_log("unparseable request")
    assert TOKEN not in log and TOKEN[:12] not in log


def test_clients_that_leave_before_the_headers_leave_no_traceback(
    origin: OriginServer, start_daemon
) -> None:
    origin.put("s.tar", bytes(8 << 20))
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    urllib.request.urlopen(daemon.url + "/web/s.tar", timeout=30).close()
    for _ in range(30):
        with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
            sock.sendall(b"GET /web/s.tar HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    wait_for("the 499s logged", lambda: daemon.log().count("GET /web/s.tar 499") >= 20)
    log = daemon.log()
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]
    assert log.count("GET /web/s.tar 499") >= 20


def test_expanded_names_are_bounded_in_bytes_too(origin: OriginServer, start_daemon) -> None:
    """100,000 names of 4,000 characters: 400 MB of strings before the key-length check."""
    daemon: Daemon = start_daemon({"web": origin.url})
    for keys in (["a" * 4070 + "{00000..99999}"], ["x{0..99999999999999999999999}"]):
        body = json.dumps({"origin": "web", "keys": keys}).encode()
        request = urllib.request.Request(daemon.url + "/_/prefetch", data=body)
        began = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        caught.value.close()
        assert caught.value.code == 400 and time.monotonic() - began < 0.5
    assert "Traceback" not in daemon.log()
