"""Eviction policies (`cache.eviction`) replayed on short traces without a store: a cache of a few
entries, the policy told what happened (admission and plans hear each request, plans each entry
cached or evicted) and asked for a victim at each miss, as the evictor asks it. Each replay's
victims are checked against an oracle written here independently: LRU order, the hot set kept
across a one-pass scan, Belady's rule with the plans (the key needed furthest in the future)."""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field

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


class Clock:
    """One second a request: the plans' pace is then one second a position."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Replay:
    """What a replay did: each miss's victim (None: room, or not admitted), hits, bypasses."""

    victims: list[str | None] = field(default_factory=list)
    admitted: list[bool] = field(default_factory=list)
    hits: list[bool] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)  # at the end, least recently used first


def replay(
    policy: EvictionPolicy,
    trace: list[str],
    capacity: int,
    admission: ScanResistantAdmission | None = None,
    plans: PlanBook | None = None,
    clock: Clock | None = None,
) -> Replay:
    """Run `trace` through a cache of `capacity` equal entries evicting by `policy`."""
    cached: OrderedDict[str, None] = OrderedDict()  # least recently used first
    done = Replay()
    for key in trace:
        if clock is not None:
            clock.now += 1.0
        hit = key in cached
        done.hits.append(hit)
        if admission is not None:
            admission.on_request(key, hit)
        if plans is not None:
            plans.on_request(key, hit)
        if hit:
            cached.move_to_end(key)
            continue
        victim = None
        if len(cached) >= capacity:
            try:
                victim = policy.choose(list(cached), key, True, lambda k: False)
            except NotAdmitted:
                done.victims.append(None)
                done.admitted.append(False)
                continue
            assert victim is not None and victim in cached, victim
            del cached[victim]
            if plans is not None:
                plans.on_evicted(victim)
        done.victims.append(victim)
        done.admitted.append(True)
        cached[key] = None
        if plans is not None:
            plans.on_cached(key)
    done.cached = list(cached)
    return done


def lru_oracle(trace: list[str], capacity: int) -> list[str | None]:
    """LRU by last-use times, without an ordered map: the victim is the key used longest ago."""
    last_use: dict[str, int] = {}
    victims: list[str | None] = []
    for now, key in enumerate(trace):
        if key not in last_use:
            victim = None
            if len(last_use) >= capacity:
                victim = min(last_use, key=last_use.__getitem__)
                del last_use[victim]
            victims.append(victim)
        last_use[key] = now
    return victims


def belady_oracle(trace: list[str], capacity: int) -> tuple[list[str | None], list[bool]]:
    """Belady's rule with bypass, as the plan-aware policy states it: the victim is the cached
    key read again furthest in the future (never again counts as furthest, the least recently
    used of those first); the fill is admitted when the victim is never read again, or when
    the fill is read again before the victim is."""
    cached: dict[str, int] = {}  # key -> last use
    victims: list[str | None] = []
    admitted: list[bool] = []

    def next_use(key: str, after: int) -> float:
        later = [i for i in range(after + 1, len(trace)) if trace[i] == key]
        return later[0] if later else math.inf

    for now, key in enumerate(trace):
        if key in cached:
            cached[key] = now
            continue
        if len(cached) < capacity:
            victims.append(None)
            admitted.append(True)
            cached[key] = now
            continue
        victim = max(cached, key=lambda k: (next_use(k, now), -cached[k]))
        admit = next_use(victim, now) == math.inf or next_use(key, now) < next_use(victim, now)
        victims.append(victim if admit else None)
        admitted.append(admit)
        if admit:
            del cached[victim]
            cached[key] = now
    return victims, admitted


def random_trace(seed: int, keys: int = 9, length: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [f"k{rng.randrange(keys)}" for _ in range(length)]


# -- LRU -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("capacity", [1, 3, 5])
def test_lru_evicts_in_least_recently_used_order(seed: int, capacity: int) -> None:
    trace = random_trace(seed)
    done = replay(LeastRecentlyUsed(), trace, capacity)
    assert done.victims == lru_oracle(trace, capacity)
    assert all(done.admitted), "plain LRU admits every fill"


def test_lru_loses_a_hot_set_to_a_scan_as_long_as_the_cache() -> None:
    hot = [f"h{i}" for i in range(4)]
    scan = [f"s{i}" for i in range(4)]
    done = replay(LeastRecentlyUsed(), hot * 3 + scan + hot, capacity=4)
    assert done.hits[-4:] == [False] * 4
    assert done.victims[4:8] == hot  # the scan took them in the order they were last read


def test_with_no_candidate_no_policy_evicts() -> None:
    """Every entry is pinned or being read: nothing may go, and no policy invents a victim."""
    admission = ScanResistantAdmission()
    plans = PlanBook(clock=Clock())
    plans.post("job", 0, ["a"])
    for policy in (
        LeastRecentlyUsed(),
        ScanResistant(admission),
        PlanAware(plans, ScanResistant(admission)),
    ):
        assert policy.choose([], "a", True, lambda k: True) is None


def test_the_ordinary_policy_is_lru_without_admission_and_scan_resistant_with() -> None:
    assert type(policy_for(None, None)) is LeastRecentlyUsed  # not its subclass
    assert isinstance(policy_for(ScanResistantAdmission(), None), ScanResistant)


# -- scan resistance -------------------------------------------------------------------------

HOT = [f"h{i}" for i in range(4)]


def test_scan_resistance_keeps_the_hot_set_across_a_one_pass_scan() -> None:
    """Four hot keys read three times round, then four keys read once (as many as the cache
    holds), then the hot keys again: LRU has lost them all; the scan-resistant policy streams
    the scan through and serves the hot set from the cache."""
    scan = [f"s{i}" for i in range(4)]
    admission = ScanResistantAdmission()
    done = replay(ScanResistant(admission), HOT * 3 + scan + HOT, 4, admission)
    assert done.hits[-4:] == [True] * 4
    assert [victim for victim in done.victims if victim is not None] == []
    assert done.admitted[-len(scan) :] == [False] * len(scan)  # the scan was not admitted
    assert sorted(done.cached) == HOT


def test_scan_resistance_lets_a_scan_in_once_the_hot_set_is_past_its_horizon() -> None:
    """Protection lasts two re-reference distances of the hot set (here 4 requests each): a
    scan longer than that is the new working set, and is let in (LRU order from there on)."""
    scan = [f"s{i}" for i in range(12)]
    admission = ScanResistantAdmission()
    done = replay(ScanResistant(admission), HOT * 3 + scan, 4, admission)
    misses_in_scan = done.victims[-len(scan) :]
    assert misses_in_scan[:4] == [None] * 4  # h0 read 4 requests ago: protected (4 < 2 x 4)
    assert [victim for victim in misses_in_scan if victim is not None][:4] == HOT


def test_scan_resistance_never_refuses_without_protect() -> None:
    """Making room on a full filesystem (`protect` False) is not a fill's admission."""
    admission = ScanResistantAdmission()
    for key in HOT * 3:
        admission.on_request(key, True)
    policy = ScanResistant(admission)
    with pytest.raises(NotAdmitted):
        policy.choose(list(HOT), "new", True, lambda k: False)
    assert policy.choose(list(HOT), "new", False, lambda k: False) == "h0"


# -- plan-aware ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("capacity", [2, 4])
def test_plan_aware_evicts_the_key_needed_furthest_in_the_future(seed: int, capacity: int) -> None:
    """A job posts the order it reads in, then reads it: each victim is Belady's."""
    trace = random_trace(seed, keys=7, length=40)
    clock = Clock()
    plans = PlanBook(clock=clock)
    plans.post("job", 0, trace)
    done = replay(PlanAware(plans, LeastRecentlyUsed()), trace, capacity, plans=plans, clock=clock)
    victims, admitted = belady_oracle(trace, capacity)
    assert done.victims == victims
    assert done.admitted == admitted


def test_plan_aware_beats_lru_on_a_loop_larger_than_the_cache() -> None:
    """Epochs of the same order over 6 keys and a cache of 4: LRU never hits; with the plan,
    the furthest key goes and the rest hit, as the optimum does."""
    keys = [f"k{i}" for i in range(6)]
    trace = keys * 4
    clock = Clock()
    plans = PlanBook(clock=clock)
    plans.post("job", 0, trace)
    planned = replay(PlanAware(plans, LeastRecentlyUsed()), trace, 4, plans=plans, clock=clock)
    assert sum(replay(LeastRecentlyUsed(), trace, 4).hits) == 0
    optimum = sum(belady_hits(trace, 4))
    assert sum(planned.hits) == optimum > 0


def belady_hits(trace: list[str], capacity: int) -> list[bool]:
    victims, admitted = belady_oracle(trace, capacity)
    cached: set[str] = set()
    hits: list[bool] = []
    misses = iter(zip(victims, admitted, strict=True))
    for key in trace:
        if key in cached:
            hits.append(True)
            continue
        hits.append(False)
        victim, admit = next(misses)
        if victim is not None:
            cached.discard(victim)
        if admit:
            cached.add(key)
    return hits


def test_plan_aware_takes_what_no_plan_reads_first_sparing_what_admission_protects() -> None:
    clock = Clock()
    plans = PlanBook(clock=clock)
    plans.post("job", 0, ["p1", "p2", "p3"])
    for key in ("p1", "p2", "p3", "old", "hot"):
        plans.on_cached(key)
    admission = ScanResistantAdmission()
    for key in ["old"] + ["hot"] * 6:  # "old" is past its horizon, "hot" was just read
        admission.on_request(key, False)
    assert admission.is_protected("hot") and not admission.is_protected("old")
    policy = PlanAware(plans, ScanResistant(admission))
    # Unplanned and unprotected first, whatever the LRU order says.
    assert policy.choose(["hot", "old", "p1"], "p2", True, lambda k: False) == "old"
    # Only a protected unplanned key left: taken for a fill some plan reads, not for one
    # no plan reads (that one streams through).
    assert policy.choose(["hot", "p1"], "p2", True, lambda k: False) == "hot"
    with pytest.raises(NotAdmitted):
        policy.choose(["hot", "p1"], "unplanned", True, lambda k: False)


def test_plan_aware_never_picks_a_spared_key_beyond_the_batch() -> None:
    """The furthest planned key is found beyond the LRU candidates, but never a pinned one."""
    clock = Clock()
    plans = PlanBook(clock=clock)
    plans.post("job", 0, ["a", "b", "c", "d"])
    for key in ("a", "b", "c", "d"):
        plans.on_cached(key)
    policy = PlanAware(plans, LeastRecentlyUsed())
    assert policy.choose(["a"], None, False, lambda k: False) == "d"
    assert policy.choose(["a"], None, False, lambda k: k == "d") == "c"
