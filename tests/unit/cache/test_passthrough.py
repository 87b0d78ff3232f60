"""Objects streamed through uncached (`cache.passthrough`, a fill in PASSTHROUGH): the starter's
stream continues the fill's first request with If-Match on its version, another reader's is its
own GET of that version, both carry the published checksums, and what a client is sent
(`relay`, the server's `send_stream`) never ends whole when the body is of another version,
corrupt or short: its last bytes wait for the verdict. No sockets, no sleeps."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from shardcache.cache.fill import Fill, FillFactory, FillState
from shardcache.cache.store import Store
from shardcache.errors import FillAbandoned, IntegrityError, OriginChanged, ShardcacheError
from shardcache.observer import NullObserver
from shardcache.origins.base import NEW_REQUEST, OriginStream, RequestContext
from shardcache.serving.body import send_stream
from tests.unit.fakes import FakeOrigin, FakeStream
from tests.unit.policies import make_policy

FIRST = 16 * 1024  # the first segment: the fill's first request asks for this much
SIZE = 100_000  # over the store's capacity: streamed through
CHUNK = 4096
POLICY = make_policy(retries=1, base_s=0.001, connections=2, first_segment_bytes=FIRST)


class Counted(NullObserver):
    def __init__(self) -> None:
        self.origin_bytes_total = 0
        self.requests: list[str] = []

    def origin_bytes(self, origin: str, size_bytes: int) -> None:
        self.origin_bytes_total += size_bytes

    def origin_request(self, origin: str, status: str) -> None:
        self.requests.append(status)


class IfMatchOrigin(FakeOrigin):
    """Records the If-Match each GET carried."""

    def __init__(self) -> None:
        super().__init__(chunk_bytes=CHUNK, accepts_ranges=True)
        self.if_matches: list[str | None] = []

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> FakeStream:
        self.if_matches.append(if_match)
        return await super().open(key, start, end, if_match, context=context)


@pytest.fixture
def origin() -> IfMatchOrigin:
    return IfMatchOrigin()


@pytest.fixture
def observer() -> Counted:
    return Counted()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "cache", SIZE // 2)
    yield store
    assert store.check() == [] and store.usage().reserved_bytes == 0
    store.close()


@pytest.fixture
async def passthrough(
    origin: FakeOrigin, store: Store, observer: Counted
) -> AsyncIterator[Callable[[str], Fill]]:
    """Start a fill of an object too large for the store; every one is awaited after."""
    fills: list[Fill] = []

    def starting(key: str) -> Fill:
        fill = FillFactory.of(store, POLICY, observer).new(origin.url_for(key), origin, key)
        fill.task = asyncio.create_task(fill.run())
        fills.append(fill)
        return fill

    yield starting
    for fill in fills:
        await fill.discard_passthrough()
        assert fill.task is not None
        await asyncio.gather(fill.task, return_exceptions=True)


async def relay(
    stream: OriginStream, start: int = 0, end: int = SIZE
) -> tuple[bytes, ShardcacheError | None]:
    """What a client of bytes [start, end) is sent, and the error that ended it early."""
    sent = bytearray()

    async def write(data: bytes) -> None:
        sent.extend(data)

    try:
        await send_stream(stream, write, start, end, 30.0, lambda s: None, lambda n: None)
    except ShardcacheError as exc:
        return bytes(sent), exc
    finally:
        await stream.aclose()
    return bytes(sent), None


async def streamed(fill: Fill) -> OriginStream:
    assert await fill.wait_started() is FillState.PASSTHROUGH
    return fill.take_passthrough()


async def test_the_starters_stream_continues_the_first_request_of_the_same_version(
    origin: IfMatchOrigin, observer: Counted, passthrough: Callable[[str], Fill]
) -> None:
    data = os.urandom(SIZE)
    origin.put("a.tar", data)
    stream = await streamed(passthrough("a.tar"))
    assert stream.info.size_bytes == SIZE
    assert stream.info.checksums == origin.checksums["a.tar"]  # learned: a part carries none
    assert await relay(stream) == (data, None)
    assert origin.ranges == [("a.tar", 0, FIRST), ("a.tar", FIRST, None)]
    assert origin.if_matches == [None, origin.etags["a.tar"]]
    assert observer.origin_bytes_total == SIZE, "each byte counted once, as a fill's"
    assert observer.requests == ["ok", "ok"]


async def test_a_range_of_a_streamed_object_is_its_bytes(
    origin: FakeOrigin, passthrough: Callable[[str], Fill]
) -> None:
    data = os.urandom(SIZE)
    origin.put("a.tar", data)
    stream = await streamed(passthrough("a.tar"))
    assert await relay(stream, 5000, 70_000) == (data[5000:70_000], None)


async def test_the_stream_is_taken_once(
    origin: FakeOrigin, passthrough: Callable[[str], Fill]
) -> None:
    origin.put("a.tar", os.urandom(SIZE))
    fill = passthrough("a.tar")
    stream = await streamed(fill)
    with pytest.raises(RuntimeError):
        fill.take_passthrough()
    await stream.aclose()


@pytest.mark.parametrize("honours_if_match", [True, False])
async def test_another_version_after_the_first_segment_is_refused(
    origin: FakeOrigin, passthrough: Callable[[str], Fill], honours_if_match: bool
) -> None:
    """The object changes between the first request and the rest: whether the origin refuses
    If-Match (412) or ignores it and sends the new version, the stream fails, and the client
    has not received even the first segment whole."""
    data = os.urandom(SIZE)
    origin.put("a.tar", data)
    origin.replace_on_open["a.tar"] = (1, os.urandom(SIZE))
    origin.ignore_if_match = not honours_if_match
    sent, error = await relay(await streamed(passthrough("a.tar")))
    assert isinstance(error, OriginChanged)
    assert len(sent) < FIRST and data.startswith(sent)


@pytest.mark.parametrize(("start", "end"), [(0, SIZE), (0, 10_000), (50_000, 60_000)])
async def test_a_checksum_mismatch_is_caught_before_the_last_byte_leaves(
    origin: FakeOrigin, passthrough: Callable[[str], Fill], start: int, end: int
) -> None:
    """The body is verified as a whole whatever the range: one wrong byte near the end of the
    object fails a range near its start too, before that range's last byte was sent."""
    data = os.urandom(SIZE)
    origin.put("a.tar", data)
    origin.corrupt("a.tar", SIZE - 10)
    sent, error = await relay(await streamed(passthrough("a.tar")), start, end)
    assert isinstance(error, IntegrityError)
    assert len(sent) < end - start, "a corrupt body ended whole"
    assert data[start:end].startswith(sent)


async def test_another_reader_gets_its_own_get_of_the_same_version(
    origin: IfMatchOrigin, observer: Counted, passthrough: Callable[[str], Fill]
) -> None:
    data = os.urandom(SIZE)
    origin.put("a.tar", data)
    fill = passthrough("a.tar")
    starters = await streamed(fill)
    other = await fill.join_passthrough()
    assert other.info.checksums == starters.info.checksums == origin.checksums["a.tar"]
    assert await relay(other) == (data, None)
    assert await relay(starters) == (data, None)
    # The first request, the joiner's own whole-object GET, the rest of the starter's.
    assert origin.ranges == [("a.tar", 0, FIRST), ("a.tar", 0, None), ("a.tar", FIRST, None)]
    assert origin.if_matches[1] == origin.etags["a.tar"]
    assert observer.origin_bytes_total == 2 * SIZE


async def test_another_reader_is_refused_another_version(
    origin: FakeOrigin, passthrough: Callable[[str], Fill]
) -> None:
    origin.put("a.tar", os.urandom(SIZE))
    fill = passthrough("a.tar")
    starters = await streamed(fill)
    origin.put("a.tar", os.urandom(SIZE))  # a new version, with its own ETag and checksum
    origin.ignore_if_match = True  # and the origin serves it whatever If-Match says
    with pytest.raises(OriginChanged):
        await fill.join_passthrough()
    await starters.aclose()


async def test_a_short_body_is_never_a_whole_response(
    origin: FakeOrigin, passthrough: Callable[[str], Fill]
) -> None:
    """The origin's connection is cut and retries run out: the client does not get a clean
    short body, the stream fails first."""
    data = os.urandom(SIZE)
    origin.put("a.tar", data)
    origin.fail_at["a.tar"], origin.failures_left["a.tar"] = 60_000, 1
    sent, error = await relay(await streamed(passthrough("a.tar")))
    assert isinstance(error, ShardcacheError)
    assert len(sent) < 60_000 and data.startswith(sent)


async def test_another_reader_that_left_gives_up_its_own_get(
    origin: FakeOrigin, passthrough: Callable[[str], Fill], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joiner's client goes while its own GET waits for the origin (a turn under a cap,
    say): it stops waiting with FillAbandoned, and the GET is given up, not waited for nobody."""
    origin.put("a.tar", os.urandom(SIZE))
    fill = passthrough("a.tar")
    starters = await streamed(fill)
    opening, given_up = origin.open, asyncio.Event()

    async def held_open(*args: object, **kwargs: object) -> object:
        try:
            await asyncio.Event().wait()  # the origin never answers
        except asyncio.CancelledError:
            given_up.set()
            raise
        return await opening(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(origin, "open", held_open)
    left = asyncio.Event()
    joining = asyncio.create_task(fill.join_passthrough(left))
    await asyncio.wait({joining}, timeout=0)
    assert not joining.done()
    left.set()
    async with asyncio.timeout(5):  # deadlines, not a pace: a wait nobody wakes fails here
        with pytest.raises(FillAbandoned):
            await joining
        await given_up.wait()
    await starters.aclose()
