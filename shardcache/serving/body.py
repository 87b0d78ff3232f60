"""Response bodies on the socket: `os.sendfile` from cache files and from fills being tailed
(on the transport's socket itself: uvloop has no `loop.sendfile`), and pass-through streams.
Every function raises on failure; the caller must then abort the connection, because the
headers promised a Content-Length that will not be met."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import struct
import termios
from collections.abc import Awaitable, Callable

from shardcache.cache.fill import Fill
from shardcache.cache.passthrough import CheckedStream
from shardcache.config.options import default as option_default
from shardcache.errors import FillAbandoned
from shardcache.origins.base import with_read_timeout

FALLBACK_CHUNK_BYTES = 1 << 20
DEFAULT_SEND_TIMEOUT_S: float = option_default("client_send_timeout")  # the table's, not a copy
PROGRESS_CHECK_S = 1.0  # how often a blocked send looks for progress
TRANSPORT_LOW_WATER_BYTES = 64 * 1024
CHECKED_PIECE_BYTES = 8 << 20  # a hit is sent and checked in pieces this large (block-aligned)
CHECKS_IN_FLIGHT = 3  # pieces sent but not yet checked before sending waits for the oldest
Write = Callable[[bytes], Awaitable[None]]


class ClientGone(ConnectionError):
    """The client closed the connection; nothing to report to it."""


class ClientStalled(ClientGone):
    """The client read nothing for the send timeout: its connection is closed like a gone one's
    (a shared fill goes on for everyone else)."""


class FileSender:
    """Sends byte ranges of open files to one connection; `close()` when the response ends.

    Every wait for the client is bounded by `send_timeout_s` of no progress: when the bytes
    the kernel and the transport hold for the client (`TIOCOUTQ` plus the transport's buffer)
    have not shrunk for that long, the client stopped reading, and `ClientStalled` is raised.
    Progress is measured in bytes acknowledged, not in the socket turning writable: that waits
    for half of a 4 MiB send buffer to drain, which a client reading 16 KB/s never achieves
    within two minutes.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        write: Write,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        self._transport = transport
        self._write = write
        self.send_timeout_s = send_timeout_s
        self._loop = asyncio.get_running_loop()
        self.sent_bytes = 0  # every body byte of the response so far
        self.bypassed_bytes = 0  # those sent with sendfile, which aiohttp's writer never saw
        sock = transport.get_extra_info("socket")
        is_plain = sock is not None and transport.get_extra_info("sslcontext") is None
        self._socket_fd = sock.fileno() if is_plain else -1
        self._any_socket_fd = sock.fileno() if sock is not None else -1  # TLS too, for TIOCOUTQ
        self._poll_fd = -1
        self.is_zero_copy = is_plain

    async def send(self, fd: int, offset: int, count: int) -> None:
        """Send `count` bytes of `fd` from `offset`."""
        if self.is_zero_copy:
            await self._sendfile(fd, offset, count)
        else:
            await self._copy(fd, offset, count)

    async def _sendfile(self, fd: int, offset: int, count: int) -> None:
        await self._flush_transport()
        while count:
            if self._transport.is_closing():
                raise ClientGone("client closed the connection")
            try:
                sent = os.sendfile(self._socket_fd, fd, offset, count)
            except BlockingIOError:
                await self._writable()
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ClientGone(str(exc)) from exc
            if sent == 0:
                raise EOFError(f"file ended {count} bytes early")  # truncated under us
            offset += sent
            count -= sent
            self.sent_bytes += sent
            self.bypassed_bytes += sent

    async def _flush_transport(self) -> None:
        """Wait until the transport's buffer is empty: headers (and earlier body bytes) sit
        there until the socket takes them, and sendfile must not overtake them."""
        if not self._transport.get_write_buffer_size():
            return  # the common case: nothing to wait for, no syscall to measure progress
        progress = _Progress(self)
        pause_s = 0.001
        while self._transport.get_write_buffer_size():
            progress.check()
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.1)  # a stuck client must not cost 1,000 wake-ups/s

    async def _writable(self) -> None:
        if self._poll_fd < 0:
            self._poll_fd = os.dup(self._socket_fd)
        progress = _Progress(self)
        while True:
            waiter = self._loop.create_future()
            self._loop.add_writer(self._poll_fd, waiter.set_result, None)
            try:
                async with asyncio.timeout(PROGRESS_CHECK_S):
                    await waiter
                return
            except TimeoutError:
                progress.check()
            finally:
                self._loop.remove_writer(self._poll_fd)

    def queued_bytes(self) -> int:
        """Bytes on their way to the client: the transport's buffer and the socket's send
        queue (unsent and unacknowledged), which shrinks exactly when the client reads."""
        queued = self._transport.get_write_buffer_size()
        if self._any_socket_fd >= 0:
            with contextlib.suppress(OSError):
                raw = fcntl.ioctl(self._any_socket_fd, termios.TIOCOUTQ, b"\0\0\0\0")
                queued += struct.unpack("i", raw)[0]
        return queued

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def stalled(self) -> ClientStalled:
        return ClientStalled(f"the client read nothing for {self.send_timeout_s:g} s")

    async def write(self, data: bytes) -> None:
        """Write through aiohttp (a relayed stream, the TLS fallback), bounded like sendfile.

        aiohttp hands `data` to the transport at once and then waits, without a limit, for a
        full buffer to drain. That wait is given a second; past it, the bytes are queued
        already and the rest of the wait is ours, measured by progress."""
        try:
            async with asyncio.timeout(PROGRESS_CHECK_S):
                await self._write(data)
                return
        except TimeoutError:
            pass
        await self.drained(TRANSPORT_LOW_WATER_BYTES)

    async def drained(self, at_most_bytes: int = 0) -> None:
        """Wait until the transport holds at most `at_most_bytes` for the client, raising
        `ClientStalled` after the send timeout without progress."""
        if self._transport.get_write_buffer_size() <= at_most_bytes:
            return
        progress = _Progress(self)
        while self._transport.get_write_buffer_size() > at_most_bytes:
            await asyncio.sleep(min(PROGRESS_CHECK_S, 0.05 * (1 + progress.checks)))
            progress.check()

    async def _copy(self, fd: int, offset: int, count: int) -> None:
        """The fallback for TLS transports: pread in a worker thread, write through aiohttp."""
        while count:
            data = await asyncio.to_thread(os.pread, fd, min(count, FALLBACK_CHUNK_BYTES), offset)
            if not data:
                raise EOFError(f"file ended {count} bytes early")
            await self.write(data)
            offset += len(data)
            count -= len(data)
            self.sent_bytes += len(data)

    def take_bypassed_bytes(self) -> int:
        """Bytes sent with sendfile not yet added to aiohttp's count (the access log's)."""
        taken, self.bypassed_bytes = self.bypassed_bytes, 0
        return taken

    def count_written(self, size_bytes: int) -> None:
        """Bytes written through aiohttp by someone else (a stream relayed by `send_stream`)."""
        self.sent_bytes += size_bytes

    def close(self) -> None:
        if self._poll_fd >= 0:
            os.close(self._poll_fd)
            self._poll_fd = -1


class _Progress:
    """The send timeout of one wait: it restarts whenever the client has taken bytes."""

    def __init__(self, sender: FileSender) -> None:
        self._sender = sender
        self._loop = asyncio.get_running_loop()
        self._queued = sender.queued_bytes()
        self._deadline = self._loop.time() + sender.send_timeout_s
        self.checks = 0

    def check(self) -> None:
        """Raise ClientGone for a closed connection, ClientStalled past the deadline."""
        self.checks += 1
        if self._sender.is_closing():
            raise ClientGone("client closed the connection")
        queued = self._sender.queued_bytes()
        now = self._loop.time()
        if queued < self._queued:
            self._deadline = now + self._sender.send_timeout_s
        self._queued = queued
        if now >= self._deadline:
            raise self._sender.stalled()


async def send_checked(
    sender: FileSender,
    fd: int,
    start: int,
    end: int,
    check: Callable[[int, int], Awaitable[int]],
    on_checked: Callable[[int], None],
) -> None:
    """Send bytes [start, end) of a cached file, `check(a, b)` (the hit's block check) passing
    on every piece; the last byte leaves only once all of it passed. `on_checked` gets the
    sum of what the checks returned (bytes read) before that byte leaves, so a client that
    has the whole body finds it counted.

    Each CHECKED_PIECE_BYTES piece is checked just after sendfile sent it, while the next ones
    are sent (its pages are still in the CPU's cache); sending waits for a check only when
    CHECKS_IN_FLIGHT are behind, so the socket never idles for one. Raises the check's
    IntegrityError (the caller aborts the connection, so the client never sees the response
    end), or the send's error.
    """
    checked = 0
    checks: collections.deque[asyncio.Future[int]] = collections.deque()
    position = start
    try:
        while position < end - 1:
            boundary = (position // CHECKED_PIECE_BYTES + 1) * CHECKED_PIECE_BYTES
            piece_end = min(boundary, end - 1)
            await sender.send(fd, position, piece_end - position)
            while checks and (checks[0].done() or len(checks) >= CHECKS_IN_FLIGHT):
                checked += await checks.popleft()  # raises a failed check's error at once
            checked_end = end if piece_end == end - 1 else piece_end  # the held-back byte too
            checks.append(asyncio.ensure_future(check(position, checked_end)))
            position = piece_end
        if not checks:
            checks.append(asyncio.ensure_future(check(start, end)))
        while checks:
            checked += await checks.popleft()
    finally:
        for pending in checks:
            pending.cancel()
        await asyncio.gather(*checks, return_exceptions=True)
    on_checked(checked)
    await sender.send(fd, end - 1, 1)


async def send_fill(
    sender: FileSender,
    fill: Fill,
    fd: int,
    start: int,
    end: int,
    on_wait: Callable[[float], None],
    reader_left: asyncio.Event | None = None,
) -> None:
    """Send bytes [start, end) of a fill in flight as they land on disk.

    `on_wait(seconds)` is told how long the client waited for bytes not yet on disk.
    Raises the fill's error if it fails before the range is complete; ClientGone once
    `reader_left` is set (the connection closed) while it waits for bytes or for the
    verification (the fill's readers watch it: `Readers.watching`).
    """
    loop = asyncio.get_running_loop()
    position = start
    with fill.readers.watching(reader_left):
        while position < end:
            began = loop.time()
            try:
                limit = await fill.wait_readable(position, end, reader_left)
            except FillAbandoned:
                raise ClientGone("client closed the connection") from None
            on_wait(loop.time() - began)
            await sender.send(fd, position, limit - position)
            position = limit


async def settle_empty(
    fill: Fill | None, stream: CheckedStream | None, read_timeout_s: float
) -> None:
    """For an empty object, wait for the verdict before any header is sent: an empty
    response has no last byte to hold back, so a failure could not be shown after the headers.
    Raises the fill's or the stream's error."""
    if fill is not None:
        await fill.wait_finished()
        await fill.wait_readable(0, 0)  # raises the fill's error if it failed
    if stream is not None:

        async def discard(chunk: bytes) -> None:
            return None

        await send_stream(stream, discard, 0, 0, read_timeout_s, lambda s: None, lambda n: None)


async def send_stream(
    stream: CheckedStream,
    write: Write,
    start: int,
    end: int,
    read_timeout_s: float,
    on_wait: Callable[[float], None],
    on_sent: Callable[[int], None],
    min_bytes_per_s: float = 0.0,
) -> None:
    """Relay bytes [start, end) of an uncached origin stream; `on_sent(n)` counts them; a
    stream slower than `min_bytes_per_s` fails (`SpeedFloor`) rather than hold the client.

    The stream runs from the object's first byte to its last, whatever the range, and ends
    only once its length and published checksums were checked (`cache.passthrough`), so the
    last chunk sent is held back until it has ended: a failure never yields a complete
    response, whole or ranged.
    """
    loop = asyncio.get_running_loop()
    position = 0  # offset in the object of the next byte the stream yields
    pending = b""
    began = loop.time()
    async for chunk in with_read_timeout(stream, read_timeout_s, min_bytes_per_s):
        on_wait(loop.time() - began)
        piece = chunk[max(0, start - position) : max(0, end - position)]
        position += len(chunk)
        if piece:
            if pending:
                await write(pending)
                on_sent(len(pending))
            pending = piece
        began = loop.time()
    await write(pending)
    on_sent(len(pending))
