"""Rendezvous (highest-random-weight) hashing: which tier member owns a key (pure).

Every node computes the same order from the same member list with no coordination; adding or
removing a member moves only the keys it gains or owned (Thaler and Ravishankar, 1998; CARP)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(member: str, key: str) -> int:
    """The member's weight for `key`: 64 bits of BLAKE2b, the same in every process (unlike
    Python's `hash`, which is salted per process)."""
    digest = hashlib.blake2b(f"{member}\n{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(key: str, members: Iterable[str]) -> list[str]:
    """`members` ordered by their weight for `key`, owner first; ties (never in practice) by
    name, so that the order is total."""
    return sorted(members, key=lambda member: (-weight(member, key), member))
