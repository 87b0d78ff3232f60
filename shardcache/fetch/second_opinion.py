"""`SecondOpinion`: what a fill does when its body on disk failed the published checksum it
was hashed against: hash the same bytes again against every other published checksum.

A corrupt body fails every checksum that applies to it, so when another one matches, the bytes
are the object the origin describes and what failed is a checksum the origin cannot get right
(moto's CRC32C composite): it is set aside for the origin (`checksum_trust`) and the body is
verified by what matched. With nothing else published, or nothing else matching, the fill
fails as before: unverified bytes are never served as verified. The bytes are read back from
the partial file, never fetched again.
"""

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
