"""Eviction policies as objects behind one interface: which entry goes first to make room for a
fill, and whether the fill is worth it (`LeastRecentlyUsed`, `ScanResistant`, `PlanAware`).

`choose` returns the key to evict (None: nothing may go), or raises `NotAdmitted` when the policy
keeps that entry over the fill. Pure: the store supplies the candidates from its index."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.plans import PlanBook
from shardcache.errors import NotAdmitted


class EvictionPolicy(Protocol):
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


class LeastRecentlyUsed:
    def choose(
        self,
        candidates: list[str],
        for_key: str | None,
        protect: bool,
        is_spared: Callable[[str], bool],
    ) -> str | None:
        return candidates[0] if candidates else None


@dataclass(frozen=True, slots=True)
class ScanResistant:
    admission: ScanResistantAdmission

    def choose(
        self,
        candidates: list[str],
        for_key: str | None,
        protect: bool,
        is_spared: Callable[[str], bool],
    ) -> str | None:
        if not candidates:
            return None
        key = candidates[0]
        if protect and self.admission.is_protected(key):
            raise NotAdmitted(f"the entries eviction would take are in use (first: {key})")
        return key


@dataclass(frozen=True, slots=True)
class PlanAware:
    plans: PlanBook
    admission: ScanResistantAdmission | None

    @property
    def is_active(self) -> bool:
        return self.plans.is_active

    def choose(
        self,
        candidates: list[str],
        for_key: str | None,
        protect: bool,
        is_spared: Callable[[str], bool],
    ) -> str | None:
        """May return a key outside `candidates` (one the plans read furthest away)."""
        victim, admit = choose_victim(
            candidates,
            for_key,
            self.plans,
            self.admission.is_protected if self.admission is not None else _never,
            is_spared,
        )
        if victim is None:
            return None
        if protect and not admit:
            raise NotAdmitted(f"the plans need the entries eviction would take ({victim})")
        return victim


def ordinary_policy(admission: ScanResistantAdmission | None) -> EvictionPolicy:
    """The policy when no plan is active: scan-resistant with admission, else plain LRU."""
    return LeastRecentlyUsed() if admission is None else ScanResistant(admission)


def _never(key: str) -> bool:
    return False


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
