"""Attacks on the plans' eviction heap (`cache.plans`): a cached key no plan reads again is the
furthest of all however its last plan went (read past, replaced, dropped as quiet), and a key
planned again after that is ranked by its new use."""

from __future__ import annotations

import math

import pytest

from shardcache.cache.eviction import choose_victim
from shardcache.cache.plans import PlanBook


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _never(key: str) -> bool:
    return False


def _book_with_a_quiet_plan() -> tuple[PlanBook, Clock, list[str], list[str]]:
    """Job A reads 100 keys (a0 and a1 read, one every 6 s); job B planned 10 keys and went
    quiet. Everything A still reads and all of B's keys are cached."""
    clock = Clock()
    book = PlanBook(quiet_after_s=10, clock=clock)
    a = [f"a{n}" for n in range(100)]
    b = [f"b{n}" for n in range(10)]
    book.post("A", 0, a)
    book.post("B", 0, b)
    for key in a[2:] + b:
        book.on_cached(key)
    clock.now = 5
    book.on_request("a0", True)
    clock.now = 11  # B quiet for 11 s: dropped at the next look
    book.on_request("a1", True)
    return book, clock, a, b


def test_the_keys_of_a_plan_dropped_as_quiet_are_the_furthest() -> None:
    """Before, dropping a quiet plan left its keys filed at the times it had predicted (0-9 s):
    eviction's furthest was a99, which A reads in 582 s, while nobody reads b0-b9."""
    book, _, _, b = _book_with_a_quiet_plan()
    assert [plan.job for plan in book.status()] == ["A"]  # the drop happens on the event loop
    furthest = book.furthest(_never)
    assert furthest is not None and furthest[0] in b and furthest[1] == math.inf, furthest


def test_eviction_beyond_the_lru_batch_takes_a_dropped_plans_key_first() -> None:
    """The store's batch of least recently used entries holds only keys A reads soon; the
    victim beyond it must be one nobody reads, not A's furthest."""
    book, _, a, b = _book_with_a_quiet_plan()
    assert book.is_active
    victim, admit = choose_victim(a[2:10], "a50", book, _never, _never)
    assert victim in b and admit, (victim, admit)


def test_a_key_planned_again_after_its_plan_went_is_ranked_by_its_new_use() -> None:
    book, clock, _, b = _book_with_a_quiet_plan()
    assert book.furthest(_never) is not None  # b-keys filed on top
    book.post("C", 0, [*b, "c0"])  # C reads b0-b9 next
    clock.now = 12
    furthest = book.furthest(_never)
    assert furthest is not None and furthest[0].startswith("a"), furthest
    assert book.next_use_s("b0") == 0.0


def test_a_read_on_the_event_loop_never_rebuilds_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read a plan follows files its key again (and, since unplanned keys are filed as
    the furthest, each fill too); the heap is rebuilt when stale entries outnumber live ones
    4 to 1, at a look at every plan for every cached key: 100,000 cached x 61 plans took
    5.7 s here. Before, the read that crossed the line paid it, on the event loop (12 times in
    50,000 reads below); now the store's threads do (a post, a fill, an eviction)."""
    rebuilds = {"in_reads": 0, "else": 0}
    reading = False
    rebuild = PlanBook._rebuild

    def counted(self: PlanBook) -> None:
        rebuilds["in_reads" if reading else "else"] += 1
        rebuild(self)

    monkeypatch.setattr(PlanBook, "_rebuild", counted)
    book = PlanBook()
    keys = [f"k{n}" for n in range(1000)]
    book.post("A", 0, keys * 50)  # fifty epochs of the same order
    for key in keys:
        book.on_cached(key)
    reading = True
    for _ in range(50):
        for key in keys:
            book.on_request(key, True)
    reading = False
    assert rebuilds["in_reads"] == 0, rebuilds
    book.on_cached("k0")  # the next fill, on a store thread
    assert rebuilds["else"] == 1, rebuilds
    assert book.furthest(_never) is not None
