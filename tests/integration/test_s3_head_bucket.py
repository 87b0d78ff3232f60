"""HeadBucket for an S3 origin asks the origin (once a minute per origin), on moto and
SeaweedFS: a configured origin whose bucket is missing is NoSuchBucket's 404, not a blind 200,
and a bucket that went away meanwhile is still the kept 200 until the minute is up."""

from __future__ import annotations

import botocore.exceptions
import pytest

from tests.s3_stores import client_for

GONE = "sig-never-made"
THERE = "sig-head-bucket"


def _status(call) -> int:  # type: ignore[no-untyped-def]
    try:
        return int(call()["ResponseMetadata"]["HTTPStatusCode"])
    except botocore.exceptions.ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def test_head_bucket_asks_the_origin_once_a_minute(s3_client, s3_env, start_daemon) -> None:
    try:
        s3_client.create_bucket(Bucket=THERE)
    except s3_client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for listed in s3_client.list_objects_v2(Bucket=THERE).get("Contents", []):
        s3_client.delete_object(Bucket=THERE, Key=listed["Key"])
    daemon = start_daemon(
        {"there": f"s3://{THERE}/under", "gone": f"s3://{GONE}"}, "--readahead", "0", env=s3_env
    )
    client = client_for(daemon.url, retries={"max_attempts": 1})
    assert _status(lambda: client.head_bucket(Bucket=GONE)) == 404
    assert _status(lambda: client.head_bucket(Bucket=THERE)) == 200
    s3_client.delete_bucket(Bucket=THERE)  # asked a moment ago: the kept answer stands
    assert _status(lambda: client.head_bucket(Bucket=THERE)) == 200
    with pytest.raises(botocore.exceptions.ClientError) as listing:
        client.list_objects_v2(Bucket=THERE)  # a listing is never kept: the origin's answer
    assert listing.value.response["Error"]["Code"] == "NoSuchBucket"
    assert "Traceback" not in daemon.log()
