"""Eviction policies as objects that receive the store's events (`LeastRecentlyUsed`,
`ScanResistant`, `PlanAware`): they rank entries, say how a fill is admitted and report their
state; `policy_for` is the one place that picks one. Pure: the store and the evictor supply
what the index holds; nothing here does I/O or takes the store's lock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Protocol

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.entry import AdmissionState
from shardcache.cache.plans import PlanBook
from shardcache.cache.transient import TransientArea
from shardcache.errors import NotAdmitted


class EvictionPolicy(Protocol):
    """What the store and the evictor tell a policy and ask of it.

    Events: `on_open` (the cached keys, at opening), `on_request` (a client read), `on_warm`
    (a shard being warmed), `on_commit` (cached now), `on_evict` (left the cache). Questions:
    `is_transient` (admit: into the transient area or as an ordinary entry), `choose` (the
    victim), `status`. `on_request` runs on the event loop for every hit: it must not wait.
    """

    @property
    def area(self) -> TransientArea:
        """The look-ahead fills held apart until read once (`cache.transient`); the evictor
        keeps its books. Of size 0, and never used, without admission."""
        ...

    @property
    def plans(self) -> PlanBook | None:
        """The loaders' plans this policy follows (the prefetch queue and `/_/plans` post and
        read them), or None."""
        ...

    @property
    def ordinary(self) -> EvictionPolicy:
        """This policy without the plans: the one to ask when the plans' choices keep naming
        keys the index no longer has."""
        ...

    def on_open(self, cached: Callable[[], Iterable[str]]) -> None:
        """The index was (re)opened; `cached()` lists what it holds (asked only if needed)."""
        ...

    def on_request(self, key: str, found: bool) -> None:
        """A client read `key`; `found`: served from a committed entry."""
        ...

    def on_warm(self, key: str) -> None:
        """`key` is being warmed: protect it as a read would, without moving any plan."""
        ...

    def on_commit(self, key: str) -> None:
        """`key` is cached now."""
        ...

    def on_evict(self, key: str) -> None:
        """`key` left the cache (evicted, deleted, dropped)."""
        ...

    def is_transient(self, key: str, look_ahead: bool, read_now: bool) -> bool:
        """Whether a fill of `key` is admitted into the transient area rather than as an
        ordinary entry: `look_ahead`, a prefetch nobody read yet (pinned); `read_now`, one a
        client's read joined."""
        ...

    def is_protected(self, key: str) -> bool:
        """Whether evicting `key` for a new fill would throw away what is still in use."""
        ...

    def area_free_bytes(self) -> int:
        """The part of the transient area ordinary fills must leave free now."""
        ...

    def next_use_s(self, key: str) -> float | None:
        """Seconds until a plan reads `key`, or None when none does (or none is followed)."""
        ...

    def choose(
        self,
        candidates: list[str],
        for_key: str | None,
        protect: bool,
        is_spared: Callable[[str], bool],
    ) -> str | None:
        """The key to evict first, or None; raises NotAdmitted (only with `protect`) when the
        policy keeps it over a fill of `for_key`. `candidates` are the index's least recently
        used keys, the spared ones already left out; `is_spared` is for a policy that looks
        beyond them."""
        ...

    def status(self, bypassed: int) -> AdmissionState:
        """What `/_/status` and `/metrics` show; `bypassed`: fills not admitted so far."""
        ...


class LeastRecentlyUsed:
    """Evict the least recently used entry; admit every fill (`--eviction lru`)."""

    plans: PlanBook | None = None

    def __init__(self) -> None:
        self.area = TransientArea(0)

    @property
    def ordinary(self) -> EvictionPolicy:
        return self

    def on_open(self, cached: Callable[[], Iterable[str]]) -> None:
        pass

    def on_request(self, key: str, found: bool) -> None:
        pass

    def on_warm(self, key: str) -> None:
        pass

    def on_commit(self, key: str) -> None:
        pass

    def on_evict(self, key: str) -> None:
        pass

    def is_transient(self, key: str, look_ahead: bool, read_now: bool) -> bool:
        return False

    def is_protected(self, key: str) -> bool:
        return False

    def area_free_bytes(self) -> int:
        return self.area.free_bytes()

    def next_use_s(self, key: str) -> float | None:
        return None

    def choose(
        self,
        candidates: list[str],
        for_key: str | None,
        protect: bool,
        is_spared: Callable[[str], bool],
    ) -> str | None:
        return candidates[0] if candidates else None

    def status(self, bypassed: int) -> AdmissionState:
        return _state("lru", bypassed, self.area, is_serving=True)


class ScanResistant(LeastRecentlyUsed):
    """LRU, but a fill whose victim admission protects streams through instead; look-ahead
    prefetches wait in the transient area until read once. A read of one is no hit on the
    resident set. Overrides only what differs from LRU."""

    def __init__(self, admission: ScanResistantAdmission, transient_max_bytes: int = 0) -> None:
        self.admission = admission
        self.area = TransientArea(transient_max_bytes)

    def on_request(self, key: str, found: bool) -> None:
        self.admission.on_request(key, found and not self.area.holds(key))

    def on_warm(self, key: str) -> None:
        self.admission.on_request(key, False)

    def is_transient(self, key: str, look_ahead: bool, read_now: bool) -> bool:
        return look_ahead or read_now

    def is_protected(self, key: str) -> bool:
        return self.admission.is_protected(key)

    def choose(
        self,
        candidates: list[str],
        for_key: str | None,
        protect: bool,
        is_spared: Callable[[str], bool],
    ) -> str | None:
        key = super().choose(candidates, for_key, protect, is_spared)
        if key is not None and protect and self.admission.is_protected(key):
            raise NotAdmitted(f"the entries eviction would take are in use (first: {key})")
        return key

    def status(self, bypassed: int) -> AdmissionState:
        return _state("scan-resistant", bypassed, self.area, self.admission.is_serving())


class PlanAware:
    """While a loader's plan is active, Belady over the plans (`choose_victim`); otherwise,
    and for every event the plans do not concern, the `ordinary` policy it wraps. A look-ahead
    prefetch a plan names is an ordinary fill: the plans rank it as needed soon."""

    def __init__(self, plans: PlanBook, ordinary: EvictionPolicy) -> None:
        self._plans = plans
        self._ordinary = ordinary

    @property
    def area(self) -> TransientArea:
        return self._ordinary.area

    @property
    def plans(self) -> PlanBook | None:
        return self._plans

    @property
    def ordinary(self) -> EvictionPolicy:
        return self._ordinary

    def on_open(self, cached: Callable[[], Iterable[str]]) -> None:
        self._plans.forget_cached(cached())
        self._ordinary.on_open(cached)

    def on_request(self, key: str, found: bool) -> None:
        self._ordinary.on_request(key, found)
        self._plans.on_request(key, found and not self._ordinary.area.holds(key))

    def on_warm(self, key: str) -> None:
        self._ordinary.on_warm(key)  # no job read it: no plan moves

    def on_commit(self, key: str) -> None:
        self._plans.on_cached(key)
        self._ordinary.on_commit(key)

    def on_evict(self, key: str) -> None:
        self._ordinary.on_evict(key)
        self._plans.on_evicted(key)

    def is_transient(self, key: str, look_ahead: bool, read_now: bool) -> bool:
        unplanned = look_ahead and self._plans.next_use_s(key) is None
        return self._ordinary.is_transient(key, unplanned, read_now)

    def is_protected(self, key: str) -> bool:
        return self._ordinary.is_protected(key)

    def area_free_bytes(self) -> int:
        """Nothing while a plan is active: a look-ahead no plan names evicts by the plans'
        ranking instead."""
        return 0 if self._plans.is_active else self._ordinary.area_free_bytes()

    def next_use_s(self, key: str) -> float | None:
        return self._plans.next_use_s(key)

    def choose(
        self,
        candidates: list[str],
        for_key: str | None,
        protect: bool,
        is_spared: Callable[[str], bool],
    ) -> str | None:
        """May return a key outside `candidates` (one the plans read furthest away)."""
        if not self._plans.is_active:
            return self._ordinary.choose(candidates, for_key, protect, is_spared)
        victim, admit = choose_victim(
            candidates, for_key, self._plans, self._ordinary.is_protected, is_spared
        )
        if victim is None:
            return None
        if protect and not admit:
            raise NotAdmitted(f"the plans need the entries eviction would take ({victim})")
        return victim

    def status(self, bypassed: int) -> AdmissionState:
        active = self._plans.status()
        state = self._ordinary.status(bypassed)
        return dataclasses.replace(state, policy="plan", plans=active) if active else state


def policy_for(
    admission: ScanResistantAdmission | None,
    plans: PlanBook | None,
    transient_max_bytes: int = 0,
) -> EvictionPolicy:
    """The policy the parts make: scan-resistant with `admission` (a transient area of up to
    `transient_max_bytes`), else LRU; plan-aware over that with `plans`."""
    ordinary: EvictionPolicy = (
        LeastRecentlyUsed() if admission is None else ScanResistant(admission, transient_max_bytes)
    )
    return ordinary if plans is None else PlanAware(plans, ordinary)


def _state(policy: str, bypassed: int, area: TransientArea, is_serving: bool) -> AdmissionState:
    return AdmissionState(
        policy,
        bypassed,
        area.held_bytes(),
        area.area_bytes,
        area.kept,
        area.dropped,
        is_serving,
    )


def choose_victim(
    candidates: Iterable[str],
    fill_key: str | None,
    plans: PlanBook,
    is_protected: Callable[[str], bool],
    excluded: Callable[[str], bool],
) -> tuple[str | None, bool]:
    """Plan-aware eviction: return (victim, admit) for a fill of `fill_key`.

    `candidates` are evictable keys, least recently used first (a bounded batch). The victim is
    the first that no plan reads again and admission does not protect; else the first no plan
    reads again (protected: only a fill some plan reads again may take its place); else the one
    whose next planned use is furthest, which a fill may take only when it is needed sooner.
    `admit` False means: stream the fill through. (None, False) when nothing is evictable.
    """
    unplanned_protected: str | None = None
    for key in candidates:
        if plans.next_use_s(key) is None:
            if not is_protected(key):
                return key, True
            if unplanned_protected is None:
                unplanned_protected = key
    fill_use = plans.next_use_s(fill_key) if fill_key is not None else None
    if unplanned_protected is not None:
        return unplanned_protected, fill_use is not None
    furthest = plans.furthest(excluded)
    if furthest is None:
        return None, False
    victim, victim_use = furthest
    return victim, fill_use is not None and fill_use < victim_use
