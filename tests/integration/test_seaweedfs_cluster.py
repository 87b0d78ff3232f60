"""docs/beyond-one-node.md, "Nodes over an existing engine": three node daemons over SeaweedFS's
read-through cluster cache (`remote.mount` of the cloud bucket), the cloud bucket their home.

The cloud is moto behind two counting proxies, one for SeaweedFS and one for the nodes, so each
side's requests to the cloud are counted by key. The shards are uploaded with boto3's default
`upload_file` (the 9 MiB one in two parts). SeaweedFS answers `ETag: ""` for every
remote-mounted object: no version, so each node checks what SeaweedFS sends against the home's
checksum and never resumes a cut body on another upstream (no proof of version).

The dataset is warmed into SeaweedFS once with `remote.cache` before the nodes read: the one
command that fetches each object from the cloud once for the whole cluster whatever the nodes'
timing (a cold first epoch depends on `-cacheWait` holding concurrent first reads together).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import webdataset as wds

from shardcache.loader.sample import SHARD_PATTERN, write_shard
from tests.daemon_process import Daemon
from tests.fault_origin import Faults
from tests.integration.helpers import curl, run_cli, wait_for
from tests.s3_fault_proxy import S3FaultProxy
from tests.s3_stores import (
    client_for,
    env_for,
    moto_server,
    seaweedfs_cloud_drive,
)

KiB = 1024
NODES = 3
# (samples, payload bytes): four 1 MiB shards and one of 9 MiB, over boto3's 8 MiB multipart
# threshold; the big one last, so it is read after SeaweedFS is killed too.
SHARDS = ((16, 64 * KiB),) * 4 + ((36, 256 * KiB),)
BUCKET = "cloud"
PREFIX = "laion"


def _samples(paths: list[Path]) -> list[tuple[str, bytes]]:
    """Every sample of `paths` read straight from the tar files: (key.field, payload)."""
    samples = []
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                stream = tar.extractfile(member)
                assert stream is not None
                samples.append((member.name, stream.read()))
    return sorted(samples)


def _pipeline(node: Daemon) -> wds.DataPipeline:
    last = len(SHARDS) - 1
    urls = f"pipe:curl -s -f {node.url}/{PREFIX}/shards_{{000..{last:03d}}}.tar"
    return wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())


def _flat(samples: Iterator[dict[str, object]]) -> list[tuple[str, bytes]]:
    found = []
    for sample in samples:
        for field, value in sample.items():
            if not field.startswith("__"):  # __key__, __url__: the loader's own
                assert isinstance(value, bytes)
                found.append((f"{sample['__key__']}.{field}", value))
    return sorted(found)


def _epoch(nodes: list[Daemon]) -> list[list[tuple[str, bytes]]]:
    """One epoch of the real loader on every node at once."""
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(lambda node: _flat(iter(_pipeline(node))), nodes))


def _mirror(node: Daemon) -> dict[str, object]:
    """The node's SeaweedFS upstream as `/_/status` shows it."""
    _, status = node.get_json("/_/status")
    upstreams = status["origins"][PREFIX]["upstreams"]  # type: ignore[index]
    return next(u for u in upstreams if u["role"] == "mirror")


def _requests(node: Daemon, result: str) -> float:
    return node.metric("shardcache_requests_total", origin=PREFIX, result=result)


def _purge(node: Daemon) -> None:
    done = run_cli("purge", PREFIX, "*", "--daemon", node.url)
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def _counting_proxy(moto: str) -> Iterator[S3FaultProxy]:
    proxy = S3FaultProxy(moto, Faults(enabled=False))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[tuple[str, list[Path]]]:
    """moto with the shards uploaded; yields its endpoint and the shards' files."""
    paths = []
    first = 0
    for index, (samples, payload) in enumerate(SHARDS):
        path = tmp_path / "shards" / SHARD_PATTERN.format(index=index)
        path.parent.mkdir(exist_ok=True)
        write_shard(path, first, samples, payload, seed=index)
        first += samples
        paths.append(path)
    with moto_server() as moto:
        client = client_for(moto)
        client.create_bucket(Bucket=BUCKET)
        for path in paths:
            client.upload_file(str(path), BUCKET, f"{PREFIX}/{path.name}")  # SDK defaults
        assert client.head_object(Bucket=BUCKET, Key=f"{PREFIX}/{paths[-1].name}")["ETag"].endswith(
            '-2"'
        )  # the big one is multipart
        yield moto, paths


def _nodes(
    start_daemon: Callable[..., Daemon], tmp_path: Path, mirror: str, home: str
) -> list[Daemon]:
    """Three node daemons: SeaweedFS's S3 endpoint (`mirror`) first, the cloud bucket the home.
    Read-ahead is off so that what each node fetches, and when, is what its loader asks for."""
    config = tmp_path / "node.toml"
    config.write_text(
        f"[origins.{PREFIX}]\n"
        f'urls = ["{mirror}/{PREFIX}", "s3://{BUCKET}/{PREFIX}"]\n'
        f'endpoint_url = "{home}"\n'
    )
    with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
        return list(
            pool.map(
                lambda i: start_daemon(
                    {},
                    "--config",
                    str(config),
                    "--readahead",
                    "0",
                    env=env_for(home),
                    cache_dir=tmp_path / f"node{i}",
                ),
                range(NODES),
            )
        )


def test_nodes_over_seaweedfs_read_through_cache(
    cloud: tuple[str, list[Path]], start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    moto, paths = cloud
    direct = _samples(paths)
    sizes = {f"{BUCKET}/{PREFIX}/{p.name}": p.stat().st_size for p in paths}
    (tmp_path / "weed").mkdir()
    with (
        _counting_proxy(moto) as drive_cloud,
        _counting_proxy(moto) as node_cloud,
        seaweedfs_cloud_drive(tmp_path / "weed") as drive,
    ):
        drive.mount(drive_cloud.url, f"{BUCKET}/{PREFIX}", f"/buckets/{PREFIX}")
        # Fleet-wide warming: the cluster layer fetches each object from the cloud once.
        drive.shell(f"remote.cache -dir=/buckets/{PREFIX}")
        assert dict(drive_cloud.get_bytes) == sizes
        nodes = _nodes(start_daemon, tmp_path, drive.endpoint, node_cloud.url)

        # Epoch 1: every node misses every shard and reads it from SeaweedFS, checked against
        # the home's checksum (one HEAD to the cloud per fill, no GET).
        assert _epoch(nodes) == [direct] * NODES
        for node in nodes:
            assert _requests(node, "miss") == len(SHARDS), node.log()
            mirror = _mirror(node)
            assert (mirror["state"], mirror["failures"]) == ("up", 0), mirror
        assert sum(node_cloud.gets.values()) == 0, node_cloud.gets
        # A HEAD a fill, and one a part of the multipart shard (its parts' MD5s are its checksum).
        big = f"{BUCKET}/{PREFIX}/{paths[-1].name}"
        parts = {f"{big}?partNumber={n}": NODES for n in (1, 2)}
        assert dict(node_cloud.heads) == {**{k: NODES for k in sizes}, **parts}
        assert dict(drive_cloud.get_bytes) == sizes  # still each object once
        for path in paths:
            hit = curl(f"{nodes[0].url}/{PREFIX}/{path.name}")
            assert hit.headers["x-shardcache"] == "hit"
            assert "(home)" in hit.headers["x-shardcache-verified"], hit.headers

        # Epoch 2: all hits on every node.
        hits_before = [_requests(node, "hit") for node in nodes]
        assert _epoch(nodes) == [direct] * NODES
        for node, before in zip(nodes, hits_before, strict=True):
            assert _requests(node, "hit") - before == len(SHARDS)
            assert _requests(node, "miss") == len(SHARDS)

        # Epoch 3, cold again: SeaweedFS is killed (SIGKILL) once every node has read its
        # first shard; the nodes finish from the cloud with no loader error.
        for node in nodes:
            _purge(node)

        def kill_when_first_shards_are_in() -> None:
            wait_for(
                "every node's first shard cached",
                lambda: all(n.metric("shardcache_cache_entries") >= 1 for n in nodes),
            )
            drive.kill()

        barrier = threading.Barrier(NODES, action=kill_when_first_shards_are_in)

        def epoch_with_kill(node: Daemon) -> list[tuple[str, bytes]]:
            first_shard = f"{node.url}/{PREFIX}/{paths[0].name}"

            def samples() -> Iterator[dict[str, object]]:
                passed = False
                for sample in _pipeline(node):
                    if not passed and sample["__url__"] != first_shard:
                        barrier.wait(timeout=60)
                        passed = True
                    yield sample

            return _flat(samples())

        with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
            assert list(pool.map(epoch_with_kill, nodes)) == [direct] * NODES
        after_kill = {f"{BUCKET}/{PREFIX}/{p.name}" for p in paths[1:]}
        # The price: every node fetched each later shard whole from the cloud.
        assert dict(node_cloud.get_bytes) == {k: NODES * sizes[k] for k in after_kill}
        for node in nodes:
            assert _mirror(node)["state"] in ("down", "probing")
            assert (
                node.metric("shardcache_origin_errors_total", origin=PREFIX, kind="integrity") == 0
            )

        # SeaweedFS returns (its data and the mount kept): each node's breaker lets one read
        # probe it once its back-off ends, and the nodes read from it again.
        drive.start()
        wait_for(
            "every node's back-off on SeaweedFS over",
            lambda: all(_mirror(n)["state"] in ("probing", "up") for n in nodes),
        )
        for node in nodes:
            _purge(node)
        fetched_before = dict(node_cloud.get_bytes)
        assert _epoch(nodes) == [direct] * NODES
        for node in nodes:
            assert _mirror(node)["state"] == "up", _mirror(node)
        assert dict(node_cloud.get_bytes) == fetched_before  # none from the cloud this time


def test_nodes_over_seaweedfs_streaming_with_an_empty_etag(
    cloud: tuple[str, list[Path]], start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """`remote.mount -cacheWait=0`: SeaweedFS streams each read from the cloud, keeps no copy,
    and answers `ETag: ""`. The nodes read every shard through it, each checked against the
    home's checksum, and keep using it (before, each first read aborted one byte short, the
    mirror was marked down and the nodes read the cloud themselves). The price of streaming:
    the cloud sends each object once per node. With no version to resume against, a body that
    SeaweedFS cuts short fails its read visibly and is fetched again whole from the home."""
    moto, paths = cloud
    direct = _samples(paths)
    sizes = {f"{BUCKET}/{PREFIX}/{p.name}": p.stat().st_size for p in paths}
    (tmp_path / "weed").mkdir()
    with (
        _counting_proxy(moto) as drive_cloud,
        _counting_proxy(moto) as node_cloud,
        seaweedfs_cloud_drive(tmp_path / "weed") as drive,
        _counting_proxy(drive.endpoint) as cutter,  # passes SeaweedFS's answers on, or cuts one
    ):
        drive.mount(drive_cloud.url, f"{BUCKET}/{PREFIX}", f"/buckets/{PREFIX}", "-cacheWait=0")
        streamed = curl(f"{drive.endpoint}/{PREFIX}/{paths[0].name}")
        assert (streamed.status, streamed.headers["etag"]) == (200, '""')
        nodes = _nodes(start_daemon, tmp_path, cutter.url, node_cloud.url)
        assert _epoch(nodes) == [direct] * NODES
        for node in nodes:
            mirror = _mirror(node)
            assert (mirror["state"], mirror["failures"]) == ("up", 0), mirror
            assert _requests(node, "error") == 0
        assert sum(node_cloud.gets.values()) == 0, node_cloud.gets
        # No copy shared: every node's read went to the cloud (a large object's more than once:
        # SeaweedFS streams it in overlapping chunk reads).
        assert all(drive_cloud.get_bytes[k] >= NODES * size for k, size in sizes.items())

        # The price of no proof of version: a body cut short is not resumed on the home.
        big, node = paths[-1], nodes[0]
        _purge(node)
        cutter.injector.faults = Faults(short_body=1.0)
        cut = curl(f"{node.url}/{PREFIX}/{big.name}")
        assert cut.exit_code == 18, cut  # visible: the last byte is held until it verifies
        assert _mirror(node)["state"] == "down"
        again = curl(f"{node.url}/{PREFIX}/{big.name}")
        assert (again.exit_code, again.body) == (0, big.read_bytes())
        key = f"{BUCKET}/{PREFIX}/{big.name}"
        assert node_cloud.get_bytes[key] == sizes[key]  # fetched again whole, once
