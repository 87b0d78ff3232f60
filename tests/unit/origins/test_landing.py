"""A body landed by `origins.landing.Body` the way a receiving process lands it, over a real
TCP connection from a raw server thread: spliced (a plain socket) or copied (a file that
refuses splicing, a body with bytes to skip), the file and the CRC-32C come out exact, a pause
is reported at once, and an early end, a silence or an over-long body fail the landing."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shardcache.checksums import crc32c
from shardcache.crc_spans import BLOCK_BYTES, Span
from shardcache.errors import OriginTimeout, OriginTooSlow, OriginUnavailable
from shardcache.origins import landing, pool, splice
from shardcache.origins.landing import Body
from shardcache.origins.pool import Connections, Exchange
from shardcache.origins.threads import Abort

Send = Callable[[socket.socket], None]


@contextmanager
def _exchange(send: Send) -> Iterator[Exchange]:
    """An answer's exchange over a real connection whose server thread runs `send` after the
    request."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)  # the request
            send(conn)
            done.wait(10)  # open until the test is done with it

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/o")
    response = connection.getresponse()
    assert connection.sock is not None
    sock: socket.socket = connection.sock
    connections = Connections(ssl.create_default_context(), 5.0)
    exchange = Exchange(
        connections, ("http", "127.0.0.1", port), connection, response, sock, Abort(), "o"
    )
    try:
        yield exchange
    finally:
        exchange.finish(complete=False)
        done.set()
        connections.close()
        thread.join(5)
        server.close()


@contextmanager
def _body(send: Send, skip: int = 0) -> Iterator[Body]:
    """The body of the answer `send` gives, as long as its Content-Length says."""
    with _exchange(send) as exchange:
        yield Body(exchange, skip, int(exchange.headers["Content-Length"]), 5.0)


def _head(length: int) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n".encode()


def _land(
    body: Body, fd: int, size: int, read_s: float = 5.0
) -> tuple[int, list[tuple[int, float]]]:
    """Land `size` bytes at 0; the final CRC and each report (bytes, when). Checks the spans
    reported: they tile what landed, cut at each block boundary, none past what its report
    counted, each the CRC-32C of the file's bytes there."""
    reports: list[tuple[int, float]] = []
    crcs = [0]
    spans: list[Span] = []

    def progress(count: int, crc: int, new_spans: list[Span]) -> None:
        reports.append((count, time.monotonic()))
        crcs.append(crc)
        landed = sum(count for count, _ in reports)
        assert all(offset + length <= landed for offset, length, _ in new_spans)
        spans.extend(new_spans)

    body.land(fd, 0, size, 0, read_s, 0.0, progress)
    ends = [offset + length for offset, length, _ in spans]
    assert [offset for offset, _, _ in spans] == [0, *ends[:-1]] and ends[-1:] == [size]
    assert all(end % BLOCK_BYTES == 0 for end in ends[:-1])
    for offset, length, crc in spans:
        assert crc == crc32c(os.pread(fd, length, offset))
    return crcs[-1], reports


def _open(path: Path, extra: int = 0) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | extra, 0o644)


@pytest.mark.parametrize("size", [1, 700_000, 5 << 20])
def test_a_plain_body_is_spliced_into_the_file_exact_with_its_crc(
    tmp_path: Path, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = os.urandom(size)
    moved: list[int] = []
    real_fill = splice.SplicePipe.fill

    def counted_fill(
        pipe: splice.SplicePipe, most: int, first_wait_s: float, gather_s: float
    ) -> tuple[int, bool]:
        result = real_fill(pipe, most, first_wait_s, gather_s)
        moved.append(result[0])
        return result

    monkeypatch.setattr(splice.SplicePipe, "fill", counted_fill)  # counts, changes nothing
    fd = _open(tmp_path / "f")
    try:
        with _body(lambda c: c.sendall(_head(size) + payload)) as body:
            crc, reports = _land(body, fd, size)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == payload
    assert crc == crc32c(payload)
    assert sum(count for count, _ in reports) == size
    # All but what came with the headers went through the pipe.
    assert size - sum(moved) <= 65536 and (size < 65536 or sum(moved) > 0)


def test_a_file_that_refuses_splicing_is_written_by_copying(tmp_path: Path) -> None:
    """A file opened for appending refuses splice(2) (EINVAL): what the pipe holds is copied
    out, and the rest of the body lands by recv and pwrite, exact."""
    size = 3 << 20
    payload = os.urandom(size)
    fd = _open(tmp_path / "f", os.O_APPEND)
    try:
        with _body(lambda c: c.sendall(_head(size) + payload)) as body:
            crc, _ = _land(body, fd, size)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == payload
    assert crc == crc32c(payload)


def test_a_body_with_bytes_to_skip_drops_them_and_lands_the_rest(tmp_path: Path) -> None:
    """A 200 to a Range request: the first `skip` bytes are not the segment's."""
    payload = os.urandom(2 << 20)
    skip = 300_000
    fd = _open(tmp_path / "f")
    try:
        with _body(lambda c: c.sendall(_head(len(payload)) + payload), skip=skip) as body:
            crc, _ = _land(body, fd, len(payload) - skip)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == payload[skip:]
    assert crc == crc32c(payload[skip:])


def test_a_pause_is_reported_at_once_not_after_a_full_report(tmp_path: Path) -> None:
    """Three pieces 0.3 s apart: each is reported in full as it lands, before the next one is
    sent (a reader streams it), not held until REPORT_BYTES came. A piece may come in two
    segments and be reported in two parts."""
    piece = 100_000
    assert piece * 3 < landing.REPORT_BYTES
    sent_at: list[float] = []

    def send(conn: socket.socket) -> None:
        conn.sendall(_head(piece * 3))
        for _ in range(3):
            time.sleep(0.3)
            sent_at.append(time.monotonic())
            conn.sendall(b"p" * piece)

    fd = _open(tmp_path / "f")
    try:
        with _body(send) as body:
            _, reports = _land(body, fd, piece * 3)
    finally:
        os.close(fd)
    landed, reported_at = 0, {}
    for count, when in reports:
        landed += count
        reported_at[landed] = when
    assert landed == piece * 3
    assert {piece, 2 * piece, 3 * piece} <= reported_at.keys(), reports  # each piece whole
    assert reported_at[piece] < sent_at[1] and reported_at[2 * piece] < sent_at[2]


def test_a_body_that_ends_early_fails_and_lands_nothing_past_what_came(tmp_path: Path) -> None:
    def send(conn: socket.socket) -> None:
        conn.sendall(_head(1_000_000) + b"x" * 400_000)
        conn.shutdown(socket.SHUT_WR)

    fd = _open(tmp_path / "f")
    try:
        with _body(send) as body, pytest.raises(OriginUnavailable, match="short"):
            _land(body, fd, 1_000_000)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"x" * 400_000


def test_a_silent_origin_times_out_at_the_read_timeout(tmp_path: Path) -> None:
    def send(conn: socket.socket) -> None:
        conn.sendall(_head(1_000_000) + b"x" * 1000)
        time.sleep(1.5)

    fd = _open(tmp_path / "f")
    try:
        with _body(send) as body:
            started = time.monotonic()
            with pytest.raises(OriginTimeout, match="no byte for 0.5s"):
                _land(body, fd, 1_000_000, read_s=0.5)
            waited = time.monotonic() - started
    finally:
        os.close(fd)
    assert 0.4 < waited < 1.4


def test_a_body_longer_than_announced_never_gives_its_connection_back(tmp_path: Path) -> None:
    """The server says 1000 bytes and sends 1500: the announced bytes land, and the extra
    ones close the connection instead of reaching the next request sent on it."""

    def send(conn: socket.socket) -> None:
        conn.sendall(_head(1000))
        time.sleep(0.1)  # past what comes with the headers: these bytes are spliced
        conn.sendall(b"y" * 1500)

    fd = _open(tmp_path / "f")
    try:
        with _exchange(send) as exchange:
            Body(exchange, 0, 1000, 5.0).land(fd, 0, 1000, 0, 5.0, 0.0, lambda n, c, s: None)
            exchange.finish(complete=True)  # the stray bytes show here, or at `take`:
            time.sleep(pool.QUIET_S + 0.1)  # a connection is reused once quiet
            connection, reused = exchange.pool.take(exchange.site)
            connection.close()
            assert not reused  # a new connection: the one with 500 stray bytes was closed
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"y" * 1000


def test_a_well_formed_body_gives_its_connection_back(tmp_path: Path) -> None:
    """The control for the test above: exactly the announced bytes, and the connection is
    reused."""

    def send(conn: socket.socket) -> None:
        conn.sendall(_head(1000))
        time.sleep(0.1)
        conn.sendall(b"y" * 1000)

    fd = _open(tmp_path / "f")
    try:
        with _exchange(send) as exchange:
            Body(exchange, 0, 1000, 5.0).land(fd, 0, 1000, 0, 5.0, 0.0, lambda n, c, s: None)
            exchange.finish(complete=True)
            time.sleep(pool.QUIET_S + 0.1)  # a connection given back is reused once quiet
            connection, reused = exchange.pool.take(exchange.site)
            connection.close()
            assert reused
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", ["spliced", "copied", "spliced, the pipe full"])
def test_a_drip_faster_than_the_gather_window_is_judged_and_reported_while_it_drips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Found by attacking the splice landing: one byte every 20 ms, each within the gather
    window of the one before, under a floor of 1,000 bytes/s over a 0.5 s read timeout.
    The gather must end on its own clock, and landed bytes be reported on one: the gather
    went on while bytes kept coming, so the landing reported nothing and judged the floor
    only once its buffer was full (a byte every 1.9 ms held a fill and its readers for 17
    minutes), and a pipe whose slots filled first (many small packets) returned "not
    paused", so its bytes waited for a report until a whole REPORT_BYTES had come.

    The window is widened to 200 ms (the scheduler's jitter, not the drip, would end a 2 ms
    one here) and the drip slowed to match; "the pipe full" shrinks the landing's pipe to
    two slots, which two drips fill."""
    monkeypatch.setattr(landing, "GATHER_S", 0.2)
    if path == "spliced, the pipe full":
        monkeypatch.setattr(landing, "LAND_BYTES", 8192)
    drips = 300  # 4 s of drip or more

    def send(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(_head(drips))
        time.sleep(0.1)  # past what comes with the headers
        for _ in range(drips):
            try:
                conn.sendall(b"d")
            except OSError:
                return  # the landing gave up: the client closed
            time.sleep(0.02)

    # An O_APPEND file refuses splicing: the copying path (TLS, a body with bytes to skip).
    fd = _open(tmp_path / "f", os.O_APPEND if path == "copied" else 0)
    reports: list[float] = []
    try:
        with _body(send) as body:
            started = time.monotonic()
            with pytest.raises(OriginTooSlow, match="under the floor"):
                body.land(
                    fd, 0, drips, 0, 0.5, 1000.0, lambda n, c, s: reports.append(time.monotonic())
                )
            waited = time.monotonic() - started
    finally:
        os.close(fd)
    assert waited < 1.5, f"judged after {waited:.1f} s, at the drip's end"
    assert len(reports) >= 3, f"{len(reports)} reports while it dripped"


def test_a_pipe_the_kernel_kept_small_is_not_spliced_through() -> None:
    """Past a non-root user's pipe-user-pages-soft a new pipe holds a page or two; the pipe
    reads its real size back and refuses, so the landing copies instead of splicing a page
    per round (root is exempt from the limit, so the small pipe is asked for here)."""
    left, right = socket.socketpair()
    try:
        small = splice.SplicePipe(left.fileno(), 4096)
        big = splice.SplicePipe(left.fileno(), landing.LAND_BYTES)
        try:
            assert (small.capacity, small.refused) == (4096, True)
            assert (big.capacity, big.refused) == (landing.LAND_BYTES, False)
        finally:
            small.close()
            big.close()
    finally:
        left.close()
        right.close()


_AT_THE_FD_LIMIT = """
import os, pathlib, sys
from shardcache.checksums import crc32c
from shardcache.crc_spans import BLOCK_BYTES, Span
from tests.unit.origins.test_landing import _body, _head, _land, _open
payload = os.urandom(3 << 20)
fd = _open(pathlib.Path(sys.argv[1]))
with _body(lambda c: c.sendall(_head(len(payload)) + payload)) as body:
    spare = []
    try:
        while True:
            spare.append(os.dup(0))  # every descriptor taken: pipe2 fails with EMFILE
    except OSError:
        pass
    try:
        crc, _ = _land(body, fd, len(payload))
    finally:
        for each in spare:
            os.close(each)
os.close(fd)
assert open(sys.argv[1], "rb").read() == payload and crc == crc32c(payload)
print("exact")
"""


def test_a_receiver_without_descriptors_to_spare_copies_instead(tmp_path: Path) -> None:
    """From the attack: a receiver at its open-file limit failed every plain landing (pipe2:
    EMFILE) where copying needs no descriptor at all. Run in a child process whose open-file
    limit is low, every descriptor taken before the landing."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _AT_THE_FD_LIMIT, str(tmp_path / "f")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
        preexec_fn=lambda: __import__("resource").setrlimit(
            __import__("resource").RLIMIT_NOFILE, (64, 64)
        ),
    )
    assert done.returncode == 0 and done.stdout.strip() == "exact", done.stderr[-2000:]
