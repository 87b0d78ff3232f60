"""Eviction policies as objects (`cache.eviction`), replayed on short traces without a store:
each read, commit and eviction told to the policy as the store tells it, over a cache that
holds a fixed number of equal entries."""

from __future__ import annotations

import collections
import itertools

import pytest

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.eviction import (
    EvictionPolicy,
    LeastRecentlyUsed,
    PlanAware,
    ScanResistant,
    policy_for,
)
from shardcache.cache.plans import PlanBook
from shardcache.errors import NotAdmitted


class Replay:
    """A cache of `capacity` entries driven by `policy`, LRU order kept as the index keeps it."""

    def __init__(self, policy: EvictionPolicy, capacity: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self.cache: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.evicted: list[str] = []
        self.bypassed: list[str] = []

    def read(self, key: str) -> bool:
        """A client read of `key`: True on a hit; a miss fills it, or streams it through."""
        hit = key in self.cache
        self.policy.on_request(key, hit)
        if hit:
            self.cache.move_to_end(key)
            return True
        if len(self.cache) >= self.capacity:
            candidates = list(itertools.islice(self.cache, 64))
            try:
                victim = self.policy.choose(candidates, key, True, lambda k: False)
            except NotAdmitted:
                self.bypassed.append(key)
                return False
            assert victim is not None
            del self.cache[victim]
            self.evicted.append(victim)
            self.policy.on_evict(victim)
        self.cache[key] = None
        self.policy.on_commit(key)
        return False

    def reads(self, keys: list[str]) -> list[bool]:
        return [self.read(key) for key in keys]


def test_lru_evicts_in_order_of_last_use() -> None:
    replay = Replay(LeastRecentlyUsed(), 3)
    replay.reads(["a", "b", "c", "a", "d", "e", "b"])
    # d takes b (a was read again), e takes c, b (refetched) takes a.
    assert replay.evicted == ["b", "c", "a"]
    assert list(replay.cache) == ["d", "e", "b"]
    assert replay.bypassed == []


def test_lru_admits_everything_and_keeps_no_area() -> None:
    policy = LeastRecentlyUsed()
    assert not policy.is_transient("k", look_ahead=True, read_now=True)
    assert not policy.is_protected("k")
    assert policy.area_free_bytes() == 0
    assert policy.next_use_s("k") is None
    assert policy.ordinary is policy
    state = policy.status(bypassed=3)
    assert (state.policy, state.bypassed, state.is_serving, state.plans) == ("lru", 3, True, [])


def _hot_set_with_a_scan(rounds: int) -> list[str]:
    """Eight hot keys read every round, four keys of a one-pass scan after each round."""
    hot = [f"hot{i}" for i in range(8)]
    scan = (f"scan{i}" for i in itertools.count())
    return [key for _ in range(rounds) for key in hot + [next(scan) for _ in range(4)]]


def test_scan_resistance_keeps_the_hot_set_through_a_one_pass_scan() -> None:
    trace = _hot_set_with_a_scan(rounds=12)
    resistant = Replay(ScanResistant(ScanResistantAdmission()), capacity=10)
    hits = resistant.reads(trace)
    hot_hits = [hit for key, hit in zip(trace, hits, strict=True) if key.startswith("hot")]
    assert all(hot_hits[8:])  # from the second round on, every hot read hits
    assert not any(key.startswith("hot") for key in resistant.evicted)
    assert resistant.bypassed  # scan keys streamed through rather than evict the hot set
    # LRU on the same trace: the scan pushes each hot key out before its next read.
    plain = Replay(LeastRecentlyUsed(), capacity=10)
    plain_hits = plain.reads(trace)
    assert not any(hit for key, hit in zip(trace, plain_hits, strict=True) if "hot" in key)


def test_a_read_of_a_look_ahead_entry_is_no_hit_on_the_resident_set() -> None:
    admission = ScanResistantAdmission()
    policy = ScanResistant(admission, transient_max_bytes=1 << 20)
    policy.area.committed("ahead", 100)  # a look-ahead prefetch, held in the area
    policy.on_request("ahead", True)
    assert admission.last_hit_at is None
    policy.on_request("resident", True)
    assert admission.last_hit_at == 2
    assert policy.is_transient("k", look_ahead=True, read_now=False)
    assert policy.is_transient("k", look_ahead=False, read_now=True)
    assert not policy.is_transient("k", look_ahead=False, read_now=False)
    assert policy.status(0).policy == "scan-resistant"


def _planned(ordinary: EvictionPolicy, keys: list[str]) -> tuple[PlanAware, list[float]]:
    now = [0.0]
    plans = PlanBook(quiet_after_s=float("inf"), clock=lambda: now[0])
    plans.post("job", 0, keys)
    return PlanAware(plans, ordinary), now


def test_plan_aware_evicts_the_key_needed_furthest_ahead() -> None:
    order = ["a", "b", "c", "a", "x", "c", "b", "x", "a"]
    policy, now = _planned(LeastRecentlyUsed(), order)
    replay = Replay(policy, capacity=3)
    hits = []
    for index, key in enumerate(order):
        now[0] = float(index)
        hits.append(replay.read(key))
    # At x's miss the plan reads c next, then b, x, and a last: a goes, though LRU takes b.
    assert replay.evicted[0] == "a"
    assert hits == [False, False, False, True, False, True, True, True, False]
    lru = Replay(LeastRecentlyUsed(), capacity=3)
    lru.reads(order)
    assert lru.evicted[0] == "b"


def test_plan_aware_streams_through_a_fill_needed_later_than_every_entry() -> None:
    policy, _ = _planned(LeastRecentlyUsed(), ["a", "b", "x", "a", "b", "x"])
    replay = Replay(policy, capacity=2)
    assert replay.reads(["a", "b", "x"]) == [False, False, False]
    assert replay.bypassed == ["x"]  # a and b are read before x's next use
    assert replay.evicted == []


def test_plan_aware_is_its_ordinary_policy_without_an_active_plan() -> None:
    plans = PlanBook(quiet_after_s=float("inf"))
    policy = PlanAware(plans, ScanResistant(ScanResistantAdmission()))
    assert policy.choose(["old", "new"], "k", False, lambda k: False) == "old"
    assert policy.status(0).policy == "scan-resistant"
    plans.post("job", 0, ["k"])
    assert policy.status(0).policy == "plan"
    assert policy.area_free_bytes() == 0  # a plan ranks look-aheads: no area kept free
    # A look-ahead the plan reads is an ordinary fill; one it does not name is transient.
    assert not policy.is_transient("k", look_ahead=True, read_now=False)
    assert policy.is_transient("other", look_ahead=True, read_now=False)


@pytest.mark.parametrize(
    ("admission", "plans", "kind"),
    [
        (False, False, LeastRecentlyUsed),
        (True, False, ScanResistant),
        (False, True, PlanAware),
        (True, True, PlanAware),
    ],
)
def test_policy_for_builds_one_policy_from_its_parts(
    admission: bool, plans: bool, kind: type
) -> None:
    book = PlanBook() if plans else None
    policy = policy_for(ScanResistantAdmission() if admission else None, book, 1 << 20)
    assert type(policy) is kind  # ScanResistant is an LRU subclass: the exact class
    assert policy.plans is book
    assert policy.area.max_bytes == (1 << 20 if admission else 0)
