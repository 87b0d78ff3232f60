"""Plans (`cache.plans`): position tracking from reads, next planned use, Belady's victim,
quiet plans dropped; and in simulation, the targets of issue 12 for `--eviction auto` with plans:
at least 90% of the offline optimum, never below LRU by more than 0.02."""

from __future__ import annotations

import gc
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from shardcache.cache.eviction import choose_victim
from shardcache.cache.plans import PlanBook, PlanRefused

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import trace_sim  # noqa: E402

SHARDS = 200


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reads_move_the_plan_and_turn_positions_into_time() -> None:
    clock = Clock()
    book = PlanBook(clock=clock)
    book.post("job", 0, ["a", "b", "c", "d", "e"])
    assert book.next_use_s("c") == 2.0  # no pace learned yet: a position is a second
    for key in ("a", "b"):
        book.on_request(key, hit=False)
        clock.now += 10.0
    assert book.status()[0].position == 2
    assert book.next_use_s("a") is None  # read; no plan reads it again
    clock.now -= 10.0
    assert book.next_use_s("e") == pytest.approx(2 * 10.0)  # 10 s a shard, two shards away


def test_another_jobs_read_of_a_far_key_does_not_move_a_plan() -> None:
    book = PlanBook(clock=Clock())
    book.post("job", 0, [f"k{i}" for i in range(100)])
    book.on_request("k50", hit=True)  # some other reader
    assert book.status()[0].position == 0
    book.on_request("k2", hit=True)  # this job, having skipped two (a failure, say)
    assert book.status()[0].position == 3


def test_the_furthest_cached_key_is_the_victim_and_a_later_fill_is_not_admitted() -> None:
    book = PlanBook(clock=Clock())
    book.post("job", 0, [f"k{i}" for i in range(10)])
    for key in ("k1", "k5", "k8", "x"):
        book.on_cached(key)
    never_protected = lambda key: False  # noqa: E731
    nothing_excluded = lambda key: False  # noqa: E731
    # No plan reads "x": it goes first, whatever the fill.
    assert choose_victim(["x", "k1"], "k9", book, never_protected, nothing_excluded) == ("x", True)
    # Also beyond the batch of LRU candidates: it is the furthest of all.
    assert choose_victim(["k1"], "k9", book, never_protected, nothing_excluded) == ("x", True)
    book.on_evicted("x")
    # Then the furthest planned: k8. A fill needed sooner (k3) is admitted, a later one not.
    assert choose_victim(["k1"], "k3", book, never_protected, nothing_excluded) == ("k8", True)
    assert choose_victim(["k1"], "k9", book, never_protected, nothing_excluded) == ("k8", False)
    assert choose_victim(["k1"], "unplanned", book, never_protected, nothing_excluded)[1] is False
    # A pinned (excluded) key is never the victim.
    assert choose_victim(["k1"], "k3", book, never_protected, lambda k: k == "k8")[0] == "k5"
    book.on_evicted("k8")
    assert choose_victim(["k1"], "k3", book, never_protected, nothing_excluded)[0] == "k5"


def test_keys_a_plan_moved_past_or_dropped_are_found_beyond_the_lru_batch() -> None:
    """Once no plan reads a cached key again (read past, skipped, or its plan replaced), it
    is eviction's first choice even when it is not among the least recently used (where a
    reshuffled epoch left it): one node of four at a quarter cache kept 80% of the optimum's
    hits while such keys hid behind a batch of still-planned ones, 99% now (trace_sim)."""
    book = PlanBook(clock=Clock())
    book.post("job", 0, ["a", "b", "c", "d", "e"])
    for key in ("a", "b", "c", "d", "e"):
        book.on_cached(key)
    nothing = lambda key: False  # noqa: E731
    book.on_request("a", hit=True)
    assert choose_victim(["e"], "d", book, nothing, nothing) == ("a", True)  # read past
    book.on_evicted("a")
    book.on_request("c", hit=True)  # b skipped
    assert choose_victim(["e"], "d", book, nothing, nothing)[0] in ("b", "c")
    book.on_evicted("b")
    book.on_evicted("c")
    book.post("job", 1, ["e"])  # d is in no plan any more
    assert choose_victim(["e"], "e", book, nothing, nothing) == ("d", True)
    # A pinned one is skipped and stays found for later.
    assert choose_victim(["e"], "e", book, nothing, lambda k: k == "d") == ("e", False)
    assert choose_victim(["e"], "e", book, nothing, nothing) == ("d", True)


def test_unplanned_entries_admission_protects_give_way_only_to_planned_fills() -> None:
    book = PlanBook(clock=Clock())
    book.post("job", 0, ["p1", "p2"])
    book.on_cached("old")
    protected = lambda key: key == "old"  # noqa: E731
    assert choose_victim(["old"], "p2", book, protected, lambda k: False) == ("old", True)
    assert choose_victim(["old"], "stray", book, protected, lambda k: False) == ("old", False)


def test_a_quiet_plan_is_dropped_and_a_new_post_replaces_the_old() -> None:
    clock = Clock()
    book = PlanBook(quiet_after_s=60.0, clock=clock)
    book.post("job", 0, ["a", "b"])
    book.post("job", 1, ["c"])
    assert [(p.job, p.epoch, p.length) for p in book.status()] == [("job", 1, 1)]
    assert book.next_use_s("a") is None
    clock.now = 61.0
    assert not book.is_active
    assert book.next_use_s("c") is None


def test_the_book_refuses_plans_beyond_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardcache.cache.plans.MAX_PLANNED_KEYS", 10)
    book = PlanBook(clock=Clock())
    book.post("a", 0, ["k"] * 8)
    with pytest.raises(PlanRefused):
        book.post("b", 0, ["k"] * 3)
    book.post("a", 0, ["k"] * 10)  # a replacement counts without the plan it replaces


def test_predicted_and_measured_hit_ratios() -> None:
    book = PlanBook(clock=Clock())
    book.post("job", 0, ["a", "b", "c", "d"])
    book.on_cached("c")
    book.on_request("a", hit=True)
    book.on_request("b", hit=False)
    (plan,) = book.status()
    assert plan.measured_hit_ratio == 0.5
    assert plan.predicted_hit_ratio == 0.5  # of c and d, c is cached


@pytest.mark.parametrize("name", list(trace_sim.TRACES))
@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.75, 0.9])
def test_plans_reach_most_of_the_optimum(name: str, fraction: float) -> None:
    trace = trace_sim.TRACES[name](SHARDS, 10, random.Random(6))
    capacity = max(1, round(fraction * SHARDS))
    planned = trace_sim.planned(trace, capacity)
    assert planned >= trace_sim.lru(trace, capacity) - 0.02
    assert planned >= 0.95 * trace_sim.belady_horizon(trace, capacity) - 0.005
    # Issue 35's bar: one node of four, reshuffled then split, at least 95% of the optimum
    # (plans naming this epoch only: 80-88% at 10-25% cache).
    bar = 0.95 if name == "node-of-4" or fraction >= 0.25 else 0.88
    assert planned >= bar * trace_sim.belady(trace, capacity)


def test_a_read_never_waits_for_a_thread_holding_the_book() -> None:
    """The event loop records reads while a worker thread posts a large plan: the read is
    queued, not waited for, and counts once the lock is free."""
    book = PlanBook(clock=Clock())
    book.post("job", 0, ["a", "b"])
    held, released = threading.Event(), threading.Event()

    def hold() -> None:  # the book's lock is what this test is about: held from outside
        with book._lock:
            held.set()
            released.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10), "the holder thread never took the book's lock"
    started = time.monotonic()
    book.on_request("a", hit=True)
    assert time.monotonic() - started < 0.05
    released.set()
    holder.join()
    assert book.status()[0].position == 1


def test_the_predicted_ratio_is_kept_up_to_date_without_a_scan() -> None:
    """status() must not walk every planned key (a scrape would then cost O(planned keys)):
    the count of cached keys ahead of each cursor follows caching, eviction and reads."""
    book = PlanBook(clock=Clock())
    keys = [f"k{i}" for i in range(10)]
    book.on_cached("k0")
    book.post("job", 0, keys)
    for key in ("k3", "k4", "k3"):
        book.on_cached(key)
    book.on_evicted("k4")
    book.on_evicted("k9")  # never cached: no change
    for key in ("k0", "k1", "k2", "k3"):
        book.on_request(key, hit=key in ("k0", "k3"))
    (plan,) = book.status()
    assert plan.predicted_hit_ratio == 0.0  # of k4..k9, none is cached
    book.on_cached("k7")
    book.forget_cached(["k5", "k6", "k7"])  # the store reopened: what it holds now
    assert book.status()[0].predicted_hit_ratio == 0.5


def test_a_refused_post_keeps_the_jobs_plan_and_finished_plans_give_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shardcache.cache.plans.MAX_PLANNED_KEYS", 10)
    book = PlanBook(clock=Clock())
    book.post("j", 0, [f"k{i}" for i in range(10)])
    with pytest.raises(PlanRefused):
        book.post("j", 1, [f"k{i}" for i in range(11)])
    assert [(p.job, p.epoch) for p in book.status()] == [("j", 0)]
    for i in range(10):  # j reads its plan to the end: finished, it gives way to a new job
        book.on_request(f"k{i}", hit=False)
    book.post("other", 0, ["x", "y"])
    assert [p.job for p in book.status()] == ["other"]


def test_long_keys_are_bounded_by_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardcache.cache.plans.MAX_PLANNED_KEY_CHARS", 10_000)
    book = PlanBook(clock=Clock())
    with pytest.raises(PlanRefused):
        book.post("j", 0, [f"/{'a' * 990}{i}" for i in range(11)])
    book.post("j", 0, [f"/{'a' * 990}{i}" for i in range(9)])


def test_a_key_listed_many_times_costs_a_lookup_not_a_walk() -> None:
    """The same key 100,000 times: a read finds its next position by bisection and moves the
    cursor by one, not through every duplicate."""
    book = PlanBook(clock=Clock())
    book.post("j", 0, ["same"] * 100_000)
    started = time.perf_counter()
    for _ in range(1000):
        book.on_request("same", hit=True)
    assert time.perf_counter() - started < 0.5
    assert book.status()[0].position == 1000
    assert book.next_use_s("same") == 0.0


def test_a_large_plan_adds_few_objects_for_the_garbage_collector() -> None:
    """A million planned keys held as one object each would make every full collection stall
    the event loop for seconds: a plan is a few tracked containers, whatever its length."""
    book = PlanBook(clock=Clock())
    keys = [f"http://origin/shards_{i:06d}.tar" for i in range(100_000)]
    gc.collect()
    before = len(gc.get_objects())
    book.post("j", 0, keys + keys[:10])
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_check_room_refuses_before_the_keys_are_expanded() -> None:
    """A post the book would refuse is refused on the count its body lists (issue 23, item
    7); the job's own plan, which a post replaces, and finished plans give way."""
    from shardcache.cache import plans as plans_module

    book = PlanBook()
    room = plans_module.MAX_PLANNED_KEYS // 2
    book.post("a", 0, [f"a{i}" for i in range(room)])
    book.post("b", 0, [f"b{i}" for i in range(room)])
    with pytest.raises(PlanRefused):
        book.check_room("c", 1)
    book.check_room("a", room)  # replaces its own plan
    book.post("b", 0, [])  # finished: gives way
    book.check_room("c", room)


def test_plans_of_one_dataset_share_their_key_strings() -> None:
    book = PlanBook()
    first = book.post("a", 0, [f"http://o/{i:07d}.tar" for i in range(1000)])
    second = book.post("b", 0, [f"http://o/{i:07d}.tar" for i in range(1000)])
    assert all(x is y for x, y in zip(first.keys, second.keys, strict=True))
    repeated = book.post("c", 0, ["x", "y", "x", "z", "x"])
    assert repeated.first == {"x": 0, "y": 1, "z": 3}
    assert repeated.repeats == {"x": [0, 2, 4]}


def _of_lake(key: str) -> bool:
    return key.startswith("lake/")


def test_read_ahead_gives_the_reading_plans_next_keys_of_the_origin() -> None:
    book = PlanBook(clock=Clock())
    assert book.read_ahead("lake/s0", 2, _of_lake) is None  # no plan: read-ahead guesses
    book.post("node0", 0, ["lake/s0", "lake/s2", "other/x", "lake/s4", "lake/s6"])
    book.post("node0-other-origin", 0, ["other/y"])
    book.on_request("lake/s0", hit=False)
    assert [key for key, _ in book.read_ahead("lake/s0", 2, _of_lake) or []] == [
        "lake/s2",
        "lake/s4",
    ]
    assert book.read_ahead("lake/s1", 2, _of_lake) == []  # covered, but no plan reads s1
    assert book.read_ahead("other/y", 2, lambda key: key.startswith("elsewhere/")) is None


def test_next_reader_is_the_plan_that_reads_a_key_soonest() -> None:
    clock = Clock()
    book = PlanBook(clock=clock)
    book.post("slow", 0, ["a", "b", "c"])
    book.post("fast", 0, ["c", "a"])
    reader = book.next_reader("c")
    assert reader is not None and (reader.job, reader.seconds_until) == ("fast", 0.0)
    clock.now += 7.0
    reader = book.next_reader("b")
    assert reader is not None and (reader.job, reader.quiet_s) == ("slow", 7.0)
    assert book.next_reader("z") is None
    assert book.covers(lambda key: key == "a") and not book.covers(lambda key: key == "z")


def test_a_read_goes_to_the_plan_that_reads_it_next_not_a_siblings_next_epoch() -> None:
    """Two workers of one loader: worker 1's plan lists, a few places past its cursor, the key
    worker 0 reads now (its next epoch's). Worker 0's read is worker 0's: worker 1's cursor
    stays, and its own reads keep counting (before, it jumped and ignored them)."""
    book = PlanBook(clock=Clock())
    book.post("w0", 0, ["a", "b", "x", "y"])
    book.post("w1", 0, ["c", "d", "b", "e"])  # "b": worker 1's next epoch, 2 places ahead
    book.on_request("a", hit=False)
    book.on_request("b", hit=False)
    positions = {p.job: (p.position, p.reads) for p in book.status()}
    assert positions == {"w0": (2, 2), "w1": (0, 0)}, positions
    book.on_request("c", hit=False)
    book.on_request("d", hit=False)
    positions = {p.job: (p.position, p.reads) for p in book.status()}
    assert positions["w1"] == (2, 2), positions
    # A skip of its own still moves a plan when no plan reads the key next.
    book.on_request("e", hit=False)
    assert {p.job: p.position for p in book.status()}["w1"] == 4
