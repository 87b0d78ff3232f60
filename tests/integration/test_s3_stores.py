"""Objects uploaded the ways users upload them, read through the daemon on every S3 store.

Uploaders: `aws s3 cp` (multipart, its default CRC32), boto3 `upload_file` with the SDK's
defaults (multipart, CRC32), with `ChecksumAlgorithm` SHA256, CRC32C and CRC64NVME, with no
checksum at all (`request_checksum_calculation="when_required"`), and a single-part object.
Multipart objects are 11 MiB + 7 bytes in 5 MiB parts (5, 5, 1 MiB + 7), as a 5 MiB threshold
makes both the CLI and s3transfer cut them. Stores differ in what they publish for the same
upload (SeaweedFS: a multipart's composite checksum as `…-3` with `x-amz-checksum-type:
COMPOSITE`, CRC64NVME as FULL_OBJECT; moto: the composite without either), and the daemon must
read every one: whole and identical, a miss then a hit, and verified beyond its length.

A second daemon reads the same objects through `tests.s3_fault_proxy` flipping bytes in every
GET body: the corruption must be caught (an integrity error, the read failed, nothing cached)
wherever a checksum applies; with the part layout derivable, the multipart ETag applies to all.
Each upload has its own origin (`s3://uploads/<way>`), so the daemon's counters are per upload.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from tests.daemon_process import Daemon
from tests.fault_origin import Faults
from tests.integration.helpers import curl, sha256
from tests.s3_fault_proxy import S3FaultProxy
from tests.s3_stores import STORES, S3Store, client_for, env_for

MiB = 1024 * 1024
BUCKET = "uploads"
KEY = "shard-000.tar"
MULTIPART = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
AWS_CONFIG = "[default]\ns3 =\n  multipart_threshold = 5MB\n  multipart_chunksize = 5MB\n"


@dataclass(frozen=True)
class Upload:
    way: str  # the test id and the origin's name
    size: int
    put: Callable[[S3Store, Path, str], None]  # (store, file, object key)


def _sdk(store: S3Store, path: Path, key: str, **extra: str) -> None:
    args = {"ExtraArgs": {"ChecksumAlgorithm": extra["algorithm"]}} if extra else {}
    client_for(store.endpoint).upload_file(str(path), BUCKET, key, Config=MULTIPART, **args)


def _no_checksum(store: S3Store, path: Path, key: str) -> None:
    client = client_for(store.endpoint, request_checksum_calculation="when_required")
    client.upload_file(str(path), BUCKET, key, Config=MULTIPART)


def _aws_cli(store: S3Store, path: Path, key: str) -> None:
    config = path.parent / "aws-config"
    config.write_text(AWS_CONFIG)
    env = {**os.environ, **env_for(store.endpoint), "AWS_CONFIG_FILE": str(config)}
    subprocess.run(
        ["aws", "s3", "cp", "--only-show-errors", str(path), f"s3://{BUCKET}/{key}"],
        env=env,
        check=True,
        timeout=60,
    )


UPLOADS = (
    Upload("aws-cli", 11 * MiB + 7, _aws_cli),
    Upload("sdk-default", 11 * MiB + 7, _sdk),
    Upload("sha256", 11 * MiB + 7, lambda s, p, k: _sdk(s, p, k, algorithm="SHA256")),
    Upload("crc32c", 11 * MiB + 7, lambda s, p, k: _sdk(s, p, k, algorithm="CRC32C")),
    Upload("crc64nvme", 11 * MiB + 7, lambda s, p, k: _sdk(s, p, k, algorithm="CRC64NVME")),
    Upload("no-checksum", 11 * MiB + 7, _no_checksum),
    Upload("single-part", MiB + 3, _sdk),
)
WAYS = [u.way for u in UPLOADS]


@dataclass
class Uploaded:
    store: S3Store
    data: dict[str, bytes]  # by way
    direct: Daemon  # over the store
    corrupted: Daemon  # over the proxy, every GET body's bytes flipped
    proxy: S3FaultProxy


@pytest.fixture(scope="module", params=STORES)
def uploaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Uploaded]:
    """Every upload way's object in one store, and the two daemons reading them."""
    store = S3Store(request.param, request.getfixturevalue(f"{request.param}_endpoint"))
    client = client_for(store.endpoint)
    client.create_bucket(Bucket=BUCKET)
    work = tmp_path_factory.mktemp(f"uploads-{store.name}")
    data = {}
    for upload in UPLOADS:
        data[upload.way] = os.urandom(upload.size)
        path = work / upload.way
        path.write_bytes(data[upload.way])
        upload.put(store, path, f"{upload.way}/{KEY}")
    origins = {way: f"s3://{BUCKET}/{way}" for way in WAYS}
    args = ("--readahead", "0", "--origin-retries", "1")
    proxy = S3FaultProxy(store.endpoint, Faults(wrong_bytes=1.0))
    proxy.start()
    daemons: list[Daemon] = []
    try:
        daemons.append(Daemon(work / "direct", origins, *args, env=env_for(store.endpoint)))
        daemons.append(Daemon(work / "corrupted", origins, *args, env=env_for(proxy.url)))
        yield Uploaded(store, data, daemons[0], daemons[1], proxy)
    finally:
        codes = {d.cache_dir.name: (d.stop(), d) for d in daemons}
        proxy.stop()
        for name, (code, daemon) in codes.items():
            assert code == 0, f"{name} daemon exited {code}:\n{daemon.log()}"


@pytest.mark.parametrize("way", WAYS)
def test_every_upload_reads_whole_then_hits(uploaded: Uploaded, way: str) -> None:
    url = f"{uploaded.direct.url}/{way}/{KEY}"
    miss, hit = curl(url, "--no-fail"), curl(url, "--no-fail")
    detail = f"{uploaded.store.name} {way}: curl exit {miss.exit_code}, {len(miss.body)} bytes"
    assert (miss.exit_code, miss.status, hit.status) == (0, 200, 200), detail
    assert miss.sha256 == hit.sha256 == sha256(uploaded.data[way])
    assert (miss.headers["x-shardcache"], hit.headers["x-shardcache"]) == ("miss", "hit")
    verified = hit.headers["x-shardcache-verified"]
    print(f"{uploaded.store.name} {way}: X-Shardcache-Verified: {verified}")
    assert verified.startswith("length, "), verified  # a checksum applies to every upload
    errors = uploaded.direct.metric("shardcache_origin_errors_total", origin=way, kind="integrity")
    assert errors == 0


@pytest.mark.parametrize("way", WAYS)
def test_corrupted_bodies_are_caught(uploaded: Uploaded, way: str) -> None:
    daemon = uploaded.corrupted
    url = f"{daemon.url}/{way}/{KEY}"
    first, again = curl(url), curl(url)
    for result in (first, again):  # not served, not cached: each read fails visibly
        assert result.exit_code != 0 and result.sha256 != sha256(uploaded.data[way]), way
        assert result.headers.get("x-shardcache") != "hit"
    caught = daemon.metric("shardcache_origin_errors_total", origin=way, kind="integrity")
    print(f"{uploaded.store.name} {way}: integrity errors {caught}")
    assert caught > 0
    assert uploaded.proxy.injected["wrong_bytes"] > 0
