"""The S3-compatible read API with the S3 clients test_s3_api.py does not run: s5cmd (the Go
SDK), obstore (Rust's object_store), the AWS CRT's S3 client (awscrt.s3, under
s3torchconnector and Mountpoint) and s3fs (fsspec, under Hugging Face datasets), each over S3
origins on moto and SeaweedFS (`lake`: `--origin lake=s3://my-bucket/datasets/laion`, read by
the bucket's own names).

Every body is compared by sha256 and every test asserts one fill per object read; the clients
that split a cold object into parallel ranges (s5cmd, the CRT) are asked to, and the origin
sends each byte once."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.integration import test_s3_api
from tests.integration.helpers import curl, sha256
from tests.integration.test_s3_api import BUCKET, UNDER, MiB, _aws_env, _fills, _upload

lake = test_s3_api.lake  # the fixture: a bucket with shards under UNDER, a daemon serving it

SHARDS = [f"{UNDER}shards_{n:06d}.tar" for n in range(1, 4)]


def _origin_bytes(daemon) -> float:  # type: ignore[no-untyped-def]
    return daemon.metric("shardcache_origin_bytes_total", origin="lake")


def _misses(daemon) -> float:  # type: ignore[no-untyped-def]
    """Requests that started a fill: one per object, however many ranges asked for it at
    once (a large object's fill may be several ranged origin GETs: `--segment-size`)."""
    return daemon.metric("shardcache_requests_total", origin="lake", result="miss")


def _reads(daemon) -> float:  # type: ignore[no-untyped-def]
    """Object GETs answered (hits, misses and those that joined a fill in flight)."""
    return sum(
        daemon.metric("shardcache_requests_total", origin="lake", result=result)
        for result in ("hit", "miss", "coalesced")
    )


def _store_rolled(s3_client, prefix: str) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    """The store's own listing of `prefix` rolled up at "/": common prefixes, keys. The stores
    live for the session, and SeaweedFS keeps a folder after its last object is deleted (an
    earlier test's `more/`): the daemon must list what the store lists, those included."""
    page = s3_client.list_objects_v2(Bucket=BUCKET, Prefix=prefix, Delimiter="/")
    prefixes = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return prefixes, sorted(o["Key"] for o in page.get("Contents", []))


def _s5cmd(daemon, *args: str) -> bytes:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        ["s5cmd", "--endpoint-url", daemon.url, *args],
        env=_aws_env(daemon),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, (args, done.stderr.decode())
    return done.stdout


def test_s5cmd_cp_cat_and_ls(lake, s3_client, tmp_path) -> None:
    daemon, shards = lake
    key = SHARDS[0]
    _s5cmd(daemon, "cp", f"s3://{BUCKET}/{key}", str(tmp_path / "one.tar"))
    assert sha256((tmp_path / "one.tar").read_bytes()) == sha256(shards[key])
    assert sha256(_s5cmd(daemon, "cat", f"s3://{BUCKET}/{key}")) == sha256(shards[key])
    listing = _s5cmd(daemon, "ls", f"s3://{BUCKET}/{UNDER}").decode()
    assert "shards_000003.tar" in listing and "DIR  val/" in listing, listing
    listed = _s5cmd(daemon, "ls", f"s3://{BUCKET}/{UNDER}*").decode()  # a wildcard lists all
    assert all(name.removeprefix(UNDER) in listed for name in shards), listed
    _s5cmd(daemon, "cp", f"s3://{BUCKET}/{UNDER}*", str(tmp_path / "all") + "/")  # many at once
    for name, data in shards.items():
        assert sha256((tmp_path / "all" / name.removeprefix(UNDER)).read_bytes()) == sha256(data)
    assert _fills(daemon) == len(shards)

    # A cold object in 1 MiB parts, 10 at once: each byte comes from the origin once.
    big = f"{UNDER}big.tar"
    data = _upload(s3_client, tmp_path, big, 6 * MiB + 3)
    before, reads = _origin_bytes(daemon), _reads(daemon)
    target = tmp_path / "big.tar"
    _s5cmd(
        daemon, "cp", "--part-size", "1", "--concurrency", "10", f"s3://{BUCKET}/{big}", str(target)
    )
    assert sha256(target.read_bytes()) == sha256(data)
    assert _origin_bytes(daemon) - before == len(data)
    assert _reads(daemon) - reads == 7  # 7 ranged GETs
    assert _misses(daemon) == len(shards) + 1


def _obstore(daemon, **options: object):  # type: ignore[no-untyped-def]
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=daemon.url,
        access_key_id="testing",
        secret_access_key="testing",
        region="us-east-1",
        client_options={"allow_http": True},
        **options,  # type: ignore[arg-type]
    )


def test_s5cmd_without_credentials_and_unsigned_bucket_requests(lake, tmp_path) -> None:
    """`s5cmd --no-sign-request` first asks HeadBucket with no signature and no `x-amz-*`
    header; a plain `HEAD /BUCKET` used to be the JSON API's 404, and s5cmd stopped at
    `NotFound`. A bare `HEAD /BUCKET` has no `/NAME/KEY` meaning, so it is HeadBucket."""
    daemon, _ = lake
    env = {k: v for k, v in _aws_env(daemon).items() if not k.startswith("AWS_")}
    key = SHARDS[0]
    done = subprocess.run(
        [
            "s5cmd",
            "--no-sign-request",
            "--endpoint-url",
            daemon.url,
            "ls",
            f"s3://{BUCKET}/{UNDER}*",
        ],
        env={**env, "HOME": str(tmp_path)},
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert key.removeprefix(UNDER) in done.stdout.decode()
    head = curl(f"{daemon.url}/{BUCKET}", "--no-fail", "-I")
    assert head.status == 200 and "x-amz-request-id" in head.headers
    bare = curl(f"{daemon.url}/{BUCKET}", "--no-fail")  # a GET of a bare name: as before
    assert bare.status == 404 and "x-amz-request-id" not in bare.headers
    missing = curl(f"{daemon.url}/no-such-name", "--no-fail", "-I")  # not a bucket: as before
    assert missing.status == 404 and "x-amz-request-id" not in missing.headers
    assert _fills(daemon) == 0


def test_obstore_get_get_range_and_list(lake, s3_client) -> None:
    import obstore

    daemon, shards = lake
    store = _obstore(daemon)
    key = SHARDS[0]
    assert sha256(bytes(obstore.get(store, key).bytes())) == sha256(shards[key])
    other = SHARDS[1]
    ranged = obstore.get_range(store, other, start=1000, end=3000)  # cold: a range of a fill
    assert bytes(ranged) == shards[other][1000:3000]
    many = obstore.get_ranges(store, other, starts=[0, MiB - 10], ends=[10, MiB])
    assert [bytes(b) for b in many] == [shards[other][:10], shards[other][-10:]]
    head = obstore.head(store, key)
    assert head["size"] == MiB and head["e_tag"]
    listed = [m["path"] for page in obstore.list(store, prefix=UNDER) for m in page]
    assert sorted(listed) == sorted(shards)
    rolled = obstore.list_with_delimiter(store, prefix=UNDER)
    prefixes, keys = _store_rolled(s3_client, UNDER)
    assert rolled["common_prefixes"] == [p.rstrip("/") for p in prefixes]
    assert f"{UNDER}val" in rolled["common_prefixes"]
    assert sorted(m["path"] for m in rolled["objects"]) == keys
    assert keys == sorted(k for k in shards if "/val/" not in k)
    # A store rooted at the origin's prefix (what a table format's base path makes): the
    # same entries.
    rooted = _obstore(daemon, prefix=UNDER.rstrip("/"))
    name = SHARDS[2].removeprefix(UNDER)
    assert sha256(bytes(obstore.get(rooted, name).bytes())) == sha256(shards[SHARDS[2]])
    assert sha256(bytes(obstore.get(rooted, SHARDS[0].removeprefix(UNDER)).bytes())) == sha256(
        shards[key]
    )
    with pytest.raises(FileNotFoundError):
        obstore.get(store, f"{UNDER}nope.tar")
    assert _fills(daemon) == 3


def _crt_get(daemon, key: str, target: Path | None = None, **request: object) -> bytes:  # type: ignore[no-untyped-def]
    """GET `key` with awscrt.s3's client (1 MiB parts, many at once), to `target` or memory."""
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import S3Client, S3RequestTlsMode, S3RequestType

    loops = EventLoopGroup()
    bootstrap = ClientBootstrap(loops, DefaultHostResolver(loops))
    client = S3Client(
        bootstrap=bootstrap,
        region="us-east-1",
        credential_provider=AwsCredentialsProvider.new_static("testing", "testing"),
        tls_mode=S3RequestTlsMode.DISABLED,
        part_size=MiB,
    )
    host = daemon.url.removeprefix("http://")
    headers = HttpHeaders([("Host", host), *request.items()])  # type: ignore[list-item]
    received = bytearray()

    def on_body(chunk: bytes, offset: int, **_: object) -> None:
        received[offset : offset + len(chunk)] = chunk

    made = client.make_request(
        type=S3RequestType.GET_OBJECT,
        request=HttpRequest("GET", f"/{BUCKET}/{key}", headers),
        recv_filepath=str(target) if target else None,
        on_body=None if target else on_body,
    )
    made.finished_future.result(120)
    return target.read_bytes() if target else bytes(received)


def test_aws_crt_get_to_a_file_and_a_range(lake, s3_client, tmp_path) -> None:
    daemon, shards = lake
    key = SHARDS[0]
    got = _crt_get(daemon, key, tmp_path / "one.tar")
    assert sha256(got) == sha256(shards[key])
    ranged = _crt_get(daemon, SHARDS[1], Range="bytes=100-199")
    assert ranged == shards[SHARDS[1]][100:200]
    big = f"{UNDER}big.tar"
    data = _upload(s3_client, tmp_path, big, 6 * MiB + 3)
    before, reads = _origin_bytes(daemon), _reads(daemon)
    assert sha256(_crt_get(daemon, big, tmp_path / "big.tar")) == sha256(data)  # cold, 7 parts
    assert _reads(daemon) - reads == 7  # 7 ranged GETs
    assert _origin_bytes(daemon) - before == len(data)
    assert sha256(_crt_get(daemon, big)) == sha256(data)  # warm
    assert _origin_bytes(daemon) - before == len(data)
    assert _misses(daemon) == 3


def _s3fs(daemon):  # type: ignore[no-untyped-def]
    import s3fs

    return s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        endpoint_url=daemon.url,
        client_kwargs={"region_name": "us-east-1"},
        skip_instance_cache=True,
        use_listings_cache=False,
    )


def test_s3fs_cat_open_with_seeks_ls_and_glob(lake, s3_client) -> None:
    daemon, shards = lake
    fs = _s3fs(daemon)
    key = SHARDS[0]
    assert sha256(fs.cat(f"{BUCKET}/{key}")) == sha256(shards[key])
    data = shards[SHARDS[1]]
    with fs.open(f"{BUCKET}/{SHARDS[1]}", "rb", block_size=64 * 1024) as f:  # ranged reads
        f.seek(MiB - 100)
        assert f.read(100) == data[-100:]
        f.seek(500_000)
        assert f.read(70_000) == data[500_000:570_000]
        f.seek(0)
        assert sha256(f.read()) == sha256(data)
    assert fs.info(f"{BUCKET}/{key}")["size"] == MiB
    listed = fs.ls(f"{BUCKET}/{UNDER}", detail=False)
    prefixes, keys = _store_rolled(s3_client, UNDER)
    assert sorted(listed) == sorted(f"{BUCKET}/{n.rstrip('/')}" for n in [*prefixes, *keys])
    assert f"{BUCKET}/{UNDER}val" in listed and keys == SHARDS
    found = fs.glob(f"{BUCKET}/{UNDER}**/shards_*.tar")
    assert sorted(found) == sorted(f"{BUCKET}/{k}" for k in shards)
    assert fs.glob(f"{BUCKET}/{UNDER}shards_00000[12].tar") == [f"{BUCKET}/{k}" for k in SHARDS[:2]]
    many = fs.cat([f"{BUCKET}/{k}" for k in shards])  # concurrently, one task per key
    assert {k.removeprefix(f"{BUCKET}/"): sha256(v) for k, v in many.items()} == {
        k: sha256(v) for k, v in shards.items()
    }
    with pytest.raises(FileNotFoundError):
        fs.cat(f"{BUCKET}/{UNDER}nope.tar")
    assert _fills(daemon) == len(shards)


def test_hugging_face_datasets_streams_a_glob_of_shards_through_s3fs(
    lake, s3_client, tmp_path, monkeypatch
) -> None:
    """`load_dataset("webdataset", data_files="s3://…/shards_*.tar", streaming=True,
    storage_options=…)`: s3fs lists the glob and reads the shards from the daemon; two
    epochs, the second all hits.

    The storage options carry an aiobotocore session: datasets opens each tar with
    `block_size=0` among the filesystem's options, and an s3fs that makes its own session
    hands that to aiobotocore's (TypeError, against S3 too); given one, s3fs makes none."""
    import aiobotocore.session
    import datasets

    from shardcache.loader.sample import write_sample_shards

    daemon, _ = lake
    shards = write_sample_shards(tmp_path / "wds", shards=3, samples_per_shard=10)
    for path in shards:
        # Beside the fixture's shards, in no folder of their own: SeaweedFS would keep the
        # folder after the next test's fixture empties the bucket (see _store_rolled).
        s3_client.upload_file(str(path), BUCKET, f"{UNDER}hf_{path.name}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the packaged webdataset builder: no hub
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    storage_options = {
        "session": aiobotocore.session.AioSession(),
        "key": "testing",
        "secret": "testing",
        "endpoint_url": daemon.url,
        "client_kwargs": {"region_name": "us-east-1"},
    }

    def epoch() -> list[tuple[str, str, str]]:
        dataset = datasets.load_dataset(
            "webdataset",
            data_files={"train": f"s3://{BUCKET}/{UNDER}hf_shards_*.tar"},
            split="train",
            streaming=True,
            storage_options=storage_options,
        )
        return [(s["__key__"], s["txt"], sha256(s["bin"])) for s in dataset]

    first = epoch()
    hits = daemon.metric("shardcache_requests_total", origin="lake", result="hit")
    second = epoch()  # datasets reads the first shard twice an epoch (features, then rows)
    assert len(first) == 30 and first == second
    expected = []  # the samples as the shards hold them
    for path in shards:
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
        for name in sorted(n for n in members if n.endswith(".bin")):
            stem = name.removesuffix(".bin")
            expected.append((stem, members[f"{stem}.txt"].decode(), sha256(members[name])))
    assert first == expected
    assert daemon.metric("shardcache_requests_total", origin="lake", result="miss") == 3
    assert daemon.metric("shardcache_requests_total", origin="lake", result="hit") - hits == 4
    assert _fills(daemon) == 3
