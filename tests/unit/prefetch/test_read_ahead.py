"""Read-ahead (issue 35): it follows the loaders' plans where one covers the origin, and a guess
without one is warmed, never pinned. The core with no sockets: a temp-dir store, the fake origin."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.plans import PlanBook
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.observer import NullObserver
from shardcache.prefetch.queue import PrefetchQueue
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

KiB, MiB = 1024, 1024 * 1024
ONE_CONNECTION = make_policy(retries=1, base_s=0.001, connections=1)
SHARD_BYTES = 48 * KiB


@pytest.fixture
def origin() -> FakeOrigin:
    fake = FakeOrigin(accepts_ranges=True, chunk_bytes=16 * KiB)
    for n in range(12):
        fake.put(f"s{n:02d}.tar", os.urandom(SHARD_BYTES))
    return fake


@pytest.fixture
def plans() -> PlanBook:
    return PlanBook()


@pytest.fixture
async def cache(tmp_path: Path, origin: FakeOrigin, plans: PlanBook) -> AsyncIterator[ShardCache]:
    store = Store(tmp_path / "cache", 64 * MiB, admission=ScanResistantAdmission(), plans=plans)
    shard_cache = ShardCache(store, {"fake": origin}, ONE_CONNECTION, NullObserver())
    yield shard_cache
    await shard_cache.aclose()
    store.close()


async def _until(what: str, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _fetched(origin: FakeOrigin) -> set[str]:
    return {key for key, start in origin.opens if start == 0}


def _read(cache: ShardCache, queue: PrefetchQueue, key: str) -> None:
    """What the server does on a client's read: the plans see it, then read-ahead."""
    assert cache.store.plans is not None
    cache.store.plans.on_request(cache.cache_key("fake", key)[1], False)
    queue.on_client_read("fake", key)


async def test_read_ahead_follows_the_nodes_plan_not_the_numbering(
    cache: ShardCache, origin: FakeOrigin, plans: PlanBook
) -> None:
    """Node 0 of two reads the even shards: read-ahead of s00 is s02 and s04 (its plan's next),
    never s01 (node 1's). Before, it queued s01 and s02 whatever the plans said."""
    even = [f"s{n:02d}.tar" for n in range(0, 12, 2)]
    plans.post("node0", 0, [origin.url_for(key) for key in even])
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=2)
    queue.start()
    try:
        _read(cache, queue, "s00.tar")
        await _until("the read-ahead", lambda: queue.completed == 2)
        assert _fetched(origin) == {"s02.tar", "s04.tar"}
        _read(cache, queue, "s01.tar")  # a key no plan reads: nothing to follow
        assert queue.depth == 0
    finally:
        await queue.aclose()
    assert origin.heads["s01.tar"] == 0 and origin.heads["s03.tar"] == 0


async def test_read_ahead_of_a_plans_keys_pins_them_for_its_loader(
    cache: ShardCache, origin: FakeOrigin, plans: PlanBook
) -> None:
    """Keys a plan reads are look-ahead: pinned until read, within the budget."""
    plans.post("node0", 0, [origin.url_for(f"s{n:02d}.tar") for n in (0, 2, 4)])
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=1)
    queue.start()
    try:
        _read(cache, queue, "s00.tar")
        await _until("the read-ahead", lambda: queue.completed == 1)
        assert cache.unread_bytes == SHARD_BYTES
    finally:
        await queue.aclose()


async def test_stray_reads_without_a_plan_warm_and_pin_nothing(
    tmp_path: Path, origin: FakeOrigin
) -> None:
    """Two stray reads on a fresh daemon: their guessed neighbours are cached, not pinned, and
    hold none of the look-ahead budget, so the loader's own prefetch starts at once. Before,
    four pinned guesses filled a budget of four shards and the loader's prefetch waited."""
    store = Store(tmp_path / "cache", 64 * MiB)
    cache = ShardCache(store, {"fake": origin}, ONE_CONNECTION, NullObserver())
    queue = PrefetchQueue(cache, 2, 4 * SHARD_BYTES, readahead=2)
    queue.start()
    try:
        queue.on_client_read("fake", "s00.tar")
        queue.on_client_read("fake", "s06.tar")
        await _until("the read-ahead", lambda: queue.completed == 4)
        assert _fetched(origin) == {"s01.tar", "s02.tar", "s07.tar", "s08.tar"}
        assert cache.unread_bytes == 0 and queue.budget.admitted_bytes == 0
        await queue.submit([("fake", "s10.tar")])
        await _until("the loader's prefetch", lambda: queue.completed == 5)
        assert cache.unread_bytes == SHARD_BYTES and queue.waiting_for is None
    finally:
        await queue.aclose()
        await cache.aclose()
        store.close()


async def test_a_guess_the_origin_lacks_is_remembered_as_missing(
    tmp_path: Path, origin: FakeOrigin
) -> None:
    store = Store(tmp_path / "cache", 64 * MiB)
    cache = ShardCache(store, {"fake": origin}, ONE_CONNECTION, NullObserver())
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=2)
    queue.start()
    try:
        queue.on_client_read("fake", "s11.tar")  # s12 and s13 do not exist
        await _until("the guess", lambda: origin.heads["s12.tar"] == 1 and queue.depth == 0)
        await _until("the queue to settle", lambda: queue.in_flight == 0)
        queue.on_client_read("fake", "s11.tar")
        assert queue.depth == 0
    finally:
        await queue.aclose()
        await cache.aclose()
        store.close()
    assert origin.heads["s12.tar"] == 1 and queue.failed == 0
