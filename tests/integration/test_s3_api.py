"""The S3-compatible read API with real S3 clients (boto3, the aws CLI) pointed at the daemon,
over S3 origins on moto and SeaweedFS (`s3_store`) and a file origin.

The README's case throughout: `--origin lake=s3://my-bucket/datasets/laion`, read by clients
that name `s3://my-bucket/datasets/laion/KEY`, one cache entry with `/lake/KEY`."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from pathlib import Path

import boto3
import boto3.exceptions
import botocore
import botocore.config
import botocore.exceptions
import pytest

from tests.integration.helpers import curl, sha256
from tests.s3_stores import client_for

MiB = 1024 * 1024
BUCKET = "my-bucket"
UNDER = "datasets/laion/"
S3_HEADERS = ("-H", "x-amz-date: 20260101T000000Z")  # what makes curl an S3 client here


def _upload(s3_client, tmp_path: Path, key: str, size: int) -> bytes:  # type: ignore[no-untyped-def]
    """Upload `size` random bytes as users upload them (boto3 `upload_file`)."""
    data = os.urandom(size)
    source = tmp_path / "upload"
    source.write_bytes(data)
    s3_client.upload_file(str(source), BUCKET, key)
    return data


@pytest.fixture
def lake(s3_client, s3_env, start_daemon, tmp_path):  # type: ignore[no-untyped-def]
    """A bucket with shards under the README's prefix (and one key outside it), a daemon
    serving it as `lake`, and the shards' bytes by the client's key."""
    try:  # the stores are shared by the session: the bucket may be there, emptied below
        s3_client.create_bucket(Bucket=BUCKET)
    except s3_client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for listed in s3_client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3_client.delete_object(Bucket=BUCKET, Key=listed["Key"])
    shards = {
        f"{UNDER}shards_{n:06d}.tar": _upload(
            s3_client, tmp_path, f"{UNDER}shards_{n:06d}.tar", MiB
        )
        for n in range(1, 4)
    }
    shards[f"{UNDER}val/shards_000000.tar"] = _upload(
        s3_client, tmp_path, f"{UNDER}val/shards_000000.tar", 1000
    )
    _upload(s3_client, tmp_path, "elsewhere/secret.tar", 10)
    daemon = start_daemon({"lake": f"s3://{BUCKET}/datasets/laion"}, "--readahead", "0", env=s3_env)
    return daemon, shards


def _fills(daemon) -> float:  # type: ignore[no-untyped-def]
    return daemon.metric("shardcache_origin_requests_total", origin="lake", status="ok")


def test_boto3_reads_the_buckets_own_names_through_one_cache_entry(lake) -> None:
    daemon, shards = lake
    client = client_for(daemon.url)
    key = f"{UNDER}shards_000001.tar"

    got = client.get_object(Bucket=BUCKET, Key=key)
    assert sha256(got["Body"].read()) == sha256(shards[key])
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    head = client.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == MiB and head["ETag"].startswith('"')
    assert head["LastModified"] is not None
    ranged = client.get_object(Bucket=BUCKET, Key=key, Range="bytes=10-19")
    assert ranged["Body"].read() == shards[key][10:20]
    assert ranged["ContentRange"] == f"bytes 10-19/{MiB}"

    buckets = [b["Name"] for b in client.list_buckets()["Buckets"]]
    assert buckets == ["lake", BUCKET]
    plain = curl(f"{daemon.url}/lake/shards_000001.tar")  # the same entry, as /NAME/KEY
    assert plain.headers["x-shardcache"] == "hit" and plain.sha256 == sha256(shards[key])
    path_style = curl(f"{daemon.url}/{BUCKET}/{key}")  # a plain client, by the bucket's names
    assert path_style.headers["x-shardcache"] == "hit"
    # A hit republishes the checksum it was verified against; boto3 (response checksum
    # validation on by default) checks the body against it, and raises on a mismatch.
    again = client.get_object(Bucket=BUCKET, Key=key)
    headers = again["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-shardcache"] == "hit" and headers["x-amz-checksum-type"] == "FULL_OBJECT"
    assert sha256(again["Body"].read()) == sha256(shards[key])
    assert _fills(daemon) == 1  # one fill: one GET of a 1 MiB object


def test_virtual_hosted_requests_name_the_bucket_in_host(lake) -> None:
    daemon, shards = lake
    key = f"{UNDER}shards_000002.tar"
    port = daemon.url.rsplit(":", 1)[1]
    for host in (f"{BUCKET}.localhost:{port}", f"{BUCKET}.127.0.0.1:{port}"):
        got = curl(f"{daemon.url}/{key}", "-H", f"Host: {host}")
        assert (got.status, got.sha256) == (200, sha256(shards[key])), host
        assert got.headers["x-amz-request-id"]
    listed = curl(f"{daemon.url}/?list-type=2&prefix={UNDER}", "-H", f"Host: {BUCKET}.localhost")
    assert f"<Key>{key}</Key>".encode() in listed.body
    foreign = f"Host: {BUCKET}.example.com"  # refused by the loopback Host guard, as S3 refuses
    refused = curl(f"{daemon.url}/{key}", "--no-fail", "-H", foreign, *S3_HEADERS)
    assert refused.status == 403 and b"<Code>AccessDenied</Code>" in refused.body
    assert _fills(daemon) == 1


def _code(call) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    error = caught.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]


def test_errors_are_s3s_for_s3_clients_and_json_for_curl(lake, tmp_path) -> None:
    daemon, _ = lake
    client = client_for(daemon.url, retries={"max_attempts": 1})
    assert _code(lambda: client.get_object(Bucket=BUCKET, Key=f"{UNDER}nope.tar")) == (
        "NoSuchKey",
        404,
    )
    assert _code(lambda: client.get_object(Bucket="no-bucket", Key="a.tar")) == (
        "NoSuchBucket",
        404,
    )
    assert _code(lambda: client.get_object(Bucket=BUCKET, Key="elsewhere/secret.tar")) == (
        "NoSuchKey",
        404,
    )
    assert _code(lambda: client.head_object(Bucket=BUCKET, Key=f"{UNDER}nope.tar")) == ("404", 404)
    assert _code(lambda: client.head_bucket(Bucket="no-bucket")) == ("404", 404)
    client.head_bucket(Bucket=BUCKET)
    key = f"{UNDER}shards_000001.tar"
    assert _code(lambda: client.put_object(Bucket=BUCKET, Key=key, Body=b"x")) == (
        "MethodNotAllowed",
        405,
    )
    assert _code(lambda: client.delete_object(Bucket=BUCKET, Key=key)) == ("MethodNotAllowed", 405)
    upload = tmp_path / "upload.bin"
    upload.write_bytes(os.urandom(2 * MiB))  # streamed by the SDK (aws-chunked, Expect)
    with pytest.raises(boto3.exceptions.S3UploadFailedError, match=r"\(MethodNotAllowed\)"):
        client.upload_file(str(upload), BUCKET, key)
    assert _code(lambda: client.get_object(Bucket=BUCKET, Key=key, PartNumber=1)) == (
        "NotImplemented",
        501,
    )
    assert _code(lambda: client.get_object_acl(Bucket=BUCKET, Key=key)) == ("NotImplemented", 501)
    assert _code(lambda: client.create_multipart_upload(Bucket=BUCKET, Key=key)) == (
        "MethodNotAllowed",
        405,
    )
    assert _code(lambda: client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={MiB}-")) == (
        "InvalidRange",
        416,
    )
    missing = curl(f"{daemon.url}/lake/nope.tar", "--no-fail")  # no S3 marks: JSON, as before
    assert missing.status == 404 and missing.headers["content-type"].startswith("application/json")
    assert "x-amz-request-id" not in missing.headers
    assert _fills(daemon) == 0


def test_an_origins_prefix_read_as_an_object_is_no_such_key_that_says_so(lake) -> None:
    """`get_object` of the prefix itself (or a folder above it) used to say the key was "under
    no configured origin's prefix", which reads as a wrong configuration; it names the origin."""
    daemon, _ = lake
    client = client_for(daemon.url, retries={"max_attempts": 1})
    for key in (UNDER, UNDER.rstrip("/"), "datasets/"):
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            client.get_object(Bucket=BUCKET, Key=key)
        error = caught.value.response["Error"]
        assert error["Code"] == "NoSuchKey"
        assert (
            "is a prefix (origin 'lake' serves the keys under 'datasets/laion/')"
            in (error["Message"])
        )
    for key in ("datasets/la", "elsewhere/secret.tar"):
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            client.get_object(Bucket=BUCKET, Key=key)
        assert "under no configured origin's prefix" in caught.value.response["Error"]["Message"]
    assert _fills(daemon) == 0


def test_an_unsigned_sdk_without_x_amz_headers_still_gets_s3_errors(lake) -> None:
    """An unsigned boto3 that does not ask for checksums (before 1.36, or
    `response_checksum_validation="when_required"`) sends no `x-amz-*` header: its GET looked
    like curl's and got the JSON 404, which boto3 reports as code "404", not `NoSuchKey`. The
    SDKs name themselves in `User-Agent`; curl keeps its JSON."""
    daemon, shards = lake
    unsigned = botocore.config.Config(
        signature_version=botocore.UNSIGNED,
        response_checksum_validation="when_required",
        retries={"max_attempts": 1},
    )
    client = boto3.client("s3", endpoint_url=daemon.url, region_name="us-east-1", config=unsigned)
    assert _code(lambda: client.get_object(Bucket=BUCKET, Key=f"{UNDER}nope.tar")) == (
        "NoSuchKey",
        404,
    )
    key = f"{UNDER}shards_000001.tar"
    assert sha256(client.get_object(Bucket=BUCKET, Key=key)["Body"].read()) == sha256(shards[key])
    missing = curl(f"{daemon.url}/{BUCKET}/{UNDER}nope.tar", "--no-fail")
    assert missing.headers["content-type"].startswith("application/json")


def test_list_objects_v2_and_v1_page_through_the_buckets_own_names(
    lake, s3_client, s3_store
) -> None:
    daemon, shards = lake
    store = s3_store.name
    client = client_for(daemon.url)
    for n in range(4, 26):  # 25 keys under the prefix, 3 pages of 10
        s3_client.put_object(Bucket=BUCKET, Key=f"{UNDER}more/{n:03d}.tar", Body=b"%d" % n)
    expected = s3_client.list_objects_v2(Bucket=BUCKET, Prefix=UNDER)["Contents"]
    assert len(expected) == 26

    def listed(operation: str, **kwargs: object) -> list[dict[str, object]]:
        pages = client.get_paginator(operation).paginate(
            Bucket=BUCKET, PaginationConfig={"PageSize": 10}, **kwargs
        )
        return [item for page in pages for item in page.get("Contents", [])]

    for operation in ("list_objects_v2", "list_objects"):
        got = listed(operation, Prefix=UNDER)
        assert [(o["Key"], o["Size"], o["ETag"]) for o in got] == [
            (o["Key"], o["Size"], o["ETag"]) for o in expected
        ], operation
    # One name a page, passed on to the store. moto's V1 with a delimiter ignores MaxKeys and
    # the marker (asked directly, it repeats common prefixes), so V1 is paged on SeaweedFS only.
    operations = ["list_objects_v2"] + (["list_objects"] if store == "seaweedfs" else [])
    for operation in operations:
        pages = client.get_paginator(operation).paginate(
            Bucket=BUCKET, Prefix=UNDER, Delimiter="/", PaginationConfig={"PageSize": 1}
        )
        names = [
            *(x["Prefix"] for page in pages for x in page.get("CommonPrefixes", [])),
        ]
        assert names == [f"{UNDER}more/", f"{UNDER}val/"], operation
    top = client.list_objects_v2(Bucket=BUCKET, Prefix=UNDER, Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == [f"{UNDER}more/", f"{UNDER}val/"]
    assert sorted(o["Key"] for o in top["Contents"]) == sorted(
        k for k in shards if "/val/" not in k
    )
    above = client.list_objects_v2(Bucket=BUCKET, Prefix="datasets/", Delimiter="/")
    assert [p["Prefix"] for p in above["CommonPrefixes"]] == [UNDER]  # nothing outside shown
    bare = client.list_objects_v2(Bucket=BUCKET, Prefix=UNDER.rstrip("/"), Delimiter="/")
    assert [p["Prefix"] for p in bare["CommonPrefixes"]] == [UNDER]  # `aws s3 ls …/laion`
    whole = listed("list_objects_v2")  # the bucket: only what the origin's prefix holds
    assert len(whole) == 26 and all(o["Key"].startswith(UNDER) for o in whole)
    assert _fills(daemon) == 0  # listing fetches no object


def test_bad_list_parameters_are_invalid_argument(lake) -> None:
    daemon, _ = lake
    for query in (
        "list-type=2&max-keys=abc",
        "list-type=2&max-keys=-1",
        "list-type=3",
        "list-type=2&continuation-token=garbage",
        "list-type=2&encoding-type=base64",
        "list-type=2&prefix=" + "a" * 2000,
        "list-type=2&prefix=a%00b",
    ):
        got = curl(f"{daemon.url}/{BUCKET}?{query}", "--no-fail")
        assert got.status == 400, query
        assert b"<Code>InvalidArgument</Code>" in got.body, (query, got.body)
    capped = curl(f"{daemon.url}/{BUCKET}?list-type=2&max-keys=99999999")
    assert b"<MaxKeys>1000</MaxKeys>" in capped.body


def test_hostile_names_get_clear_s3_errors(lake) -> None:
    daemon, _ = lake
    for path, status, code in (
        (f"/{BUCKET}/{UNDER}../../elsewhere/secret.tar", 400, "InvalidArgument"),
        (f"/{BUCKET}/{UNDER}%2E%2E/%2E%2E/elsewhere/secret.tar", 400, "InvalidArgument"),
        (f"/{BUCKET}/{UNDER}a%00b.tar", 400, "InvalidArgument"),
        (f"/{BUCKET}/{UNDER}%ff%fe.tar", 400, "InvalidArgument"),
        (f"/{BUCKET}/datasets%2Flaion%2Fnope.tar", 404, "NoSuchKey"),
        ("/other-bucket/a.tar", 404, "NoSuchBucket"),
        ("/other-bucket", 404, "NoSuchBucket"),
    ):
        got = curl(daemon.url + path, "--no-fail", "--path-as-is", *S3_HEADERS)
        assert got.status == status and f"<Code>{code}</Code>".encode() in got.body, (path, got)
        assert got.headers["x-amz-request-id"]
    chunked = ("-X", "PUT", "-H", "Content-Encoding: aws-chunked", "--data-binary", "x")
    put = curl(f"{daemon.url}/{BUCKET}/{UNDER}new.tar", "--no-fail", *chunked, *S3_HEADERS)
    assert put.status == 405 and b"<Code>MethodNotAllowed</Code>" in put.body
    host, port = daemon.url.removeprefix("http://").split(":")
    for _ in range(5):  # clients that leave before their listing is answered
        with socket.create_connection((host, int(port)), timeout=5) as gone:
            gone.sendall(f"GET /{BUCKET}?list-type=2 HTTP/1.1\r\nHost: {host}\r\n".encode())
            gone.sendall(b"x-amz-date: 20260101T000000Z\r\n\r\n")
    after = client_for(daemon.url).list_objects_v2(Bucket=BUCKET, Prefix=UNDER)
    assert after["KeyCount"] == 4
    assert _fills(daemon) == 0
    assert "Traceback" not in daemon.log()


def test_aws_cli_cp_ls_and_sync(lake, tmp_path) -> None:
    daemon, shards = lake
    env = _aws_env(daemon)

    def aws(*args: str) -> bytes:
        done = subprocess.run(["aws", "s3", *args], env=env, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout

    key = f"{UNDER}shards_000001.tar"
    aws("cp", f"s3://{BUCKET}/{key}", str(tmp_path / "file.tar"))
    assert sha256((tmp_path / "file.tar").read_bytes()) == sha256(shards[key])
    assert hashlib.sha256(aws("cp", f"s3://{BUCKET}/{key}", "-")).hexdigest() == sha256(shards[key])
    listing = aws("ls", f"s3://{BUCKET}/{UNDER}").decode()
    assert "shards_000003.tar" in listing and "PRE val/" in listing
    aws("sync", f"s3://{BUCKET}/{UNDER}", str(tmp_path / "synced"))
    for name, data in shards.items():
        assert sha256((tmp_path / "synced" / name.removeprefix(UNDER)).read_bytes()) == sha256(data)
    assert _fills(daemon) == len(shards)  # each object fetched once


def _aws_env(daemon) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": daemon.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }


def test_file_origin_lists_its_directory(start_daemon, tmp_path) -> None:
    """A file origin named like the bucket (the issue's first try); an HTTP origin cannot
    list."""
    root = tmp_path / "bkt"
    names = [f"train/{n:03d}.tar" for n in range(23)] + ["val/a.tar", "val/b/c.tar", "z.tar"]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())
    (root / "train" / "link.tar").symlink_to("/etc/passwd")
    daemon = start_daemon({"bkt": f"file://{root}", "web": "http://127.0.0.1:9/shards"})
    client = client_for(daemon.url)
    copied = tmp_path / "copied.tar"
    done = subprocess.run(
        ["aws", "s3", "cp", "s3://bkt/val/a.tar", str(copied)],
        env=_aws_env(daemon),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0 and copied.read_bytes() == b"val/a.tar", done.stderr
    assert _code(lambda: client.list_objects_v2(Bucket="web")) == ("NotImplemented", 501)
    for operation in ("list_objects_v2", "list_objects"):
        pages = client.get_paginator(operation).paginate(
            Bucket="bkt", PaginationConfig={"PageSize": 7}
        )
        got = [o["Key"] for page in pages for o in page.get("Contents", [])]
        assert got == sorted(names), operation
    for operation in ("list_objects_v2", "list_objects"):  # rolled up, one name a page
        pages = client.get_paginator(operation).paginate(
            Bucket="bkt", Delimiter="/", PaginationConfig={"PageSize": 1}
        )
        rolled = [
            (p.get("CommonPrefixes", []), [o["Key"] for o in p.get("Contents", [])]) for p in pages
        ]
        assert [x for prefixes, _ in rolled for x in prefixes] == [
            {"Prefix": "train/"},
            {"Prefix": "val/"},
        ], operation
        assert [k for _, keys in rolled for k in keys] == ["z.tar"], operation
    top = client.list_objects_v2(Bucket="bkt", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["train/", "val/"]
    assert [o["Key"] for o in top["Contents"]] == ["z.tar"]
    val = client.list_objects_v2(Bucket="bkt", Prefix="val/", Delimiter="/")
    assert [o["Key"] for o in val["Contents"]] == ["val/a.tar"]
    assert [p["Prefix"] for p in val["CommonPrefixes"]] == ["val/b/"]
    got = client.get_object(Bucket="bkt", Key="val/b/c.tar")["Body"].read()
    assert got == b"val/b/c.tar"
    hostile = curl(f"{daemon.url}/bkt?list-type=2&prefix=../", "--no-fail")
    assert hostile.status == 200 and b"<KeyCount>0</KeyCount>" in hostile.body


def test_download_file_with_parallel_ranges_on_a_cold_object(lake, s3_client, tmp_path) -> None:
    """boto3's `download_file` asks ranges at once (here 1 MiB each, 10 at a time) of an
    object nobody read yet: every byte comes from the origin once."""
    from boto3.s3.transfer import TransferConfig

    daemon, _ = lake
    key = f"{UNDER}big.tar"
    data = _upload(s3_client, tmp_path, key, 6 * MiB + 3)
    config = TransferConfig(multipart_threshold=MiB, multipart_chunksize=MiB, max_concurrency=10)
    target = tmp_path / "big.tar"
    client_for(daemon.url).download_file(BUCKET, key, str(target), Config=config)
    assert sha256(target.read_bytes()) == sha256(data)
    assert daemon.metric("shardcache_origin_bytes_total", origin="lake") == len(data)
    client_for(daemon.url).download_file(BUCKET, key, str(target), Config=config)  # warm
    assert sha256(target.read_bytes()) == sha256(data)
    assert daemon.metric("shardcache_origin_bytes_total", origin="lake") == len(data)


def test_webdataset_over_unchanged_pipe_aws_urls_reads_twice_then_hits(
    lake, s3_client, tmp_path, monkeypatch
) -> None:
    """The OpenCLIP recipe's `pipe:aws s3 cp s3://…/shards_{…}.tar -` URLs, unchanged, with
    only AWS_ENDPOINT_URL set: two epochs, the second all hits."""
    import webdataset as wds

    from shardcache.loader.sample import write_sample_shards

    daemon, _ = lake
    shards = write_sample_shards(tmp_path / "wds", shards=3, samples_per_shard=10)
    for path in shards:
        s3_client.upload_file(str(path), BUCKET, f"{UNDER}wds/{path.name}")
    for name, value in _aws_env(daemon).items():
        monkeypatch.setenv(name, value)
    url = f"pipe:aws s3 cp s3://{BUCKET}/{UNDER}wds/shards_{{000..002}}.tar -"

    def epoch() -> list[tuple[str, bytes]]:
        dataset = wds.WebDataset(url, shardshuffle=False, empty_check=True)
        return [(s["__key__"], s["bin"]) for s in dataset]

    first, second = epoch(), epoch()
    assert len(first) == 30 and first == second
    assert daemon.metric("shardcache_requests_total", origin="lake", result="miss") == 3
    assert daemon.metric("shardcache_requests_total", origin="lake", result="hit") == 3
    assert _fills(daemon) == 3


def test_buckets_on_demand_become_origins_up_to_the_limit(s3_client, s3_env, start_daemon) -> None:
    """`--s3-buckets-on-demand 1`: a bucket no origin names is made one on first use (with
    the daemon's credentials), once; a missing bucket is NoSuchBucket and not kept; past the
    limit, NoSuchBucket too."""
    for bucket in ("fresh-bucket", "second-bucket"):
        try:
            s3_client.create_bucket(Bucket=bucket)
        except s3_client.exceptions.BucketAlreadyOwnedByYou:
            pass
        s3_client.put_object(Bucket=bucket, Key="a/b.tar", Body=bucket.encode())
    daemon = start_daemon({}, "--s3-buckets-on-demand", "1", env=s3_env)
    client = client_for(daemon.url, retries={"max_attempts": 1})
    assert _code(lambda: client.get_object(Bucket="no-such-bucket-x", Key="k")) == (
        "NoSuchBucket",
        404,
    )
    for _ in range(2):  # made once, then an origin like any
        body = client.get_object(Bucket="fresh-bucket", Key="a/b.tar")["Body"].read()
        assert body == b"fresh-bucket"
    listed = client.list_objects_v2(Bucket="fresh-bucket")["Contents"]
    assert [o["Key"] for o in listed] == ["a/b.tar"]
    assert _code(lambda: client.get_object(Bucket="second-bucket", Key="a/b.tar")) == (
        "NoSuchBucket",
        404,
    )
    status, origins = daemon.get_json("/_/origins")
    assert status == 200 and origins == {"origins": {"fresh-bucket": "s3://fresh-bucket"}}
    hit = curl(f"{daemon.url}/fresh-bucket/a/b.tar")
    assert hit.headers["x-shardcache"] == "hit"
