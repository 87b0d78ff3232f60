"""docs/beyond-one-node.md, "Warming the cluster layer": one command fills a sharded tier with a
dataset before a job, each shard fetched from the origin once, into its owner member; the nodes'
first epoch then reads from the members. (Over SeaweedFS the command is `weed shell`
`remote.cache`: tests/integration/test_seaweedfs_cluster.py.)"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, run_cli
from tests.origin_server import OriginServer

SHARDS = [f"shard-{i:03d}.tar" for i in range(12)]
MEMBERS = 2
NODES = 2


def test_one_prefetch_through_a_node_warms_the_tier_once(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    data = {key: os.urandom(256 * 1024 + i) for i, key in enumerate(SHARDS)}
    for key, body in data.items():
        origin.put(key, body)
    members = [
        start_daemon({"d": origin.url}, "--readahead", "0", cache_dir=tmp_path / f"member{i}")
        for i in range(MEMBERS)
    ]
    config = tmp_path / "node.toml"
    tier = ", ".join(f'"{m.url}"' for m in members)
    config.write_text(f'[origins.d]\nurl = "{origin.url}"\ntier = [{tier}]\n')

    def node(name: str) -> Daemon:
        return start_daemon(
            {}, "--config", str(config), "--readahead", "0", cache_dir=tmp_path / name
        )

    # The warming: one command, through any daemon that has the tier (here one of its own).
    warmer = node("warmer")
    last = len(SHARDS) - 1
    warmed = run_cli(
        "prefetch", "--daemon", warmer.url, "--wait", f"/d/shard-{{000..{last:03d}}}.tar"
    )
    assert warmed.returncode == 0, warmed.stderr
    assert dict(origin.gets) == {key: 1 for key in SHARDS}  # each shard once, for the cluster
    entries = [m.metric("shardcache_cache_entries") for m in members]
    assert sum(entries) == len(SHARDS) and all(entries), entries  # each in its owner only

    # The nodes' first epoch: misses on each node, hits on the members, nothing from the origin.
    nodes = [node(f"node{i}") for i in range(NODES)]
    with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
        reads = list(pool.map(lambda n: [curl(f"{n.url}/d/{key}") for key in SHARDS], nodes))
    for got in reads:
        assert [r.body for r in got] == [data[key] for key in SHARDS]
        assert {r.headers["x-shardcache"] for r in got} == {"miss"}
    assert dict(origin.gets) == {key: 1 for key in SHARDS}
    member_hits = sum(
        m.metric("shardcache_requests_total", origin="d", result="hit") for m in members
    )
    assert member_hits == NODES * len(SHARDS)
