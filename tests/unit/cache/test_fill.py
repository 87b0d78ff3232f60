"""`Fill` on its own (`cache.fill`): readers tail the bytes as they land and never get the last
byte before verification; an abort (the origin's failure, a stop, shutdown) reaches every reader
and leaves no partial file; a purged fill finishes uncommitted; the last holder letting go tells
the owner. A temp-dir store and an in-memory origin whose chunks pass one turnstile permit at a
time: no sockets, no sleeps."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Literal

import pytest

from shardcache.cache.fill import Fill, FillFactory, FillState
from shardcache.cache.store import Store
from shardcache.checksums import Checksum
from shardcache.errors import (
    FillAbandoned,
    IntegrityError,
    OriginNotFound,
    OriginUnavailable,
    ShardcacheError,
    ShuttingDown,
)
from shardcache.observer import NullObserver
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

MiB = 1024 * 1024
CHUNK = 4096
POLICY = make_policy(retries=1, base_s=0.001, connections=1)  # one GET: chunks land in order


class Turnstile(asyncio.Event):
    """A gate for the fake's bodies that lets `admit(n)` chunks through, or all once `set`."""

    def __init__(self) -> None:
        super().__init__()
        self._permits = 0
        self._moved = asyncio.Event()

    def admit(self, chunks: int = 1) -> None:
        self._permits += chunks
        self._wake()

    def set(self) -> None:
        super().set()
        self._wake()

    def _wake(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def wait(self) -> Literal[True]:
        while not self.is_set():
            if self._permits:
                self._permits -= 1
                return True
            await self._moved.wait()
        return True


@pytest.fixture
def origin() -> FakeOrigin:
    fake = FakeOrigin(chunk_bytes=CHUNK)
    fake.gate = Turnstile()
    return fake


@pytest.fixture
async def start(origin: FakeOrigin, store: Store) -> AsyncIterator[Callable[..., Fill]]:
    """Start a fill of a key as its owner would (a task it keeps); every one is awaited after."""
    fills: list[Fill] = []

    def starting(key: str, on_unwanted: Callable[[Fill], None] | None = None) -> Fill:
        fill = FillFactory.of(store, POLICY, NullObserver()).new(
            origin.url_for(key), origin, key, on_unwanted=on_unwanted
        )
        fill.task = asyncio.create_task(fill.run())
        fills.append(fill)
        return fill

    yield starting
    gate(origin).set()
    for fill in fills:
        assert fill.task is not None
        await asyncio.gather(fill.task, return_exceptions=True)


def gate(origin: FakeOrigin) -> Turnstile:
    assert isinstance(origin.gate, Turnstile)
    return origin.gate


async def landed(fill: Fill, at_least: int, end: int) -> int:
    """Wait until `at_least` bytes a reader of [0, end) may send are on disk; return how many."""
    position = 0
    while position < at_least:
        position = await fill.wait_readable(position, end)
    return position


async def read_all(fill: Fill, size: int) -> bytes:
    """Tail the fill as a response does: every byte it may send, then the rest once verified."""
    fd = fill.readers.acquire()
    try:
        body = b""
        while len(body) < size:
            limit = await fill.wait_readable(len(body), size)
            body += os.pread(fd, limit - len(body), len(body))
        return body
    finally:
        fill.readers.release()


async def test_readers_see_the_bytes_as_they_land(
    origin: FakeOrigin, store: Store, start: Callable[..., Fill]
) -> None:
    data = os.urandom(5 * CHUNK + 100)
    origin.put("a.tar", data)
    fill = start("a.tar")
    gate(origin).admit()
    assert await fill.wait_started() is FillState.FILLING
    readers = [fill.readers.acquire() for _ in range(2)]
    position = 0
    for landed in range(1, 6):  # chunk by chunk: each reader may send exactly what is on disk
        if landed > 1:
            gate(origin).admit()
        for fd in readers:
            limit = await fill.wait_readable(position, len(data))
            assert limit == landed * CHUNK
            assert os.pread(fd, limit - position, position) == data[position:limit]
        position = landed * CHUNK
        assert fill.state is FillState.FILLING
    gate(origin).admit()
    while position < len(data):
        limit = await fill.wait_readable(position, len(data))
        assert limit < len(data) or fill.state.is_body_complete, (
            "the last byte came before verifying"
        )
        position = limit
    assert os.pread(readers[0], len(data), 0) == data
    for _ in readers:
        fill.readers.release()
    assert await fill.wait_finished() is FillState.COMMITTED
    entry = store.lookup(fill.cache_key)
    assert entry is not None
    try:
        assert os.pread(entry.fd, len(data) + 1, 0) == data
    finally:
        entry.close()


async def test_a_range_that_ends_early_still_waits_for_verification(
    origin: FakeOrigin, start: Callable[..., Fill]
) -> None:
    """A range's last byte is withheld until the whole object verified: the rest of the object
    could prove its first part was of another version, or corrupt."""
    data = os.urandom(4 * CHUNK)
    origin.put("a.tar", data)
    fill = start("a.tar")
    gate(origin).admit(2)
    await fill.wait_started()
    end = CHUNK + 10  # the range [0, end) is on disk after two chunks
    assert await landed(fill, end - 1, end) == end - 1
    waiting = asyncio.create_task(fill.wait_readable(end - 1, end))
    await asyncio.wait({waiting}, timeout=0)
    assert not waiting.done()
    gate(origin).set()
    assert await waiting == end
    assert fill.state.is_body_complete


@pytest.mark.parametrize("abort", ["origin", "stop", "shutdown", "checksum"])
async def test_an_abort_reaches_every_reader_and_leaves_nothing_behind(
    origin: FakeOrigin, store: Store, start: Callable[..., Fill], abort: str
) -> None:
    data = os.urandom(6 * CHUNK)
    origin.put("a.tar", data)
    expected: type[ShardcacheError]
    if abort == "origin":  # fails at the same byte on every try: retries run out
        origin.fail_at["a.tar"], origin.failures_left["a.tar"] = 3 * CHUNK, 99
        expected = OriginUnavailable
    elif abort == "checksum":
        origin.checksums["a.tar"] = (Checksum("md5", b"\0" * 16, "test"),)
        expected = IntegrityError
    elif abort == "stop":
        expected = FillAbandoned
    else:
        expected = ShuttingDown
    fill = start("a.tar")
    gate(origin).admit(2)
    await fill.wait_started()
    readers = [asyncio.create_task(read_all(fill, len(data))) for _ in range(3)]
    assert await landed(fill, 2 * CHUNK, len(data)) == 2 * CHUNK
    if abort == "stop":
        fill.stop(FillAbandoned("every reader left"))
    elif abort == "shutdown":
        fill.cancel()
    else:
        gate(origin).set()
    outcomes = await asyncio.gather(*readers, return_exceptions=True)
    assert [type(outcome) for outcome in outcomes] == [expected] * 3, outcomes
    assert len({id(outcome) for outcome in outcomes}) == 1  # the fill's error, for each
    assert await fill.wait_finished() is FillState.FAILED
    assert isinstance(fill.error, expected)
    assert store.lookup(fill.cache_key) is None and store.usage().entries == 0
    assert store.usage().reserved_bytes == 0
    with pytest.raises(expected):
        await fill.wait_readable(0, len(data))  # a reader that comes late is told too


async def test_a_failure_before_the_first_byte_is_the_starters_error(
    origin: FakeOrigin, store: Store, start: Callable[..., Fill]
) -> None:
    gate(origin).set()
    fill = start("missing.tar")
    with pytest.raises(OriginNotFound):
        await fill.wait_started()
    assert await fill.wait_finished() is FillState.FAILED
    assert origin.opens == [("missing.tar", 0)], "a 404 is an answer, not retried"
    with pytest.raises(RuntimeError):
        fill.readers.acquire()  # no data file was ever made
    assert store.usage().entries == 0


async def test_a_reader_that_left_stops_waiting_and_the_fill_goes_on(
    origin: FakeOrigin, start: Callable[..., Fill]
) -> None:
    data = os.urandom(3 * CHUNK)
    origin.put("a.tar", data)
    fill = start("a.tar")
    gate(origin).admit()
    await fill.wait_started()
    left = asyncio.Event()
    leaving = asyncio.create_task(fill.wait_readable(CHUNK, len(data), left))
    staying = asyncio.create_task(read_all(fill, len(data)))
    await asyncio.wait({leaving}, timeout=0)
    left.set()
    fill.readers.wake()  # what a response's watcher does when its client goes
    with pytest.raises(FillAbandoned):
        await leaving
    gate(origin).set()
    assert await staying == data
    assert await fill.wait_finished() is FillState.COMMITTED


async def test_a_purged_fill_finishes_for_its_readers_and_is_not_kept(
    origin: FakeOrigin, store: Store, start: Callable[..., Fill]
) -> None:
    data = os.urandom(3 * CHUNK)
    origin.put("a.tar", data)
    fill = start("a.tar")
    gate(origin).admit()
    await fill.wait_started()
    reading = asyncio.create_task(read_all(fill, len(data)))
    assert fill.do_not_keep() is True
    gate(origin).set()
    assert await reading == data
    assert await fill.wait_finished() is FillState.DISCARDED
    assert fill.do_not_keep() is False  # too late now: nothing is fetched any more
    assert store.lookup(fill.cache_key) is None


async def test_the_last_holder_letting_go_tells_the_owner_once(
    origin: FakeOrigin, start: Callable[..., Fill]
) -> None:
    data = os.urandom(3 * CHUNK)
    origin.put("a.tar", data)
    origin.put("b.tar", data)
    unwanted: list[Fill] = []
    fill = start("a.tar", unwanted.append)
    fill.hold()
    fill.hold()
    gate(origin).admit()
    await fill.wait_started()
    fill.let_go()
    assert unwanted == [], "one reader still holds it"
    fill.let_go()
    assert unwanted == [fill]
    kept = start("b.tar", unwanted.append)
    kept.hold()
    await kept.wait_started()
    kept.readers.keep_unread()  # the prefetch queue wants it cached: it goes on without readers
    kept.let_go()
    assert unwanted == [fill]
    kept.readers.forget_unread()  # the daemon is stopping
    assert unwanted == [fill, kept]
    gate(origin).set()
    fill.stop(FillAbandoned("every reader left"))
    kept.stop(FillAbandoned("every reader left"))
    assert await fill.wait_finished() is await kept.wait_finished() is FillState.FAILED


async def test_a_body_already_complete_is_committed_whoever_is_left(
    origin: FakeOrigin, start: Callable[..., Fill]
) -> None:
    data = os.urandom(2 * CHUNK)
    origin.put("a.tar", data)
    unwanted: list[Fill] = []
    fill = start("a.tar", unwanted.append)
    fill.hold()
    gate(origin).admit()
    await fill.wait_started()
    reading = asyncio.create_task(read_all(fill, len(data)))
    gate(origin).set()
    assert await reading == data  # the last byte came: the body is complete
    fill.let_go()
    assert unwanted == []
    assert await fill.wait_finished() is FillState.COMMITTED


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_a_fill_stopped_before_its_task_ran_still_fails(
    origin: FakeOrigin, start: Callable[..., Fill], how: str
) -> None:
    origin.put("a.tar", b"x" * CHUNK)
    fill = start("a.tar")
    if how == "stop":  # the same step that started it
        fill.stop(FillAbandoned("every reader left"))
    else:
        fill.cancel()
    expected = FillAbandoned if how == "stop" else ShuttingDown
    assert fill.task is not None
    await asyncio.gather(fill.task, return_exceptions=True)
    assert fill.state is FillState.FAILED
    assert isinstance(fill.error, expected)
    with pytest.raises(expected):
        await fill.wait_started()
    assert await fill.wait_finished() is FillState.FAILED


async def test_a_reader_that_left_before_the_origin_answered_stops_waiting(
    origin: FakeOrigin, start: Callable[..., Fill], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its client gone while the origin has not answered (a turn under a cap, say): the
    reader's wait ends with FillAbandoned at once; the fill goes on for whoever holds it."""
    origin.put("a.tar", os.urandom(2 * CHUNK))
    answer = asyncio.Event()
    opening = origin.open

    async def held_open(*args: object, **kwargs: object) -> object:
        await answer.wait()
        return await opening(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(origin, "open", held_open)
    fill = start("a.tar")
    left = asyncio.Event()

    async def waiting() -> FillState:
        with fill.readers.watching(left):
            return await fill.wait_started(left)

    waiter = asyncio.create_task(waiting())
    await asyncio.wait({waiter}, timeout=0)
    assert not waiter.done() and fill.state is FillState.STARTING
    left.set()  # nothing else wakes the fill's waiters: the origin has not answered
    with pytest.raises(FillAbandoned):
        async with asyncio.timeout(5):  # a deadline, not a pace: a watcher that never wakes it
            await waiter
    assert fill.state is FillState.STARTING
    answer.set()
    assert await fill.wait_started() is FillState.FILLING
