"""The body sender (`serving.body`) over a `socket.socketpair()`: exact bytes from a file with
sendfile and with the copying fallback, a hit's checked pieces and a fill's bytes as they land;
when a check or the fill fails, the sender raises with the response's last byte never sent (the
caller aborts: no clean short body); a client gone or stalled ends the send. No sleeps: the
peer reads until end of file, or not at all."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardcache.cache.fill import FillFactory
from shardcache.cache.store import Store
from shardcache.errors import IntegrityError, OriginUnavailable
from shardcache.observer import NullObserver
from shardcache.serving import body
from shardcache.serving.body import ClientGone, ClientStalled, FileSender
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

MiB = 1024 * 1024
SIZE = 3 * MiB + 5  # several socket buffers: the sender must wait for the peer to read


@dataclass
class Pair:
    """The daemon's end as an asyncio transport, the client's as a plain socket."""

    transport: asyncio.Transport
    client: socket.socket
    sender: FileSender

    def close(self) -> None:
        """End the response: the sender's own descriptor of the socket too, or the peer never
        sees the end of file."""
        self.sender.close()
        self.transport.close()

    async def receive_all(self) -> bytes:
        """Everything the peer gets until the daemon's end closes."""
        loop = asyncio.get_running_loop()
        got = bytearray()
        while chunk := await loop.sock_recv(self.client, 1 << 16):
            got.extend(chunk)
        return bytes(got)

    async def sent_until(self, sending: asyncio.Future[None]) -> tuple[bytes, BaseException]:
        """What the peer got while `sending` ran, and the error it ended with; the daemon's end
        is then closed (what the server does after it aborts)."""
        receiving = asyncio.ensure_future(self.receive_all())
        outcome = (await asyncio.gather(sending, return_exceptions=True))[0]
        self.close()
        assert isinstance(outcome, BaseException), "the send ended without an error"
        return await receiving, outcome


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)

    async def write(data: bytes) -> None:
        transport.write(data)

    sender = FileSender(transport, write, send_timeout_s=30.0)
    pair = Pair(transport, theirs, sender)
    yield pair
    pair.close()
    theirs.close()


@pytest.fixture
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture
def fd(tmp_path: Path, data: bytes) -> Iterator[int]:
    path = tmp_path / "object"
    path.write_bytes(data)
    descriptor = os.open(path, os.O_RDONLY)
    yield descriptor
    os.close(descriptor)


async def send_then_close(pair: Pair, fd: int, offset: int, count: int) -> None:
    try:
        await pair.sender.send(fd, offset, count)
    finally:
        pair.close()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "copy"])
@pytest.mark.parametrize(("offset", "count"), [(0, SIZE), (12_345, 2 * MiB), (SIZE - 1, 1)])
async def test_a_range_of_a_file_arrives_exactly(
    pair: Pair, fd: int, data: bytes, zero_copy: bool, offset: int, count: int
) -> None:
    assert pair.sender.is_zero_copy, "a plain socket is sent to with sendfile"
    pair.sender.is_zero_copy = zero_copy
    received, _ = await asyncio.gather(pair.receive_all(), send_then_close(pair, fd, offset, count))
    assert received == data[offset : offset + count]
    assert pair.sender.sent_bytes == count
    assert pair.sender.take_bypassed_bytes() == (count if zero_copy else 0)


async def test_checked_pieces_arrive_exactly_and_are_all_counted(
    pair: Pair, fd: int, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(body, "CHECKED_PIECE_BYTES", 256 * 1024)
    checked: list[tuple[int, int]] = []
    counted: list[tuple[int, int]] = []  # (bytes checked, bytes sent by then)

    async def check(start: int, end: int) -> int:
        checked.append((start, end))
        return end - start

    def on_checked(size_bytes: int) -> None:
        counted.append((size_bytes, pair.sender.sent_bytes))

    async def sending() -> None:
        try:
            await body.send_checked(pair.sender, fd, 100, SIZE, check, on_checked)
        finally:
            pair.close()

    received, _ = await asyncio.gather(pair.receive_all(), sending())
    assert received == data[100:]
    # Counted before the last byte leaves: a client holding the whole body finds it counted.
    assert counted == [(SIZE - 100, SIZE - 100 - 1)]
    covered = sorted(checked)  # the pieces tile the range with no gap and no overlap
    assert covered[0][0] == 100 and covered[-1][1] == SIZE
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))


@pytest.mark.parametrize("failing_piece", [0, 5, -1])
async def test_a_failed_check_raises_with_the_last_byte_unsent(
    pair: Pair, fd: int, data: bytes, monkeypatch: pytest.MonkeyPatch, failing_piece: int
) -> None:
    """Wherever the damage is, even in the last piece, the client never gets the whole body."""
    monkeypatch.setattr(body, "CHECKED_PIECE_BYTES", 256 * 1024)
    pieces = -(-SIZE // (256 * 1024))
    bad = failing_piece % pieces
    counted: list[int] = []

    async def check(start: int, end: int) -> int:
        if start // (256 * 1024) == bad:
            raise IntegrityError(f"block at {start} does not match its CRC-32C")
        return end - start

    sending = asyncio.ensure_future(
        body.send_checked(pair.sender, fd, 0, SIZE, check, counted.append)
    )
    received, error = await pair.sent_until(sending)
    assert isinstance(error, IntegrityError)
    assert len(received) < SIZE and data.startswith(received)
    assert counted == [], "a failed body was counted as checked"


async def test_a_fill_is_sent_as_it_lands(pair: Pair, tmp_path: Path, data: bytes) -> None:
    origin = FakeOrigin(chunk_bytes=64 * 1024)
    origin.put("a.tar", data)
    store = Store(tmp_path / "cache", 8 * MiB)
    fills = FillFactory.of(store, make_policy(connections=1), NullObserver())
    fill = fills.new(origin.url_for("a.tar"), origin, "a.tar")
    fill.task = asyncio.create_task(fill.run())
    try:
        await fill.wait_started()
        fd = fill.readers.acquire()
        waits: list[float] = []

        async def sending() -> None:
            try:
                await body.send_fill(pair.sender, fill, fd, 0, SIZE, waits.append)
            finally:
                pair.close()
                fill.readers.release()

        received, _ = await asyncio.gather(pair.receive_all(), sending())
        assert received == data
        assert fill.state.is_body_complete
    finally:
        await asyncio.gather(fill.task, return_exceptions=True)
        assert store.check() == []
        store.close()


@pytest.mark.parametrize("how", ["origin", "reader_left"])
async def test_a_failed_fill_is_never_a_whole_response(
    pair: Pair, tmp_path: Path, data: bytes, how: str
) -> None:
    origin = FakeOrigin(chunk_bytes=64 * 1024)
    origin.put("a.tar", data)
    origin.fail_at["a.tar"], origin.failures_left["a.tar"] = MiB, 99
    gate = origin.gate = asyncio.Event()
    store = Store(tmp_path / "cache", 8 * MiB)
    policy = make_policy(retries=1, base_s=0.001, connections=1)
    fill = FillFactory.of(store, policy, NullObserver()).new(
        origin.url_for("a.tar"), origin, "a.tar"
    )
    fill.task = asyncio.create_task(fill.run())
    left = asyncio.Event()
    try:
        await fill.wait_started()
        fd = fill.readers.acquire()
        sending = asyncio.ensure_future(
            body.send_fill(pair.sender, fill, fd, 0, SIZE, lambda s: None, left)
        )
        if how == "reader_left":
            left.set()  # the client closed its connection while waiting for bytes
        gate.set()
        received, error = await pair.sent_until(sending)
        fill.readers.release()
        expected = OriginUnavailable if how == "origin" else ClientGone
        assert isinstance(error, expected), error
        assert len(received) <= MiB and data.startswith(received)
    finally:
        await asyncio.gather(fill.task, return_exceptions=True)
        assert store.check() == [] and store.usage().reserved_bytes == 0
        store.close()


async def test_a_client_gone_ends_the_send(pair: Pair, fd: int) -> None:
    pair.client.close()
    with pytest.raises(ClientGone):
        await pair.sender.send(fd, 0, SIZE)


async def test_a_client_that_reads_nothing_is_stalled_out(
    pair: Pair, fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer never reads: once the socket's buffers are full, no byte is acknowledged for
    the send timeout, and the send gives up (a shared fill goes on for everyone else)."""
    monkeypatch.setattr(body, "PROGRESS_CHECK_S", 0.02)
    pair.sender.send_timeout_s = 0.2
    async with asyncio.timeout(10):  # a bound on the test, far past the send timeout
        with pytest.raises(ClientStalled):
            await pair.sender.send(fd, 0, SIZE)
    assert 0 < pair.sender.sent_bytes < SIZE
