"""Issue 12 end to end: a dataset twice the cache's size, read in a fresh shard order every
epoch by the real WebDataset pipeline (with the `prefetch_ahead` stage) through real curl and the
daemon. LRU throws away what the next epoch needs; the default policy keeps about half.

The figure is the daemon's own: `shardcache_origin_bytes_total` per epoch against the bytes
the loader read, so a shard that a prefetch fetched from the origin counts as fetched, even
though the loader's read of it is a hit."""

from __future__ import annotations

import random
from pathlib import Path

import webdataset as wds

from shardcache.sample import write_sample_shards
from shardcache.webdataset import prefetch_ahead
from tests.daemon_process import Daemon
from tests.integration.helpers import run_cli
from tests.origin_server import OriginServer

SHARDS = 100
EPOCHS = 4
ENTRY_OVERHEAD = 8 * 1024  # store.ENTRY_OVERHEAD_BYTES: what each entry costs beyond its bytes
INDEX_ALLOWANCE = 768 * 1024  # the index database and its write-ahead log allowance


def _epoch(daemon: Daemon, epoch: int) -> int:
    """Read every sample of every shard once, in this epoch's shuffled order; return samples."""
    urls = [f"pipe:curl -s -f {daemon.url}/data/train/shards_{i:03d}.tar" for i in range(SHARDS)]
    random.Random(1000 + epoch).shuffle(urls)
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(urls),
        prefetch_ahead(2),  # the stage sees the shuffled order, as after split_by_worker
        wds.tarfile_to_samples(),
    )
    return sum(1 for _ in pipeline)


def _byte_hit_ratios(
    origin: OriginServer, start_daemon, tmp_path: Path, *flags: str
) -> tuple[list[float], Daemon]:
    shards = write_sample_shards(
        tmp_path / "shards", SHARDS, samples_per_shard=8, payload_bytes=32768
    )
    dataset_bytes = 0
    for path in shards:
        origin.put(f"train/{path.name}", path.read_bytes())
        dataset_bytes += path.stat().st_size
    shard_bytes = dataset_bytes // SHARDS
    # A cache that holds half of the shards: C/N = 0.5.
    cache_size = (SHARDS // 2) * (shard_bytes + ENTRY_OVERHEAD) + INDEX_ALLOWANCE
    daemon = start_daemon(
        {"data": origin.url}, "--readahead", "0", *flags, cache_size=str(cache_size)
    )
    ratios = []
    for epoch in range(EPOCHS):
        before = daemon.metric("shardcache_origin_bytes_total", origin="data")
        assert _epoch(daemon, epoch) == SHARDS * 8
        fetched = daemon.metric("shardcache_origin_bytes_total", origin="data") - before
        ratios.append(1 - fetched / dataset_bytes)
    print("byte hit ratios", flags, [round(r, 3) for r in ratios])
    return ratios, daemon


def test_reshuffled_epochs_keep_half_the_dataset_with_a_half_size_cache(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    ratios, daemon = _byte_hit_ratios(origin, start_daemon, tmp_path)
    assert ratios[0] <= 0.01  # the first epoch reads everything from the origin
    assert all(ratio >= 0.45 for ratio in ratios[1:]), ratios
    status = daemon.get_json("/_/status")[1]
    eviction = status["cache"]["eviction"]  # type: ignore[index]
    assert eviction["policy"] == "scan-resistant"
    assert eviction["bypassed"] + eviction["transient_dropped"] >= 3 * SHARDS // 3
    assert daemon.metric("shardcache_eviction_policy", policy="scan-resistant") == 1
    stats = run_cli("stats", "--daemon", daemon.url)
    assert stats.returncode == 0, stats.stderr
    line = next(line for line in stats.stdout.splitlines() if line.startswith("eviction"))
    assert f"scan-resistant: {eviction['bypassed']} misses streamed through" in line


def test_lru_keeps_little_of_the_same_workload(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """The same epochs under `--eviction lru`: what the issue measured before (0.12-0.14)."""
    ratios, daemon = _byte_hit_ratios(origin, start_daemon, tmp_path, "--eviction", "lru")
    assert all(ratio < 0.3 for ratio in ratios[1:]), ratios
    assert daemon.metric("shardcache_eviction_policy", policy="lru") == 1
