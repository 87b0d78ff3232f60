"""GetBucketLocation answers an S3 origin's bucket's region as the origin gives it (asked once
with the daemon's credentials, then kept), on moto and SeaweedFS, through boto3's
`get_bucket_location` pointed at the daemon; a file origin's bucket is us-east-1's (empty); a
failure at the origin is S3's error with S3's status (NoSuchBucket 404, AccessDenied 403,
ServiceUnavailable 503), never a 500.

SeaweedFS (4.x) accepts a bucket's `LocationConstraint` and forgets it: its GetBucketLocation
answers us-east-1 (empty) for every bucket, and so does the daemon in front of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.exceptions
import pytest

from tests.ports import free_port
from tests.s3_stores import S3Store, client_for, env_for, seaweedfs_server

EU = "loc-eu-bucket"
US = "loc-us-bucket"
GONE = "loc-never-made"
ACCESS_KEY, SECRET_KEY = "locator", "locator-secret"


def _error(call) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    response = caught.value.response
    return int(response["ResponseMetadata"]["HTTPStatusCode"]), str(response["Error"]["Code"])


def _location(client, bucket: str) -> str | None:  # type: ignore[no-untyped-def]
    return client.get_bucket_location(Bucket=bucket)["LocationConstraint"]  # type: ignore[no-any-return]


def _create(client, bucket: str, region: str | None = None) -> None:  # type: ignore[no-untyped-def]
    where = {"CreateBucketConfiguration": {"LocationConstraint": region}} if region else {}
    try:
        client.create_bucket(Bucket=bucket, **where)
    except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        pass


def test_get_bucket_location_is_the_origin_bucket_s_region(
    s3_store: S3Store, s3_client, s3_env, start_daemon, tmp_path: Path
) -> None:
    _create(s3_client, EU, "eu-west-1")
    _create(s3_client, US)
    region = _location(s3_client, EU)
    assert region == ("eu-west-1" if s3_store.name == "moto" else None)
    root = tmp_path / "files"
    root.mkdir()
    origins = {
        "eu": f"s3://{EU}/under/here",
        "us": f"s3://{US}",
        "gone": f"s3://{GONE}",
        "files": f"file://{root}",
    }
    daemon = start_daemon(origins, "--readahead", "0", env=s3_env)
    client = client_for(daemon.url, retries={"max_attempts": 1})

    assert _location(client, EU) == region
    assert _location(client, US) is None
    assert _location(client, "files") is None
    assert _error(lambda: _location(client, GONE)) == (404, "NoSuchBucket")
    assert _error(lambda: _location(client, "never-configured")) == (404, "NoSuchBucket")

    # Kept: a bucket's region is fixed when it is made, so the origin is asked once.
    s3_client.delete_bucket(Bucket=EU)
    assert _location(client, EU) == region
    # A missing bucket is kept a minute too, as HeadBucket keeps it: one made meanwhile is
    # found after that (a failure that may pass, a 5xx, is not kept: `s3_buckets`).
    _create(s3_client, GONE)
    assert _error(lambda: _location(client, GONE)) == (404, "NoSuchBucket")
    assert _location(s3_client, GONE) is None
    assert "Traceback" not in daemon.log()


@pytest.fixture(scope="module")
def seaweedfs_with_identities(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SeaweedFS whose S3 gateway accepts one identity's credentials only."""
    directory = tmp_path_factory.mktemp("seaweedfs-location")
    identities = directory / "s3.json"
    identity = {
        "name": "locator",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Write"],
    }
    identities.write_text(json.dumps({"identities": [identity]}))
    with seaweedfs_server(directory, identities) as url:
        yield url


def test_an_origin_that_refuses_or_is_down_is_s3_s_error(
    seaweedfs_with_identities: str, start_daemon, tmp_path: Path
) -> None:
    owner = boto3.client(
        "s3",
        endpoint_url=seaweedfs_with_identities,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    _create(owner, US)
    stranger = start_daemon(  # the daemon's credentials are not the store's identity's
        {"us": f"s3://{US}"},
        "--readahead",
        "0",
        env=env_for(seaweedfs_with_identities),
        cache_dir=tmp_path / "stranger",
    )
    client = client_for(stranger.url, retries={"max_attempts": 1})
    assert _error(lambda: _location(client, US)) == (403, "AccessDenied")

    down = start_daemon(
        {"us": f"s3://{US}"},
        "--readahead",
        "0",
        env=env_for(f"http://127.0.0.1:{free_port()}"),  # nobody listens there
        cache_dir=tmp_path / "down",
    )
    client = client_for(down.url, retries={"max_attempts": 1})
    assert _error(lambda: _location(client, US)) == (503, "ServiceUnavailable")
    for daemon in (stranger, down):
        assert "Traceback" not in daemon.log()
