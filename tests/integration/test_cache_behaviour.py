"""Single-flight, persistence across restarts, the disk bound and oversized objects."""

from __future__ import annotations

import asyncio
import os
import threading

import aiohttp
import pytest

from tests.integration.helpers import curl, disk_usage, sha256, wait_for
from tests.origin_server import OriginServer

MiB = 1024 * 1024
# Counted when a response\'s headers go out (its result counts once it ends).
FIRST_BYTES = "shardcache_time_to_first_byte_seconds_count"


async def _get_many(url: str, count: int) -> list[tuple[str, bytes]]:
    async with aiohttp.ClientSession() as session:

        async def one() -> tuple[str, bytes]:
            async with session.get(url) as response:
                assert response.status == 200
                return response.headers["X-Shardcache"], await response.read()

        return await asyncio.gather(*(one() for _ in range(count)))


def test_32_concurrent_requests_make_one_origin_fetch(origin: OriginServer, start_daemon) -> None:
    data = os.urandom(8 * MiB)
    hold = threading.Event()
    origin.put("s.tar", data, hold=hold)
    daemon = start_daemon({"web": origin.url})
    results: list[tuple[str, bytes]] = []
    runner = threading.Thread(
        target=lambda: results.extend(asyncio.run(_get_many(f"{daemon.url}/web/s.tar", 32)))
    )
    runner.start()
    # Release the origin only once all 32 requests are inside the daemon.
    wait_for("all 31 joiners", lambda: daemon.metric(FIRST_BYTES, result="coalesced") >= 31)
    hold.set()
    runner.join(60)

    # One fill: a set of ranged GETs that together cover the object exactly once.
    assert origin.served["s.tar"] == len(data)
    assert sorted(r for r, _ in results) == ["coalesced"] * 31 + ["miss"]
    assert {sha256(body) for _, body in results} == {sha256(data)}


def test_entries_survive_a_restart(origin: OriginServer, start_daemon, tmp_path) -> None:
    data = os.urandom(2 * MiB)
    origin.put("s.tar", data)
    cache_dir = tmp_path / "cache"
    first = start_daemon({"web": origin.url}, cache_dir=cache_dir)
    assert curl(f"{first.url}/web/s.tar").headers["x-shardcache"] == "miss"
    assert first.stop() == 0

    second = start_daemon({"web": origin.url}, cache_dir=cache_dir)
    result = curl(f"{second.url}/web/s.tar")
    assert result.headers["x-shardcache"] == "hit" and result.sha256 == sha256(data)
    assert origin.served["s.tar"] == len(data)


@pytest.mark.parametrize("eviction", ["lru", "auto"])
def test_disk_usage_stays_within_cache_size(
    origin: OriginServer, start_daemon, tmp_path, eviction: str
) -> None:
    limit = 6 * MiB
    blobs = {f"s{i:02d}.tar": os.urandom(MiB) for i in range(12)}
    for key, data in blobs.items():
        origin.put(key, data)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon(
        {"web": origin.url},
        "--eviction",
        eviction,
        "--readahead",
        "0",  # read-ahead would hold a transient area: this is about the bound alone
        cache_size=str(limit),
        cache_dir=cache_dir,
    )
    for key, data in blobs.items():
        assert curl(f"{daemon.url}/web/{key}").sha256 == sha256(data)
        # The client has its last byte once the body verified; the fill commits just after.
        # Until then its reservation holds room no eviction can free, and under slow fsyncs
        # (CI) the next shard found no room and streamed through: wait, this is about the bound.
        wait_for(
            f"{key} to be indexed",
            lambda: daemon.get_json("/_/status")[1]["cache"]["reserved_bytes"] == 0,
        )
        assert disk_usage(cache_dir) <= limit, f"over the bound after {key}"

    if eviction == "lru":  # the oldest go
        assert daemon.metric("shardcache_cache_evictions_total") >= 6
        assert curl(f"{daemon.url}/web/s11.tar").headers["x-shardcache"] == "hit"
        assert curl(f"{daemon.url}/web/s00.tar").headers["x-shardcache"] == "miss"
    else:  # a one-pass scan keeps what came first and streams the rest through
        assert daemon.metric("shardcache_cache_evictions_total") == 0
        assert daemon.metric("shardcache_admission_bypassed_total") >= 6
        assert curl(f"{daemon.url}/web/s00.tar").headers["x-shardcache"] == "hit"
        assert curl(f"{daemon.url}/web/s11.tar").headers["x-shardcache"] == "miss"


def test_object_larger_than_cache_is_streamed_not_stored(
    origin: OriginServer, start_daemon, tmp_path
) -> None:
    data = os.urandom(6 * MiB)
    origin.put("big.tar", data)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, cache_size="4MiB", cache_dir=cache_dir)
    for _ in range(2):
        result = curl(f"{daemon.url}/web/big.tar")
        assert result.exit_code == 0 and result.sha256 == sha256(data)
        assert result.headers["x-shardcache"] == "miss"
    assert disk_usage(cache_dir) < MiB
    assert origin.served["big.tar"] == 2 * len(data)  # each pass fetched every byte once
    ranged = curl(f"{daemon.url}/web/big.tar", "-H", "Range: bytes=100-199")
    assert ranged.status == 206 and ranged.body == data[100:200]
