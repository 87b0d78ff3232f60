"""Data-parallel training (issue 35): each node its own daemon in front of one origin, each node
reading its share. Read-ahead follows the node's plan, and guesses pin nothing."""

from __future__ import annotations

import os
import time

from shardcache.loader import client
from tests.integration.helpers import curl
from tests.origin_server import OriginServer

KiB = 1024
SHARDS = 32
SHARD_BYTES = 160 * KiB


def _settle(daemon, timeout_s: float = 60) -> dict[str, object]:
    """Wait until the prefetch queue is empty and idle; return its status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = daemon.get_json("/_/prefetch")[1]
        if status["pending"] == 0 and status["in_flight"] == 0:
            return status
        assert time.monotonic() < deadline, f"prefetch did not settle: {status}"
        time.sleep(0.05)


def _served(origin: OriginServer, keys: list[str]) -> int:
    return sum(origin.served[key] for key in keys)


def test_each_node_fetches_its_share_and_no_neighbour_with_default_read_ahead(
    origin: OriginServer, start_daemon, tmp_path
) -> None:
    """Two nodes, node 0 the even shards and node 1 the odd ones, default `--readahead 2`,
    each posting its plan as `prefetch_ahead` does. Before, each node's read-ahead fetched
    k+1 and k+2 on every read: twice its share from the origin (the other node's shards)."""
    keys = [f"train/s_{n:03d}.tar" for n in range(SHARDS)]
    for key in keys:
        origin.put(key, os.urandom(SHARD_BYTES))
    fetched = []
    for rank in range(2):
        before = sum(origin.served.values())
        daemon = start_daemon({"web": origin.url}, cache_dir=tmp_path / f"node{rank}")
        share = keys[rank::2]
        client.post_plan(f"node{rank}", 0, [f"/web/{key}" for key in share], daemon.url)
        for key in share:
            assert curl(f"{daemon.url}/web/{key}").status == 200
        status = _settle(daemon)
        fetched.append(sum(origin.served.values()) - before)
        print(f"node {rank}: {fetched[-1] / KiB:.0f} KiB from the origin, share {16 * 160} KiB")
        assert status["unread_bytes"] == 0, status  # read-ahead of its own plan, all read
    assert fetched == [16 * SHARD_BYTES, 16 * SHARD_BYTES]
    assert all(origin.gets[key] == 1 for key in keys), origin.gets


def test_stray_reads_on_a_fresh_daemon_pin_nothing(origin: OriginServer, start_daemon) -> None:
    """Two `curl`s of shards on a daemon no loader has posted a plan to: read-ahead guesses
    their neighbours and warms them, without pinning them or holding the look-ahead budget."""
    for n in range(8):
        origin.put(f"s_{n:03d}.tar", os.urandom(SHARD_BYTES))
    daemon = start_daemon({"web": origin.url})
    assert curl(f"{daemon.url}/web/s_000.tar").status == 200
    assert curl(f"{daemon.url}/web/s_004.tar").status == 200
    status = _settle(daemon)
    assert status["done"] == 4 and status["unread_bytes"] == 0, status
    assert daemon.metric("shardcache_prefetch_unread_bytes") == 0
    for n in (1, 2, 5, 6):  # warmed: hits for whoever reads them
        assert curl(f"{daemon.url}/web/s_{n:03d}.tar").headers["x-shardcache"] == "hit"
