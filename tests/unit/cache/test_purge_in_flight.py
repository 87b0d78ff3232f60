"""A purge reaches the fills in flight: one still fetching finishes for its readers and is not
kept (DISCARDED, nothing indexed), and no request joins it after; one whose body is complete
is committing already, so the purge waits for it and deletes its entry. No sockets: a temp-dir
store and a fake origin whose bodies wait on a gate."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardcache.cache.entry import EntryMeta, Reservation
from shardcache.cache.fill import FillState
from shardcache.cache.lease import Result
from shardcache.cache.purge import Purged
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.errors import NotCached
from shardcache.observer import NullObserver
from tests.unit.cache.test_shard_cache import read_all
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

MiB = 1024 * 1024


class HeldCommitStore(Store):
    """A store whose commits wait for `release` after saying they began (`committing`)."""

    committing: threading.Event
    release: threading.Event

    def commit(self, reservation: Reservation, key: str, meta: EntryMeta) -> None:
        self.committing.set()
        assert self.release.wait(10), "the test never released the commit"
        super().commit(reservation, key, meta)


@pytest.fixture
def origin() -> FakeOrigin:
    fake = FakeOrigin(gate=asyncio.Event())  # bodies wait until the test opens the gate
    fake.put("a.tar", os.urandom(MiB))
    fake.put("b.tar", os.urandom(MiB))
    return fake


@pytest.fixture
def store(tmp_path: Path) -> HeldCommitStore:
    held = HeldCommitStore(tmp_path / "cache", 8 * MiB)
    held.committing, held.release = threading.Event(), threading.Event()
    held.release.set()  # commits go through unless a test holds them
    return held


@pytest.fixture
async def cache(store: HeldCommitStore, origin: FakeOrigin) -> AsyncIterator[ShardCache]:
    shard_cache = ShardCache(
        store, {"fake": origin}, make_policy(retries=2, base_s=0.001), NullObserver()
    )
    yield shard_cache
    store.release.set()
    await shard_cache.aclose()
    assert store.check() == []
    store.close()


async def _finished(cache: ShardCache) -> None:
    async with asyncio.timeout(5):
        await asyncio.gather(*(fill.wait_finished() for fill in cache.flights))


async def test_a_fill_purged_while_fetching_serves_its_reader_and_is_not_kept(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    lease = await cache.open("fake", "a.tar")
    purged_fill = lease.fill
    assert purged_fill is not None
    url = purged_fill.cache_key

    assert await cache.purge("fake", "a.tar") == Purged(deleted=[], not_kept=[url])
    assert cache.flights.get(url) is None  # joined by no one from now on
    assert purged_fill in list(cache.flights)  # still running: shutdown would cancel it
    after = await cache.open("fake", "a.tar")
    assert after.result is Result.MISS and after.fill is not purged_fill

    origin.gate.set()
    assert await read_all(lease) == origin.objects["a.tar"]  # whole, verified
    assert await read_all(after) == origin.objects["a.tar"]
    await _finished(cache)
    assert purged_fill.state is FillState.DISCARDED
    assert after.fill is None  # closed by read_all
    entry = await asyncio.to_thread(cache.store.lookup, url)
    assert entry is not None  # the fill started after the purge was kept
    entry.close()


async def test_a_purge_waits_for_a_commit_under_way_and_deletes_its_entry(
    cache: ShardCache, origin: FakeOrigin, store: HeldCommitStore
) -> None:
    """In steps: (1) the body is complete and verified, its commit is on a worker thread
    (held); (2) the purge starts: too late to keep the fill from committing, so it waits for
    it; (3) the commit goes through; (4) the purge deletes the entry. Without the wait, its
    delete ran beside the commit, found nothing, and the entry was indexed after."""
    store.release.clear()
    origin.gate.set()
    lease = await cache.open("fake", "a.tar")
    fill = lease.fill
    assert fill is not None
    assert await read_all(lease) == origin.objects["a.tar"]  # its last byte: VERIFIED
    await asyncio.to_thread(store.committing.wait, 5)
    assert fill.state is FillState.VERIFIED
    # Created before the commit is released: its first step (which sees VERIFIED and waits)
    # runs before the commit's completion is handed back to the loop.
    purge = asyncio.create_task(cache.purge("fake", "a.tar"))
    store.release.set()
    assert await purge == Purged(deleted=[fill.cache_key], not_kept=[])
    assert fill.state is FillState.COMMITTED
    assert await asyncio.to_thread(store.peek, fill.cache_key) is None


async def test_a_purge_of_neither_an_entry_nor_a_fill_is_not_cached(cache: ShardCache) -> None:
    with pytest.raises(NotCached):
        await cache.purge("fake", "b.tar")


async def test_purging_entries_reaches_each_fill_once(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """A bulk purge pages through the index, and each page looks at the fills in flight:
    one purged already (detached) is not counted again."""
    leases = [await cache.open("fake", key) for key in ("a.tar", "b.tar")]
    urls = [lease.fill.cache_key for lease in leases if lease.fill is not None]
    origin_ = cache.origin("fake")
    assert await cache.purge_entries(origin_, urls) == Purged(deleted=[], not_kept=urls)
    assert await cache.purge_entries(origin_, urls) == Purged(deleted=[], not_kept=[])
    origin.gate.set()
    for lease in leases:
        await read_all(lease)
    await _finished(cache)
    assert [await asyncio.to_thread(cache.store.peek, url) for url in urls] == [None, None]
