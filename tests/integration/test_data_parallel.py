"""Data-parallel training (issue 35): each node its own daemon in front of one origin, each node
reading its share. Read-ahead follows the node's plan, guesses pin nothing, pins end, and the
README's recipe splits the shards across nodes without overlap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from shardcache.loader import client
from tests.integration.helpers import curl, run_cli, wait_for
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


def test_queued_look_ahead_no_plan_reads_is_dropped_unfetched(
    origin: OriginServer, start_daemon
) -> None:
    """A job's plan covers the origin; look-ahead items for shards no plan reads (a job that
    ended, or posted a plan without them) are dropped when their turn comes, not fetched,
    pinned and released again at the next sweep (before: fetched, 4 GETs, then ended as
    `unplanned`; a tight budget refilled with such items after each sweep)."""
    keys = [f"s_{n:03d}.tar" for n in range(8)]
    for key in keys:
        origin.put(key, os.urandom(SHARD_BYTES))
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", "--eviction", "auto")
    client.post_plan("job", 0, [f"/web/{key}" for key in keys[:4]], daemon.url)
    client.prefetch([f"/web/{key}" for key in keys], daemon.url)
    status = _settle(daemon)
    assert [origin.gets[key] for key in keys] == [1, 1, 1, 1, 0, 0, 0, 0], origin.gets
    assert status["dropped_unwanted"] == {"unplanned": 4}, status
    assert status["unread_bytes"] == 4 * SHARD_BYTES, status  # the planned ones, pinned


def test_a_budget_wait_says_who_holds_it_and_the_cancel_command_ends_it(
    origin: OriginServer, start_daemon
) -> None:
    """A job posts look-ahead and never reads it: the queue waits for the budget. `stats`, the
    status and `/metrics` say so and name the holder; `shardcache prefetch --cancel` drops the
    rest and releases the budget (before, only a raw `curl -X DELETE /_/prefetch` did)."""
    for n in range(6):
        origin.put(f"s_{n:03d}.tar", os.urandom(SHARD_BYTES))
    daemon = start_daemon(
        {"web": origin.url}, "--readahead", "0", "--prefetch-max-bytes", f"{2 * SHARD_BYTES}"
    )
    queued = run_cli("prefetch", "--lookahead", "/web/s_{000..005}.tar", "--daemon", daemon.url)
    assert queued.returncode == 0, queued.stderr

    def is_waiting_on_both() -> bool:  # the wait may begin while the second fill still lands
        prefetch = daemon.get_json("/_/prefetch")[1]
        return prefetch["waiting_for"] is not None and prefetch["held_by"] == {
            "batch 1": 2 * SHARD_BYTES
        }

    wait_for("the wait, on both look-ahead shards held", is_waiting_on_both)
    status = daemon.get_json("/_/status")[1]["prefetch"]
    assert status["held_by"] == {"batch 1": 2 * SHARD_BYTES}, status
    assert "held by batch 1 320 KiB" in status["waiting_for"], status
    assert daemon.metric("shardcache_prefetch_waiting_for_readers") == 1
    assert daemon.metric("shardcache_prefetch_held_bytes", job="batch 1") == 2 * SHARD_BYTES
    stats = run_cli("stats", "--daemon", daemon.url)
    assert "waiting for  the look-ahead budget" in stats.stdout, stats.stdout

    cancelled = run_cli("prefetch", "--cancel", "--daemon", daemon.url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "dropped 4 shards queued; released 320 KiB" in cancelled.stderr, cancelled.stderr
    after = _settle(daemon)
    assert after["unread_bytes"] == 0 and after["waiting_for"] is None, after
    assert daemon.metric("shardcache_prefetch_waiting_for_readers") == 0
    missing = run_cli("prefetch", "--cancel", "99", "--daemon", daemon.url)
    assert missing.returncode == 2 and "no prefetch batch" in missing.stderr, missing.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--cancel", "x1"], "prefetch --cancel: expected a batch number, got 'x1'"),
        (
            ["--cancel", "3", "/web/s.tar"],
            "prefetch --cancel takes a batch number at most, no shards or flags",
        ),
        ([], "prefetch: give the shards to fetch, or --cancel [BATCH]"),
    ],
)
def test_the_prefetch_command_refuses_bad_arguments_in_one_line(args: list[str], line: str) -> None:
    """Refused before any daemon is asked (none runs here)."""
    result = run_cli("prefetch", *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"shardcache: error: {line}"]


README = Path(__file__).parents[2] / "README.md"
PREFETCH_DOC = Path(__file__).parents[2] / "docs" / "prefetch.md"
RECIPE = "wds.detshuffle(1000, seed=0), wds.split_by_node, wds.split_by_worker"
TODAYS = "wds.shuffle(1000), wds.split_by_node, wds.split_by_worker"
# One node's view: the recipe's shard stages in WebDataset's own iteration, two epochs of one
# pipeline, RANK and WORLD_SIZE read from the environment as WebDataset reads them.
NODE = """
import json, sys
import webdataset as wds
urls = [f"pipe:curl -s -f http://127.0.0.1:8470/lake/shards_{{n:03d}}.tar" for n in range(40)]
pipeline = wds.DataPipeline(wds.SimpleShardList(urls), {stages})
print(json.dumps([[shard["url"] for shard in pipeline] for epoch in range(2)]))
"""


def _epochs_across_nodes(stages: str, nodes: int) -> list[Counter[str]]:
    """Each epoch's reads of each shard, over `nodes` processes (one a node) run side by side."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORKER", "NUM_WORKERS")}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", NODE.format(stages=stages)],
            env={**env, "RANK": str(rank), "WORLD_SIZE": str(nodes)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(nodes)
    ]
    per_node = [json.loads(run.communicate(timeout=120)[0]) for run in runs]
    assert all(run.returncode == 0 for run in runs)
    return [Counter(url for node in per_node for url in node[epoch]) for epoch in range(2)]


@pytest.mark.parametrize("nodes", [2, 4])
def test_the_recipe_reads_every_shard_once_per_epoch_across_nodes(nodes: int) -> None:
    for text in (README.read_text(), PREFETCH_DOC.read_text()):
        assert TODAYS not in text
    assert RECIPE in README.read_text()
    epochs = _epochs_across_nodes(RECIPE, nodes)
    for reads in epochs:
        assert len(reads) == 40 and set(reads.values()) == {1}, reads


def test_todays_recipe_reads_some_shards_twice_and_others_never() -> None:
    """`wds.shuffle` seeds itself from the process id and the time: each node splits its own
    permutation (the recipe the README had)."""
    reads = _epochs_across_nodes(TODAYS, 2)
    assert any(len(epoch) < 40 and max(epoch.values()) > 1 for epoch in reads), reads


def test_the_stage_plans_the_next_two_epochs_and_prefetches_across_the_epochs_end(
    origin: OriginServer, start_daemon, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0 of 2 with the README's recipe: the plan names this epoch's share and the next two
    epochs' (computed by replaying detshuffle), and the last shards of an epoch prefetch the
    first of the next before the loader starts it."""
    import webdataset as wds

    from shardcache.loader.webdataset import prefetch_ahead

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    keys = [f"s_{n:03d}.tar" for n in range(16)]
    for key in keys:
        origin.put(key, os.urandom(SHARD_BYTES))
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", "--eviction", "auto")
    urls = [f"{daemon.url}/web/{key}" for key in keys]

    def shard_stages() -> list[object]:
        return [wds.SimpleShardList(urls), wds.detshuffle(100, seed=3), wds.split_by_node]

    reference = wds.DataPipeline(*shard_stages())
    orders = [[shard["url"].rsplit("/", 1)[1] for shard in reference] for _ in range(3)]
    pipeline = wds.DataPipeline(*shard_stages(), prefetch_ahead(2))
    read = [shard["url"].rsplit("/", 1)[1] for shard in pipeline]  # the shards, not fetched
    assert read == orders[0]
    plans = daemon.get_json("/_/status")[1]["cache"]["eviction"]["plans"]  # type: ignore[index]
    assert [(p["epoch"], p["length"]) for p in plans] == [(0, 40)], plans  # 8 an epoch, five epochs
    # Nothing was read through the daemon: what it fetched is what the stage asked for, the
    # two ahead of each shard, the last two of them the next epoch's first.
    _settle(daemon)
    fetched = {key for key in keys if origin.gets[key]}
    assert set(orders[1][:2]) <= fetched, (orders[1][:2], fetched)
    assert fetched <= set(orders[0]) | set(orders[1][:2]), fetched


def test_a_read_that_joins_its_look_ahead_prefetch_fetches_the_shard_once(
    origin: OriginServer, start_daemon, tmp_path
) -> None:
    """The loader reads a shard while its look-ahead prefetch waits for the origin's first
    byte: the read ends the pin, and the plans need what the fill would evict. Before, the
    fill was then streamed through and the joined reader fetched the shard a second time
    (2 GETs for one read); a fill a read joined is kept for that read (transient)."""
    size = 200 * KiB
    for name in "ABC":
        origin.put(f"{name}.tar", os.urandom(size))
    origin.put("X.tar", os.urandom(size), delay_s=1.0)
    daemon = start_daemon(
        {"web": origin.url},
        "--readahead",
        "0",
        "--eviction",
        "auto",
        cache_size=str(640 * KiB + 3 * (size + 8 * KiB)),
    )
    client.post_plan("job", 0, [f"/web/{n}.tar" for n in "ABCXABC"], daemon.url)
    for name in "ABC":
        assert curl(f"{daemon.url}/web/{name}.tar").status == 200
    client.prefetch(["/web/X.tar"], daemon.url)
    wait_for("the prefetch's GET", lambda: origin.gets["X.tar"] >= 1)
    answer = curl(f"{daemon.url}/web/X.tar")
    assert answer.status == 200 and answer.headers["x-shardcache"] == "coalesced", answer
    _settle(daemon)
    assert origin.gets["X.tar"] == 1, origin.gets
