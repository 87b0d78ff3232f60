"""The unread ledger (`cache.unread`): holds become pins in one step, pins end when read or
released, the store's pins match the ledger's after any interleaving, and every change wakes
a waiter, which re-checks. A real store in a temp dir; no sockets, no sleeps."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.cache.store import Store
from shardcache.cache.unread import Hold, UnreadLedger

MiB = 1024 * 1024


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "cache", 8 * MiB)
    yield store
    assert store.check() == []
    store.close()


def _store_pins(store: Store, urls: list[str]) -> set[str]:
    """The urls the store had pinned (each unpinned by asking: call once, at the end)."""
    return {url for url in urls if store.unpin(url)}


def test_a_hold_becomes_a_pin_in_one_step_and_a_read_ends_it(store: Store) -> None:
    ledger = UnreadLedger(store)
    hold = ledger.hold(3)
    assert (ledger.held_bytes, ledger.total_bytes) == (3, 0)
    ledger.pin("a", 3, hold)
    assert (ledger.held_bytes, ledger.total_bytes) == (0, 3) and "a" in ledger
    ledger.let_go(hold)  # pinned already: nothing to give back
    ledger.let_go(None)
    assert (ledger.held_bytes, ledger.total_bytes) == (0, 3)
    ledger.mark_read("a")
    assert ledger.total_bytes == 0 and "a" not in ledger
    assert _store_pins(store, ["a"]) == set()


def test_a_hold_let_go_twice_is_given_back_once(store: Store) -> None:
    ledger = UnreadLedger(store)
    first, second = ledger.hold(2), ledger.hold(5)
    ledger.let_go(first)
    ledger.let_go(first)
    assert ledger.held_bytes == 5
    ledger.let_go(second)
    assert ledger.held_bytes == 0


def test_release_frees_only_what_it_names_and_pinned(store: Store) -> None:
    ledger = UnreadLedger(store)
    for url, size in (("a", 1), ("b", 2), ("c", 4)):
        ledger.pin(url, size)
    assert ledger.release(["a", "x"]) == 1  # "x" was never pinned
    assert ledger.sizes() == {"b": 2, "c": 4}
    assert ledger.release([]) == 0
    assert ledger.release() == 6 and ledger.sizes() == {}
    assert _store_pins(store, ["a", "b", "c", "x"]) == set()


@pytest.mark.parametrize(
    "change",
    ["hold", "let_go", "pin", "mark_read", "release", "release_nothing"],
)
async def test_every_change_wakes_a_waiter_which_rechecks(store: Store, change: str) -> None:
    ledger = UnreadLedger(store)
    held = ledger.hold(1)
    ledger.pin("a", 1)
    asked = 0

    def ready() -> bool:
        nonlocal asked
        asked += 1
        return asked > 1  # ready on the first re-check: counts the wakes

    waiter = asyncio.create_task(ledger.wait_for(ready))
    for _ in range(3):
        await asyncio.sleep(0)
    assert asked == 1 and not waiter.done(), "no change yet: no wake"
    if change == "hold":
        ledger.hold(1)
    elif change == "let_go":
        ledger.let_go(held)
    elif change == "pin":
        ledger.pin("b", 1)
    elif change == "mark_read":
        ledger.mark_read("a")
    elif change == "release":
        ledger.release(["a"])
    else:
        ledger.release(["nothing"])  # a drop: the waiter must look again
    await asyncio.wait_for(waiter, timeout=10)
    assert asked == 2


@pytest.mark.parametrize("seed", range(8))
async def test_bytes_and_pins_reconcile_under_interleavings(store: Store, seed: int) -> None:
    """Prefetches (hold, then pin or let go), readers (mark_read), the sweep and the queue
    (release some or all) and a budget waiter run interleaved in a seeded order; after every
    step the ledger's figures add up, and at the end the store pins exactly what it lists."""
    rng = random.Random(seed)
    ledger = UnreadLedger(store)
    urls = [f"s{n}" for n in range(12)]
    holds: set[Hold] = set()
    budget = 6
    admitted: list[str] = []

    def check() -> None:
        assert ledger.total_bytes == sum(ledger.sizes().values())
        assert ledger.held_bytes == sum(hold.size_bytes for hold in holds)

    async def prefetch(url: str, size: int) -> None:
        def fits() -> bool:
            return ledger.total_bytes + ledger.held_bytes + size <= budget

        await ledger.wait_for(fits)
        assert fits()
        hold = ledger.hold(size)
        holds.add(hold)
        admitted.append(url)
        check()
        await asyncio.sleep(0)
        holds.discard(hold)
        if rng.random() < 0.7:
            ledger.pin(url, size, hold)
        ledger.let_go(hold)  # the dispatcher's `finally`: a no-op once pinned
        check()

    async def churn() -> None:
        for _ in range(60):
            await asyncio.sleep(0)
            choice = rng.random()
            if choice < 0.5:
                ledger.mark_read(rng.choice(urls))
            elif choice < 0.9:
                ledger.release(rng.sample(urls, 3))
            else:
                ledger.release()
            check()
        while not all(task.done() for task in tasks):  # the queue clears until all went
            ledger.release()
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(prefetch(url, rng.randint(1, 3))) for url in urls]
    await asyncio.wait_for(asyncio.gather(churn(), *tasks), timeout=30)
    check()
    assert sorted(admitted) == sorted(urls)
    pinned = set(ledger.sizes())
    assert ledger.held_bytes == 0
    assert _store_pins(store, urls) == pinned
