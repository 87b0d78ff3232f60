"""Look-ahead pins that end (issue 35): read, batch dropped, plan ended or replaced, job silent,
bound reached; and a queue that never waits on pins no loader will read. The ledger with a fake
clock; the queue on a temp-dir store and the fake origin."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.plans import PlanBook, Reader
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.observer import NullObserver
from shardcache.prefetch.pins import MIN_BOUND_S, MIN_SILENT_S, READ_AHEAD, PinLedger
from shardcache.prefetch.queue import PrefetchQueue
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

KiB, MiB = 1024, 1024 * 1024
ONE_CONNECTION = make_policy(retries=1, base_s=0.001, connections=1)
SHARD_BYTES = 32 * KiB


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the ledger alone --------------------------------------------------------------------------


def test_a_read_pin_is_forgotten() -> None:
    ledger = PinLedger(300.0, Clock())
    ledger.add("u", "batch 1")
    assert ledger.expired({}, lambda url: None) == [] and "u" not in ledger


def test_an_unplanned_pin_lasts_until_the_ceiling() -> None:
    clock = Clock()
    ledger = PinLedger(300.0, clock)
    ledger.add("u", "batch 1")
    clock.now += 299
    assert ledger.expired({"u": 1}, lambda url: None) == []
    clock.now += 1
    assert ledger.expired({"u": 1}, lambda url: None) == [("u", "bound")]


def test_a_planned_pin_ends_when_no_plan_reads_it_any_more() -> None:
    ledger = PinLedger(300.0, Clock())
    ledger.add("u", "batch 1")
    reading = Reader("node0", 2.0, 1.0, 0.5)
    assert ledger.expired({"u": 1}, lambda url: reading) == []
    assert ledger.held({"u": 1}) == {"node0": 1}  # named by its job once a plan reads it
    assert ledger.expired({"u": 1}, lambda url: None) == [("u", "unplanned")]


def test_a_read_ahead_pin_ends_when_no_plan_reads_it_even_before_a_sweep_saw_its_job() -> None:
    ledger = PinLedger(300.0, Clock())
    ledger.add("u", READ_AHEAD)  # read-ahead pins only what a plan reads next
    assert ledger.expired({"u": 1}, lambda url: None) == [("u", "unplanned")]


def test_a_planned_pin_ends_when_its_job_falls_silent() -> None:
    ledger = PinLedger(300.0, Clock())
    ledger.add("u", "read-ahead")
    assert ledger.expired({"u": 1}, lambda url: Reader("j", 2.0, 1.0, MIN_SILENT_S - 1)) == []
    silent = Reader("j", 2.0, 1.0, MIN_SILENT_S + 1)
    assert ledger.expired({"u": 1}, lambda url: silent) == [("u", "silent")]


def test_a_planned_pin_is_bounded_by_its_jobs_pace() -> None:
    """Read in 40 s at 10 s a shard: the pin lasts 4 x (40 + 10) = 200 s, not the 300 s ceiling."""
    clock = Clock()
    ledger = PinLedger(300.0, clock)
    ledger.add("u", "batch 1")
    reader = Reader("j", 40.0, 10.0, 0.0)
    assert ledger.expired({"u": 1}, lambda url: reader) == []
    clock.now += 199
    assert ledger.expired({"u": 1}, lambda url: reader) == []
    clock.now += 1
    assert ledger.expired({"u": 1}, lambda url: reader) == [("u", "bound")]


def test_a_fast_jobs_bound_has_a_floor() -> None:
    clock = Clock()
    ledger = PinLedger(300.0, clock)
    ledger.add("u", "batch 1")
    reader = Reader("j", 0.1, 0.05, 0.0)
    assert ledger.expired({"u": 1}, lambda url: reader) == []
    clock.now += MIN_BOUND_S - 1
    assert ledger.expired({"u": 1}, lambda url: reader) == []
    clock.now += 1
    assert ledger.expired({"u": 1}, lambda url: reader) == [("u", "bound")]


# -- the queue -----------------------------------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def plans(clock: Clock) -> PlanBook:
    return PlanBook(clock=clock)


@pytest.fixture
def origin() -> FakeOrigin:
    fake = FakeOrigin(accepts_ranges=True, chunk_bytes=16 * KiB)
    for n in range(12):
        fake.put(f"s{n:02d}.tar", os.urandom(SHARD_BYTES))
    return fake


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


def _urls(origin: FakeOrigin, numbers: range | list[int]) -> list[str]:
    return [origin.url_for(f"s{n:02d}.tar") for n in numbers]


async def _fill_the_budget(queue: PrefetchQueue, cache: ShardCache) -> None:
    """Two look-ahead shards, s00 and s01: the whole budget of two shards."""
    await queue.submit([("fake", "s00.tar"), ("fake", "s01.tar")])
    await _until("the look-ahead", lambda: queue.completed == 2)
    assert cache.unread_bytes == 2 * SHARD_BYTES


async def test_a_plan_posted_without_its_shards_frees_the_budget_a_waiting_item_needs(
    cache: ShardCache, origin: FakeOrigin, plans: PlanBook, clock: Clock
) -> None:
    """The queue never waits on pins no loader will read: the job's new plan leaves s00 and s01
    out, and s02 of the new plan waits for the budget only until the pins are checked (at once,
    when the wait begins). Before, s02 waited for good: `N pending, 0 in flight`."""
    plans.post("job", 0, _urls(origin, range(4)))
    queue = PrefetchQueue(cache, 2, 2 * SHARD_BYTES, readahead=0, clock=clock)
    queue.start()
    try:
        await _fill_the_budget(queue, cache)
        assert queue.held_by() == {"batch 1": 2 * SHARD_BYTES}  # no check of the pins yet
        plans.post("job", 0, _urls(origin, [2, 3]))  # a new plan, without s00 and s01
        await queue.submit([("fake", "s02.tar")])
        await _until("s02 past the budget", lambda: queue.completed == 3)
        assert cache.unread_bytes == SHARD_BYTES and queue.pins_ended["unplanned"] == 2
    finally:
        await queue.aclose()


async def test_a_job_that_ends_its_plan_releases_its_pins(
    cache: ShardCache, origin: FakeOrigin, plans: PlanBook, clock: Clock
) -> None:
    plans.post("job", 0, _urls(origin, range(4)))
    queue = PrefetchQueue(cache, 2, 2 * SHARD_BYTES, readahead=0, clock=clock)
    queue.start()
    try:
        await _fill_the_budget(queue, cache)
        await queue.sweep_pins()
        plans.post("job", 0, [])  # `"urls": []`: the job is done
        assert await queue.sweep_pins() == 2 * SHARD_BYTES
        assert cache.unread_bytes == 0 and queue.held_by() == {}
    finally:
        await queue.aclose()


async def test_a_silent_jobs_pins_end(
    cache: ShardCache, origin: FakeOrigin, plans: PlanBook, clock: Clock
) -> None:
    """The job read two shards a second apart (a pace of 1 s), then stopped."""
    keys = _urls(origin, range(6))
    plans.post("job", 0, keys)
    plans.on_request(keys[0], False)
    clock.now += 1.0
    plans.on_request(keys[1], False)
    queue = PrefetchQueue(cache, 2, 2 * SHARD_BYTES, readahead=0, clock=clock)
    queue.start()
    try:
        await queue.submit([("fake", "s02.tar"), ("fake", "s03.tar")])
        await _until("the look-ahead", lambda: queue.completed == 2)
        assert await queue.sweep_pins() == 0
        clock.now += MIN_SILENT_S + 1
        assert await queue.sweep_pins() == 2 * SHARD_BYTES
        assert queue.pins_ended["silent"] == 2
    finally:
        await queue.aclose()


async def test_a_pin_no_plan_names_ends_at_the_ceiling(
    cache: ShardCache, origin: FakeOrigin, clock: Clock
) -> None:
    queue = PrefetchQueue(cache, 2, 2 * SHARD_BYTES, readahead=0, clock=clock, max_pin_s=60.0)
    queue.start()
    try:
        await _fill_the_budget(queue, cache)
        assert queue.held_by() == {"batch 1": 2 * SHARD_BYTES}
        clock.now += 59
        assert await queue.sweep_pins() == 0
        clock.now += 1
        assert await queue.sweep_pins() == 2 * SHARD_BYTES
        assert queue.pins_ended["bound"] == 2 and cache.unread_bytes == 0
    finally:
        await queue.aclose()


async def test_a_read_shard_and_a_cancelled_batch_end_their_pins(
    cache: ShardCache, origin: FakeOrigin, clock: Clock
) -> None:
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=0, clock=clock)
    queue.start()
    try:
        await _fill_the_budget(queue, cache)
        lease = await cache.open("fake", "s00.tar")  # a loader reads s00
        await lease.aclose()
        assert queue.held_by() == {"batch 1": SHARD_BYTES}
        assert queue.clear(1) == (0, SHARD_BYTES)  # `shardcache prefetch --cancel 1`
        assert queue.held_by() == {} and cache.unread_bytes == 0
    finally:
        await queue.aclose()


async def test_the_wait_names_the_jobs_holding_the_budget(
    cache: ShardCache, origin: FakeOrigin, plans: PlanBook, clock: Clock
) -> None:
    plans.post("node0-worker3", 0, _urls(origin, range(6)))
    queue = PrefetchQueue(cache, 2, 2 * SHARD_BYTES, readahead=0, clock=clock)
    queue.start()
    try:
        await _fill_the_budget(queue, cache)
        await queue.submit([("fake", "s02.tar")])  # the plan reads it: a wait for its loader
        await _until("the wait", lambda: queue.waiting_for is not None)
        await queue.sweep_pins()
        assert queue.waiting_for is not None
        assert "held by node0-worker3 64 KiB" in queue.waiting_for, queue.waiting_for
        assert queue.status()["held_by"] == {"node0-worker3": 2 * SHARD_BYTES}
    finally:
        await queue.aclose()
