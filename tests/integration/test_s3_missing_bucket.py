"""A bucket that does not exist is named to the client (issue 24): "no such bucket", not the
404 a missing key gets, on GET and HEAD alike; a missing key in a bucket that exists still
says nothing of buckets."""

from __future__ import annotations

import json

from tests.integration.helpers import curl


def test_a_missing_bucket_is_named_and_a_missing_key_is_not(
    s3_client, s3_env, start_daemon
) -> None:
    s3_client.create_bucket(Bucket="present")
    daemon = start_daemon(
        {"gone": "s3://no-such-bucket-here/train", "lake": "s3://present"},
        "--readahead",
        "0",
        env=s3_env,
    )

    missing = curl(f"{daemon.url}/gone/shard.tar", "--no-fail")
    assert missing.status == 404
    assert "no such bucket: no-such-bucket-here" in json.loads(missing.body)["error"]
    assert curl(f"{daemon.url}/gone/shard.tar", "--no-fail", "-I").status == 404
    absent = curl(f"{daemon.url}/lake/shard.tar", "--no-fail")
    assert absent.status == 404
    assert "bucket" not in json.loads(absent.body)["error"]
    assert "no such bucket: no-such-bucket-here" in daemon.log()
