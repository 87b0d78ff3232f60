"""`ChecksumTrust`: the kinds of published checksum each origin has shown it cannot get right.

A kind is set aside only on a second opinion (another published checksum of the same bytes
matched), never on one checksum's say, and is still used where it is all an object has. One
owner (the cache); fills ask `usable()` and report `set_aside()`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shardcache.checksums import Algorithm, Checksum
from shardcache.observer import Observer

log = logging.getLogger("shardcache.checksums")


@dataclass(frozen=True, slots=True)
class SetAside:
    """A checksum kind an origin publishes but cannot get right, and the evidence."""

    checksum: str  # where it is published: "x-amz-checksum-crc32c (composite)"
    algorithm: Algorithm
    key: str  # the object that showed it
    reason: str  # its mismatch
    vouched_by: str  # the independent checksum the same bytes matched


class ChecksumTrust:
    def __init__(self, observer: Observer) -> None:
        self._observer = observer
        self._set_aside: dict[str, dict[Algorithm, SetAside]] = {}

    def usable(self, origin: str, found: tuple[Checksum, ...]) -> tuple[Checksum, ...]:
        """`found` without the kinds set aside for `origin`, unless that would leave the object
        none: one object's evidence never makes another unverified (else a proxy rewriting one
        object's CRC32 could get a second object, whose only checksum is CRC32, "verified" by
        its length alone). An object checked only by set-aside kinds is still checked by them,
        and fails as before when they do not match."""
        aside = self._set_aside.get(origin)
        if not aside:
            return found
        kept = tuple(c for c in found if c.algorithm not in aside)
        return kept or found

    def set_aside(
        self, origin: str, checksum: Checksum, key: str, reason: str, vouched_by: Checksum
    ) -> None:
        """`checksum` failed bytes that `vouched_by` (another published checksum) matched:
        stop using its kind for `origin`. Said and counted the first time only."""
        aside = self._set_aside.setdefault(origin, {})
        if checksum.algorithm in aside:
            return
        aside[checksum.algorithm] = SetAside(
            checksum.source, checksum.algorithm, key, reason, vouched_by.source
        )
        self._observer.checksum_unusable(origin, checksum.algorithm)
        log.warning(
            "origin %s: %s is unusable for this origin (%s: %s, but %s matched the same bytes); "
            "its objects are verified without it from now on",
            origin,
            checksum.source,
            key,
            reason,
            vouched_by.source,
        )

    def status(self) -> dict[str, list[dict[str, str]]]:
        """Per origin, the kinds set aside, for `/_/status`."""
        return {
            origin: [
                {
                    "checksum": a.checksum,
                    "algorithm": a.algorithm,
                    "key": a.key,
                    "reason": a.reason,
                    "vouched_by": a.vouched_by,
                }
                for a in aside.values()
            ]
            for origin, aside in self._set_aside.items()
            if aside
        }
