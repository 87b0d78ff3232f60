"""S3 clients beyond loopback: a daemon on 0.0.0.0 (as the DaemonSet runs it) whose reads need
the admin token, with S3 access keys configured, takes an S3 request validly signed (SigV4) by
one of them in the token's stead, and refuses every other with S3's error: boto3 and presigned
URLs through curl as the reference clients, the hostile cases on the wire."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import botocore.exceptions
import pytest

from tests.integration.helpers import curl, sha256
from tests.s3_stores import client_for

TOKEN = "0123456789abcdef0123456789abcdef"
KEY_ID, SECRET = "AKIASHARDCACHETEST", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
BUCKET = "my-bucket"


@pytest.fixture
def signed_daemon(start_daemon, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A daemon on 0.0.0.0 with reads behind the token and one S3 access key, serving a file
    origin named like the bucket, and the bytes of its one shard."""
    root = tmp_path / "bucket"
    (root / "shards").mkdir(parents=True)
    data = os.urandom(300_000)
    (root / "shards" / "a b+c.tar").write_bytes(data)
    keys = tmp_path / "s3-keys"
    keys.write_text(f"# the training jobs' key\n{KEY_ID} {SECRET}\n")
    daemon = start_daemon(
        {BUCKET: root.as_uri()},
        "--readahead",
        "0",
        "--require-token-for-reads",
        "--s3-access-keys-file",
        str(keys),
        listen_host="0.0.0.0",
        env={"SHARDCACHE_ADMIN_TOKEN": TOKEN},
        token=TOKEN,
    )
    return daemon, data


def _client(daemon, key_id: str = KEY_ID, secret: str = SECRET):  # type: ignore[no-untyped-def]
    # s3v4: boto3 presigns with SigV2 by default, which this API refuses (InvalidRequest).
    client = client_for(daemon.url, retries={"max_attempts": 1}, signature_version="s3v4")
    client._request_signer._credentials = botocore.credentials.Credentials(key_id, secret)
    return client


def _code(call) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    error = caught.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]


@contextlib.contextmanager
def _signing_clock(moment: datetime.datetime) -> Iterator[None]:
    """botocore signs at `moment`: its own signer and the CRT's (used when awscrt is there)."""

    def now(remove_tzinfo: bool = True) -> datetime.datetime:
        return moment.replace(tzinfo=None) if remove_tzinfo else moment

    with contextlib.ExitStack() as stack:
        for module in ("botocore.auth", "botocore.crt.auth"):
            stack.enter_context(mock.patch(f"{module}.get_current_datetime", now))
        yield


def _fills(daemon) -> float:  # type: ignore[no-untyped-def]
    return daemon.metric("shardcache_origin_requests_total", origin=BUCKET, status="ok")


def test_a_client_signing_with_a_configured_key_reads_lists_and_presigns(signed_daemon) -> None:
    daemon, data = signed_daemon
    client = _client(daemon)
    key = "shards/a b+c.tar"
    got = client.get_object(Bucket=BUCKET, Key=key)
    assert sha256(got["Body"].read()) == sha256(data)
    assert client.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == len(data)
    ranged = client.get_object(Bucket=BUCKET, Key=key, Range="bytes=5-9")["Body"].read()
    assert ranged == data[5:10]
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="shards/")
    assert [o["Key"] for o in listed["Contents"]] == [key]
    client.head_bucket(Bucket=BUCKET)
    sigv2 = client_for(daemon.url).generate_presigned_url(
        "get_object", {"Bucket": BUCKET, "Key": key}, 300
    )
    refused = curl(sigv2, "--no-fail")
    assert refused.status == 400 and b"<Code>InvalidRequest</Code>" in refused.body
    url = client.generate_presigned_url("get_object", {"Bucket": BUCKET, "Key": key}, 300)
    fetched = curl(url)  # a presigned URL: any HTTP client, no SDK
    assert (fetched.status, fetched.sha256) == (200, sha256(data))
    assert fetched.headers["x-shardcache"] == "hit"
    # curl's own SigV4 signer (libcurl's, not botocore's): another client's canonical request.
    # curl 7.x does not send x-amz-content-sha256, which S3 requires: given, curl signs it.
    by_curl = curl(
        f"{daemon.url}/{BUCKET}/shards/a%20b%2Bc.tar",
        *("--aws-sigv4", "aws:amz:eu-west-1:s3", "--user", f"{KEY_ID}:{SECRET}"),
        "-H",
        "x-amz-content-sha256: UNSIGNED-PAYLOAD",
    )
    assert (by_curl.status, by_curl.sha256) == (200, sha256(data))
    curl_signs = ("--aws-sigv4", "aws:amz:eu-west-1:s3", "--user", f"{KEY_ID}:{SECRET}")
    # Sorted already: curl 7.88 signs the query in the order given (S3 sorts it: a mismatch).
    listed = curl(
        f"{daemon.url}/{BUCKET}?list-type=2&max-keys=5&prefix=shards%2F",
        *curl_signs,
        "-H",
        "x-amz-content-sha256: UNSIGNED-PAYLOAD",
    )
    assert listed.status == 200 and b"<Key>shards/a b+c.tar</Key>" in listed.body
    plain = curl(f"{daemon.url}/{BUCKET}/shards/a%20b%2Bc.tar", "--no-fail")
    assert plain.status == 401  # no signature, no token: refused as before
    by_token = ("-H", f"Authorization: Bearer {TOKEN}")
    bearer = curl(f"{daemon.url}/{BUCKET}/shards/a%20b%2Bc.tar", *by_token)
    assert bearer.sha256 == sha256(data)
    stale = url.replace("X-Amz-Expires=300", "X-Amz-Expires=301")  # no longer its signature
    assert curl(stale, *by_token).sha256 == sha256(data)  # the token stands on its own
    assert _fills(daemon) == 1
    log = daemon.log()
    assert SECRET not in log and SECRET[:12] not in log and TOKEN not in log
    assert "or an S3 signature by one of 1 access keys" in log


def test_wrong_keys_replays_skew_and_expiry_are_s3_errors_and_fetch_nothing(
    signed_daemon,
) -> None:
    daemon, _ = signed_daemon
    key = "shards/a b+c.tar"
    unknown = _client(daemon, key_id="AKIAUNKNOWN")
    assert _code(lambda: unknown.get_object(Bucket=BUCKET, Key=key)) == ("InvalidAccessKeyId", 403)
    wrong = _client(daemon, secret="not-the-secret")
    assert _code(lambda: wrong.get_object(Bucket=BUCKET, Key=key)) == ("SignatureDoesNotMatch", 403)
    assert _code(lambda: wrong.list_objects_v2(Bucket=BUCKET)) == ("SignatureDoesNotMatch", 403)
    client = _client(daemon)
    skewed = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    with _signing_clock(skewed):
        assert _code(lambda: client.get_object(Bucket=BUCKET, Key=key)) == (
            "RequestTimeTooSkewed",
            403,
        )
        expired = client.generate_presigned_url(
            "get_object", {"Bucket": BUCKET, "Key": key}, ExpiresIn=60
        )
    answer = curl(expired, "--no-fail")
    assert answer.status == 403 and b"<Code>AccessDenied</Code>" in answer.body
    assert b"<Message>Request has expired</Message>" in answer.body

    # A valid presigned URL replayed against another key, another bucket, with a header added.
    url = client.generate_presigned_url("get_object", {"Bucket": BUCKET, "Key": key}, 300)
    for replayed in (
        url.replace("a%20b%2Bc.tar", "other.tar"),
        url.replace(f"/{BUCKET}/", "/another-bucket/"),
        url.replace("X-Amz-Expires=300", "X-Amz-Expires=600"),
    ):
        answer = curl(replayed, "--no-fail")
        assert answer.status == 403, replayed
        assert b"<Code>SignatureDoesNotMatch</Code>" in answer.body
        assert SECRET.encode() not in answer.body
    added = curl(url, "--no-fail", "-H", "x-amz-checksum-mode: ENABLED")
    assert added.status == 403 and b"<HeadersNotSigned>x-amz-checksum-mode" in added.body
    altered = curl(url, "--no-fail", "-H", f"Host: 127.0.0.2:{daemon.port}")
    assert altered.status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in altered.body

    # Garbage on the wire: each a 4xx in S3's XML, never a 5xx.
    for authorization in (
        "AWS4-HMAC-SHA256 garbage",
        "AWS4-HMAC-SHA256 Credential=x/y/z, SignedHeaders=host, Signature=00",
        "AWS AKIASHARDCACHETEST:c2lnbmF0dXJl",
        "AWS4-HMAC-SHA256 " + "Credential=" * 600,  # under aiohttp's 8 KiB header bound
    ):
        answer = curl(
            f"{daemon.url}/{BUCKET}/{key.replace(' ', '%20')}",
            "--no-fail",
            "-H",
            f"Authorization: {authorization}",
            "-H",
            "x-amz-date: 20260101T000000Z",
        )
        assert 400 <= answer.status < 500 and answer.body.startswith(b"<?xml"), answer
        assert answer.headers["x-amz-request-id"]
    assert _fills(daemon) == 0  # nothing refused was fetched or cached
    assert daemon.metric("shardcache_client_refused_total", reason="unauthorized") >= 10
    assert "Traceback" not in daemon.log()
