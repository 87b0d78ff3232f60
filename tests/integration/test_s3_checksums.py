"""Objects uploaded as today's SDKs upload them (issue 24): multipart with a composite
checksum per part, or single-part with a full-object CRC32, read through the daemon from the
real moto S3 server. moto publishes a composite without its `-N` suffix or checksum type, and
a CRC32C composite that can never match (it is the CRC32 one): the daemon must still serve
every object, verified against what can be verified, and say which checksum it set aside.
SeaweedFS marks its composites (`-N`, COMPOSITE) and gets them right: the same uploads verify
against them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from tests.fault_origin import Faults
from tests.integration.helpers import curl, run_cli, sha256
from tests.s3_fault_proxy import S3FaultProxy

MiB = 1024 * 1024
# S3's smallest part is 5 MiB: three parts, the last one short, as aws s3 cp cuts them.
SMALL_PARTS = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
NOTICE = "is unusable for this origin"


def _upload(s3_client, tmp_path: Path, bucket: str, key: str, extra: dict[str, str]) -> bytes:  # type: ignore[no-untyped-def]
    data = os.urandom(11 * MiB + 17)
    source = tmp_path / key.replace("/", "_")
    source.write_bytes(data)
    s3_client.upload_file(str(source), bucket, key, ExtraArgs=extra, Config=SMALL_PARTS)
    return data


@pytest.mark.parametrize(
    ("extra", "verified_by"),
    [
        ({}, "length, x-amz-checksum-crc32 (composite)"),  # boto3's default: CRC32 per part
        ({"ChecksumAlgorithm": "SHA256"}, "length, x-amz-checksum-sha256 (composite)"),
        ({"ChecksumAlgorithm": "CRC32C"}, "length, x-amz-checksum-crc32c (composite)"),
    ],
    ids=["default-crc32", "sha256", "crc32c"],
)
def test_multipart_uploads_are_readable_and_verified(
    s3_store, s3_client, s3_env, start_daemon, tmp_path, extra, verified_by
) -> None:
    if s3_store.name == "moto" and extra.get("ChecksumAlgorithm") == "CRC32C":
        # moto's CRC32C composite never matches: the multipart ETag verifies instead.
        verified_by = "length, etag (multipart)"
    bucket = f"uploads-{extra.get('ChecksumAlgorithm', 'default').lower()}"
    s3_client.create_bucket(Bucket=bucket)
    data = _upload(s3_client, tmp_path, bucket, "train/big.tar", extra)
    assert "-3" in s3_client.head_object(Bucket=bucket, Key="train/big.tar")["ETag"]
    daemon = start_daemon({"lake": f"s3://{bucket}/train"}, "--readahead", "0", env=s3_env)

    miss = curl(f"{daemon.url}/lake/big.tar")
    assert miss.exit_code == 0, daemon.log()
    assert miss.sha256 == sha256(data)
    hit = curl(f"{daemon.url}/lake/big.tar")
    assert (hit.exit_code, hit.headers["x-shardcache"]) == (0, "hit")
    assert hit.sha256 == sha256(data)
    assert hit.headers["x-shardcache-verified"] == verified_by


def test_single_part_put_object_is_verified_by_its_full_object_crc32(
    s3_client, s3_env, start_daemon
) -> None:
    s3_client.create_bucket(Bucket="single")
    data = os.urandom(3 * MiB + 5)
    s3_client.put_object(Bucket="single", Key="shard.tar", Body=data)
    assert "ChecksumCRC32" in s3_client.head_object(
        Bucket="single", Key="shard.tar", ChecksumMode="ENABLED"
    )
    daemon = start_daemon({"lake": "s3://single"}, "--readahead", "0", env=s3_env)

    assert curl(f"{daemon.url}/lake/shard.tar").sha256 == sha256(data)
    hit = curl(f"{daemon.url}/lake/shard.tar")
    assert hit.headers["x-shardcache"] == "hit" and hit.sha256 == sha256(data)
    assert hit.headers["x-shardcache-verified"] == "length, x-amz-checksum-crc32"


@pytest.mark.parametrize("s3_store", ["moto"], indirect=True)  # the lie is moto's alone
def test_a_checksum_that_never_matches_is_set_aside_once_and_said(
    s3_client, s3_env, start_daemon, tmp_path
) -> None:
    """moto's CRC32C composite is wrong for every object: the first fill finds that out from
    the multipart ETag (an independent check of the same bytes); the log says so once, the
    status page names it under the origin, and later fills do not compute it again."""
    s3_client.create_bucket(Bucket="castagnoli")
    extra = {"ChecksumAlgorithm": "CRC32C"}
    objects = {
        f"{n}.tar": _upload(s3_client, tmp_path, "castagnoli", f"{n}.tar", extra) for n in (1, 2)
    }
    daemon = start_daemon({"lake": "s3://castagnoli"}, "--readahead", "0", env=s3_env)

    for key, data in objects.items():
        result = curl(f"{daemon.url}/lake/{key}")
        assert result.exit_code == 0, daemon.log()
        assert result.sha256 == sha256(data)
        assert result.headers.get("x-shardcache-verified") is None  # a miss: not yet known

    log = daemon.wait_for_log(NOTICE)
    assert log.count(NOTICE) == 1, log
    assert "crc32c" in log and "WARNING" in log
    _, status = daemon.get_json("/_/status")
    unusable = status["origins"]["lake"]["unusable_checksums"]  # type: ignore[index]
    assert [u["checksum"] for u in unusable] == ["x-amz-checksum-crc32c (composite)"]
    assert (
        daemon.metric("shardcache_checksum_unusable_total", origin="lake", algorithm="crc32c-parts")
        == 1
    )
    table = run_cli("stats", "--daemon", daemon.url)
    assert "checksum set aside: checksum x-amz-checksum-crc32c (composite)" in table.stdout


def test_a_body_corrupted_in_flight_fails_against_the_composite_checksum(
    s3_client, s3_env, start_daemon, tmp_path
) -> None:
    """Every GET's body has bytes flipped by a proxy: the composite CRC32 and the multipart
    ETag both fail, so nothing independent vouches for the bytes: the read fails, nothing is
    cached, and no checksum is set aside. Intact again, the object reads and verifies."""
    s3_client.create_bucket(Bucket="flipped")
    data = _upload(s3_client, tmp_path, "flipped", "big.tar", {})
    proxy = S3FaultProxy(s3_env["AWS_ENDPOINT_URL"], Faults(wrong_bytes=1.0))
    proxy.start()
    try:
        env = {**s3_env, "AWS_ENDPOINT_URL": proxy.url}
        daemon = start_daemon({"lake": "s3://flipped"}, "--readahead", "0", env=env)
        result = curl(f"{daemon.url}/lake/big.tar")
        assert result.exit_code != 0 and result.body != data
        assert proxy.injected["wrong_bytes"] >= 1
        _, status = daemon.get_json("/_/status")
        assert status["cache"]["entries"] == 0  # type: ignore[index]
        assert "unusable_checksums" not in status["origins"]["lake"]  # type: ignore[index]
        assert NOTICE not in daemon.log()
        assert daemon.metric("shardcache_origin_errors_total", origin="lake", kind="integrity") >= 1
        proxy.faults.wrong_bytes = 0.0  # the same object, intact: served and verified
        assert curl(f"{daemon.url}/lake/big.tar").sha256 == sha256(data)
        hit = curl(f"{daemon.url}/lake/big.tar")
        assert hit.headers["x-shardcache-verified"] == "length, x-amz-checksum-crc32 (composite)"
    finally:
        proxy.stop()


@pytest.mark.parametrize("claimed", ["-3", "-99999999999"], ids=["no-such-part", "huge-count"])
def test_a_part_layout_the_store_cannot_show_leaves_the_other_checksums(
    s3_client, s3_env, start_daemon, claimed
) -> None:
    """Review attack: a composite claiming parts the object does not have (the part HEAD is
    refused, 416) failed every read of an intact object. The layout is then not derivable: the
    composite goes unused and the object is verified by its whole-object CRC32."""
    bucket = f"parts{len(claimed)}"
    s3_client.create_bucket(Bucket=bucket)
    data = os.urandom(3 * MiB + 5)
    s3_client.put_object(Bucket=bucket, Key="shard.tar", Body=data)
    proxy = S3FaultProxy(s3_env["AWS_ENDPOINT_URL"], Faults(enabled=False))
    proxy.rewrite_headers["shard.tar"] = {"x-amz-checksum-crc32c": f"AAAAAA=={claimed}"}
    proxy.start()
    try:
        env = {**s3_env, "AWS_ENDPOINT_URL": proxy.url}
        daemon = start_daemon({"lake": f"s3://{bucket}"}, "--readahead", "0", env=env)
        miss = curl(f"{daemon.url}/lake/shard.tar")
        assert miss.exit_code == 0 and miss.sha256 == sha256(data), daemon.log()
        hit = curl(f"{daemon.url}/lake/shard.tar")
        assert hit.headers["x-shardcache"] == "hit"
        assert hit.headers["x-shardcache-verified"] == "length, x-amz-checksum-crc32"
    finally:
        proxy.stop()
