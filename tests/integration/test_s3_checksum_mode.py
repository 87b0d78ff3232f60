"""`x-amz-checksum-mode: ENABLED` (boto3 ≥ 1.36 sends it on every GetObject and validates
what comes back): a miss publishes the object's full-object checksum as S3 does, once the fill
learned it from the origin, so boto3 checks the body on a miss as on a hit; a multipart object
uploaded with a per-part checksum gets the origin's composite (`…-N`, type COMPOSITE) on hits
and misses, GET and HEAD, as the origin answers it, and one uploaded with CRC-64/NVME its
full-object value; a range and a client that did not ask get none on a miss; a hit whose cached
bytes rotted still fails the read, never a clean short body.

Both stores publish composites: SeaweedFS on GET and HEAD, moto (5.x) on GET only (its HEAD
gives the value without `-N` or a type, which the daemon reads as the composite the ETag's part
count says). moto computes a CRC32C composite with CRC-32 (a moto bug, so it is not used here)."""

from __future__ import annotations

import os
from pathlib import Path

import botocore.exceptions
import pytest
from boto3.s3.transfer import TransferConfig

from tests.integration.disk_helpers import entry_files, flip_byte
from tests.integration.helpers import curl, sha256, wait_for
from tests.s3_stores import client_for

MiB = 1024 * 1024
BUCKET = "checksum-mode"


@pytest.fixture
def objects(s3_client, s3_env, start_daemon, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A single-part object (boto3's put_object: a full-object CRC32), multipart ones as
    users upload them (upload_file of 9 MiB over an 8 MiB threshold: SHA256 per part, boto3's
    default CRC32 per part, and CRC64NVME, which S3 keeps whole) and a daemon serving the
    bucket."""
    try:
        s3_client.create_bucket(Bucket=BUCKET)
    except s3_client.exceptions.BucketAlreadyOwnedByYou:
        pass
    single = os.urandom(3 * MiB + 5)
    s3_client.put_object(Bucket=BUCKET, Key="single.tar", Body=single)
    multi = os.urandom(9 * MiB + 7)
    source = tmp_path / "multi"
    source.write_bytes(multi)
    parts = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=5 * MiB)
    for key, algorithm in (("multi.tar", "SHA256"), ("nvme.tar", "CRC64NVME")):
        extra = {"ChecksumAlgorithm": algorithm}
        s3_client.upload_file(str(source), BUCKET, key, ExtraArgs=extra, Config=parts)
    s3_client.upload_file(str(source), BUCKET, "crc32.tar", Config=parts)  # boto3's default
    daemon = start_daemon({BUCKET: f"s3://{BUCKET}"}, "--readahead", "0", env=s3_env)
    return daemon, {"single.tar": single, "multi.tar": multi, "crc32.tar": multi, "nvme.tar": multi}


def _is_validated(body: object) -> bool:
    """Whether botocore wrapped the body to check it against a published checksum."""
    return type(body).__name__ == "StreamingChecksumBody"


def test_a_miss_publishes_the_full_object_checksum_boto3_validates(objects) -> None:
    daemon, data = objects
    client = client_for(daemon.url, retries={"max_attempts": 1})
    got = client.get_object(Bucket=BUCKET, Key="single.tar")
    headers = got["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-shardcache"] == "miss"
    assert headers["x-amz-checksum-type"] == "FULL_OBJECT"
    assert headers["x-amz-checksum-crc32"] == got["ChecksumCRC32"]
    assert _is_validated(got["Body"]) and sha256(got["Body"].read()) == sha256(data["single.tar"])
    hit = client.get_object(Bucket=BUCKET, Key="single.tar")
    assert hit["ResponseMetadata"]["HTTPHeaders"]["x-shardcache"] == "hit"
    assert hit["ChecksumCRC32"] == got["ChecksumCRC32"] and _is_validated(hit["Body"])
    assert sha256(hit["Body"].read()) == sha256(data["single.tar"])

    fetched = daemon.metric("shardcache_origin_bytes_total", origin=BUCKET)
    assert fetched == len(data["single.tar"])  # each byte once


def _claim(headers: dict[str, str], algorithm: str) -> tuple[str | None, str | None]:
    """The checksum value of `algorithm` and its type, as a response's headers give them."""
    return headers.get(f"x-amz-checksum-{algorithm}"), headers.get("x-amz-checksum-type")


@pytest.mark.parametrize(
    ("key", "algorithm", "kind"),
    [
        ("multi.tar", "sha256", "COMPOSITE"),
        ("crc32.tar", "crc32", "COMPOSITE"),
        ("nvme.tar", "crc64nvme", "FULL_OBJECT"),
    ],
)
def test_a_multipart_object_gets_the_origins_checksum_and_type(
    objects, s3_client, key: str, algorithm: str, kind: str
) -> None:
    daemon, data = objects
    origin = s3_client.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    claim = _claim(origin["ResponseMetadata"]["HTTPHeaders"], algorithm)
    origin["Body"].read()
    assert claim[1] == kind and claim[0] is not None
    assert ("-2" in claim[0]) is (kind == "COMPOSITE")  # 9 MiB in 5 MiB parts: 2 of them
    client = client_for(daemon.url, retries={"max_attempts": 1})

    head = client.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-shardcache"] == "miss"
    assert _claim(head["ResponseMetadata"]["HTTPHeaders"], algorithm) == claim
    for expected in ("miss", "hit"):
        got = client.get_object(Bucket=BUCKET, Key=key)
        headers = got["ResponseMetadata"]["HTTPHeaders"]
        assert headers["x-shardcache"] == expected
        assert _claim(headers, algorithm) == claim
        # boto3 checks a full-object value and skips a composite, as against S3
        assert _is_validated(got["Body"]) is (kind == "FULL_OBJECT")
        assert sha256(got["Body"].read()) == sha256(data[key])
    head = client.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-shardcache"] == "hit"
    assert _claim(head["ResponseMetadata"]["HTTPHeaders"], algorithm) == claim
    assert daemon.metric("shardcache_origin_bytes_total", origin=BUCKET) == len(data[key])


def test_a_range_or_a_client_that_did_not_ask_gets_none_on_a_miss(objects) -> None:
    daemon, data = objects
    client = client_for(daemon.url, retries={"max_attempts": 1})
    ranged = client.get_object(Bucket=BUCKET, Key="single.tar", Range="bytes=0-99")
    headers = ranged["ResponseMetadata"]["HTTPHeaders"]
    assert not any(name.startswith("x-amz-checksum-") for name in headers)
    assert ranged["Body"].read() == data["single.tar"][:100]
    plain = curl(f"{daemon.url}/{BUCKET}/multi.tar")  # not asked: verified before its end
    assert plain.headers["x-shardcache"] in ("miss", "coalesced")
    assert "x-amz-checksum-type" not in plain.headers


def test_a_rotten_hit_still_fails_the_read(objects) -> None:
    daemon, data = objects
    client = client_for(daemon.url, retries={"max_attempts": 1})
    before = set(entry_files(daemon.cache_dir))
    client.get_object(Bucket=BUCKET, Key="single.tar")["Body"].read()
    wait_for("the fill's commit", lambda: set(entry_files(daemon.cache_dir)) - before)
    (path,) = set(entry_files(daemon.cache_dir)) - before
    flip_byte(path, 2 * MiB + 1)
    with pytest.raises(
        (botocore.exceptions.ResponseStreamingError, botocore.exceptions.FlexibleChecksumError)
    ):
        rotten = client.get_object(Bucket=BUCKET, Key="single.tar")
        assert rotten["ResponseMetadata"]["HTTPHeaders"]["x-shardcache"] == "hit"
        rotten["Body"].read()
    again = client.get_object(Bucket=BUCKET, Key="single.tar")  # the entry dropped: a miss
    assert sha256(again["Body"].read()) == sha256(data["single.tar"])
