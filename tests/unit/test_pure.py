"""The pure leaves: sizes, keys, ranges, checksums."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import zlib

import pytest

from shardcache.backoff import doubling_s
from shardcache.checksums import (
    Checksum,
    Verifier,
    crc32c,
    crc32c_combine,
    from_headers,
    from_s3_etag,
    from_s3_multipart_etag,
    multipart_etag_parts,
)
from shardcache.errors import IntegrityError, InvalidKey, RangeNotSatisfiable
from shardcache.keys import validate_key, validate_origin_name
from shardcache.serving.ranges import ByteRange, parse_range
from shardcache.units import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("500MiB", 500 * 2**20),
        ("20GiB", 20 * 2**30),
        ("1TiB", 2**40),
        ("4096", 4096),
        ("1.5GB", 1_500_000_000),
        (" 2 kib ", 2048),
        (1234, 1234),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1GiB", "0", "12 parsecs", "1e9", "１６", "1٫5GiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(512) == "512 B"
    assert format_size(1536 * 2**20) == "1.5 GiB"
    # 1000-1023 of a unit: whole numbers, not "1e+03 MiB" (`stats`, `--cache-size 1000GiB`)
    assert format_size(1000 * 2**20) == "1000 MiB"
    assert format_size(1023 * 2**20) == "1023 MiB"
    assert format_size(1000 * 2**30) == "1000 GiB"
    assert format_size(5000 * 2**40) == "5000 TiB"
    assert format_size(999 * 2**10) == "999 KiB"


@pytest.mark.parametrize("key", ["a.tar", "train/shards_000.tar", "a b/c%20d.tar", "x" * 1024])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    "key",
    ["", "a//b", "./a", "a/..", "a/../b", "a\x00b", "a\\b", "/a", "a/", "é" * 513, "\ud800.tar"],
)
def test_invalid_keys(key: str) -> None:
    with pytest.raises(InvalidKey):
        validate_key(key)


@pytest.mark.parametrize("name", ["metrics", "healthz", "readyz", "_", "-x", "a/b", ""])
def test_invalid_origin_names(name: str) -> None:
    with pytest.raises(InvalidKey):
        validate_origin_name(name)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-9", ByteRange(0, 9)),
        ("bytes=5-", ByteRange(5, 99)),
        ("bytes=-10", ByteRange(90, 99)),
        ("bytes=-500", ByteRange(0, 99)),
        ("bytes=90-500", ByteRange(90, 99)),
        ("bytes=0-1,5-6", None),
        ("items=0-1", None),
        ("bytes=9-2", None),
        ("bytes=0-" + "9" * 5000, ByteRange(0, 99)),  # past Python's 4,300-digit int() limit
        ("bytes=-" + "9" * 5000, ByteRange(0, 99)),
        ("bytes=\u0661-\u0662", None),  # Arabic-Indic digits are not a range
        ("bytes=\xa00-9", None),  # NBSP and NEL are no spaces (aiohttp reads them as surrogates)
        ("bytes=0-9\x85", None),
    ],
)
def test_parse_range(header: str | None, expected: ByteRange | None) -> None:
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize(
    "header", ["bytes=100-", "bytes=100-200", "bytes=-0", "bytes=" + "9" * 5000 + "-"]
)
def test_unsatisfiable_ranges(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable) as caught:
        parse_range(header, 100)
    assert caught.value.size_bytes == 100


def test_verifier_accepts_right_and_rejects_wrong_digests() -> None:
    body = b"shard bytes" * 1000
    published = {
        "content-md5": base64.b64encode(hashlib.md5(body).digest()).decode(),
        "x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(body).digest()).decode(),
        "x-amz-checksum-crc32": base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode(),
    }
    checksums = tuple(from_headers(published))
    assert [c.algorithm for c in checksums] == ["md5", "sha256", "crc32"]
    good = Verifier(checksums)
    for start in range(0, len(body), 777):
        good.update(body[start : start + 777])
    good.verify()
    bad = Verifier(checksums)
    bad.update(body[:-1] + b"X")
    with pytest.raises(IntegrityError, match="md5 from Content-MD5"):
        bad.verify()


def test_s3_etag_is_md5_only_when_single_part_and_not_kms() -> None:
    md5 = hashlib.md5(b"x").hexdigest()
    assert from_s3_etag(f'"{md5}"') == Checksum("md5", bytes.fromhex(md5), "etag")
    assert from_s3_etag(f'"{md5}-3"') is None
    assert from_s3_etag(f'"{md5}"', "aws:kms") is None
    assert from_s3_etag(None) is None


def test_composite_checksums_are_skipped() -> None:
    assert from_headers({"x-amz-checksum-sha256": "abc=-3"}) == []
    assert (
        from_headers({"x-amz-checksum-type": "COMPOSITE", "x-amz-checksum-crc32": "AAAAAA=="}) == []
    )


def test_multipart_etag_is_the_md5_of_the_parts_md5s() -> None:
    parts = [os.urandom(1000), os.urandom(1000), os.urandom(10)]
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    etag = f'"{hashlib.md5(md5s).hexdigest()}-3"'
    assert multipart_etag_parts(etag) == 3 and multipart_etag_parts('"abc"') is None
    checksum = from_s3_multipart_etag(etag, 1000)
    assert checksum is not None
    body = b"".join(parts)
    for cut in (1, 999, 1000, 1500, 2005):  # chunk edges that do and do not meet part edges
        verifier = Verifier((checksum,))
        verifier.update(body[:cut])
        verifier.update(body[cut:])
        verifier.verify()
    wrong_layout = Verifier((from_s3_multipart_etag(etag, 999),))  # type: ignore[arg-type]
    wrong_layout.update(body)
    with pytest.raises(IntegrityError):
        wrong_layout.verify()


def test_crc_combine_matches_the_crc_of_the_whole() -> None:
    rng = random.Random(9)
    for _ in range(200):
        a, b = rng.randbytes(rng.randint(0, 3000)), rng.randbytes(rng.randint(0, 3000))
        assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720 B.4)


def test_s3_crc32c_checksums_are_verified() -> None:
    data = b"shard bytes" * 1000
    published = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
    (checksum,) = from_headers({"x-amz-checksum-crc32c": published})
    verifier = Verifier((checksum,))
    verifier.update(data)
    verifier.verify()
    corrupt = Verifier((checksum,))
    corrupt.update(data[:-1] + b"x")
    with pytest.raises(IntegrityError):
        corrupt.verify()


def test_the_cheapest_published_checksum_is_the_one_verified() -> None:
    from shardcache.checksums import cheapest

    md5 = Checksum("md5", bytes(16), "etag")
    crc = Checksum("crc32", bytes(4), "x-amz-checksum-crc32")
    sha = Checksum("sha256", bytes(32), "x-amz-checksum-sha256")
    assert cheapest((md5, sha, crc)) == (crc,)
    assert cheapest((md5, sha)) == (sha,)
    assert cheapest(()) == ()


@pytest.mark.parametrize(
    "pattern",
    [
        "a",
        "{a,b}",
        "x{1..10}y",
        "{07..10}",
        "{a..g..2}",
        "{4..1}",
        "{2..-1}",
        r"{1\{2,3}",
        "{a,{b,c}}",
        "{}",
        "{a}",
        "{{a,b},{c,d}}{e,f}",
        "{1..10..3}",
        "{z..a..5}",
        "{a,}",
        "a{b{c,d}e,f}g",
        "{1..3}{a..c}{x,y,z}",
    ],
)
def test_count_agrees_with_braceexpand(pattern: str) -> None:
    from braceexpand import braceexpand

    from shardcache.patterns import count

    assert count(pattern, 10**9) == len(list(braceexpand(pattern)))


def test_count_refuses_what_it_cannot_size_cheaply() -> None:
    from shardcache.patterns import MAX_EXPANSION, count, expand

    assert count("s_{000000000..999999999}.tar") == MAX_EXPANSION + 1  # capped, in microseconds
    with pytest.raises(InvalidKey):
        expand("s_{000000000..999999999}.tar")
    with pytest.raises(InvalidKey):
        count("{" * 20 + "a" + "}" * 20)
    with pytest.raises(InvalidKey):
        count("{a,b")


def test_the_one_back_off_schedule_doubles_from_its_base_up_to_its_cap() -> None:
    """A fill's retries and a failing upstream's breaker wait by the same schedule."""
    from shardcache.cluster.breaker import CircuitBreaker

    assert [doubling_s(n, 0.25, 5.0) for n in range(1, 8)] == [0.25, 0.5, 1, 2, 4, 5, 5]
    assert doubling_s(0, 1.0, 30.0) == 1.0  # no try before the first: the base
    now = [0.0]
    breaker = CircuitBreaker("u", lambda: now[0], base_s=1.0, cap_s=30.0)
    waits = []
    for _ in range(7):
        breaker.failed("reset")
        waits.append(breaker.backoff_s)
        now[0] += breaker.backoff_s
    assert waits == [doubling_s(n, 1.0, 30.0) for n in range(1, 8)]
