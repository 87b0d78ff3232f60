"""The S3 origin against real S3 APIs (moto and SeaweedFS: `s3_store`), configured as for MinIO."""

from __future__ import annotations

import os

from tests.integration.helpers import curl, sha256

MiB = 1024 * 1024


def test_s3_via_standard_endpoint_settings(s3_client, s3_env, start_daemon) -> None:
    s3_client.create_bucket(Bucket="data")
    plain = os.urandom(3 * MiB + 5)
    with_sha = os.urandom(MiB)
    s3_client.put_object(Bucket="data", Key="train/shards_000.tar", Body=plain)
    s3_client.put_object(
        Bucket="data", Key="train/shards_001.tar", Body=with_sha, ChecksumAlgorithm="SHA256"
    )
    daemon = start_daemon({"lake": "s3://data/train"}, "--readahead", "0", env=s3_env)

    for key, data in (("shards_000.tar", plain), ("shards_001.tar", with_sha)):
        miss = curl(f"{daemon.url}/lake/{key}")
        hit = curl(f"{daemon.url}/lake/{key}")
        assert (miss.headers["x-shardcache"], hit.headers["x-shardcache"]) == ("miss", "hit")
        assert miss.sha256 == hit.sha256 == sha256(data)
        assert (
            miss.headers["etag"] == s3_client.head_object(Bucket="data", Key=f"train/{key}")["ETag"]
        )
    ranged = curl(f"{daemon.url}/lake/shards_000.tar", "-H", "Range: bytes=10-19")
    assert (ranged.status, ranged.body) == (206, plain[10:20])
    missing = curl(f"{daemon.url}/lake/nope.tar", "--no-fail")
    assert missing.status == 404
    # 3 MiB + 5 bytes is two segments (2 MiB, then the rest), 1 MiB is one: three GETs.
    assert daemon.metric("shardcache_origin_requests_total", origin="lake", status="ok") == 3


def test_s3_multipart_object_and_per_origin_endpoint(
    s3_client, s3_env, start_daemon, tmp_path
) -> None:
    s3_client.create_bucket(Bucket="multipart")
    parts = [os.urandom(5 * MiB), os.urandom(2 * MiB)]
    upload = s3_client.create_multipart_upload(Bucket="multipart", Key="big.tar")
    etags = [
        s3_client.upload_part(
            Bucket="multipart",
            Key="big.tar",
            PartNumber=n + 1,
            UploadId=upload["UploadId"],
            Body=part,
        )["ETag"]
        for n, part in enumerate(parts)
    ]
    s3_client.complete_multipart_upload(
        Bucket="multipart",
        Key="big.tar",
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n + 1} for n, e in enumerate(etags)]},
    )
    config = tmp_path / "shardcache.toml"
    config.write_text(
        f'[origins.minio]\nurl = "s3://multipart"\nendpoint_url = "{s3_env["AWS_ENDPOINT_URL"]}"\n'
    )
    env = {k: v for k, v in s3_env.items() if k != "AWS_ENDPOINT_URL"}
    env["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:9"  # would fail: the file's endpoint wins
    daemon = start_daemon({}, "--config", str(config), env=env)
    result = curl(f"{daemon.url}/minio/big.tar")
    assert result.exit_code == 0 and result.sha256 == sha256(b"".join(parts))
    assert "-2" in result.headers["etag"]


def test_s3_multipart_etags_verify_when_the_part_layout_is_derivable(
    s3_client, s3_env, start_daemon
) -> None:
    """aws s3 cp's layout (equal parts, a shorter last one) is verified against the ETag."""
    s3_client.create_bucket(Bucket="parts")
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(MiB + 7)]
    upload = s3_client.create_multipart_upload(Bucket="parts", Key="big.tar")
    etags = [
        s3_client.upload_part(
            Bucket="parts", Key="big.tar", PartNumber=n + 1, UploadId=upload["UploadId"], Body=p
        )["ETag"]
        for n, p in enumerate(parts)
    ]
    s3_client.complete_multipart_upload(
        Bucket="parts",
        Key="big.tar",
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n + 1} for n, e in enumerate(etags)]},
    )
    s3_client.put_object(  # an MD5 ETag and a SHA-256: the cheaper one is verified
        Bucket="parts", Key="single.tar", Body=parts[2], ChecksumAlgorithm="SHA256"
    )
    daemon = start_daemon({"lake": "s3://parts"}, "--readahead", "0", env=s3_env)

    for key, data, source in (
        ("big.tar", b"".join(parts), "etag (multipart)"),
        ("single.tar", parts[2], "x-amz-checksum-sha256"),
    ):
        assert curl(f"{daemon.url}/lake/{key}").sha256 == sha256(data)
        hit = curl(f"{daemon.url}/lake/{key}")
        assert hit.headers["x-shardcache"] == "hit" and hit.sha256 == sha256(data)
        assert hit.headers["x-shardcache-verified"] == f"length, {source}"
