"""Many nodes over a sharded tier (issue 14): three tier daemons and six node daemons, real
processes on loopback, over one origin that counts the bytes it sends; curl loaders on every
node, each node in its own shuffled order. One tier member is killed with SIGKILL half way
through the second half of the reads, and later comes back.

The tier members listen on 127.0.0.11-13, port 8470, so their URLs, and with them the
rendezvous shares of the 40 shards, are the same in every run (12, 13 and 15 shards).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import random
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shardcache.cluster.rendezvous import rank
from tests.daemon_process import Daemon
from tests.integration.helpers import curl
from tests.origin_server import OriginServer

SHARDS = [f"shard-{i:03d}.tar" for i in range(40)]
SHARD_BYTES = 1 << 20
TIER_HOSTS = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
TIER_PORT = 8470
MEMBERS = [f"http://{host}:{TIER_PORT}" for host in TIER_HOSTS]


def _tier_port_is_free() -> None:
    for host in TIER_HOSTS:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemon does
            try:
                sock.bind((host, TIER_PORT))
            except OSError as exc:
                pytest.fail(f"{host}:{TIER_PORT} is taken ({exc}); the tier test needs it")


def _node_config(path: Path, origin_url: str) -> Path:
    members = ", ".join(f'"{m}"' for m in MEMBERS)
    path.write_text(f'[origins.d]\nurl = "{origin_url}"\ntier = [{members}]\n')
    return path


def _start_all(make: list[Callable[[], Daemon]]) -> list[Daemon]:
    with concurrent.futures.ThreadPoolExecutor(len(make)) as pool:
        return list(pool.map(lambda start: start(), make))


def _tier_requests(member: Daemon) -> float:
    return sum(
        member.metric("shardcache_requests_total", origin="d", result=result)
        for result in ("hit", "miss", "coalesced")
    )


def test_six_nodes_share_three_tier_members_and_survive_losing_one(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    _tier_port_is_free()
    expected: dict[str, str] = {}
    for key in SHARDS:
        data = os.urandom(SHARD_BYTES)
        origin.put(key, data, chunk_delay_s=0.005)  # 1 MiB in ~20 ms: reads overlap the kill
        expected[key] = hashlib.sha256(data).hexdigest()
    owner = {key: rank(key, MEMBERS)[0] for key in SHARDS}

    def tier(i: int) -> Daemon:
        return start_daemon(
            {"d": origin.url},
            cache_dir=tmp_path / f"tier{i}",
            listen_host=TIER_HOSTS[i],
            port=TIER_PORT,
        )

    tiers = _start_all([lambda i=i: tier(i) for i in range(3)])  # type: ignore[misc]
    config = _node_config(tmp_path / "node.toml", origin.url)

    def node(i: int) -> Daemon:
        return start_daemon({}, "--config", str(config), cache_dir=tmp_path / f"node{i}")

    nodes = _start_all([lambda i=i: node(i) for i in range(6)])  # type: ignore[misc]
    orders = [random.Random(i).sample(SHARDS, len(SHARDS)) for i in range(6)]
    failures: list[str] = []
    done = threading.Semaphore(0)

    def load(node: Daemon, keys: list[str]) -> None:
        for key in keys:
            result = curl(f"{node.url}/d/{key}")
            if result.exit_code != 0 or result.sha256 != expected[key]:
                failures.append(f"node {node.port} {key}: curl exit {result.exit_code}")
            done.release()

    def read(half: slice, during: Callable[[], None] | None = None) -> None:
        threads = [
            threading.Thread(target=load, args=(n, order[half]))
            for n, order in zip(nodes, orders, strict=True)
        ]
        for thread in threads:
            thread.start()
        if during is not None:
            for _ in range(60):  # half of this half's 120 reads
                assert done.acquire(timeout=60)
            during()
        for thread in threads:
            thread.join(120)
        assert not failures, failures

    # First half: every byte comes from the origin once, each member caches its own share.
    read(slice(0, 20))
    read_so_far = {key for order in orders for key in order[:20]}
    assert sum(origin.served.values()) == SHARD_BYTES * len(read_so_far)
    for key in read_so_far:
        assert origin.gets[key] == 1, key
    held = [t.get_json("/_/status")[1]["cache"]["entries"] for t in tiers]  # type: ignore[index]
    assert sum(held) == len(read_so_far)
    for member, entries in zip(MEMBERS, held, strict=True):
        share = sum(1 for key in read_so_far if owner[key] == member)
        assert entries == share, (member, entries, share)  # each key at its owner only
        assert abs(entries / len(read_so_far) - 1 / 3) <= 0.10, held

    # Second half: the busiest member is killed half way through; no loader notices.
    victim = max(range(3), key=lambda i: held[i])
    victim_keys = {key for key in SHARDS if owner[key] == MEMBERS[victim]}
    read(slice(20, 40), during=lambda: tiers[victim].stop(signal.SIGKILL))
    served = sum(origin.served.values())
    assert served <= SHARD_BYTES * (len(SHARDS) + len(victim_keys)), (served, len(victim_keys))
    survivors = [t for i, t in enumerate(tiers) if i != victim]
    assert all(t.process.poll() is None for t in survivors)
    node_status = nodes[0].get_json("/_/status")[1]["origins"]["d"]  # type: ignore[index]
    states = {u["url"]: u["state"] for u in node_status["upstreams"]}
    assert states[MEMBERS[victim]] in ("down", "probing"), states
    assert (
        sum(
            n.metric("shardcache_upstream_failures_total", origin="d", upstream=m, role="tier")
            for n in nodes
            for m in MEMBERS
        )
        == sum(
            n.metric(
                "shardcache_upstream_failures_total",
                origin="d",
                upstream=MEMBERS[victim],
                role="tier",
            )
            for n in nodes
        )
        > 0
    )  # only the dead member failed
    assert "is down" in "".join(n.log() for n in nodes)

    # The member comes back with its cache: its keys return to it, and a fresh node reading
    # everything asks each key of its owner, the origin nothing it had sent already.
    returned = start_daemon(
        {"d": origin.url},
        cache_dir=tmp_path / f"tier{victim}",
        listen_host=TIER_HOSTS[victim],
        port=TIER_PORT,
    )
    members = [returned if i == victim else t for i, t in enumerate(tiers)]
    before = [_tier_requests(m) for m in members]
    fresh = start_daemon({}, "--config", str(config), cache_dir=tmp_path / "node-fresh")
    load(fresh, SHARDS)
    assert not failures, failures
    for i, member in enumerate(members):
        share = sum(1 for key in SHARDS if owner[key] == MEMBERS[i])
        assert _tier_requests(member) - before[i] == share, (MEMBERS[i], share)
    assert sum(origin.served.values()) - served <= SHARD_BYTES * len(victim_keys)
