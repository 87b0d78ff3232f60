"""Two tiers on loopback: node daemons whose HTTP origin is a cluster-level shardcache. Many node
requests make one fetch from the real origin; ETag and Range pass through both tiers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os

import aiohttp

from tests.integration.helpers import curl, sha256
from tests.origin_server import OriginServer

MiB = 1024 * 1024


async def _get_all(urls: list[str]) -> list[tuple[str, str, bytes]]:
    async with aiohttp.ClientSession() as session:

        async def one(url: str) -> tuple[str, str, bytes]:
            async with session.get(url) as response:
                assert response.status == 200
                return (
                    response.headers["X-Shardcache"],
                    response.headers["ETag"],
                    await response.read(),
                )

        return await asyncio.gather(*(one(url) for url in urls))


def test_node_tier_over_cluster_tier(origin: OriginServer, start_daemon, tmp_path) -> None:
    data = os.urandom(20 * MiB + 123)
    origin.put("train/s_000.tar", data, chunk_delay_s=0.002)
    segments = ("--segment-size", "4MiB", "--readahead", "0")
    cluster = start_daemon({"data": origin.url}, *segments, cache_dir=tmp_path / "cluster")
    nodes = [
        start_daemon({"data": f"{cluster.url}/data"}, *segments, cache_dir=tmp_path / f"node{n}")
        for n in range(3)
    ]
    urls = [f"{node.url}/data/train/s_000.tar" for node in nodes for _ in range(4)]

    first = asyncio.run(_get_all(urls))
    again = asyncio.run(_get_all(urls))

    assert {sha256(body) for _, _, body in first + again} == {sha256(data)}
    assert {etag for _, etag, _ in first + again} == {origin.etags["train/s_000.tar"]}
    for n in range(3):  # each node: one miss and three joiners, then hits
        assert sorted(r for r, _, _ in first[4 * n : 4 * n + 4]) == ["coalesced"] * 3 + ["miss"]
    assert [r for r, _, _ in again] == ["hit"] * 12
    # The real origin sent every byte exactly once, for twelve loader requests.
    assert cluster.metric("shardcache_origin_bytes_total", origin="data") == len(data)
    assert origin.served["train/s_000.tar"] == len(data)
    assert cluster.metric("shardcache_requests_total", origin="data", result="miss") == 1
    node_bytes = sum(n.metric("shardcache_origin_bytes_total", origin="data") for n in nodes)
    assert node_bytes == 3 * len(data)

    ranged = curl(f"{nodes[0].url}/data/train/s_000.tar", "-H", "Range: bytes=5000000-5000099")
    assert ranged.status == 206 and ranged.body == data[5_000_000:5_000_100]
    assert ranged.headers["content-range"] == f"bytes 5000000-5000099/{len(data)}"
    cold = start_daemon({"data": f"{cluster.url}/data"}, cache_dir=tmp_path / "node-cold")
    cold_range = curl(f"{cold.url}/data/train/s_000.tar", "-H", "Range: bytes=-100")
    assert cold_range.status == 206 and cold_range.body == data[-100:]
    head = curl(f"{cold.url}/data/train/s_000.tar", "-I")
    assert head.headers["etag"] == origin.etags["train/s_000.tar"]

    # The origin's Content-MD5 reached every tier: each one verified the whole object against it
    # and republishes it, on HEAD and on a whole-object hit.
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    assert curl(f"{cluster.url}/data/train/s_000.tar", "-I").headers["content-md5"] == md5
    assert curl(f"{nodes[1].url}/data/train/s_000.tar", "-I").headers["content-md5"] == md5
    assert curl(f"{nodes[2].url}/data/train/s_000.tar").headers["content-md5"] == md5
