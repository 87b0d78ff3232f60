"""Attacks on the S3-compatible read API with real clients (boto3, curl) against a daemon over a
file origin, moto, and a lying S3 endpoint: what S3 accepts must be accepted here, what it
refuses refused as S3 refuses it, and what a store answers wrongly never a 500."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import botocore.exceptions
import pytest
from aiohttp import web

from tests.app_thread import AppThread
from tests.integration.helpers import curl
from tests.s3_stores import client_for, env_for

S3_HEADERS = ("-H", "x-amz-date: 20260101T000000Z")  # what makes curl an S3 client here


@pytest.fixture
def bucket(start_daemon, tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "bkt"
    (root / "dir").mkdir(parents=True)
    data = os.urandom(10_000)
    (root / "dir" / "a.tar").write_bytes(data)
    daemon = start_daemon({"bkt": f"file://{root}"})
    return daemon, data


def test_an_unquoted_etag_in_if_match_and_if_none_match_is_s3s_etag(bucket) -> None:  # type: ignore[no-untyped-def]
    """S3 compares precondition ETags quoted or not (the AWS Java SDK v1 sends them bare): an
    unquoted If-Match of the object's ETag is a match (200, not 412), an unquoted
    If-None-Match of it a 304."""
    daemon, data = bucket
    client = client_for(daemon.url)
    etag = client.head_object(Bucket="bkt", Key="dir/a.tar")["ETag"]
    bare = etag.strip('"')
    got = client.get_object(Bucket="bkt", Key="dir/a.tar", IfMatch=bare)
    assert got["Body"].read() == data
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.get_object(Bucket="bkt", Key="dir/a.tar", IfNoneMatch=bare)
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.get_object(Bucket="bkt", Key="dir/a.tar", IfMatch="not-its-etag")
    assert caught.value.response["Error"]["Code"] == "PreconditionFailed"
    # A plain (non-S3) client keeps RFC 9110's strict rule: a bare tag is no entity-tag.
    plain = curl(f"{daemon.url}/bkt/dir/a.tar", "-H", f"If-Match: {bare}")
    assert plain.status == 412


@pytest.mark.parametrize("name", ["metrics", "healthz", "readyz"])
def test_a_virtual_hosted_key_named_like_a_probe_still_needs_the_token(
    name: str, start_daemon, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Reads behind the token on 0.0.0.0: `Host: bkt.localhost` and `GET /metrics` names the
    object `metrics` of bucket `bkt`, not the probe. It needs the token (or a signature)
    like any other object: the open paths are open only as the daemon's own endpoints."""
    root = tmp_path / "bkt"
    root.mkdir()
    (root / name).write_bytes(b"secret bytes")
    token = "t" * 32
    daemon = start_daemon(
        {"bkt": root.as_uri()},
        "--require-token-for-reads",
        listen_host="0.0.0.0",
        env={"SHARDCACHE_ADMIN_TOKEN": token},
        token=token,
    )
    refused = curl(f"{daemon.url}/{name}", "-H", "Host: bkt.localhost")
    assert refused.status == 403 and b"secret bytes" not in refused.body, refused
    assert daemon.metric("shardcache_origin_requests_total", origin="bkt", status="ok") == 0
    granted = curl(
        f"{daemon.url}/{name}", "-H", "Host: bkt.localhost", "-H", f"Authorization: Bearer {token}"
    )
    assert (granted.status, granted.body) == (200, b"secret bytes")
    probe = curl(f"{daemon.url}/{name}")  # the daemon's own endpoint stays open
    assert probe.status == 200 and b"secret bytes" not in probe.body


def test_a_paged_listing_of_origin_prefixes_shown_as_folders_reaches_every_one(
    moto_endpoint: str, start_daemon
) -> None:  # type: ignore[no-untyped-def]
    """Three origins under three prefixes of one bucket: listing the bucket's top level shows
    their prefixes as folders. Asked a page of one at a time (`aws s3 ls --page-size 1`, any
    paginator with a small PageSize), every folder must come, page after page, by V2's
    token and by V1's marker; a token of another listing is InvalidArgument."""
    bucket = "attack-views"
    store = client_for(moto_endpoint)
    store.create_bucket(Bucket=bucket)
    origins = {}
    for name, prefix in (("va", "alpha/x"), ("vb", "beta/y"), ("vc", "gamma/z")):
        store.put_object(Bucket=bucket, Key=f"{prefix}/a.tar", Body=b"a")
        origins[name] = f"s3://{bucket}/{prefix}"
    daemon = start_daemon(origins, "--readahead", "0", env=env_for(moto_endpoint))
    client = client_for(daemon.url, retries={"max_attempts": 1})
    wanted = ["alpha/", "beta/", "gamma/"]
    for operation in ("list_objects_v2", "list_objects"):
        pages = client.get_paginator(operation).paginate(
            Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 1}
        )
        folders = [p["Prefix"] for page in pages for p in page.get("CommonPrefixes", [])]
        assert folders == wanted, operation
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.list_objects_v2(
            Bucket=bucket,
            Delimiter="/",
            ContinuationToken="czM6Z2FyYmFnZQ==",  # "s3:garbage"
        )
    assert caught.value.response["Error"]["Code"] == "InvalidArgument"
    assert "Traceback" not in daemon.log()


@pytest.fixture
def lying_store() -> Iterator[tuple[AppThread, dict[str, bytes]]]:
    """An S3 endpoint whose GetBucketLocation answers the body the test sets (`location`),
    and whose ListObjectsV2 lists what it sets (`contents`): a store, or a proxy in front of
    one, that lies."""
    answer = {"location": b"", "contents": b"", "last_modified": b""}

    async def handle(request: web.Request) -> web.Response:
        if request.path.startswith("/liar/"):  # HeadObject of one byte, its date as set
            headers = {"ETag": '"0cc175b9c0f1b6a831c399e269772661"'}
            headers["Last-Modified"] = answer["last_modified"].decode()
            return web.Response(body=b"a", headers=headers)
        if "location" in request.query:
            return web.Response(body=answer["location"], content_type="application/xml")
        listing = (
            b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
            b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>liar</Name>'
            b"<IsTruncated>false</IsTruncated>" + answer["contents"] + b"</ListBucketResult>"
        )
        return web.Response(body=listing, content_type="application/xml")

    def make_app() -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    server = AppThread(make_app, "lying-s3")
    server.start()
    try:
        yield server, answer
    finally:
        server.stop()


@pytest.mark.parametrize(
    "body",
    [
        b"<<<no XML at all",
        b'<?xml version="1.0"?><LocationConstraint>eu\x01west</LocationConstraint>',
        b"",
        b"<html>a captive portal: sign in first</html>",
        b"<LocationConstraint>eu-west-1</LocationConstraint><LocationConstraint>x",
    ],
)
def test_a_bucket_location_the_store_answers_garbage_to_is_service_unavailable(
    body: bytes, lying_store, start_daemon
) -> None:  # type: ignore[no-untyped-def]
    """GetBucketLocation from a store (or a proxy before it) that answers 200 with no
    LocationConstraint document: S3's ServiceUnavailable (the client retries), never an
    InternalError with a traceback, nor a made-up region kept a minute."""
    server, answer = lying_store
    answer["location"] = body
    daemon = start_daemon({"liar": "s3://liar"}, "--readahead", "0", env=env_for(server.url))
    client = client_for(daemon.url, retries={"max_attempts": 1})
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.get_bucket_location(Bucket="liar")
    error = caught.value.response
    assert (error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Code"]) == (
        503,
        "ServiceUnavailable",
    )
    answer["location"] = b'<LocationConstraint xmlns="x">eu-west-3</LocationConstraint>'
    assert client.get_bucket_location(Bucket="liar")["LocationConstraint"] == "eu-west-3"
    assert "Traceback" not in daemon.log()


def test_a_remembered_checked_hit_cut_short_on_disk_fails_and_a_purge_is_never_served_stale(
    start_daemon, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The hottest hit (its index row remembered, its blocks checked within the window: one
    sendfile, no SQLite, no check) still fails visibly when its file was cut short on disk
    (boto3 raises; the entry is dropped and refetched), and a purge is never answered from
    the remembered row: the next read fetches the origin's new bytes."""
    root = tmp_path / "bkt"
    root.mkdir()
    data = os.urandom(3 * 1024 * 1024)
    (root / "hot.tar").write_bytes(data)
    daemon = start_daemon(
        {"bkt": root.as_uri()}, "--scrub-rate", "0", "--verify-hits-window", "600"
    )
    client = client_for(daemon.url, retries={"max_attempts": 1})

    def read() -> tuple[str, bytes]:
        got = client.get_object(Bucket="bkt", Key="hot.tar")
        return got["ResponseMetadata"]["HTTPHeaders"]["x-shardcache"], got["Body"].read()

    assert read() == ("miss", data)
    deadline = time.monotonic() + 30
    while read()[0] != "hit":  # committed: then read once more, remembered and checked
        assert time.monotonic() < deadline, "the fill never committed"
    assert read() == ("hit", data)
    [entry] = (daemon.cache_dir / "v1" / "index").rglob("*.val")
    os.truncate(entry, 1024 * 1024)
    got = client.get_object(Bucket="bkt", Key="hot.tar")
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-shardcache"] == "hit"
    with pytest.raises(botocore.exceptions.BotoCoreError):
        got["Body"].read()
    assert read() == ("miss", data)  # dropped, refetched

    while read()[0] != "hit":
        assert time.monotonic() < deadline, "the refetch never committed"
    assert read() == ("hit", data)
    changed = os.urandom(len(data))
    (root / "hot.tar").write_bytes(changed)
    assert curl(f"{daemon.url}/_/cache/bkt/hot.tar", "-X", "DELETE").status == 200
    assert read() == ("miss", changed)
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize(
    "contents",
    [
        b"<Contents><Key>a</Key><LastModified>garbage</LastModified><Size>1</Size></Contents>",
        b"<Contents><Key>a</Key><LastModified>99999-01-01T00:00:00Z</LastModified></Contents>",
        b"<Contents><Key>a</Key><Size>abc</Size></Contents>",
    ],
)
def test_a_listing_the_store_answers_garbage_to_is_service_unavailable(
    contents: bytes, lying_store, start_daemon
) -> None:  # type: ignore[no-untyped-def]
    """ListObjectsV2 and HeadBucket (a one-key listing) from a store whose listing is XML but
    not S3's (a size that is no number, a date out of range, a common prefix without its
    prefix): ServiceUnavailable, never an InternalError with a traceback."""
    server, answer = lying_store
    answer["contents"] = contents
    daemon = start_daemon({"liar": "s3://liar"}, "--readahead", "0", env=env_for(server.url))
    client = client_for(daemon.url, retries={"max_attempts": 1})
    for call in (
        lambda: client.list_objects_v2(Bucket="liar"),
        lambda: client.head_bucket(Bucket="liar"),
    ):
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            call()
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "Traceback" not in daemon.log()


def test_a_common_prefix_without_its_prefix_is_left_out(lying_store, start_daemon) -> None:  # type: ignore[no-untyped-def]
    """A listing's `<CommonPrefixes>` with no `<Prefix>` names no folder: it is left out, the
    rest of the listing is served (it was a KeyError and a 500 with a traceback)."""
    server, answer = lying_store
    answer["contents"] = b"<CommonPrefixes></CommonPrefixes>"
    daemon = start_daemon({"liar": "s3://liar"}, "--readahead", "0", env=env_for(server.url))
    client = client_for(daemon.url, retries={"max_attempts": 1})
    listed = client.list_objects_v2(Bucket="liar", Delimiter="/")
    assert listed.get("CommonPrefixes", []) == [] and listed.get("Contents", []) == []
    client.head_bucket(Bucket="liar")
    assert "Traceback" not in daemon.log()


def test_a_head_the_store_answers_with_a_garbage_date_is_service_unavailable(
    lying_store, start_daemon
) -> None:  # type: ignore[no-untyped-def]
    """HeadObject from a store that answers a Last-Modified that is no date: S3's
    ServiceUnavailable for an S3 client and a 502 for curl, never a 500 and a traceback."""
    server, answer = lying_store
    answer["last_modified"] = b"yesterday, about noon"
    daemon = start_daemon({"liar": "s3://liar"}, "--readahead", "0", env=env_for(server.url))
    client = client_for(daemon.url, retries={"max_attempts": 1})
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.head_object(Bucket="liar", Key="obj")
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert curl(f"{daemon.url}/liar/obj", "-I").status == 502  # a bad gateway, for curl
    assert "Traceback" not in daemon.log()
