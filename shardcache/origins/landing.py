"""One answer's body, received in a receiving process (`origins.receiver`) and written into the
fill's file (spliced for plain HTTP, copied for TLS) or handed over in chunks.

Held to exactly the announced length: more or less raises OriginUnavailable and nothing beyond
it is written. Knows nothing of objects or fills: the daemon says what to skip and expect."""

from __future__ import annotations

import contextlib
import errno
import os
import ssl
import time
from collections.abc import Callable, Iterator

from shardcache.crc_spans import Span, SpanHasher
from shardcache.errors import OriginTimeout, OriginTooSlow, OriginUnavailable
from shardcache.origins.base import CHUNK_BYTES, SpeedFloor
from shardcache.origins.pool import Exchange
from shardcache.origins.responses import map_http_errors
from shardcache.origins.splice import AVAILABLE as SPLICE_AVAILABLE
from shardcache.origins.splice import GATHER_MOST_S, SplicePipe

LAND_BYTES = 512 << 10  # a landing thread's buffer: the most one write (and report) takes; each
# landing in flight holds one, so this times the landings bounds a receiver's memory
REPORT_BYTES = 1 << 20  # bytes written between two progress reports, while they keep coming
GATHER_S = 0.002  # how long more bytes are waited for before those that came are written
# (a gather goes on for GATHER_MOST_S at most, and landed bytes wait no longer for their report)

# `progress(count, crc, spans)`: `count` more bytes are written, `crc` is the running CRC-32C
# of every byte of the segment written so far, and `spans` the CRC-32C of each span of a block
# (`crc_spans`) those bytes completed: none reaches past what this report counts.
Progress = Callable[[int, int, list[Span]], None]


class Body:
    """The body of `exchange`'s answer: `body_bytes` long, of which the first `skip` are
    dropped (a server that answered a Range request with 200)."""

    def __init__(self, exchange: Exchange, skip: int, body_bytes: int, read_s: float) -> None:
        self._exchange = exchange
        self._skip = skip
        self._left = body_bytes
        self._buffer_drained = False
        self._read_s = read_s

    def next_chunk(self, read_s: float) -> bytes | None:
        """The next bytes (at most CHUNK_BYTES), or None at the body's end."""
        self._read_s = read_s
        buffer = bytearray(CHUNK_BYTES)
        with self._mapping_errors():
            while True:
                self._exchange.abort.check()
                received = self._receive(memoryview(buffer))
                if received is None:
                    return None
                if received:
                    return bytes(received)

    def land(
        self,
        fd: int,
        position: int,
        end: int,
        crc: int,
        read_s: float,
        min_bytes_per_s: float,
        progress: Progress,
    ) -> None:
        """Write the body at `position` of `fd` until `end`, reporting each write and the CRC-32C
        of the spans it completed (`crc` is the segment's before `position`); raise
        OriginTimeout when no byte comes for `read_s`, OriginTooSlow under the floor,
        OriginUnavailable when it ends before `end`."""
        self._read_s = read_s
        buffer = memoryview(bytearray(LAND_BYTES))
        floor = SpeedFloor(min_bytes_per_s, read_s)
        label = self._exchange.label
        unreported = 0
        reported_at = time.monotonic()
        pipe = self._splice_pipe()
        hasher = SpanHasher(position, crc)
        try:
            with self._mapping_errors():
                while position < end:
                    self._exchange.abort.check()
                    if pipe is not None and not pipe.refused and self._splices_now():
                        count, paused = self._splice(pipe, fd, position, end)
                        if count:
                            hasher.update(_read_back(fd, buffer[:count], position))
                    else:
                        received = self._receive(buffer)
                        if received is None:
                            raise OriginUnavailable(
                                f"{label}: body ended at byte {position}, expected {end}"
                            )
                        piece = received[: end - position]  # it may run past its segment
                        if piece:
                            _write_at(fd, piece, position)
                            hasher.update(piece)
                        count, paused = len(piece), len(received) < len(buffer)
                    floor.passed(count, label)
                    position += count
                    unreported += count
                    if position == end:
                        hasher.close()
                    # Reported every REPORT_BYTES on a fast origin (each report costs the
                    # serving process a message), at once when the origin paused (a reader
                    # waits on it), and every GATHER_MOST_S on one that keeps dripping.
                    if unreported and (
                        unreported >= REPORT_BYTES
                        or paused
                        or time.monotonic() - reported_at >= GATHER_MOST_S
                    ):
                        progress(unreported, hasher.crc, hasher.take())
                        unreported = 0
                        reported_at = time.monotonic()
                if unreported:
                    progress(unreported, hasher.crc, hasher.take())
                if self._left == 0:
                    self._receive(buffer)  # the body's end: its connection goes back to the pool
        finally:
            if pipe is not None:
                pipe.close()

    def _splice_pipe(self) -> SplicePipe | None:
        """A pipe to splice this body through, where it can be: a plain (not TLS) socket,
        a body that is not chunked, and two descriptors to spare (copying needs none: a
        receiver at its open-file limit still lands the body)."""
        sock = self._exchange.sock
        if (
            not SPLICE_AVAILABLE
            or isinstance(sock, ssl.SSLSocket)
            or self._exchange.response.chunked
        ):
            return None
        try:
            return SplicePipe(sock.fileno(), LAND_BYTES)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                return None
            raise

    def _splices_now(self) -> bool:
        """Past what came with the headers, and past the bytes to skip."""
        return self._buffer_drained and not self._skip and self._left > 0

    def _splice(self, pipe: SplicePipe, fd: int, position: int, end: int) -> tuple[int, bool]:
        """Move the body's next bytes (at most to `end`) into `fd` at `position`; returns
        (count, paused). Raises OriginUnavailable at the body's early end."""
        sock = self._exchange.sock
        sock.settimeout(self._read_s)  # non-blocking underneath; the waits are the pipe's
        count, paused = pipe.fill(min(self._left, end - position), self._read_s, GATHER_S)
        if pipe.refused:
            return 0, False  # nothing moved: the next round copies
        if count == 0:
            raise OriginUnavailable(f"{self._exchange.label}: body ended {self._left} bytes short")
        self._left -= count
        pipe.empty_into(fd, position)
        return count, paused

    @contextlib.contextmanager
    def _mapping_errors(self) -> Iterator[None]:
        try:
            with map_http_errors(self._exchange.label):
                yield
        except OriginTooSlow:
            raise  # it says how slow; the rewording below is for a socket's silence
        except OriginTimeout as exc:
            raise OriginTimeout(f"{self._exchange.label}: no byte for {self._read_s:g}s") from exc

    def _receive(self, buffer: memoryview) -> memoryview | None:
        """The next bytes of the body, with what a 200 to a Range request sent before the
        range dropped (possibly none); None once the body is complete. Raises
        OriginUnavailable when it ends early or runs long."""
        label = self._exchange.label
        if self._left == 0:
            if self._runs_past_its_end():
                raise OriginUnavailable(f"{label}: body longer than announced")
            self._exchange.finish(complete=True)
            return None
        count = self._read_some(buffer[: min(len(buffer), self._left)])
        if count == 0:
            raise OriginUnavailable(f"{label}: body ended {self._left} bytes short")
        if count > self._left:
            raise OriginUnavailable(f"{label}: body longer than announced")
        self._left -= count
        received = buffer[:count]
        if self._skip:
            dropped = min(self._skip, count)
            self._skip -= dropped
            received = received[dropped:]
        return received

    def _runs_past_its_end(self) -> bool:
        """Whether a body with no Content-Length (chunked, or ended by closing) goes on past
        what was announced; it must end right there."""
        response = self._exchange.response
        if response.chunked:
            return bool(response.read1(1))
        if response.length is None:
            assert response.fp is not None
            return bool(response.fp.read1(1))
        return False  # http.client and `_left` hold it to its Content-Length

    def _read_some(self, buffer: memoryview) -> int:
        """Block until some bytes came, then take what else comes, each within GATHER_S of
        the one before, up to the buffer and for GATHER_MOST_S at most: few large writes
        (and progress reports) on a fast origin, no waiting for a full buffer on a slow one
        (a reader streams what has landed).

        Past what http.client buffered with the headers, a body with a Content-Length is
        read from the socket itself: one call per TLS record (16 KiB) is the floor, and each
        layer above it (the buffered reader, SocketIO) took the GIL again."""
        response = self._exchange.response
        if response.chunked:  # rare for object stores; http.client decodes the chunks
            data = response.read1(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        assert response.fp is not None
        if not self._buffer_drained:
            self._buffer_drained = True
            data = response.fp.read1(len(buffer))  # what came with the headers, or one read
            buffer[: len(data)] = data
            return len(data)
        sock = self._exchange.sock
        sock.settimeout(self._read_s)
        count = sock.recv_into(buffer)
        limit = len(buffer)
        if 0 < count < limit:
            sock.settimeout(GATHER_S)
            gather_end = time.monotonic() + GATHER_MOST_S
            try:
                while count < limit and time.monotonic() < gather_end:
                    more = sock.recv_into(buffer[count:])
                    if not more:
                        break
                    count += more
            except TimeoutError:
                pass  # nothing more for now: write what came
            finally:
                sock.settimeout(self._read_s)
        return count


def _read_back(fd: int, into: memoryview, position: int) -> memoryview:
    """The bytes just spliced at `position`, read back from the page cache into `into` for
    their CRC (a copy of bytes still in the CPU's cache, not the socket's second one)."""
    count = os.preadv(fd, [into], position)
    if count != len(into):
        raise OSError(f"read back {count} of {len(into)} bytes just written at {position}")
    return into


def _write_at(fd: int, chunk: memoryview, offset: int) -> None:
    while chunk:
        written = os.pwrite(fd, chunk, offset)
        offset += written
        chunk = chunk[written:]


__all__ = ["Body", "Progress"]
