"""Incremental verifiers for the checksums an origin publishes (pure): S3 ETags (single-part MD5,
multipart `md5-parts`), `Content-MD5`, full-object `x-amz-checksum-*`, and S3's composite
(`<algorithm>-parts`) checksums. Which S3 checksum is which is `origins.s3_checksums`' rule; what
cannot be computed is skipped (length is still checked by `fill`)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from awscrt.checksums import crc32c as _crt_crc32c
from awscrt.checksums import crc64nvme as _crt_crc64nvme

from shardcache.errors import CacheError, IntegrityError

Algorithm = Literal[
    "md5",
    "sha1",
    "sha256",
    "crc32",
    "crc32c",
    "crc64nvme",
    "md5-parts",
    "crc32-parts",
    "crc32c-parts",
    "sha1-parts",
    "sha256-parts",
]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)  # metric labels, touched at zero
_HEX_MD5 = re.compile(r'^"?([0-9a-fA-F]{32})"?$')
_MULTIPART_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})-([1-9][0-9]{0,4})"?$')
_AMZ_ALGORITHMS: dict[str, Algorithm] = {
    "sha256": "sha256",
    "sha1": "sha1",
    "crc32": "crc32",
    "crc32c": "crc32c",
    "crc64nvme": "crc64nvme",
}
# The composite (per-part) form of each algorithm S3 publishes one for.
COMPOSITE: dict[Algorithm, Algorithm] = {
    "md5": "md5-parts",
    "crc32": "crc32-parts",
    "crc32c": "crc32c-parts",
    "sha1": "sha1-parts",
    "sha256": "sha256-parts",
}


@dataclass(frozen=True, slots=True)
class Checksum:
    """An expected digest of the whole object and where the origin published it."""

    algorithm: Algorithm
    digest: bytes
    source: str
    part_bytes: int = 0  # `*-parts` only: the size of every part but the last

    @property
    def is_composite(self) -> bool:
        """Whether this is a per-part checksum (its digest ends with the part count)."""
        return self.algorithm.endswith("-parts")


class _Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def digest(self) -> bytes: ...


class _Crc32:
    """zlib.crc32 behind the hashlib interface; S3 publishes it as 4 big-endian bytes."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._value = zlib.crc32(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


class _Crc32c:
    """CRC-32C (Castagnoli) with the CPU's crc32 and carry-less multiply instructions,
    through awscrt."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._value = _crt_crc32c(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


class _Crc64Nvme:
    """CRC-64/NVME through awscrt: S3's default for objects uploaded by today's SDKs."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._value = _crt_crc64nvme(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(8, "big")


class _Parts:
    """A per-part checksum, as S3 builds a multipart ETag (MD5) and a composite checksum (CRC32,
    CRC32C, SHA-1, SHA-256): the algorithm over the concatenated digests of each `part_bytes`
    part. Its digest is that followed by the number of parts (4 bytes), as the `-N` says: a
    body cut into another number of parts does not match."""

    def __init__(self, algorithm: Algorithm, part_bytes: int) -> None:
        if part_bytes <= 0:
            raise ValueError(f"a per-part {algorithm} needs its part size, not {part_bytes}")
        self._algorithm = algorithm
        self._part_bytes = part_bytes
        self._part = _new_hasher(algorithm)
        self._left = part_bytes
        self._digests: list[bytes] = []

    def update(self, data: bytes | memoryview, /) -> None:
        while len(data) >= self._left:  # the rest of this part, then the next one
            left = self._left
            self._part.update(memoryview(data)[:left] if len(data) > left else data)
            self._digests.append(self._part.digest())
            self._part, self._left = _new_hasher(self._algorithm), self._part_bytes
            data = memoryview(data)[left:]
            if not data:
                return
        self._part.update(data)  # whole chunks inside a part are hashed without a copy
        self._left -= len(data)

    def digest(self) -> bytes:
        digests = self._digests + ([self._part.digest()] if self._left < self._part_bytes else [])
        whole = _new_hasher(self._algorithm)
        whole.update(b"".join(digests))
        return whole.digest() + len(digests).to_bytes(4, "big")


def _new_hasher(algorithm: Algorithm, part_bytes: int = 0) -> _Hasher:
    if algorithm.endswith("-parts"):
        return _Parts(_WHOLE_OF[algorithm], part_bytes)
    if algorithm == "crc32":
        return _Crc32()
    if algorithm == "crc32c":
        return _Crc32c()
    if algorithm == "crc64nvme":
        return _Crc64Nvme()
    return hashlib.new(algorithm)


_WHOLE_OF: dict[Algorithm, Algorithm] = {parts: whole for whole, parts in COMPOSITE.items()}


# The digest kept per entry when no published checksum can be rechecked on its own, for
# `shardcache verify`: it detects what happens to a file on local disk (bit rot, truncation, a
# torn write). The fill's writer threads take it as the bytes land, per segment, combined with
# `crc32c_combine`: CRC-32C runs on the CPU's crc32 instruction (8.4 GB/s here, against 2.6 for
# zlib's CRC-32, which cost a capped miss 12% of its throughput on two cores).
LOCAL_DIGEST: Algorithm = "crc32c"


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """The running CRC-32C of `data` after `crc` (what `_Crc32c` computes). Any buffer, no
    copy: awscrt hashes a receiver's landing buffer or a page-cache read in place."""
    return int(_crt_crc32c(data, crc))


class Verifier:
    """Feeds every body byte, in order, to one hasher per expected checksum.

    `update()` releases the GIL for large buffers (hashlib and zlib do), so callers run it in
    a worker thread.
    """

    def __init__(self, checksums: tuple[Checksum, ...]) -> None:
        self.checksums = checksums
        self._hashers = [_new_hasher(c.algorithm, c.part_bytes) for c in checksums]

    def only(self, kept: tuple[Checksum, ...]) -> Verifier:
        """This verifier reduced to those of its checksums in `kept`, with what they hashed."""
        pairs = [(c, h) for c, h in zip(self.checksums, self._hashers, strict=True) if c in kept]
        reduced = Verifier(())
        reduced.checksums = tuple(c for c, _ in pairs)
        reduced._hashers = [h for _, h in pairs]
        return reduced

    def update(self, data: bytes | memoryview) -> None:
        for hasher in self._hashers:
            hasher.update(data)

    def update_from(self, fd: int, offset: int, count: int) -> None:
        """Feed bytes [offset, offset+count) of `fd`, in 1 MiB reads (a bounded buffer per
        fill: sixteen fills at once must not cost a 4 MiB buffer each). Blocking: call it on
        a worker thread. Raises CacheError when the file is shorter than that."""
        while count:
            data = os.pread(fd, min(count, 1 << 20), offset)
            if not data:
                raise CacheError("the partial file is shorter than what was written")
            self.update(data)
            offset += len(data)
            count -= len(data)

    def digests(self) -> dict[str, str]:
        """Hex digest per algorithm of everything hashed so far (a multipart ETag's is left
        out: it cannot be rechecked without its part size)."""
        pairs = zip(self.checksums, self._hashers, strict=True)
        return {c.algorithm: h.digest().hex() for c, h in pairs if c.algorithm in _HEADER_FOR}

    def mismatches(self) -> dict[Checksum, str]:
        """What does not match: each such checksum with a sentence saying so (empty when
        everything matches)."""
        found = {}
        for checksum, hasher in zip(self.checksums, self._hashers, strict=True):
            actual = hasher.digest()
            if actual != checksum.digest:
                found[checksum] = (
                    f"{checksum.algorithm} from {checksum.source} does not match: expected "
                    f"{_shown(checksum, checksum.digest)}, received {_shown(checksum, actual)}"
                )
        return found

    def verify(self) -> None:
        """Raise IntegrityError naming the first checksum that does not match."""
        for reason in self.mismatches().values():
            raise IntegrityError(reason)


def _shown(checksum: Checksum, digest: bytes) -> str:
    """A digest as S3 writes it: hex, and a per-part one's part count as `-N` (it is kept as
    four trailing bytes, which read as part of the value in a log)."""
    if not checksum.part_bytes or len(digest) <= 4:
        return digest.hex()
    return f"{digest[:-4].hex()}-{int.from_bytes(digest[-4:], 'big')}"


def from_s3_etag(etag: str | None, server_side_encryption: str | None = None) -> Checksum | None:
    """Return the MD5 an S3 ETag stands for, or None when it is not an MD5 of the body."""
    if not etag or server_side_encryption not in (None, "", "AES256"):
        return None
    match = _HEX_MD5.match(etag.strip())
    if match is None:  # multipart ETags look like "<hex>-<parts>"
        return None
    return Checksum("md5", bytes.fromhex(match.group(1)), "etag")


_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected


def _multmodp(a: int, b: int, poly: int = _CRC32C_POLY) -> int:
    """a·b modulo a CRC-32 polynomial, in zlib's reflected bit order (crc32.c)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table, p = [], 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()  # x^(2^k) modulo the polynomial, k = 0..31


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32C of A+B from crc32c(A), crc32c(B) and len(B), by zlib's crc32_combine
    algorithm over the Castagnoli polynomial: segments fetched in parallel each keep their
    own CRC, combined in order at the end."""
    p, k = 1 << 31, 3  # x^0; x^(8·len2) is built from x^(2^k), bytes to bits
    while len2:
        if len2 & 1:
            p = _multmodp(_X2N[k & 31], p)
        len2 >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


def multipart_etag_parts(etag: str | None) -> int | None:
    """The number of parts a multipart S3 ETag names, or None for any other ETag."""
    match = _MULTIPART_ETAG.match((etag or "").strip())
    return int(match.group(2)) if match else None


def from_s3_multipart_etag(
    etag: str, part_bytes: int, server_side_encryption: str | None = None
) -> Checksum | None:
    """The checksum a multipart ETag stands for when every part but the last has
    `part_bytes` bytes (what aws s3 cp, boto3, s5cmd, rclone and mc upload), or None."""
    match = _MULTIPART_ETAG.match(etag.strip())
    if match is None or server_side_encryption not in (None, "", "AES256") or part_bytes <= 0:
        return None
    digest = bytes.fromhex(match.group(1)) + int(match.group(2)).to_bytes(4, "big")
    return Checksum("md5-parts", digest, "etag (multipart)", part_bytes)


def composite(
    algorithm: Algorithm, digest: bytes, parts: int, part_bytes: int, source: str
) -> Checksum:
    """A composite checksum of `algorithm` (a whole-object one, such as "crc32") over `parts`
    parts of `part_bytes` bytes each but the last, as S3 publishes it for a multipart object."""
    return Checksum(
        COMPOSITE[algorithm], digest + parts.to_bytes(4, "big"), f"{source} (composite)", part_bytes
    )


# CPU per byte, cheapest first (this machine: CRC-64/NVME 15 GB/s with awscrt, CRC-32C 8.4,
# CRC-32 2.6, SHA-1 1.7, SHA-256 1.6 with SHA-NI, MD5 0.7; a per-part checksum costs its
# algorithm plus the part bookkeeping).
_COST_ORDER: tuple[Algorithm, ...] = (
    "crc64nvme",
    "crc32c",
    "crc32c-parts",
    "crc32",
    "crc32-parts",
    "sha1",
    "sha1-parts",
    "sha256",
    "sha256-parts",
    "md5",
    "md5-parts",
)


def cheapest(checksums: tuple[Checksum, ...]) -> tuple[Checksum, ...]:
    """The one published checksum that is cheapest to compute (or none): any one of them
    proves the bytes are the object the origin describes, and S3 often publishes two (an MD5
    ETag and a CRC), which would double the hashing of every miss for nothing."""
    if not checksums:
        return ()
    return (min(checksums, key=lambda c: _COST_ORDER.index(c.algorithm)),)


def has_storable_digest(checksums: tuple[Checksum, ...]) -> bool:
    """Whether one of `checksums` can be kept with an entry and rechecked on its own by
    `shardcache verify` (a multipart ETag needs its part size, which is not kept)."""
    return any(c.algorithm in _HEADER_FOR for c in checksums)


def _b64(value: str) -> bytes | None:
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def from_headers(headers: Mapping[str, str], part_bytes: int = 0) -> list[Checksum]:
    """Return the full-object checksums in `headers` (`Content-MD5`, `x-amz-checksum-*`), and
    with `part_bytes` the composites too.

    `headers` must be case-insensitive or lower-case. A composite checksum (S3 marks it with a
    `-N` suffix or `x-amz-checksum-type: COMPOSITE`) is no digest of the body: it is read only
    with the size of each part but the last (`part_bytes`, which only an entry's metadata
    knows), else skipped. So is any `x-amz-checksum-*` of a
    multipart object (ETag `...-N`) that no type calls FULL_OBJECT: some stores publish a
    composite without its suffix (moto 5).
    """
    found: list[Checksum] = []
    content_md5 = headers.get("content-md5")
    if content_md5 and (digest := _b64(content_md5)) is not None and len(digest) == 16:
        found.append(Checksum("md5", digest, "Content-MD5"))
    kind = str(headers.get("x-amz-checksum-type", "")).upper()
    if kind == "COMPOSITE" or (not kind and multipart_etag_parts(headers.get("etag"))):
        return found + _composites(headers, part_bytes) if part_bytes > 0 else found
    for name, algorithm in _AMZ_ALGORITHMS.items():
        value = headers.get(f"x-amz-checksum-{name}")
        if not value or "-" in value:
            continue
        if (digest := _b64(value)) is not None:
            found.append(Checksum(algorithm, digest, f"x-amz-checksum-{name}"))
    return found


def _composites(headers: Mapping[str, str], part_bytes: int) -> list[Checksum]:
    """The composites in `headers` written as S3 writes them (`<base64>-<parts>`), as
    checksums of parts of `part_bytes` bytes."""
    found = []
    for name, algorithm in _AMZ_ALGORITHMS.items():
        encoded, dash, count = headers.get(f"x-amz-checksum-{name}", "").partition("-")
        if algorithm not in COMPOSITE or not dash or not count.isdigit():
            continue
        parts, source = int(count), f"x-amz-checksum-{name}"
        if (digest := _b64(encoded)) is not None and 0 < parts <= MAX_COMPOSITE_PARTS:
            found.append(composite(algorithm, digest, parts, part_bytes, source))
    return found


_HEADER_FOR: dict[str, str] = {
    "crc64nvme": "x-amz-checksum-crc64nvme",
    "crc32c": "x-amz-checksum-crc32c",
    "md5": "Content-MD5",
    "sha256": "x-amz-checksum-sha256",
    "sha1": "x-amz-checksum-sha1",
    "crc32": "x-amz-checksum-crc32",
}
# The composites S3 publishes as `x-amz-checksum-*` (a multipart ETag is published as itself).
_COMPOSITE_HEADER_FOR: dict[str, str] = {
    parts: f"x-amz-checksum-{whole}" for whole, parts in COMPOSITE.items() if whole != "md5"
}
MAX_COMPOSITE_PARTS = 10_000  # S3's limit on an upload's parts


def to_headers(checksums: tuple[Checksum, ...]) -> dict[str, str]:
    """The response headers that publish `checksums` (what `from_headers` reads back), so a
    shardcache tier below, or any client, can verify the whole object end to end. A multipart
    ETag is published as the ETag itself. `x-amz-checksum-type` says which kind the
    `x-amz-checksum-*` are, as S3 says it: FULL_OBJECT, or COMPOSITE for a composite, written
    as S3 writes one (`<base64>-<parts>`: clients skip checking it, and a tier below reads it
    as no digest of the body). One response has one type: a composite is published only when
    no full-object checksum is."""
    found = {
        _HEADER_FOR[c.algorithm]: base64.b64encode(c.digest).decode()
        for c in checksums
        if c.algorithm in _HEADER_FOR
    }
    if any(name.startswith("x-amz-") for name in found):
        found["x-amz-checksum-type"] = "FULL_OBJECT"
        return found
    for c in checksums:
        if c.algorithm in _COMPOSITE_HEADER_FOR and len(c.digest) > 4:
            parts = int.from_bytes(c.digest[-4:], "big")
            value = f"{base64.b64encode(c.digest[:-4]).decode()}-{parts}"
            found[_COMPOSITE_HEADER_FOR[c.algorithm]] = value
            found["x-amz-checksum-type"] = "COMPOSITE"
    return found


def composite_part_bytes(checksums: tuple[Checksum, ...]) -> int:
    """The part size of the composites among `checksums` that `to_headers` publishes (what
    `from_headers` needs to read them back), or 0 when there is none."""
    return next((c.part_bytes for c in checksums if c.algorithm in _COMPOSITE_HEADER_FOR), 0)
