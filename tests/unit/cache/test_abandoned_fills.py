"""Item 4 (b): a fill every reader has left, and that nothing wants cached for later (no
prefetch started or joined it), stops; a reader that joins before the last one leaves keeps
it, one that comes after starts a fill of its own. No sockets: a temp-dir store and a fake
origin whose bodies wait on a gate."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardcache.cache.fill import FillState
from shardcache.cache.lease import Result
from shardcache.cache.shard_cache import PrefetchOutcome, ShardCache, Sized
from shardcache.cache.store import Store
from shardcache.observer import NullObserver
from tests.unit.cache.test_shard_cache import read_all
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

MiB = 1024 * 1024


@pytest.fixture
def origin() -> FakeOrigin:
    fake = FakeOrigin(gate=asyncio.Event())  # bodies wait until the test opens the gate
    fake.put("a.tar", os.urandom(MiB))
    return fake


@pytest.fixture
async def cache(tmp_path: Path, origin: FakeOrigin) -> AsyncIterator[ShardCache]:
    store = Store(tmp_path / "cache", 8 * MiB)
    shard_cache = ShardCache(
        store, {"fake": origin}, make_policy(retries=2, base_s=0.001), NullObserver()
    )
    yield shard_cache
    await shard_cache.aclose()
    assert store.check() == []
    store.close()


async def _ended(state: asyncio.Future[FillState] | asyncio.Task[FillState]) -> FillState:
    async with asyncio.timeout(2):
        return await state


async def test_a_fill_its_only_reader_left_stops(cache: ShardCache, origin: FakeOrigin) -> None:
    lease = await cache.open("fake", "a.tar")
    fill = lease.fill
    assert fill is not None
    await lease.aclose()  # the client went away; the origin has sent nothing yet
    assert cache.flights.get(fill.cache_key) is None  # at once: nobody can join it now
    assert await _ended(asyncio.ensure_future(fill.wait_finished())) is FillState.FAILED
    assert await asyncio.to_thread(cache.store.peek, fill.cache_key) is None


async def test_a_reader_that_joined_first_keeps_it_and_one_after_starts_anew(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """The race, in steps: (1) A starts the fill, (2) B joins it, (3) A leaves: B still
    holds it, it goes on; (4) B leaves: it stops, and leaves the flights at once; (5) C
    comes: a fill of its own, served whole."""
    first = await cache.open("fake", "a.tar")
    second = await cache.open("fake", "a.tar")
    assert second.result is Result.COALESCED and second.fill is first.fill
    await first.aclose()
    assert cache.flights.get(second.fill.cache_key) is second.fill
    abandoned = second.fill
    await second.aclose()
    third = await cache.open("fake", "a.tar")
    assert third.result is Result.MISS and third.fill is not abandoned
    origin.gate.set()
    assert await read_all(third) == origin.objects["a.tar"]


async def test_a_reader_joining_while_the_first_waits_for_its_answer_is_not_stranded(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """A starter cancelled while it waits for the origin's answer lets the fill go; a reader
    that joined meanwhile still holds it and is served (passes before the fix too: it
    guards the stop against stranding a joiner)."""
    starter = asyncio.create_task(cache.open("fake", "a.tar"))
    while not cache.flights.get(origin.url_for("a.tar")):
        await asyncio.sleep(0)
    joiner = asyncio.create_task(cache.open("fake", "a.tar"))
    await asyncio.sleep(0)
    starter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starter
    origin.gate.set()
    lease = await joiner
    assert await read_all(lease) == origin.objects["a.tar"]


async def test_a_starter_cancelled_before_its_answer_lets_the_fill_go(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    starter = asyncio.create_task(cache.open("fake", "a.tar"))
    while not cache.flights.get(origin.url_for("a.tar")):
        await asyncio.sleep(0)
    fill = cache.flights.get(origin.url_for("a.tar"))
    assert fill is not None
    starter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starter
    assert await _ended(asyncio.ensure_future(fill.wait_finished())) is FillState.FAILED


async def test_a_prefetch_goes_on_without_readers_and_so_does_a_fill_it_joined(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    origin.put("b.tar", os.urandom(MiB))
    sized = await cache.size_prefetch("fake", "a.tar")
    assert isinstance(sized, Sized)
    outcome, fetched = await cache.start_prefetch(sized)
    assert outcome is PrefetchOutcome.FETCHED and fetched is not None
    lease = await cache.open("fake", "a.tar")  # a client reads it early, then leaves
    await lease.aclose()
    client = await cache.open("fake", "b.tar")  # a client's fill, then a prefetch joins it
    joining = await cache.size_prefetch("fake", "b.tar")  # nothing to size: it joins
    assert not isinstance(joining, Sized)
    outcome, joined = joining
    assert outcome is PrefetchOutcome.JOINED and joined is client.fill
    await client.aclose()
    origin.gate.set()
    for fill in (fetched, joined):
        assert await _ended(asyncio.ensure_future(fill.wait_finished())) is FillState.COMMITTED
