"""Single flight (`cache.flights`, and `ShardCache.open` around it): one fill per key, joined by
every concurrent reader, which all get its bytes or its error; the cache re-checked when a fill
came and went while a lookup ran; a detached fill joined by no one. No sockets, no sleeps: the
origin holds its answer until every reader has joined (the store's public `note_request`)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator

import pytest

from shardcache.cache.entry import Entry
from shardcache.cache.fill import Fill, FillFactory
from shardcache.cache.flights import Flights
from shardcache.cache.lease import Lease, Result
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.errors import OriginNotFound, OriginUnavailable, ShardcacheError
from shardcache.observer import NullObserver
from shardcache.origins.base import NEW_REQUEST, RequestContext
from tests.unit.fakes import FakeOrigin, FakeStream
from tests.unit.policies import make_policy

MiB = 1024 * 1024
READERS = 8
POLICY = make_policy(retries=1, base_s=0.001)


class HeldOrigin(FakeOrigin):
    """A fake whose GETs wait for `answer` before the origin says anything (not even 404)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.asked = asyncio.Event()

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> FakeStream:
        self.asked.set()
        await self.answer.wait()
        return await super().open(key, start, end, if_match, context=context)


@pytest.fixture
def origin() -> HeldOrigin:
    return HeldOrigin()


@pytest.fixture
async def cache(store: Store, origin: HeldOrigin) -> AsyncIterator[ShardCache]:
    shard_cache = ShardCache(store, {"fake": origin}, POLICY, NullObserver())
    yield shard_cache
    await shard_cache.aclose()


def joined_after(store: Store, count: int, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set once `count` reads missed the store: `ShardCache.open` notes the miss and
    joins or starts the fill in the same step, so by then every one of them holds the fill."""
    misses = 0
    every_one = asyncio.Event()
    note = store.note_request

    def counting(key: str, found: bool) -> None:
        nonlocal misses
        note(key, found)
        misses += not found
        if misses >= count:
            every_one.set()

    monkeypatch.setattr(store, "note_request", counting)
    return every_one


async def read_all(lease: Lease) -> bytes:
    try:
        if lease.entry is not None:
            return os.pread(lease.entry.fd, lease.size_bytes, 0)
        assert lease.fill is not None
        body = b""
        while len(body) < lease.size_bytes:
            limit = await lease.fill.wait_readable(len(body), lease.size_bytes)
            body += os.pread(lease.fill_fd, limit - len(body), len(body))
        return body
    finally:
        await lease.aclose()


async def test_concurrent_reads_of_one_key_fetch_it_once_and_all_get_its_bytes(
    cache: ShardCache, origin: HeldOrigin, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(MiB + 17)
    origin.put("a.tar", data)
    everyone = joined_after(store, READERS, monkeypatch)
    opening = [asyncio.create_task(cache.open("fake", "a.tar")) for _ in range(READERS)]
    await everyone.wait()
    assert len(cache.flights) == 1
    origin.answer.set()
    leases = await asyncio.gather(*opening)
    bodies = await asyncio.gather(*(read_all(lease) for lease in leases))
    assert [body == data for body in bodies] == [True] * READERS
    assert sorted(lease.result.value for lease in leases) == ["coalesced"] * 7 + ["miss"]
    assert origin.opens == [("a.tar", 0)]
    assert {id(lease.fill) for lease in leases} == {id(leases[0].fill)}


@pytest.mark.parametrize("failure", ["not_found", "unavailable"])
async def test_concurrent_reads_of_one_key_all_get_the_one_fetchs_error(
    cache: ShardCache,
    origin: HeldOrigin,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    """A fetch that fails before its first byte fails every reader that joined it, with the
    same error, and the origin is asked once per attempt, not once per reader."""
    if failure == "unavailable":
        origin.put("a.tar", b"x" * 1000)
        origin.open_failures["a.tar"] = 99
    everyone = joined_after(store, READERS, monkeypatch)
    opening = [asyncio.create_task(cache.open("fake", "a.tar")) for _ in range(READERS)]
    await everyone.wait()
    origin.answer.set()
    outcomes = await asyncio.gather(*opening, return_exceptions=True)
    errors = [outcome for outcome in outcomes if isinstance(outcome, ShardcacheError)]
    assert len(errors) == READERS, outcomes
    expected = OriginNotFound if failure == "not_found" else OriginUnavailable
    assert all(type(error) is expected for error in errors)
    assert len({id(error) for error in errors}) == 1, "one fetch, one error, for everyone"
    attempts = 1 if failure == "not_found" else 1 + POLICY.retries
    assert len(origin.opens) == attempts
    assert len(cache.flights) == 0


async def test_a_failed_flight_is_not_remembered(cache: ShardCache, origin: HeldOrigin) -> None:
    """An error is the answer of one flight only: the next read asks the origin again."""
    origin.answer.set()
    with pytest.raises(OriginNotFound):
        await cache.open("fake", "a.tar")
    origin.put("a.tar", b"now it is there")
    assert await read_all(await cache.open("fake", "a.tar")) == b"now it is there"
    assert [key for key, _ in origin.opens] == ["a.tar", "a.tar"]


async def test_a_fill_that_came_and_went_during_the_lookup_is_found_by_the_recheck(
    cache: ShardCache, origin: HeldOrigin, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving: (1) A finds no fill in flight; (2) A's store lookup runs on a thread
    and finds nothing; (3) meanwhile B starts a fill, reads it, and it commits and finishes;
    (4) A's lookup returns its stale "not cached". A must look again, not fetch a second time."""
    data = os.urandom(200_000)
    origin.put("a.tar", data)
    origin.answer.set()
    loop = asyncio.get_running_loop()
    looked, go_on = asyncio.Event(), threading.Event()
    lookup, calls = store.lookup, 0

    def stale_first_lookup(key: str) -> Entry | None:
        nonlocal calls
        calls += 1
        entry = lookup(key)
        if calls == 1:
            loop.call_soon_threadsafe(looked.set)
            go_on.wait(timeout=60)
        return entry

    monkeypatch.setattr(store, "lookup", stale_first_lookup)
    try:
        reader_a = asyncio.create_task(cache.open("fake", "a.tar"))
        await looked.wait()  # (2): A's lookup found nothing and is held
        lease_b = await cache.open("fake", "a.tar")  # (3)
        fill = lease_b.fill
        assert lease_b.result is Result.MISS and fill is not None
        assert await read_all(lease_b) == data
        await fill.wait_finished()
    finally:
        go_on.set()  # (4)
    lease_a = await reader_a
    assert lease_a.result is Result.HIT
    assert await read_all(lease_a) == data
    assert origin.opens == [("a.tar", 0)], "the object was fetched twice"


# -- the map itself --------------------------------------------------------------------------


@pytest.fixture
def fills(store: Store, origin: HeldOrigin) -> list[Fill]:
    def fill(key: str) -> Fill:
        return FillFactory.of(store, POLICY, NullObserver()).new(origin.url_for(key), origin, key)

    return [fill("a"), fill("a"), fill("b")]


def test_join_or_start_starts_once_and_later_callers_join(fills: list[Fill]) -> None:
    flights = Flights()
    started: list[Fill] = []

    def start(fill: Fill) -> Fill:
        started.append(fill)
        return fill

    first, second, other = fills
    assert flights.join_or_start(first.cache_key, lambda: start(first)) == (first, False)
    assert flights.join_or_start(first.cache_key, lambda: start(second)) == (first, True)
    assert flights.join_or_start(other.cache_key, lambda: start(other)) == (other, False)
    assert started == [first, other]
    assert flights.get(first.cache_key) is first
    assert sorted(flights.keys()) == sorted([first.cache_key, other.cache_key])
    assert len(flights) == 2


def test_a_finished_flight_leaves_and_the_next_caller_starts_afresh(fills: list[Fill]) -> None:
    flights = Flights()
    first, second, _ = fills
    flights.join_or_start(first.cache_key, lambda: first)
    flights.finish(first)
    assert flights.get(first.cache_key) is None and len(flights) == 0
    assert flights.join_or_start(first.cache_key, lambda: second) == (second, False)
    flights.finish(first)  # an old fill finishing late must not drop the new one
    assert flights.get(first.cache_key) is second


def test_a_detached_fill_is_joined_by_no_one_but_still_iterated(fills: list[Fill]) -> None:
    """A purged fill runs on for its readers: shutdown must still find (and cancel) it."""
    flights = Flights()
    first, second, _ = fills
    flights.join_or_start(first.cache_key, lambda: first)
    flights.detach(first)
    assert flights.get(first.cache_key) is None and flights.keys() == []
    assert list(flights) == [first] and len(flights) == 1
    assert flights.join_or_start(first.cache_key, lambda: second) == (second, False)
    assert set(map(id, flights)) == {id(first), id(second)} and len(flights) == 2
    flights.finish(first)
    assert list(flights) == [second] and flights.get(first.cache_key) is second
    flights.detach(first)  # no longer registered: detaching it again changes nothing
    assert list(flights) == [second]


def test_an_ended_fill_is_counted_for_the_recheck_and_a_forgotten_one_is_not(
    fills: list[Fill],
) -> None:
    flights = Flights()
    first, second, other = fills
    mark = flights.mark(first.cache_key)
    flights.join_or_start(first.cache_key, lambda: first)
    flights.finish(first)  # stopped, its task not ended yet: not counted
    assert not flights.ended_since(first.cache_key, mark)
    flights.ended(first)
    assert flights.ended_since(first.cache_key, mark)
    assert not flights.ended_since(other.cache_key, flights.mark(other.cache_key))
    flights.join_or_start(first.cache_key, lambda: second)
    flights.ended(first)  # an old fill ending late counts, and leaves the new one registered
    assert flights.get(first.cache_key) is second


async def test_look_asks_again_when_a_fill_ended_during_the_lookup(fills: list[Fill]) -> None:
    """(1) nothing in flight; (2) the lookup runs and finds nothing; (3) meanwhile a fill
    ends; (4) `look` asks again, and the second lookup finds the entry."""
    flights = Flights()
    first, second, _ = fills
    answers: list[str | None] = [None, "entry"]

    async def lookup() -> str | None:
        if len(answers) == 2:  # (3): during the first lookup
            flights.join_or_start(first.cache_key, lambda: first)
            flights.ended(first)
        return answers.pop(0)

    assert await flights.look(first.cache_key, lookup) == "entry"
    assert answers == []

    async def nothing() -> str | None:
        return None

    assert await flights.look(first.cache_key, nothing) is None  # no fill ended: one look
    flights.join_or_start(first.cache_key, lambda: second)

    async def unasked() -> str | None:
        raise AssertionError("a fill in flight is joined without a lookup")

    assert await flights.look(first.cache_key, unasked) is second
