"""The command line against a misbehaving daemon and hostile files: whatever a daemon answers
(not HTTP, not JSON, too deep, too large, too slow, the wrong shape, a cursor that never
advances) and whatever `--config` names (a FIFO, a device, binary, nested 100,000 deep),
`ls`, `purge`, `stats` and the others print ONE line on stderr and exit 2, never a
traceback, in bounded time and memory; what daemons say is shown with its control characters
escaped.

The daemon here is a raw socket server in a thread (`HostileDaemon`), sending exactly the
bytes each case scripts: the real daemon never answers like this, so a real one cannot stand
in. The commands mostly run in this process (`cli.main`: an exception escaping it fails the
test as a traceback would), through real sockets; the memory bound and `serve` run as
processes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from shardcache import cli
from shardcache.loader import client
from shardcache.observability.status import Snapshot, build_status
from tests.integration.helpers import run_cli

Answer = Callable[[str], Iterable[bytes]]  # request target → the bytes sent back


class HostileDaemon:
    """A loopback server that answers each request with what `answer(target)` yields, then
    closes the connection; `requests` counts the requests it read."""

    def __init__(self) -> None:
        self.answer: Answer = lambda target: [b"HTTP/1.1 204 No Content\r\n\r\n"]
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed at the end of the test
                return
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(10)
            request = b""
            try:
                while b"\r\n\r\n" not in request:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    request += chunk
                self.requests += 1
                target = request.split(b" ", 2)[1].decode()
                for part in self.answer(target):
                    connection.sendall(part)
            except OSError:  # the command gave up on us: what the case wanted
                return


@pytest.fixture
def daemon() -> Iterator[HostileDaemon]:
    server = HostileDaemon()
    yield server
    server.close()


def _ok(body: bytes) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body), body]


def _json(document: object) -> list[bytes]:
    return _ok(json.dumps(document).encode())


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the command in this process: (exit status, stdout, stderr)."""
    try:
        status = cli.main(list(args))
    except SystemExit as exit_:  # argparse's errors
        status = int(exit_.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _assert_one_line_exit_2(status: int, err: str, needle: str = "") -> None:
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("shardcache"), err
    assert needle in err, err
    assert "\x1b" not in err and "Traceback" not in err


COMMANDS = [["ls"], ["purge", "x", "*"], ["purge", "x", "*", "--dry-run"], ["stats"]]
WRONG_SHAPE = {  # each command finds a field it reads missing or of the wrong type
    "origins": {"x": "file:///x"},
    "entries": [{"key": 1}],
    "next": None,
    "deleted": 5,
    "deleted_bytes": "x",
}
GARBAGE: dict[str, tuple[list[bytes], str]] = {
    "invalid JSON": (_ok(b"{not json"), "does not understand: JSONDecodeError"),
    "not UTF-8": (_ok(b'{"a":"\xff\xfe"}'), "does not understand: UnicodeDecodeError"),
    "nested 100,000 deep": (_ok(b"[" * 100_000), "does not understand: nested too deep"),
    "a JSON list": (_ok(b"[1, 2, 3]"), "expected a JSON object, got list"),
    "the wrong shape": (_json(WRONG_SHAPE), "does not understand"),
    "a garbage status line": ([b"GARBAGE\r\n\r\n"], "not HTTP (BadStatusLine"),
    "a header line over 64 KiB": (
        [b"HTTP/1.1 200 OK\r\nX: " + b"a" * 100_000 + b"\r\n\r\n"],
        "not HTTP (LineTooLong",
    ),
    "200 headers": (
        [b"HTTP/1.1 200 OK\r\n" + b"X: a\r\n" * 200 + b"\r\n"],
        "got more than 100 headers",
    ),
    "a short body": (
        [b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a"'],
        "it ended after 4 of 100 bytes",
    ),
    "a redirect": (
        [b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/\r\nContent-Length: 0\r\n\r\n"],
        "302 Found",
    ),
}
_ERROR = json.dumps({"error": "\x1b]0;pwned\x07\x1b[2J\rFAKE"}).encode()
GARBAGE["an error with escapes"] = (
    [b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(_ERROR), _ERROR],
    "500 \\x1b]0;pwned\\x07\\x1b[2J\\x0dFAKE",
)


@pytest.mark.parametrize("case", list(GARBAGE))
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_daemon_answering_garbage_is_one_line_and_exit_2(
    daemon: HostileDaemon, capsys: pytest.CaptureFixture[str], command: list[str], case: str
) -> None:
    answer, needle = GARBAGE[case]
    daemon.answer = lambda target: answer
    status, out, err = _main(capsys, *command, "--daemon", daemon.url)
    _assert_one_line_exit_2(status, err, needle)
    assert "\x1b" not in out


def test_an_answer_over_32_mib_is_refused_in_bounded_memory(daemon: HostileDaemon) -> None:
    """384 MiB without a Content-Length (the client reads 32 MiB, then stops), and a
    Content-Length of 3 GiB (refused before reading), to a command limited to 320 MiB of
    address space (`ulimit -v`): reading the whole answer would need twice 384 MiB."""
    chunk = b"A" * (1 << 20)

    def endless(target: str) -> Iterator[bytes]:
        yield b'HTTP/1.1 200 OK\r\n\r\n{"origins": {"x": "'
        for _ in range(384):
            yield chunk

    for answer, needle in (
        (endless, "an answer over 32 MiB"),
        (lambda t: [b"HTTP/1.1 200 OK\r\nContent-Length: 3221225472\r\n\r\n"], "3221225472"),
    ):
        daemon.answer = answer
        limited = 'ulimit -v 327680 && exec "$@"'
        command = ["bash", "-c", limited, "-", sys.executable, "-m", "shardcache", "stats"]
        result = subprocess.run(
            [*command, "--daemon", daemon.url], capture_output=True, text=True, timeout=60
        )
        _assert_one_line_exit_2(result.returncode, result.stderr, needle)


@pytest.mark.parametrize("where", ["status line", "body"])
def test_a_daemon_sending_a_byte_at_a_time_is_cut_off_at_the_deadline(
    daemon: HostileDaemon,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """Each byte comes well within the per-read timeout; the request's deadline (30 s, 1 s
    here) ends it all the same."""
    monkeypatch.setattr(client, "DEADLINE_S", 1.0)

    def drip(target: str) -> Iterator[bytes]:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n"
        if where == "body":
            yield head
            head = b" " * 40
        for byte in head:
            yield bytes([byte])
            time.sleep(0.2)

    daemon.answer = drip
    started = time.monotonic()
    status, _, err = _main(capsys, "stats", "--daemon", daemon.url)
    _assert_one_line_exit_2(status, err, "did not answer in 1 s")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("command", COMMANDS[:3], ids=" ".join)
@pytest.mark.parametrize("cursors", [["same"], ["b", "a"]], ids=["repeated", "backwards"])
def test_a_next_cursor_that_does_not_advance_stops_ls_and_purge(
    daemon: HostileDaemon,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    cursors: list[str],
) -> None:
    """A daemon that pages forever: before the check, the command never ended (after 50
    pages, this one gives in, so a command without the check exits 0 and fails the test)."""

    def answer(target: str) -> list[bytes]:
        if target.startswith("/_/origins"):
            return _json({"origins": {"x": "file:///x"}})
        pages = daemon.requests
        cursor = None if pages > 50 else cursors[min(pages, len(cursors)) - 1]
        return _json({"entries": [], "deleted": [], "deleted_bytes": 0, "next": cursor})

    daemon.answer = answer
    status, _, err = _main(capsys, *command, "--daemon", daemon.url)
    _assert_one_line_exit_2(status, err, "a `next` cursor that does not advance")


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\rFAKE\u202e"


def test_keys_names_and_errors_from_a_daemon_are_escaped(
    daemon: HostileDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = {
        "key": f"a{ESCAPES}.tar",
        "size_bytes": 1,
        "age_s": 1,
        "read_at": time.time(),
        "verified_by": [f"sha256{ESCAPES}"],
        "pinned_by": [],
    }
    status_document = build_status(
        version="x",
        uptime_s=1,
        listen="127.0.0.1:1",
        snapshot=Snapshot(),
        cache={"size_bytes": 1, "capacity_bytes": 2, "entries": 1},
        prefetch=dict.fromkeys(
            ("pending", "in_flight", "fetched", "done", "failed", "unread_bytes"), 0
        ),
        origins={f"x{ESCAPES}": "file:///x"},
        upstreams={
            f"x{ESCAPES}": [
                {
                    "role": "member",
                    "url": f"http://m{ESCAPES}",
                    "state": "down",
                    "failures": 3,
                    "last_error": f"refused{ESCAPES}\nFORGED LINE",
                }
            ]
        },
    )

    def answer(target: str) -> list[bytes]:
        if target.startswith("/_/origins"):
            return _json({"origins": {f"x{ESCAPES}": "file:///x"}})
        if target.startswith("/_/status"):
            return _json(status_document)
        return _json({"entries": [entry], "next": None})

    daemon.answer = answer
    for command in (["ls"], ["purge", "x", "*", "--dry-run"], ["stats"]):
        status, out, err = _main(capsys, *command, "--daemon", daemon.url)
        assert status == 0, err
        for text in (out, err):
            assert not any(c in text for c in "\x1b\x07\r\u202e"), repr(text)
        assert "\\x1b]0;pwned\\x07\\x1b[2J\\x0dFAKE\\u202e" in out, out
        assert "FORGED LINE" not in out.splitlines()  # the newline in last_error escaped too


@pytest.mark.parametrize("watch", ["-1", "0", "nan", "inf", "1e9", "soon"])
def test_stats_watch_takes_only_a_sane_interval(
    capsys: pytest.CaptureFixture[str], watch: str
) -> None:
    status, _, err = _main(capsys, "stats", "--watch", watch, "--daemon", "http://127.0.0.1:9")
    _assert_one_line_exit_2(status, err, "--watch: expected seconds above 0")


def _hostile_configs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Name → (path, what the line says about it)."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    (tmp_path / "binary.toml").write_bytes(b"listen = '\xff\xfe'\n")
    (tmp_path / "deep.toml").write_text("a = " + "[" * 100_000)
    (tmp_path / "large.toml").write_text("# padding\n" * 120_000)
    return {
        "a FIFO": (str(fifo), "is not a regular file"),
        "/dev/zero": ("/dev/zero", "is not a regular file"),
        "a directory": (str(tmp_path), "is not a regular file"),
        "not UTF-8": (str(tmp_path / "binary.toml"), "is not UTF-8 text"),
        "nested 100,000 deep": (str(tmp_path / "deep.toml"), "nested too deep"),
        "over 1 MiB": (str(tmp_path / "large.toml"), "is larger than 1 MiB"),
    }


@pytest.mark.parametrize(
    "command",
    [["check"], ["url", "/x/a.tar"], ["ls"], ["stats"], ["purge", "x", "*"]],
    ids=" ".join,
)
def test_a_hostile_config_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    for path, needle in _hostile_configs(tmp_path).values():
        status, _, err = _main(capsys, *command, "--config", path)
        _assert_one_line_exit_2(status, err, path)
        assert needle in err, err


def test_serve_with_a_hostile_config_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for path, needle in _hostile_configs(tmp_path).values():
        result = run_cli("serve", "--cache-dir", str(tmp_path / "c"), "--config", path, timeout=20)
        _assert_one_line_exit_2(result.returncode, result.stderr, needle)


VERIFY_GARBAGE = {  # what a daemon may answer to the live verify's POST and its polls
    "fields missing": {"verify": {"is_finished": True, "checked_bytes": 0}},
    "problems of the wrong shape": {
        "verify": {
            "is_finished": True,
            "checked_bytes": 0,
            "entries": 1,
            "digest_checked": 0,
            "length_only": 0,
            "damaged": 1,
            "problems": ["x"],
        }
    },
    "an error with escapes": {"verify": {"is_finished": True, "error": "\x1b]0;pwned\x07"}},
}


@pytest.mark.parametrize("answer", VERIFY_GARBAGE, ids=list(VERIFY_GARBAGE))
def test_verify_through_a_daemon_answering_garbage_is_one_line_and_exit_2(
    answer: str,
    daemon: HostileDaemon,
    start_daemon: Callable[..., object],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verify` of a cache a daemon holds asks that daemon; fields it read after its checks
    (damaged, entries, problems) were a KeyError/TypeError traceback, and an error's text
    reached the terminal raw (the re-attack)."""
    (tmp_path / "files").mkdir()
    real = start_daemon({"f": (tmp_path / "files").as_uri()})  # holds the cache's lock
    cache_dir = str(real.cache_dir)  # type: ignore[attr-defined]
    status = {"cache": {"dir": cache_dir}}
    daemon.answer = lambda target: _json(
        status if target.startswith("/_/status") else VERIFY_GARBAGE[answer]
    )
    code, _, err = _main(capsys, "verify", "--cache-dir", cache_dir, "--daemon", daemon.url)
    _assert_one_line_exit_2(code, err)


def test_a_size_too_large_to_hold_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A size of 400 digits made `int(float(...))` raise OverflowError: a traceback."""
    config = tmp_path / "huge.toml"
    config.write_text(f'cache_size = "{"9" * 400}TiB"\n')
    done = run_cli("serve", "--config", str(config), timeout=30)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "too large" in done.stderr, done.stderr
