"""`SecondOpinion`: a body that failed the checksum it was hashed against, hashed again (read back
from the partial file) against every other published checksum.

Another match means the failed checksum is one the origin cannot get right (`checksum_trust`);
nothing else matching fails the fill: unverified bytes are never served as verified."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from shardcache.checksums import Checksum, Verifier
from shardcache.errors import IntegrityError
from shardcache.fetch.checksum_trust import ChecksumTrust


@dataclass(frozen=True, slots=True)
class SecondOpinion:
    published: tuple[Checksum, ...]  # every usable checksum the origin published
    mismatches: dict[Checksum, str]  # what the body failed, with why
    fd: int  # the partial file, `size_bytes` long
    size_bytes: int

    async def judge(self, trust: ChecksumTrust, origin: str, key: str) -> Verifier:
        """Return a verifier of the checksums the body matched (for `checksums` and the
        digests kept with the entry), after setting aside for `origin` every kind it failed.
        Raises IntegrityError (the first mismatch) when no other checksum matched. Reads the
        file on a thread."""
        reason = next(iter(self.mismatches.values()))
        others = tuple(c for c in self.published if c not in self.mismatches)
        if not others:
            raise IntegrityError(reason)
        verifier = Verifier(others)
        await asyncio.to_thread(verifier.update_from, self.fd, 0, self.size_bytes)
        also_failed = verifier.mismatches()
        matched = tuple(c for c in others if c not in also_failed)
        if not matched:
            raise IntegrityError(reason)
        for checksum, why in {**self.mismatches, **also_failed}.items():
            trust.set_aside(origin, checksum, key, why, matched[0])
        return verifier.only(matched)
