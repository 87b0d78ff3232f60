"""Attacks on the next epochs' plans against a real daemon: what `prefetch_ahead` posts with
the next epochs' order must fit the daemon's bounds for the workers one node runs."""

from __future__ import annotations

from shardcache.cache.plans import MAX_PLANNED_KEYS
from shardcache.loader import client
from shardcache.loader.webdataset import FORECAST_WINDOW
from tests.origin_server import OriginServer

RANKS_PER_NODE = 8  # an 8-GPU machine: 8 ranks, one daemon
WORKERS_PER_RANK = 8  # DataLoader workers of each rank


def test_every_worker_of_an_eight_gpu_node_has_its_plan(origin: OriginServer, start_daemon) -> None:
    """Each worker near its epoch's end posts FORECAST_WINDOW names (the rest of its epoch,
    then the next epochs'). A worker whose plan is refused reads unplanned: while the other
    plans are active its shards are evicted first and, with the cache full of planned
    shards, not admitted at all. Before the next epochs were planned, a plan named 2,048; with
    16,384 the 62nd plan was refused (429)."""
    daemon = start_daemon({"web": origin.url}, "--eviction", "auto")
    jobs = RANKS_PER_NODE * WORKERS_PER_RANK
    print(f"{jobs} plans of {FORECAST_WINDOW}: {jobs * FORECAST_WINDOW} keys, "
          f"bound {MAX_PLANNED_KEYS}")  # fmt: skip
    accepted = 0
    for job in range(jobs):
        paths = [f"/web/train/s_{job:02d}_{n:05d}.tar" for n in range(FORECAST_WINDOW)]
        try:
            client.post_plan(f"node0:{job}", 0, paths, daemon.url)
        except client.ClientError as exc:
            print(f"plan {job + 1} of {jobs} refused: {exc.status} {exc}")
            raise
        accepted += 1
    assert accepted == jobs


def test_a_plan_too_large_for_the_daemon_falls_back_to_this_epochs_window(
    origin: OriginServer, start_daemon
) -> None:
    """Long shard names: this epoch and the next four are over the daemon's 4 MiB body limit
    (413). The stage posts the first PLAN_WINDOW names instead of reading on without a plan."""
    import webdataset as wds

    from shardcache.loader.webdataset import PLAN_WINDOW, prefetch_ahead

    daemon = start_daemon({"web": origin.url}, "--readahead", "0", "--eviction", "auto")
    name = "d" * 800
    urls = [f"{daemon.url}/web/{name}/s_{n:04d}.tar" for n in range(1200)]
    pipeline = wds.DataPipeline(wds.SimpleShardList(urls), prefetch_ahead(1))
    first = next(iter(pipeline))
    assert first["url"] == urls[0]
    plans = daemon.get_json("/_/status")[1]["cache"]["eviction"]["plans"]  # type: ignore[index]
    assert [p["length"] for p in plans] == [PLAN_WINDOW], plans
