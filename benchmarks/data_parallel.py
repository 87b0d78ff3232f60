"""Data-parallel nodes in front of one origin (issue 35): origin bytes per node, pins left behind,
and a first epoch after stray reads. `python benchmarks/data_parallel.py` (from the repository
root: it starts daemons as users do, with the test suite's origin); about a minute.

Arms:
- nodes: N nodes (`--nodes`, default 2), each its own daemon (200 MiB cache), each running the
  README's pipeline (`wds.detshuffle(1000, seed=0)`, `split_by_node` with RANK/WORLD_SIZE,
  `prefetch_ahead(2)`, `tarfile_to_samples`) over 32 shards of 1.15 MiB, one after the other:
  what each node fetched from the origin against its share, and what it left pinned unread.
- stray: two `curl`s of shards no loader reads, on a fresh daemon (32 MiB cache, so an 8 MiB
  look-ahead budget, 2 MiB shards, 0.2 s to first byte), then one epoch of 16 other shards
  through `prefetch_ahead(2)`: the epoch's misses and the daemon's loader stall.
- epochs (`--epochs-arm`): N nodes (`--nodes`), two loader workers each (processes with
  WORKER/NUM_WORKERS, as WebDataset reads them without torch), three epochs of the same
  pipeline run side by side, epochs ending together (`tests/data_parallel_nodes.py`), over
  32 shards of 1.15 MiB a node an epoch, a cache of a quarter of a node's share, 0.05 s to
  first byte: per node and epoch the origin MiB against the share and the loader wait (time
  blocked in `next()` of the pipeline, its workers added), and the share of epoch 2-3 reads
  whose shard stayed cached since the node last read it, against the offline optimum
  (`trace_sim.belady`) for the node's reads as they happened, at that cache size; and the
  origin GETs no read of the node followed (the queue settled after the last epoch).
Each arm runs with the default `--readahead 2` and with `--readahead 0`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import webdataset as wds  # noqa: E402
from trace_sim import Read, belady  # noqa: E402

from shardcache.loader.sample import write_sample_shards  # noqa: E402
from shardcache.loader.webdataset import prefetch_ahead  # noqa: E402
from tests import data_parallel_nodes  # noqa: E402
from tests.daemon_process import Daemon  # noqa: E402
from tests.origin_server import OriginServer  # noqa: E402

MiB = 1 << 20


def _settle(daemon: Daemon) -> dict[str, Any]:
    """The prefetch queue's status once nothing is pending or running (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        status: dict[str, Any] = daemon.get_json("/_/prefetch")[1]
        if (status["pending"] == 0 and status["in_flight"] == 0) or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def nodes_arm(work: Path, nodes: int, extra: list[str]) -> list[tuple[float, float, float]]:
    """(MiB from the origin, MiB of its share, MiB left pinned unread) for each node."""
    origin = OriginServer()
    origin.start()
    paths = write_sample_shards(work / "shards", shards=32, samples_per_shard=9,
                                payload_bytes=128 * 1024)  # fmt: skip
    for path in paths:
        origin.put(path.name, path.read_bytes())
    rows = []
    try:
        for rank in range(nodes):
            daemon = Daemon(work / f"node{rank}", {"web": origin.url}, *extra,
                            cache_size="200MiB")  # fmt: skip
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(nodes))
            before = sum(origin.served.values())
            urls = [f"pipe:curl -s -f {daemon.url}/web/{path.name}" for path in paths]
            pipeline = wds.DataPipeline(
                wds.SimpleShardList(urls),
                wds.detshuffle(1000, seed=0), wds.split_by_node, wds.split_by_worker,
                prefetch_ahead(2), wds.tarfile_to_samples(),
            )  # fmt: skip
            read = set()
            for sample in pipeline:
                read.add(sample["__url__"])
                time.sleep(0.01)  # a training step
            unread = _settle(daemon)["unread_bytes"]
            share = sum(p.stat().st_size for p in paths if any(u.endswith(p.name) for u in read))
            fetched = sum(origin.served.values()) - before
            rows.append((fetched / MiB, share / MiB, unread / MiB))
            daemon.stop()
    finally:
        origin.stop()
    return rows


def stray_arm(work: Path, extra: list[str]) -> tuple[float, int, float]:
    """(MiB pinned after two stray reads, misses of the 16-shard epoch, loader stall s)."""
    origin = OriginServer()
    origin.start()
    paths = write_sample_shards(work / "shards", shards=16, samples_per_shard=16,
                                payload_bytes=128 * 1024)  # fmt: skip
    for path in paths:
        origin.put(f"e/{path.name}", path.read_bytes(), delay_s=0.2)
    for number in (100, 101, 102, 200, 201, 202):  # the strays and their neighbours
        origin.put(f"e/shards_{number:03d}.tar", paths[0].read_bytes(), delay_s=0.2)
    daemon = Daemon(work / "cache", {"web": origin.url}, *extra, cache_size="32MiB")
    try:
        for number in (100, 200):
            url = f"{daemon.url}/web/e/shards_{number:03d}.tar"
            subprocess.run(["curl", "-s", "-o", "/dev/null", url], check=True)
        pinned = _settle(daemon)["unread_bytes"]
        os.environ.update(RANK="0", WORLD_SIZE="1")
        urls = [f"pipe:curl -s -f {daemon.url}/web/e/{path.name}" for path in paths]
        pipeline = wds.DataPipeline(
            wds.SimpleShardList(urls), prefetch_ahead(2), wds.tarfile_to_samples()
        )
        for _ in pipeline:
            time.sleep(0.02)
        misses = daemon.metric("shardcache_requests_total", origin="web", result="miss") - 2
        stall = float(daemon.get_json("/_/status")[1]["loader_stall_s"])
    finally:
        daemon.stop()
        origin.stop()
    return pinned / MiB, int(misses), stall


def epochs_arm(work: Path, nodes: int, extra: list[str]) -> list[dict[str, Any]]:
    """Per node: origin MiB and share MiB per epoch, loader wait per epoch, the epoch 2-3 reads
    kept cached and the optimum's (`data_parallel_nodes`, module doc above)."""
    setup = data_parallel_nodes.Setup(
        nodes=nodes, shards=32 * nodes, samples_per_shard=9, payload_bytes=128 * 1024,
        cache_shards=8, daemon_args=tuple(extra), first_byte_s=0.05,
    )  # fmt: skip
    started: list[Daemon] = []

    def start_daemon(origins: dict[str, str], *args: str, cache_dir: Path, **kw: Any) -> Daemon:
        started.append(Daemon(cache_dir, origins, *args, **kw))
        return started[-1]

    try:
        ran = data_parallel_nodes.run(setup, work, start_daemon, timeout_s=600)
    finally:
        for daemon in started:
            daemon.stop()
    rows = []
    for node in ran:
        trace = [Read(epoch, shard) for epoch, shard in node.trace()]
        later = [f for f, read in zip(node.fetched_reads(), trace, strict=True) if read.epoch]
        rows.append(
            {
                "origin": [node.origin_bytes(e) / MiB for e in range(setup.epochs)],
                "share": [node.share_bytes(e) / MiB for e in range(setup.epochs)],
                "wait": node.wait_s,
                "kept": 1 - sum(later) / len(later),
                "optimum": belady(trace, setup.cache_shards),
                "unread": len(node.unread_gets()),
                "after_end": sum(at > node.last_read for at, _ in node.unread_gets()),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, help="nodes of the nodes arm (2) and epochs arm (4)")
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=("nodes", "stray", "epochs"),
        default=["nodes", "stray", "epochs"],
        help="the arms to run (all three by default)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        if "nodes" in args.arms:
            _print_nodes(work, args.nodes or 2)
        if "stray" in args.arms:
            _print_stray(work)
        if "epochs" in args.arms:
            _print_epochs(work, args.nodes or 4)


def _print_nodes(work: Path, nodes: int) -> None:
    print(
        "| arm | `--readahead` | node | from origin (MiB) | its share (MiB) | left pinned (MiB) |"
    )
    print("|---|---|---|---|---|---|")
    for readahead in ("2", "0"):
        rows = nodes_arm(work / f"nodes{readahead}", nodes, ["--readahead", readahead])
        for rank, (fetched, share, unread) in enumerate(rows):
            print(f"| {nodes} nodes | {readahead} | {rank} | {fetched:.1f} | {share:.1f} "
                  f"| {unread:.1f} |")  # fmt: skip
    print()


def _print_stray(work: Path) -> None:
    print(
        "| arm | `--readahead` | pinned after 2 stray reads (MiB) | epoch misses of 16 "
        "| loader stall (s) |"
    )
    print("|---|---|---|---|---|")
    for readahead in ("2", "0"):
        pinned, misses, stall = stray_arm(work / f"stray{readahead}", ["--readahead", readahead])
        print(f"| stray curls | {readahead} | {pinned:.2f} | {misses} | {stall:.2f} |")
    print()


def _print_epochs(work: Path, nodes: int) -> None:
    print(f"{nodes} nodes, 3 epochs:")
    print(
        "| `--readahead` | node | from origin, epochs 1/2/3 (MiB) | share (MiB) "
        "| loader wait, epochs 1/2/3 (s) | epochs 2-3 reads kept cached | optimum | of optimum "
        "| fetched, never read (of which after its last read) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for readahead in ("2", "0"):
        rows = epochs_arm(work / f"epochs{readahead}", nodes, ["--readahead", readahead])
        for rank, row in enumerate(rows):
            origin = " / ".join(f"{mib:.1f}" for mib in row["origin"])
            wait = " / ".join(f"{s:.2f}" for s in row["wait"])
            print(
                f"| {readahead} | {rank} | {origin} | {row['share'][0]:.1f} | {wait} "
                f"| {row['kept']:.3f} | {row['optimum']:.3f} "
                f"| {row['kept'] / row['optimum']:.0%} | {row['unread']} ({row['after_end']}) |"
            )


if __name__ == "__main__":
    main()
