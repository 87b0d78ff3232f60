"""S3's composite checksums and which published checksum is of the whole object (issue 24):
the per-part verifiers against digests built here by S3's definition, the HeadObject rules
(`s3_checksums.published`, `s3._info`) on responses shaped as moto, SeaweedFS and AWS answer,
and the second opinion on the core (fake origin, temp-dir store)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import google_crc32c
import pytest

from shardcache import checksums
from shardcache.cache.lease import Result
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.checksums import Checksum, Verifier
from shardcache.errors import IntegrityError
from shardcache.observer import NullObserver
from shardcache.origins import s3_checksums
from shardcache.origins.s3 import _info
from tests.unit.cache.test_integrity import SEGMENTED
from tests.unit.cache.test_shard_cache import read_all, settle
from tests.unit.fakes import FakeOrigin

MiB = 1024 * 1024
PART = 64 * 1024


def _crc32(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def _crc32c(data: bytes) -> bytes:
    return int(google_crc32c.value(data)).to_bytes(4, "big")


HASHES: dict[str, Callable[[bytes], bytes]] = {
    "crc32": _crc32,
    "crc32c": _crc32c,
    "sha1": lambda d: hashlib.sha1(d).digest(),
    "sha256": lambda d: hashlib.sha256(d).digest(),
    "md5": lambda d: hashlib.md5(d).digest(),
}


def _composite(algorithm: str, data: bytes, part_bytes: int) -> tuple[bytes, int]:
    """S3's definition: algorithm(concat(algorithm(part) for each part)), and the parts."""
    parts = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)]
    return HASHES[algorithm](b"".join(HASHES[algorithm](p) for p in parts)), len(parts)


def _feed(verifier: Verifier, data: bytes, sizes: tuple[int, ...]) -> None:
    """Feed `data` in chunks of the given sizes in turn (crossing part ends anywhere), every
    other one as a memoryview."""
    position, turn = 0, 0
    while position < len(data):
        chunk = data[position : position + sizes[turn % len(sizes)]]
        verifier.update(memoryview(chunk) if turn % 2 else chunk)
        position += len(chunk)
        turn += 1


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "sha1", "sha256"])
@pytest.mark.parametrize("chunks", [(PART,), (1000, 77_777), (3 * PART + 5,)])
def test_a_composite_matches_s3s_definition_in_any_chunking(
    algorithm: checksums.Algorithm, chunks: tuple[int, ...]
) -> None:
    data = os.urandom(3 * PART + 1234)
    digest, parts = _composite(algorithm, data, PART)
    checksum = checksums.composite(algorithm, digest, parts, PART, f"x-amz-checksum-{algorithm}")
    assert checksum.is_composite and checksum.source.endswith("(composite)")
    verifier = Verifier((checksum,))
    _feed(verifier, data, chunks)
    assert verifier.mismatches() == {}
    verifier.verify()


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "sha256"])
def test_a_composite_fails_another_layout_and_another_body(algorithm: checksums.Algorithm) -> None:
    data = os.urandom(2 * PART + 9)
    digest, parts = _composite(algorithm, data, PART)
    wrong_layout = checksums.composite(algorithm, digest, parts, PART // 2, "x")
    wrong_count = checksums.composite(algorithm, digest, parts + 1, PART, "x")
    right = checksums.composite(algorithm, digest, parts, PART, "x")
    verifier = Verifier((wrong_layout, wrong_count))
    verifier.update(data)
    assert set(verifier.mismatches()) == {wrong_layout, wrong_count}
    corrupt = bytearray(data)
    corrupt[PART + 3] ^= 1
    verifier = Verifier((right,))
    verifier.update(bytes(corrupt))
    with pytest.raises(IntegrityError, match="does not match"):
        verifier.verify()


def test_the_multipart_etag_is_still_the_md5_composite() -> None:
    data = os.urandom(2 * PART + 1)
    digest, parts = _composite("md5", data, PART)
    checksum = checksums.from_s3_multipart_etag(f'"{digest.hex()}-{parts}"', PART)
    assert checksum is not None
    verifier = Verifier((checksum,))
    _feed(verifier, data, (5000,))
    verifier.verify()


def test_the_cheapest_composite_beats_the_multipart_etag() -> None:
    crc = checksums.composite("crc32", bytes(4), 3, PART, "x-amz-checksum-crc32")
    sha = checksums.composite("sha256", bytes(32), 3, PART, "x-amz-checksum-sha256")
    etag = checksums.from_s3_multipart_etag(f'"{"0" * 32}-3"', PART)
    assert etag is not None
    assert checksums.cheapest((etag, sha, crc)) == (crc,)
    assert checksums.cheapest((etag, sha)) == (sha,)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _response(etag: str, **fields: Any) -> dict[str, Any]:
    return {"ContentLength": 3 * PART, "ETag": etag, **fields}


MULTIPART_ETAG = f'"{"ab" * 16}-3"'
SINGLE_ETAG = f'"{"ab" * 16}"'


def test_moto_s_unsuffixed_untyped_crc_of_a_multipart_object_is_composite() -> None:
    """moto 5: the composite CRC32 with no `-3` and no type; only the ETag says multipart."""
    response = _response(MULTIPART_ETAG, ChecksumCRC32=_b64(bytes(4)))
    published = s3_checksums.published(response)
    assert published.full == ()
    assert published.composites == (s3_checksums.Composite("crc32", bytes(4), None),)
    assert published.parts == 3
    assert _info(response, published.full).checksums == ()  # not a whole-object CRC
    (crc,) = published.per_part(3, PART)
    assert (crc.algorithm, crc.part_bytes) == ("crc32-parts", PART)
    assert crc.digest == bytes(4) + (3).to_bytes(4, "big")


def test_a_suffixed_typed_composite_must_name_the_etag_s_part_count() -> None:
    """SeaweedFS and AWS: `...-3` and `ChecksumType: COMPOSITE`."""
    response = _response(
        MULTIPART_ETAG,
        ChecksumCRC32=_b64(bytes(4)) + "-3",
        ChecksumSHA256=_b64(bytes(32)) + "-2",  # names another layout: never used
        ChecksumType="COMPOSITE",
    )
    published = s3_checksums.published(response)
    assert published.full == ()
    assert [c.algorithm for c in published.per_part(3, PART)] == ["crc32-parts"]


def test_whole_object_checksums_are_those_the_store_says_or_of_single_part_objects() -> None:
    nvme = _b64(bytes(8))
    full = s3_checksums.published(
        _response(MULTIPART_ETAG, ChecksumCRC64NVME=nvme, ChecksumType="FULL_OBJECT")
    )
    assert [(c.algorithm, c.source) for c in full.full] == [
        ("crc64nvme", "x-amz-checksum-crc64nvme")
    ]
    single = _response(SINGLE_ETAG, ChecksumCRC32=_b64(bytes(4)))
    info = _info(single, s3_checksums.published(single).full)
    assert [c.algorithm for c in info.checksums] == ["crc32", "md5"]
    contradiction = _response(
        MULTIPART_ETAG, ChecksumCRC32=_b64(bytes(4)) + "-3", ChecksumType="FULL_OBJECT"
    )
    assert s3_checksums.published(contradiction) == s3_checksums.Published((), (), 3)
    unknown = _response(SINGLE_ETAG, ChecksumCRC32=_b64(bytes(4)), ChecksumType="NEW_KIND")
    assert s3_checksums.published(unknown).full == ()


def test_moto_s_untyped_crc64nvme_of_a_multipart_object_is_whole() -> None:
    """moto 5's HEAD of a multipart CRC64NVME upload: no type, no suffix; CRC-64/NVME has no
    composite form, so it is the whole object's (as moto's GET then says: FULL_OBJECT)."""
    response = _response(MULTIPART_ETAG, ChecksumCRC64NVME=_b64(bytes(8)))
    published = s3_checksums.published(response)
    assert [c.algorithm for c in published.full] == ["crc64nvme"]
    assert published.composites == ()


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "sha1", "sha256"])
def test_a_composite_is_republished_as_s3_writes_it_and_read_back(
    algorithm: checksums.Algorithm,
) -> None:
    data = os.urandom(3 * PART + 1234)
    digest, parts = _composite(algorithm, data, PART)
    checksum = checksums.composite(algorithm, digest, parts, PART, f"x-amz-checksum-{algorithm}")
    md5_parts = checksums.from_s3_multipart_etag(f'"{"ab" * 16}-{parts}"', PART)
    assert md5_parts is not None
    published = checksums.to_headers((checksum, md5_parts))  # the ETag is published as itself
    assert published == {
        f"x-amz-checksum-{algorithm}": f"{_b64(digest)}-{parts}",
        "x-amz-checksum-type": "COMPOSITE",
    }
    assert checksums.composite_part_bytes((md5_parts, checksum)) == PART
    assert checksums.from_headers(published) == []  # no part size: no digest of the body
    (again,) = checksums.from_headers(published, PART)
    assert again == checksum
    verifier = Verifier((again,))
    _feed(verifier, data, (1000,))
    verifier.verify()


def test_one_response_has_one_checksum_type() -> None:
    """A full-object checksum wins: a response's `x-amz-checksum-type` names one kind."""
    composite = checksums.composite("crc32", bytes(4), 3, PART, "x-amz-checksum-crc32")
    whole = Checksum("crc64nvme", bytes(8), "x-amz-checksum-crc64nvme")
    assert checksums.to_headers((composite, whole)) == {
        "x-amz-checksum-crc64nvme": _b64(bytes(8)),
        "x-amz-checksum-type": "FULL_OBJECT",
    }
    assert checksums.composite_part_bytes((whole,)) == 0
    garbage = {"x-amz-checksum-type": "COMPOSITE", "x-amz-checksum-crc32": "AAAAAA==-x"}
    assert checksums.from_headers(garbage, PART) == []
    too_many = {"x-amz-checksum-type": "COMPOSITE", "x-amz-checksum-crc32": "AAAAAA==-10001"}
    assert checksums.from_headers(too_many, PART) == []


def test_crc64nvme_is_verified_with_awscrt() -> None:
    from awscrt.checksums import crc64nvme

    data = os.urandom(PART + 3)
    checksum = Checksum("crc64nvme", crc64nvme(data).to_bytes(8, "big"), "x-amz-checksum-crc64nvme")
    verifier = Verifier((checksum,))
    _feed(verifier, data, (1000,))
    verifier.verify()
    assert checksums.cheapest((checksum, Checksum("crc32c", bytes(4), "x"))) == (checksum,)


def test_headers_of_a_multipart_object_without_a_type_carry_no_whole_object_checksum() -> None:
    crc = _b64(bytes(4))
    assert checksums.from_headers({"etag": MULTIPART_ETAG, "x-amz-checksum-crc32": crc}) == []
    typed = {"etag": MULTIPART_ETAG, "x-amz-checksum-crc32": crc}
    typed["x-amz-checksum-type"] = "FULL_OBJECT"
    assert [c.algorithm for c in checksums.from_headers(typed)] == ["crc32"]
    # What a shardcache tier republishes reads back as whole-object checksums.
    published = checksums.to_headers((Checksum("crc32", bytes(4), "x-amz-checksum-crc32"),))
    assert published["x-amz-checksum-type"] == "FULL_OBJECT"
    again = checksums.from_headers({"etag": MULTIPART_ETAG, **published})
    assert [c.algorithm for c in again] == ["crc32"]


# -- the second opinion, on the core ---------------------------------------------------------


class UnusableCounter(NullObserver):
    def __init__(self) -> None:
        self.unusable: list[tuple[str, str]] = []

    def checksum_unusable(self, origin: str, algorithm: str) -> None:
        self.unusable.append((origin, algorithm))


@pytest.fixture
def observer() -> UnusableCounter:
    return UnusableCounter()


@pytest.fixture
def origin() -> FakeOrigin:
    return FakeOrigin(accepts_ranges=True, chunk_bytes=64 * 1024, checksums_on_get=False)


@pytest.fixture
async def cache(
    tmp_path: Path, origin: FakeOrigin, observer: UnusableCounter
) -> AsyncIterator[ShardCache]:
    store = Store(tmp_path / "cache", 8 * MiB)
    shard_cache = ShardCache(store, {"fake": origin}, SEGMENTED, observer)
    yield shard_cache
    await shard_cache.aclose()
    assert store.check() == []
    store.close()


def _publish(origin: FakeOrigin, key: str, data: bytes, *, crc32c_wrong: bool) -> None:
    """What moto publishes for a CRC32C upload: a composite that is the CRC32 one (wrong when
    `crc32c_wrong`), beside the multipart ETag."""
    origin.put(key, data, with_md5=False)
    crc_digest, parts = _composite("crc32" if crc32c_wrong else "crc32c", data, PART)
    md5_digest, _ = _composite("md5", data, PART)
    etag = checksums.from_s3_multipart_etag(f'"{md5_digest.hex()}-{parts}"', PART)
    assert etag is not None
    crc = checksums.composite("crc32c", crc_digest, parts, PART, "x-amz-checksum-crc32c")
    origin.checksums[key] = (crc, etag)


async def _peek(cache: ShardCache, key: str) -> object:
    return await asyncio.to_thread(cache.store.peek, key)


async def test_a_checksum_that_never_matches_is_set_aside_on_a_second_opinion(
    cache: ShardCache, origin: FakeOrigin, observer: UnusableCounter, caplog: Any
) -> None:
    data = {key: os.urandom(MiB + 17) for key in ("a.tar", "b.tar")}
    for key, body in data.items():
        _publish(origin, key, body, crc32c_wrong=True)

    for key, body in data.items():
        assert await read_all(await cache.open("fake", key)) == body
        await settle(cache)
        hit = await cache.open("fake", key)
        assert hit.result is Result.HIT and hit.verified_by == ("length", "etag (multipart)")
        await hit.aclose()
    assert observer.unusable == [("fake", "crc32c-parts")]  # once, not once per object
    notices = [r for r in caplog.records if "is unusable for this origin" in r.message]
    assert len(notices) == 1 and notices[0].levelname == "WARNING"
    (aside,) = cache.checksum_trust.status()["fake"]
    assert (aside["checksum"], aside["vouched_by"]) == (
        "x-amz-checksum-crc32c (composite)",
        "etag (multipart)",
    )


async def test_a_corrupt_body_fails_every_checksum_and_nothing_is_set_aside(
    cache: ShardCache, origin: FakeOrigin, observer: UnusableCounter
) -> None:
    for crc32c_wrong in (False, True):
        _publish(origin, "a.tar", os.urandom(MiB + 17), crc32c_wrong=crc32c_wrong)
        origin.corrupt("a.tar", 300_000)
        with pytest.raises(IntegrityError):
            await read_all(await cache.open("fake", "a.tar"))
        await settle(cache)
        assert await _peek(cache, "fake://fake/a.tar") is None
    assert observer.unusable == [] and cache.checksum_trust.status() == {}


async def test_a_checksum_alone_is_never_set_aside(
    cache: ShardCache, origin: FakeOrigin, observer: UnusableCounter
) -> None:
    """Without an independent check the fill fails as it always did."""
    _publish(origin, "a.tar", os.urandom(MiB + 17), crc32c_wrong=True)
    origin.checksums["a.tar"] = origin.checksums["a.tar"][:1]  # the CRC32C composite only
    with pytest.raises(IntegrityError):
        await read_all(await cache.open("fake", "a.tar"))
    await settle(cache)
    assert observer.unusable == []


async def test_a_kind_set_aside_still_checks_objects_with_nothing_else(
    cache: ShardCache, origin: FakeOrigin, observer: UnusableCounter
) -> None:
    """Review attack: one object's wrong CRC32C (vouched for by its ETag) set the kind aside
    for the origin, and then a second object, whose only checksum was that kind, was served
    corrupt as verified by its length. A set-aside kind still checks such an object."""
    _publish(origin, "a.tar", os.urandom(MiB + 17), crc32c_wrong=True)
    assert len(await read_all(await cache.open("fake", "a.tar"))) == MiB + 17
    await settle(cache)
    assert observer.unusable == [("fake", "crc32c-parts")]

    body = os.urandom(MiB + 17)
    _publish(origin, "b.tar", body, crc32c_wrong=False)
    origin.checksums["b.tar"] = origin.checksums["b.tar"][:1]  # its CRC32C composite only
    origin.corrupt("b.tar", 300_000)
    with pytest.raises(IntegrityError):
        await read_all(await cache.open("fake", "b.tar"))
    await settle(cache)
    assert await _peek(cache, "fake://fake/b.tar") is None


def test_a_per_part_mismatch_reads_as_s3_writes_it() -> None:
    """The part count is kept as four trailing bytes: a log shows it as `-N`, as S3 does,
    not as part of the value (issue 24 review: `ff83b2ba00000002`)."""
    etag = checksums.from_s3_multipart_etag('"0123456789abcdef0123456789abcdef-2"', 5)
    assert etag is not None
    verifier = checksums.Verifier((etag,))
    verifier.update(b"0123456789")
    (reason,) = verifier.mismatches().values()
    assert "expected 0123456789abcdef0123456789abcdef-2, received " in reason
    assert reason.endswith("-2")
