"""The prefetch queue's order and concurrency (issue 13), on the core with no sockets: a temp-dir
store and the in-memory fake origin, paced where bandwidth matters."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.plans import PlanBook
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.errors import QueueFull
from shardcache.observer import NullObserver
from shardcache.prefetch import queue as prefetch
from shardcache.prefetch import slots
from shardcache.prefetch.queue import PrefetchQueue
from shardcache.prefetch.slots import MAX_CONCURRENCY, START_CONCURRENCY
from tests.unit.fakes import FakeOrigin, Pace
from tests.unit.policies import make_policy

KiB, MiB = 1024, 1024 * 1024
ONE_CONNECTION = make_policy(retries=1, base_s=0.001, connections=1)


@pytest.fixture
def origin() -> FakeOrigin:
    return FakeOrigin(accepts_ranges=True, chunk_bytes=16 * KiB)


@pytest.fixture
async def cache(tmp_path: Path, origin: FakeOrigin) -> AsyncIterator[ShardCache]:
    store = Store(tmp_path / "cache", 256 * MiB)
    shard_cache = ShardCache(store, {"fake": origin}, ONE_CONNECTION, NullObserver())
    yield shard_cache
    await shard_cache.aclose()
    store.close()


async def _until(what: str, condition, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _fetch_order(origin: FakeOrigin) -> list[str]:
    return [key for key, start in origin.opens if start == 0]


async def test_eight_workers_posting_their_next_four_are_served_in_reading_order(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """A DataLoader reads its workers in turn: w0's next shard, w1's, … w7's, then w0's second.
    Served first in, first out, the eighth worker's first shard came after 28 others."""
    for worker in range(8):
        for place in range(4):
            origin.put(f"w{worker}-{place}.tar", os.urandom(32 * KiB))
    origin.gate = asyncio.Event()  # hold the first fetch until every post is in
    queue = PrefetchQueue(cache, 1, 1 << 40, readahead=0)
    queue.start()
    try:
        for worker in range(8):
            await queue.submit([("fake", f"w{worker}-{place}.tar") for place in range(4)])
        origin.gate.set()
        await _until("every prefetch", lambda: queue.completed == 32)
    finally:
        await queue.aclose()
    order = _fetch_order(origin)
    assert order[0] == "w0-0.tar"  # started before the other posts arrived
    expected = [f"w{worker}-{place}.tar" for place in range(4) for worker in range(8)]
    assert order[1:] == [key for key in expected if key != "w0-0.tar"]


async def test_a_plan_orders_the_queue(tmp_path: Path, origin: FakeOrigin) -> None:
    """Where a loader's plan names the keys, its order wins over the order they were posted in."""
    plans = PlanBook()
    store = Store(tmp_path / "planned", 64 * MiB, admission=ScanResistantAdmission(), plans=plans)
    cache = ShardCache(store, {"fake": origin}, ONE_CONNECTION, NullObserver())
    keys = [f"s{n}.tar" for n in range(6)]
    for key in keys:
        origin.put(key, os.urandom(32 * KiB))
    plans.post("job", 0, [origin.url_for(k) for k in ["s0.tar", "s5.tar", "s3.tar", "s1.tar"]])
    origin.gate = asyncio.Event()
    queue = PrefetchQueue(cache, 1, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", "s0.tar")])
        posted = ["s1.tar", "s3.tar", "s5.tar", "s2.tar", "s4.tar"]
        await queue.submit([("fake", key) for key in posted])
        origin.gate.set()
        await _until("every prefetch", lambda: queue.completed == 4)
        await _until(
            "the unplanned dropped",
            lambda: queue.status()["dropped_unwanted"] == {"unplanned": 2},
        )
    finally:
        await queue.aclose()
        await cache.aclose()
        store.close()
    # Planned: s5 (1 shard ahead), s3 (2), s1 (3), a second per shard before a pace is known.
    # The plan covers the origin and reads neither s2 nor s4: look-ahead no loader will read
    # is dropped when its turn comes, unfetched (its pin would end at the next sweep).
    assert _fetch_order(origin) == ["s0.tar", "s5.tar", "s3.tar", "s1.tar"]


async def test_concurrency_climbs_while_the_origin_delivers_more(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An origin that caps each connection: a fixed 4 prefetches use 4 connections' worth.
    The tuner raises the limit while the aggregate grows."""
    monkeypatch.setattr(slots, "TUNING_WINDOW_S", 0.1)
    origin.pace = Pace(chunk_delay_s=0.01)  # 1.6 MB/s per connection
    keys = [f"s{n:03d}.tar" for n in range(300)]
    for key in keys:
        origin.put(key, os.urandom(128 * KiB))
    queue = PrefetchQueue(cache, None, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", k) for k in keys])
        await _until("the limit to climb", lambda: queue.limit >= 16, timeout_s=20)
        await _until("more fetches at once", lambda: origin.pace.most_open_streams >= 12)  # type: ignore[union-attr]
    finally:
        await queue.aclose()
    assert queue.status()["concurrency_mode"] == "auto"


async def test_concurrency_stays_low_when_more_fetches_only_share_the_bandwidth(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slots, "TUNING_WINDOW_S", 0.1)
    origin.pace = Pace(chunk_delay_s=0.002, shared=True)  # one connection's worth in all
    keys = [f"s{n:03d}.tar" for n in range(300)]
    for key in keys:
        origin.put(key, os.urandom(64 * KiB))
    queue = PrefetchQueue(cache, None, 1 << 40, readahead=0)
    queue.start()
    limits: list[int] = []
    try:
        await queue.submit([("fake", k) for k in keys])
        for _ in range(40):  # 4 s: long enough to have climbed to the ceiling
            await asyncio.sleep(0.1)
            limits.append(queue.limit)
    finally:
        await queue.aclose()
    assert max(limits) < MAX_CONCURRENCY
    assert sum(limits) / len(limits) <= START_CONCURRENCY * 2


async def test_a_fixed_concurrency_is_kept(cache: ShardCache, origin: FakeOrigin) -> None:
    origin.pace = Pace(chunk_delay_s=0.01)
    keys = [f"s{n:03d}.tar" for n in range(40)]
    for key in keys:
        origin.put(key, os.urandom(64 * KiB))
    queue = PrefetchQueue(cache, 3, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", k) for k in keys])
        await _until("every prefetch", lambda: queue.completed == 40)
    finally:
        await queue.aclose()
    assert origin.pace.most_open_streams == 3
    assert queue.status()["concurrency"] == 3


async def test_a_prefetch_a_client_is_fetching_holds_no_slot(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """The loader asked before the prefetch started: the client's fill serves both, and the
    queue goes on with the next key instead of waiting for that fill in a slot."""
    origin.put("late.tar", os.urandom(256 * KiB))
    origin.put("next.tar", os.urandom(16 * KiB))
    origin.pace = Pace(chunk_delay_s=0.05)  # late.tar takes 0.8 s
    lease = await cache.open("fake", "late.tar")  # the client's miss, in flight
    queue = PrefetchQueue(cache, 1, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", "late.tar"), ("fake", "next.tar")])
        await _until("next.tar", lambda: "next.tar" in _fetch_order(origin), timeout_s=0.5)
        assert lease.fill is not None and not lease.fill.state.is_final
    finally:
        await lease.aclose()
        await queue.aclose()


async def test_a_prefetch_heads_its_object_once(cache: ShardCache, origin: FakeOrigin) -> None:
    """Found by the new-user trial: the queue's HEAD sized the object, then the fill sent its
    own for the checksums (the GET carries none, as S3's does not). One serves both."""
    origin.checksums_on_get = False
    origin.put("a.tar", os.urandom(256 * KiB))
    origin.put("b.tar", os.urandom(256 * KiB))
    origin.corrupt("b.tar", 1000)  # the HEAD's checksum must still be checked
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", "a.tar"), ("fake", "b.tar")])
        await _until("both prefetches", lambda: queue.completed + queue.failed == 2)
    finally:
        await queue.aclose()
    assert origin.heads["a.tar"] == 1 and origin.heads["b.tar"] == 1
    assert (queue.completed, queue.failed) == (1, 1)
    assert "does not match" in str(queue.status()["recent_failures"])


# -- found by the attack on the concurrent queue ------------------------------------------------


async def test_warming_runs_while_look_ahead_waits_for_budget(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """Look-ahead items waiting for the budget held every shared slot: a warm batch (which
    never waits for budget) then never started, and `shardcache prefetch --wait` hung."""
    for n in range(6):
        origin.put(f"la{n}.tar", os.urandom(64 * KiB))
    origin.put("warm.tar", os.urandom(16 * KiB))
    queue = PrefetchQueue(cache, 2, 100 * KiB, readahead=0)  # one look-ahead shard fits
    queue.start()
    try:
        await queue.submit([("fake", f"la{n}.tar") for n in range(6)])
        await _until("the budget to bind", lambda: queue.waiting_for is not None)
        submitted = await queue.submit([("fake", "warm.tar")], warm=True)
        batch = queue.batch(submitted.batch)
        assert batch is not None
        await _until("the warm item", lambda: batch.is_finished, timeout_s=5)
        assert batch.done == 1
    finally:
        await queue.aclose()


async def test_an_unexpected_error_while_sizing_fails_the_item_not_the_queue(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A HEAD whose answer crashed a parser (OverflowError) leaked its slot for good; once all
    were leaked, nothing was prefetched until a restart."""
    for n in range(12):
        origin.put(f"s{n}.tar", os.urandom(16 * KiB))
    real_head = origin.head

    async def head(key: str, **kwargs: object):  # type: ignore[no-untyped-def]
        if key.startswith("s") and int(key[1:].split(".")[0]) < 8:
            raise OverflowError("date value out of range")
        return await real_head(key, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(origin, "head", head)
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", f"s{n}.tar") for n in range(12)])
        await _until("every item to end", lambda: queue.completed + queue.failed == 12)
    finally:
        await queue.aclose()
    assert (queue.completed, queue.failed) == (4, 8)
    assert queue.status()["pending"] == 0 and queue.in_flight == 0


async def test_posts_at_once_cannot_pass_the_queue_bound_together(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each POST checked the bound, then awaited its index lookups, then queued: twenty posts
    at once all passed the check (two million items against a bound of 200,000)."""
    monkeypatch.setattr(prefetch, "MAX_PENDING", 100)
    origin.gate = asyncio.Event()  # nothing finishes meanwhile
    queue = PrefetchQueue(cache, 1, 1 << 40, readahead=0)
    queue.start()
    try:
        results = await asyncio.gather(
            *(queue.submit([("fake", f"p{post}-{n}.tar") for n in range(40)]) for post in range(5)),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, QueueFull)]
        assert len(refused) == 3
        assert queue.depth <= 100
    finally:
        origin.gate.set()
        await queue.aclose()


async def test_a_clear_while_an_item_starts_leaves_nothing_pinned(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DELETE between an item's admission and its fill's start: the fill started anyway,
    pinned its shard against the budget for good, and counted as done in a batch of 0."""
    origin.put("a.tar", os.urandom(64 * KiB))
    # The store's admission decision runs on a thread (`Store.would_admit`): held there.
    deciding, go_on = threading.Event(), threading.Event()
    real_would_admit = cache.store.would_admit

    def would_admit(key: str, size_bytes: int, look_ahead: bool) -> bool:
        deciding.set()
        go_on.wait(5)
        return real_would_admit(key, size_bytes, look_ahead)

    monkeypatch.setattr(cache.store, "would_admit", would_admit)
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=0)
    queue.start()
    try:
        submitted = await queue.submit([("fake", "a.tar")])
        assert await asyncio.to_thread(deciding.wait, 5)
        assert queue.clear() == (1, 0)
        go_on.set()
        await _until("the fill", lambda: not cache.flights.get(origin.url_for("a.tar")))
        await _until("the queue to settle", lambda: queue.in_flight == 0)
        await asyncio.sleep(0.05)
        batch = queue.batch(submitted.batch)
        assert batch is not None and batch.done <= batch.total
        assert cache.unread_bytes == 0  # nothing left pinned against the budget
        assert queue.status()["pending"] == 0
    finally:
        await queue.aclose()


async def test_one_slow_head_does_not_hold_up_the_rest(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admission in order made every item wait for the first one's HEAD (up to the read
    timeout), with budget to spare for all of them."""
    for n in range(10):
        origin.put(f"s{n}.tar", os.urandom(16 * KiB))
    real_head = origin.head

    async def head(key: str, **kwargs: object):  # type: ignore[no-untyped-def]
        if key == "s0.tar":
            await asyncio.sleep(3)
        return await real_head(key, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(origin, "head", head)
    queue = PrefetchQueue(cache, 4, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", f"s{n}.tar") for n in range(10)])
        await _until("the other nine", lambda: queue.completed >= 9, timeout_s=2)
    finally:
        await queue.aclose()


async def test_a_sizing_head_is_retried(cache: ShardCache, origin: FakeOrigin) -> None:
    """One 503 to the HEAD failed the prefetch, where a fill retries --origin-retries times."""
    origin.put("a.tar", os.urandom(16 * KiB))
    origin.head_failures["a.tar"] = 1
    queue = PrefetchQueue(cache, 2, 1 << 40, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", "a.tar")])
        await _until("the prefetch", lambda: queue.completed + queue.failed == 1)
    finally:
        await queue.aclose()
    assert (queue.completed, queue.failed) == (1, 0)


# -- the look-ahead budget goes in the queue's order (CI: s_003 fetched where s_002 belonged) ---


def _gate_heads(origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch, keys: list[str]):  # type: ignore[no-untyped-def]
    """Hold the HEADs of `keys` until their event is set; the others answer at once."""
    gates = {key: asyncio.Event() for key in keys}
    real_head = origin.head

    async def head(key: str, **kwargs: object):  # type: ignore[no-untyped-def]
        if key in gates:
            await gates[key].wait()
        return await real_head(key, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(origin, "head", head)
    return gates


async def test_a_later_item_sized_first_does_not_take_an_earlier_ones_budget(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for three, s0..s2 still being sized: a later item whose HEAD answered first (s_003
    in CI) was admitted at once, since nothing was held yet (the rule that lets a shard larger
    than the budget in alone), then s0 and s1; s2, the loader's third shard, waited."""
    keys = [f"s{n}.tar" for n in range(10)]
    for key in keys:
        origin.put(key, os.urandom(64 * KiB))
    gates = _gate_heads(origin, monkeypatch, keys[:3])
    queue = PrefetchQueue(cache, 8, 3 * 64 * KiB, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", key) for key in keys])
        # 1. s3..s7 are sized: one of them is admitted (wrong), or they wait (right).
        await _until(
            "a later item to be admitted or to wait",
            lambda: bool(_fetch_order(origin)) or queue.budget.waiters == 5,
        )
        # 2. s0, s1 and s2 are sized, the three of them at once.
        for gate in gates.values():
            gate.set()
        await _until("three prefetches", lambda: queue.completed >= 3)
        await _until("the rest to wait for the budget", lambda: queue.budget.waiters == 7)
    finally:
        await queue.aclose()
    # Admitted together, the three ask the store for room side by side (on threads), so
    # their GETs may go in any order; which three they are is the point.
    assert sorted(_fetch_order(origin)) == ["s0.tar", "s1.tar", "s2.tar"]


async def test_a_smaller_later_shard_does_not_take_the_budget_a_larger_earlier_one_waits_for(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for 4 units, a (2) held: b (3) waits for a to be read. c (1) was admitted because
    it fit next to a second item of its own size, not of b's; b then waited for c as well."""
    unit = 64 * KiB
    for key, units in (("a.tar", 2), ("b.tar", 3), ("c.tar", 1)):
        origin.put(key, os.urandom(units * unit))
    gates = _gate_heads(origin, monkeypatch, ["b.tar", "c.tar"])
    queue = PrefetchQueue(cache, 4, 4 * unit, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", key) for key in ("a.tar", "b.tar", "c.tar")])
        await _until("a", lambda: queue.completed == 1)
        gates["b.tar"].set()
        await _until("b to wait for the budget", lambda: queue.budget.waiters == 1)
        gates["c.tar"].set()
        await _until(
            "c to be admitted or to wait",
            lambda: "c.tar" in _fetch_order(origin) or queue.budget.waiters == 2,
        )
        assert _fetch_order(origin) == ["a.tar"]
        lease = await cache.open("fake", "a.tar")  # the loader reads a: b goes, then c
        await lease.aclose()
        await _until("b and c", lambda: queue.completed == 3)
    finally:
        await queue.aclose()
    assert _fetch_order(origin) == ["a.tar", "b.tar", "c.tar"]


async def test_the_small_last_shard_does_not_pass_an_earlier_one_being_sized(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for three 1-unit shards, two held, s2 being sized: the dataset's last shard (half a
    unit) fit next to a guess of its own size for s2, and took the room s2 needed."""
    unit = 64 * KiB
    for n in range(3):
        origin.put(f"s{n}.tar", os.urandom(unit))
    origin.put("s3.tar", os.urandom(unit // 2))
    gates = _gate_heads(origin, monkeypatch, ["s1.tar", "s2.tar", "s3.tar"])
    queue = PrefetchQueue(cache, 4, 3 * unit, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", f"s{n}.tar") for n in range(4)])
        await _until("s0", lambda: queue.completed == 1)
        gates["s1.tar"].set()
        await _until("s1", lambda: queue.completed == 2)
        gates["s3.tar"].set()
        await _until(
            "s3 to be admitted or to wait",
            lambda: "s3.tar" in _fetch_order(origin) or queue.budget.waiters == 1,
        )
        gates["s2.tar"].set()
        await _until("s2", lambda: queue.completed == 3)
    finally:
        await queue.aclose()
    assert _fetch_order(origin) == ["s0.tar", "s1.tar", "s2.tar"]


async def test_a_shard_larger_than_the_budget_does_not_become_the_guess_for_others(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item whose HEAD has not answered is owed the largest shard sized so far; had that
    been a shard larger than the whole budget (which goes alone), every later item would wait
    on one slow HEAD with nothing held."""
    unit = 64 * KiB
    origin.put("big.tar", os.urandom(10 * unit))
    for n in range(4):
        origin.put(f"s{n}.tar", os.urandom(unit))
    gates = _gate_heads(origin, monkeypatch, ["s0.tar"])
    queue = PrefetchQueue(cache, 8, 4 * unit, readahead=0)
    queue.start()
    try:
        await queue.submit([("fake", "big.tar")])
        await _until("big", lambda: queue.completed == 1)
        lease = await cache.open("fake", "big.tar")
        await lease.aclose()  # read: nothing is held now
        await queue.submit([("fake", f"s{n}.tar") for n in range(4)])
        await _until(
            "s1..s3 while s0's HEAD hangs",
            lambda: {"s1.tar", "s2.tar", "s3.tar"} <= set(_fetch_order(origin)),
            timeout_s=5.0,
        )
        gates["s0.tar"].set()
        await _until("s0", lambda: queue.completed == 5)
    finally:
        await queue.aclose()


async def test_a_full_queue_adds_few_objects_for_the_garbage_collector(cache: ShardCache) -> None:
    """200,000 queued keys held as an Item and a heap tuple each were 400,000 objects that every
    full collection walked on the event loop (issue 23, item 7: up to 135 ms each): pending
    keys are tuples of strings and numbers, which the collector stops tracking."""
    queue = PrefetchQueue(cache, 1, 1 << 40, readahead=0)  # not started: everything stays queued
    keys = [("fake", f"s{n:06d}.tar") for n in range(20_000)]
    gc.collect()
    before = len(gc.get_objects())
    first = await queue.submit(keys[:10_000])
    await queue.submit(keys[10_000:], warm=True)
    gc.collect()
    assert queue.depth == 20_000
    assert len(gc.get_objects()) - before < 1_000  # 40,000 before: an Item and a tuple each
    # Dropping one batch leaves the other's entries, and its count, as they were.
    assert queue.clear(first.batch) == (10_000, 0)
    assert queue.depth == 10_000
    batch = queue.batch(first.batch)
    assert batch is not None and batch.total == 0 and batch.is_finished
    assert queue.clear() == (10_000, 0)
    assert queue.depth == 0


async def test_a_run_of_failed_prefetches_logs_two_warnings_not_one_a_key(
    cache: ShardCache, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 23 (second attack): after a reload removed an origin, every queued key of it
    failed with its own WARNING (1,029 lines in 20 s). The count is in the status and
    metrics; the log says it once, then once more when the interval ends."""
    queue = PrefetchQueue(cache, 3, 1 << 40, readahead=0)
    queue.start()
    try:
        with caplog.at_level("DEBUG", logger="shardcache.prefetch"):
            await queue.submit([("fake", f"gone-{n:03d}.tar") for n in range(40)])
            await _until("every failure", lambda: queue.failed == 40)
    finally:
        await queue.aclose()  # closes the interval: its summary line
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert "39 more not_found failures" in warnings[1]
