"""Issue 12 end to end: a dataset twice the cache's size, read in a fresh shard order every
epoch by the real WebDataset pipeline (with the `prefetch_ahead` stage) through real curl and the
daemon. LRU throws away what the next epoch needs; the default policy keeps about half; with two
loaders on different shuffles, the plans their stages post bring it near the offline optimum.

The figure is the daemon's own: `shardcache_origin_bytes_total` per epoch against the bytes
the loader read, so a shard that a prefetch fetched from the origin counts as fetched, even
though the loader's read of it is a hit."""

from __future__ import annotations

import itertools
import json
import random
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
import webdataset as wds

from shardcache.loader.sample import write_sample_shards
from shardcache.loader.webdataset import PLAN_EPOCHS_AHEAD, prefetch_ahead
from tests.daemon_process import Daemon
from tests.integration.helpers import curl, run_cli
from tests.origin_server import OriginServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import trace_sim  # noqa: E402

SHARDS = 100
SAMPLES_PER_SHARD = 8
EPOCHS = 3  # the first reads everything; two more show what the cache keeps
ENTRY_OVERHEAD = 8 * 1024  # store.ENTRY_OVERHEAD_BYTES: what each entry costs beyond its bytes
INDEX_ALLOWANCE = 768 * 1024  # the index database and its write-ahead log allowance


def _epoch(daemon: Daemon, epoch: int, plan: bool) -> int:
    """Read every sample of every shard once, in this epoch's shuffled order; return samples."""
    urls = [f"pipe:curl -s -f {daemon.url}/data/train/shards_{i:03d}.tar" for i in range(SHARDS)]
    random.Random(1000 + epoch).shuffle(urls)
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(urls),
        prefetch_ahead(2, plan=plan),  # it sees the shuffled order, as after split_by_worker
        wds.tarfile_to_samples(),
    )
    return sum(1 for _ in pipeline)


def _dataset(origin: OriginServer, tmp_path: Path) -> tuple[int, int]:
    """Put the shards on the origin; return (dataset bytes, a cache size holding half)."""
    shards = write_sample_shards(
        tmp_path / "shards", SHARDS, samples_per_shard=SAMPLES_PER_SHARD, payload_bytes=32768
    )
    dataset_bytes = 0
    for path in shards:
        origin.put(f"train/{path.name}", path.read_bytes())
        dataset_bytes += path.stat().st_size
    shard_bytes = dataset_bytes // SHARDS
    # A cache that holds half of the shards: C/N = 0.5.
    return dataset_bytes, (SHARDS // 2) * (shard_bytes + ENTRY_OVERHEAD) + INDEX_ALLOWANCE


def _byte_hit_ratios(
    origin: OriginServer, start_daemon, tmp_path: Path, *flags: str, plan: bool = True
) -> tuple[list[Fraction], Daemon, list[tuple[int, int, int]]]:
    """Each epoch's byte hit ratio, exact (a float 1 - 55/100 is 0.4499…), and the cache's
    (entries, bytes, capacity) when each epoch began."""
    dataset_bytes, cache_size = _dataset(origin, tmp_path)
    daemon = start_daemon(
        {"data": origin.url},
        "--readahead",
        "0",
        "--eviction",
        "auto",
        *flags,
        cache_size=str(cache_size),
    )
    ratios: list[Fraction] = []
    held: list[tuple[int, int, int]] = []
    for epoch in range(EPOCHS):
        cache = daemon.get_json("/_/status")[1]["cache"]  # type: ignore[index]
        held.append((cache["entries"], cache["size_bytes"], cache["capacity_bytes"]))
        before = daemon.metric("shardcache_origin_bytes_total", origin="data")
        assert _epoch(daemon, epoch, plan) == SHARDS * SAMPLES_PER_SHARD
        fetched = daemon.metric("shardcache_origin_bytes_total", origin="data") - before
        ratios.append(1 - Fraction(round(fetched), dataset_bytes))
    print(
        "byte hit ratios",
        flags,
        [round(float(r), 3) for r in ratios],
        "entries, bytes, capacity at each epoch's start",
        held,
    )
    return ratios, daemon, held


@pytest.mark.parametrize("plan", [False, True], ids=["scan-resistant", "plan"])
def test_reshuffled_epochs_keep_half_the_dataset_with_a_half_size_cache(
    origin: OriginServer, start_daemon, tmp_path: Path, plan: bool
) -> None:
    """Without plans, scan-resistant admission (look-ahead prefetches in the transient area);
    with the stage's plans (the default), the plans decide."""
    ratios, daemon, held = _byte_hit_ratios(origin, start_daemon, tmp_path, plan=plan)
    assert ratios[0] < 0.05  # the first epoch reads (nearly) everything from the origin
    # About half: the cache holds 50 of the 100 shards at each epoch's start, and an epoch
    # hits 47 of them in most runs, 45 and 42 in two CI runs (every later epoch alike): the
    # shards a look-ahead displaces within an epoch vary with timing. LRU keeps 12-16.
    bar = Fraction(40, 100)
    assert all(ratio >= bar for ratio in ratios[1:]), (ratios, held)
    status = daemon.get_json("/_/status")[1]
    eviction = status["cache"]["eviction"]  # type: ignore[index]
    policy = "plan" if plan else "scan-resistant"
    assert eviction["policy"] == policy
    assert daemon.metric("shardcache_eviction_policy", policy=policy) == 1
    if plan:  # a prefetch the plan needs sooner takes the place of a shard read already
        assert daemon.metric("shardcache_cache_evictions_total") >= SHARDS
    else:  # look-ahead prefetches of shards with no room: read once, dropped
        assert eviction["transient_dropped"] >= SHARDS
    stats = run_cli("stats", "--daemon", daemon.url)
    assert stats.returncode == 0, stats.stderr
    line = next(line for line in stats.stdout.splitlines() if line.startswith("eviction"))
    # Prefetches posted at the end may still finish: the count can have moved since.
    assert re.search(rf"{policy}: \d+ misses streamed through", line), line


def test_lru_keeps_little_of_the_same_workload(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """The same epochs under `--eviction lru`: what the issue measured before (0.12-0.14)."""
    ratios, daemon, _ = _byte_hit_ratios(origin, start_daemon, tmp_path, "--eviction", "lru")
    assert all(ratio < 0.3 for ratio in ratios[1:]), ratios
    assert daemon.metric("shardcache_eviction_policy", policy="lru") == 1


def _loader(daemon: Daemon, seed: int) -> wds.DataPipeline:
    """A loader as a training job builds it once: the shard list reshuffled every epoch by
    WebDataset's own deterministic shuffle, then the prefetch stage (which posts the plan)."""
    urls = [f"pipe:curl -s -f {daemon.url}/data/train/shards_{i:03d}.tar" for i in range(SHARDS)]
    return wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.detshuffle(bufsize=SHARDS, initial=SHARDS, seed=seed),
        prefetch_ahead(2),
        wds.tarfile_to_samples(),
    )


def _shards_of(samples: Iterator[dict[str, object]]) -> Iterator[str]:
    """Read a loader shard by shard: yield each shard's key once its samples are consumed."""
    while True:
        batch = [sample for _, sample in zip(range(SAMPLES_PER_SHARD), samples, strict=False)]
        if not batch:
            return
        assert len(batch) == SAMPLES_PER_SHARD
        yield str(batch[0]["__url__"]).rsplit("/", 1)[1]


class _Job:
    """One loader read shard by shard over several epochs, as its trainer would."""

    def __init__(self, daemon: Daemon, seed: int, epochs: int) -> None:
        self.loader = _loader(daemon, seed)
        self.epochs = epochs
        self.epoch = -1
        self._reader: Iterator[str] = iter(())

    def next_shard(self) -> tuple[int, str] | None:
        shard = next(self._reader, None)
        if shard is None:
            self.epoch += 1
            if self.epoch == self.epochs:
                return None
            self._reader = _shards_of(iter(self.loader))
            shard = next(self._reader)
        return self.epoch, shard


def test_two_loaders_posting_plans_come_near_the_offline_optimum(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    """Two jobs on one node over one dataset, each with its own shuffle, one reading two shards
    for each of the other's (the simulator's two-jobs trace). Their stages post each epoch's
    order; from the fast job's second epoch on, the daemon's byte hit ratio is compared with the
    simulator's Belady (the offline optimum, knowing the whole future) for the very same reads."""
    dataset_bytes, cache_size = _dataset(origin, tmp_path)
    shard_bytes = dataset_bytes / SHARDS
    daemon = start_daemon(
        {"data": origin.url}, "--readahead", "0", "--eviction", "auto", cache_size=str(cache_size)
    )
    fast, slow = _Job(daemon, seed=0, epochs=4), _Job(daemon, seed=1000, epochs=2)
    trace: trace_sim.Trace = []
    counted_from: float | None = None
    for step in itertools.count():
        job = slow if step % 3 == 2 else fast
        read = job.next_shard()
        if read is None:
            if job is fast:
                break
            continue
        if counted_from is None and fast.epoch == 1:
            counted_from = daemon.metric("shardcache_origin_bytes_total", origin="data")
        # The simulator counts reads tagged epoch >= 1: from the fast job's second epoch on.
        trace.append(trace_sim.Read(int(counted_from is not None), read[1], int(job is slow)))
    assert counted_from is not None
    fetched = daemon.metric("shardcache_origin_bytes_total", origin="data") - counted_from
    counted = sum(1 for read in trace if read.epoch == 1)
    measured = 1 - fetched / (counted * shard_bytes)
    optimum = trace_sim.belady(trace, SHARDS // 2)
    print(f"two loaders: byte hit ratio {measured:.3f}, belady {optimum:.3f}")
    assert measured >= 0.9 * optimum, (measured, optimum)
    eviction = daemon.get_json("/_/status")[1]["cache"]["eviction"]  # type: ignore[index]
    assert eviction["policy"] == "plan"
    assert sorted(plan["epoch"] for plan in eviction["plans"]) == [1, 3]
    # Each plan names its epoch and the next PLAN_EPOCHS_AHEAD (detshuffle's order is computable).
    for plan in eviction["plans"]:
        assert (plan["position"], plan["length"]) == (SHARDS, SHARDS * (1 + PLAN_EPOCHS_AHEAD))
    assert daemon.metric("shardcache_plans_active") == 2


def _post_plan(daemon: Daemon, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        daemon.url + "/_/plan", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        assert exc.headers["Content-Type"].startswith("application/json")
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"not json", 400, "not JSON"),
        (b"[]", 400, "expected"),
        (b'{"epoch": 0, "urls": ["/data/a.tar"]}', 400, '"job"'),
        (b'{"job": "", "urls": ["/data/a.tar"]}', 400, '"job"'),
        (rb'{"job": "j\u0000", "urls": ["/data/a.tar"]}', 400, '"job"'),
        (b'{"job": "j", "epoch": -1, "urls": ["/data/a.tar"]}', 400, '"epoch"'),
        (b'{"job": "j", "epoch": true, "urls": ["/data/a.tar"]}', 400, '"epoch"'),
        (b'{"job": "j", "urls": ["/nope/a.tar"]}', 400, "no origin"),
        (b'{"job": "j", "urls": "/data/a.tar"}', 400, "list"),
        (b'{"job": "j", "urls": ["/data/../a.tar"]}', 400, "urls"),
        (b'{"job": "j", "urls": ["/data/a.tar"], "warm": true}', 400, "unknown"),
        (b'{"job": "j", "urls": ["/data/a.tar"], "extra": 1}', 400, "unknown"),
        (b'{"job": "j", "epoch": 1}', 400, '"urls"'),
    ],
)
def test_a_bad_plan_gets_a_json_4xx_and_changes_nothing(
    origin: OriginServer, start_daemon, body: bytes, status: int, says: str
) -> None:
    daemon = start_daemon({"data": origin.url}, "--eviction", "auto")
    code, answer = _post_plan(daemon, body)
    assert (code, says in str(answer["error"])) == (status, True), answer
    assert daemon.get_json("/_/status")[1]["cache"]["eviction"]["plans"] == []  # type: ignore[index]


def test_a_plan_is_taken_replaced_and_refused_under_lru(origin: OriginServer, start_daemon) -> None:
    daemon = start_daemon({"data": origin.url}, "--eviction", "auto")
    code, answer = _post_plan(
        daemon, b'{"job": "j", "epoch": 2, "urls": ["/data/shards_{000..009}.tar"]}'
    )
    assert (code, answer) == (200, {"job": "j", "epoch": 2, "keys": 10})
    code, answer = _post_plan(daemon, b'{"job": "j", "epoch": 3, "urls": ["/data/a.tar"]}')
    assert (code, answer) == (200, {"job": "j", "epoch": 3, "keys": 1})
    plans = daemon.get_json("/_/status")[1]["cache"]["eviction"]["plans"]  # type: ignore[index]
    assert [(p["job"], p["epoch"], p["length"]) for p in plans] == [("j", 3, 1)]
    code, answer = _post_plan(daemon, b'{"job": "j", "urls": []}')  # the job is done
    assert (code, answer) == (200, {"job": "j", "epoch": 0, "keys": 0})
    status, answer = daemon.get_json("/_/plan")
    assert status == 405 and "not allowed" in str(answer["error"])
    lru = start_daemon(
        {"data": origin.url}, "--eviction", "lru", cache_dir=daemon.cache_dir.parent / "lru"
    )
    code, answer = _post_plan(lru, b'{"job": "j", "urls": ["/data/a.tar"]}')
    assert code == 409 and "--eviction lru" in str(answer["error"])


def test_a_prefetch_the_plans_would_not_keep_is_not_downloaded(
    origin: OriginServer, start_daemon
) -> None:
    """A full cache of shards a plan reads before the one a look-ahead prefetch asks for: the
    prefetch would be streamed to nobody. It is sized (HEAD) and skipped, never fetched. (A
    look-ahead of a shard no plan names is another job's: it keeps its transient area.)"""
    mib = 1 << 20
    for name in ("a", "b", "c", "d", "x"):
        origin.put(f"{name}.tar", bytes([ord(name)]) * mib)
    # Four fit whatever the index takes (up to 1.4 MiB); a fifth never does.
    cache_size = 4 * (mib + ENTRY_OVERHEAD) + INDEX_ALLOWANCE + 640 * 1024
    daemon = start_daemon(
        {"data": origin.url}, "--readahead", "0", "--eviction", "auto", cache_size=str(cache_size)
    )
    code, _ = _post_plan(
        daemon,
        b'{"job": "j", "origin": "data", "keys": ["a.tar", "b.tar", "c.tar", "d.tar", "x.tar"]}',
    )
    assert code == 200
    for name in "abcd":  # one at a time: four fills at once could find the index mid-growth
        assert _prefetch(daemon, [f"/data/{name}.tar"], warm=True)["not_cached"] == 0
    assert daemon.get_json("/_/status")[1]["cache"]["entries"] == 4  # type: ignore[index]
    plans = daemon.get_json("/_/status")[1]["cache"]["eviction"]["plans"]  # type: ignore[index]
    assert plans[0]["position"] == 0  # warming is not the job reading

    batch = _prefetch(daemon, ["/data/x.tar"])
    assert batch["not_cached"] == 1 and batch["failed"] == 0
    assert origin.gets["x.tar"] == 0 and origin.heads["x.tar"] == 1
    # Read now, it streams through (needed after everything cached), and its bytes count.
    before = daemon.metric("shardcache_origin_bytes_total", origin="data")
    assert curl(f"{daemon.url}/data/x.tar").headers["x-shardcache"] == "miss"
    assert daemon.metric("shardcache_origin_bytes_total", origin="data") - before == mib
    assert daemon.get_json("/_/status")[1]["cache"]["eviction"]["bypassed"] == 1  # type: ignore[index]
    assert daemon.get_json("/_/status")[1]["cache"]["entries"] == 4  # type: ignore[index]


def _prefetch(daemon: Daemon, paths: list[str], warm: bool = False) -> dict[str, object]:
    """Queue `paths` (as look-ahead, or to warm) and wait for the batch; return its status."""
    request = urllib.request.Request(
        daemon.url + "/_/prefetch", data=json.dumps({"urls": paths, "warm": warm}).encode()
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        batch_id = json.loads(response.read())["batch"]
    deadline = time.monotonic() + 20
    while True:
        batch = daemon.get_json(f"/_/prefetch?batch={batch_id}")[1]["batch"]
        if batch["done"] == batch["total"]:  # type: ignore[index]
            return batch  # type: ignore[return-value]
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)
