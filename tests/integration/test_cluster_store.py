"""docs/beyond-one-node.md: SeaweedFS as the nodes' only origin ("Nodes over SeaweedFS").

Every node daemon has the same TOML origin, `url =
"s3://bucket/laion"` with the store's `endpoint_url`, and the store's credentials from the
environment (whose `AWS_ENDPOINT_URL` points nowhere: the file's endpoint must win). The shards
are uploaded as users upload them (s3transfer: multipart above its threshold). A real
WebDataset loader on each node reads them twice: every sample as written, the store asked once
per shard per node, and the second epoch all hits, each verified beyond its length.
"""

from __future__ import annotations

import concurrent.futures
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import webdataset as wds
from boto3.s3.transfer import TransferConfig

from shardcache.loader.sample import write_sample_shards
from tests.daemon_process import Daemon
from tests.integration.helpers import curl
from tests.s3_stores import S3Store, client_for, env_for

MiB = 1024 * 1024
NODES = 3
SHARDS = 4
BUCKET = "cluster-store"


def _direct(paths: list[Path]) -> list[tuple[str, bytes]]:
    """Samples read straight from the tar files: (key, payload)."""
    samples = []
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                stream = tar.extractfile(member)
                assert stream is not None
                samples.append((member.name, stream.read()))
    return samples


def _loader(url: str) -> list[tuple[str, bytes]]:
    dataset = wds.WebDataset(url, shardshuffle=False, empty_check=True)
    return sorted(
        (f"{s['__key__']}.{field}", value)
        for s in dataset
        for field, value in s.items()
        if not field.startswith("__")  # __key__, __url__: the loader's own
    )


@pytest.mark.parametrize("s3_store", ["seaweedfs"], indirect=True)  # moto is no cluster store
def test_nodes_over_an_s3_compatible_cluster_store(
    s3_store: S3Store, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # 64 samples of 16 KiB: 1 MiB + headers, multipart at a 1 MiB threshold (two parts)
    shards = write_sample_shards(tmp_path / "shards", shards=SHARDS)
    client = client_for(s3_store.endpoint)
    client.create_bucket(Bucket=BUCKET)
    upload = TransferConfig(multipart_threshold=MiB, multipart_chunksize=MiB)
    for path in shards:
        client.upload_file(str(path), BUCKET, f"laion/{path.name}", Config=upload)
    config = tmp_path / "node.toml"
    config.write_text(
        f'[origins.laion]\nurl = "s3://{BUCKET}/laion"\nendpoint_url = "{s3_store.endpoint}"\n'
    )
    env = {**env_for(s3_store.endpoint), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
        nodes = list(
            pool.map(
                lambda i: start_daemon(
                    {}, "--config", str(config), env=env, cache_dir=tmp_path / f"node{i}"
                ),
                range(NODES),
            )
        )
    direct = sorted(_direct(shards))
    last = SHARDS - 1
    for node in nodes:
        pattern = f"pipe:curl -s -f {node.url}/laion/shards_{{000..{last:03d}}}.tar"
        assert _loader(pattern) == direct  # the first epoch: misses (or read ahead)
        assert _loader(pattern) == direct
        fetched = node.metric("shardcache_origin_requests_total", origin="laion", status="ok")
        assert fetched == SHARDS, node.log()  # one GET a shard (1 MiB: one segment)
        assert node.metric("shardcache_requests_total", origin="laion", result="hit") >= SHARDS
        assert node.metric("shardcache_origin_errors_total", origin="laion", kind="integrity") == 0
    for path in shards:  # the composite CRC32, its part layout derived: not the length alone
        hit = curl(f"{nodes[0].url}/laion/{path.name}")
        assert hit.headers["x-shardcache"] == "hit"
        assert hit.headers["x-shardcache-verified"] == "length, x-amz-checksum-crc32 (composite)"
