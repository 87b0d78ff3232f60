"""Which checksums an S3 HeadObject publishes are of the whole object, and which are composite
(per part), by S3's rules as stores actually apply them (pure).

Whole-object only when the store says `FULL_OBJECT`, the object is single-part (an ETag
without `-N`), or the algorithm has no composite form (CRC-64/NVME); a composite is checked
only once the part layout is known (`per_part`)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardcache import checksums
from shardcache.checksums import Algorithm, Checksum

# HeadObject's fields, and the header each stands for (what logs and X-Shardcache-Verified name).
_FIELDS: dict[str, Algorithm] = {
    "ChecksumSHA256": "sha256",
    "ChecksumSHA1": "sha1",
    "ChecksumCRC32": "crc32",
    "ChecksumCRC32C": "crc32c",
    "ChecksumCRC64NVME": "crc64nvme",
}


@dataclass(frozen=True, slots=True)
class Composite:
    """A published composite checksum: its algorithm, digest, and the part count its `-N`
    suffix names (None without a suffix)."""

    algorithm: Algorithm
    digest: bytes
    parts: int | None


@dataclass(frozen=True, slots=True)
class Published:
    """What one HeadObject publishes: whole-object checksums, usable as they are, and
    composites, usable once the part layout is known."""

    full: tuple[Checksum, ...]
    composites: tuple[Composite, ...]
    etag_parts: int | None  # the part count a multipart ETag names

    @property
    def parts(self) -> int | None:
        """The object's part count: the ETag's, else a composite's `-N`; None if unknown."""
        if self.etag_parts:
            return self.etag_parts
        return next((c.parts for c in self.composites if c.parts), None)

    def per_part(self, parts: int, part_bytes: int) -> tuple[Checksum, ...]:
        """The composites as checksums of a body of `parts` parts of `part_bytes` bytes (all
        but the last); one whose `-N` names another part count is left out (it describes
        another layout, and could never match)."""
        return tuple(
            checksums.composite(
                c.algorithm, c.digest, parts, part_bytes, f"x-amz-checksum-{c.algorithm}"
            )
            for c in self.composites
            if c.parts in (None, parts)
        )


def _split(value: str) -> tuple[bytes, int | None] | None:
    """A published value as (digest, part count of its `-N` suffix or None), or None when
    it is not base64 (or its suffix is not a count)."""
    encoded, dash, suffix = value.strip().partition("-")
    if dash and not suffix.isdigit():
        return None
    try:
        digest = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return digest, int(suffix) if dash else None


def published(response: Mapping[str, Any]) -> Published:
    """Sort the `Checksum*` fields of a HeadObject `response` into whole-object checksums and
    composites. CRC64NVME is used whole only (S3 has no composite CRC64NVME)."""
    kind = str(response.get("ChecksumType") or "").upper()
    etag_parts = checksums.multipart_etag_parts(response.get("ETag"))
    full: list[Checksum] = []
    composites: list[Composite] = []
    for field, algorithm in _FIELDS.items():
        value = response.get(field)
        split = _split(value) if isinstance(value, str) else None
        if split is None:
            continue
        digest, suffix = split
        if kind not in ("", "FULL_OBJECT", "COMPOSITE"):
            continue  # a type this code does not know: nothing it could check
        # Untyped (moto's HEAD), a multipart object's value is a composite, unless its
        # algorithm has no composite form (CRC-64/NVME): then it is of the whole object.
        may_be_composite = bool(etag_parts) and algorithm in checksums.COMPOSITE
        if kind == "FULL_OBJECT" or (not kind and suffix is None and not may_be_composite):
            if suffix is None:
                full.append(Checksum(algorithm, digest, f"x-amz-checksum-{algorithm}"))
        elif algorithm in checksums.COMPOSITE:
            composites.append(Composite(algorithm, digest, suffix))
    return Published(tuple(full), tuple(composites), etag_parts)
