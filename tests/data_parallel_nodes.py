"""Data-parallel training as processes: N nodes, each its own daemon, each running the README's
WebDataset pipeline in W worker processes, over several epochs, in front of one origin.

torch is not installed here (its wheels are gigabytes of CUDA), so a node's `DataLoader` is
modelled as WebDataset does without one: each worker is a process iterating the pipeline, with
RANK/WORLD_SIZE (the node) and WORKER/NUM_WORKERS (the worker) in its environment, exactly the
variables `webdataset.utils.pytorch_worker_info` reads when torch is absent. Each worker
iterates the same `DataPipeline` once per epoch, so `wds.detshuffle`'s epoch advances as in a
training loop. Epochs end together on every node (the coordinator releases the next epoch once
every worker has finished the last), as a synchronous data-parallel job's steps keep them.

The origin is one `OriginServer`; each node's daemon reads the same shards under its own prefix
(`n0/`, `n1/`, …), so the origin's counts say which node asked for what, and when (each GET's
start is recorded with the wall clock the workers stamp their reads with). A monitor thread
samples each daemon's `/_/prefetch` and its look-ahead pins (`/_/cache`) while the workers run.
Used by `tests/integration/test_data_parallel_epochs.py` and `benchmarks/data_parallel.py`.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from shardcache.loader.sample import write_sample_shards
from tests.daemon_process import Daemon
from tests.origin_server import OriginServer

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_EVERY_S = 0.25  # the monitor's period, per daemon
LATER_EPOCHS = 5  # orders known beyond the run: `prefetch_ahead` plans up to 4 epochs ahead

# One worker of one node. Prints its orders (those of the run, then LATER_EPOCHS more: what a
# plan may name beyond the run),
# then, for each "go" line on stdin, reads one epoch and prints what it read and waited.
WORKER = """
import json, os, sys, time
import webdataset as wds
from shardcache.loader.webdataset import prefetch_ahead
port, shards, epochs, pace_s, ahead, later = (
    int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]),
    int(sys.argv[6]))
urls = [f"pipe:curl -s -f http://127.0.0.1:{port}/web/shards_{n:03d}.tar" for n in range(shards)]
shard_stages = lambda: [wds.SimpleShardList(urls), wds.detshuffle(1000, seed=0),
                        wds.split_by_node, wds.split_by_worker]
pipeline = wds.DataPipeline(*shard_stages(), prefetch_ahead(ahead), wds.tarfile_to_samples())
orders = wds.DataPipeline(*shard_stages())
name = lambda url: url.rsplit("/", 1)[-1]
print(json.dumps({"pid": os.getpid(),
                  "orders": [[name(s["url"]) for s in orders] for _ in range(epochs + later)]}),
      flush=True)
for epoch in range(epochs):
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)
    reads, keys, wait_s = [], [], 0.0
    samples = iter(pipeline)
    while True:
        started = time.perf_counter()
        sample = next(samples, None)
        wait_s += time.perf_counter() - started
        if sample is None:
            break
        if not reads or reads[-1][1] != name(sample["__url__"]):
            reads.append((time.time(), name(sample["__url__"])))
        keys.append(sample["__key__"])
        time.sleep(pace_s)  # a training step
    print(json.dumps({"epoch": epoch, "reads": reads, "keys": keys, "wait_s": wait_s}),
          flush=True)
"""


class TimedOrigin(OriginServer):
    """The test origin, also recording when each GET of an object it holds began."""

    get_started: list[tuple[float, str]]

    def start(self) -> None:
        self.get_started = []
        super().start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        if request.method == "GET" and key in self.objects:
            self.get_started.append((time.time(), key))
        return await super()._handle(request)


@dataclass(frozen=True)
class Setup:
    nodes: int
    workers: int = 2  # per node
    shards: int = 64
    samples_per_shard: int = 4
    payload_bytes: int = 48 * 1024
    epochs: int = 3
    pace_s: float = 0.01  # per sample
    ahead: int = 2  # prefetch_ahead(k)
    cache_shards: int = 6  # the cache holds this many shards (besides its index)
    daemon_args: tuple[str, ...] = ()
    first_byte_s: float = 0.0  # the origin's delay before each response


@dataclass
class Sample:
    """One look at one daemon while the workers ran."""

    at: float  # time.time() as it began
    windows: tuple[int, int]  # the epoch (0-based; -1 before the first) at its start and end
    alive: set[int]  # the node's workers still running as it began
    waiting_for: str | None
    in_flight: int  # prefetches running (their admitted bytes hold the budget until pinned)
    held_by: dict[str, int]
    pinned: list[str]  # shards pinned as look-ahead (prefetched, unread)
    pins_ended: dict[str, int]


@dataclass
class Node:
    rank: int
    daemon: Daemon
    pids: list[int] = field(default_factory=list)
    orders: list[list[str]] = field(default_factory=list)  # per epoch (+LATER_EPOCHS): share
    reads: list[list[tuple[float, str]]] = field(default_factory=list)  # per epoch, by time
    keys: list[list[str]] = field(default_factory=list)  # sample keys read, per epoch
    wait_s: list[float] = field(default_factory=list)  # loader wait, per epoch (all workers)
    samples: list[Sample] = field(default_factory=list)
    shard_bytes: dict[str, int] = field(default_factory=dict)
    gets: list[tuple[float, str]] = field(default_factory=list)  # origin GETs: (start, shard)
    epoch_ends: list[float] = field(default_factory=list)
    log: str = ""

    @property
    def last_read(self) -> float:
        """When the node's last read began (time.time())."""
        return max(at for reads in self.reads for at, _ in reads)

    def origin_bytes(self, epoch: int) -> int:
        """What this node's daemon asked of the origin while epoch `epoch` ran (until every
        node finished it; the last epoch's span ends when the queue settled)."""
        start = self.epoch_ends[epoch - 1] if epoch else 0.0
        return sum(
            self.shard_bytes[shard]
            for at, shard in self.gets
            if start <= at < self.epoch_ends[epoch]
        )

    def share_bytes(self, epoch: int) -> int:
        return sum(self.shard_bytes[shard] for shard in self.orders[epoch])

    def trace(self) -> list[tuple[int, str]]:
        """(epoch, shard) for every read of the node, its workers' reads merged by time."""
        return [
            (epoch, shard) for epoch, reads in enumerate(self.reads) for _, shard in sorted(reads)
        ]

    def fetched_reads(self) -> list[bool]:
        """For each read of `trace()`, whether the origin was asked for its shard since this
        node last read it: a read the cache did not keep the shard for (a prefetch counts)."""
        gets: dict[str, list[float]] = collections.defaultdict(list)
        for at, shard in self.gets:
            gets[shard].append(at)
        last_read: dict[str, float] = {}
        fetched = []
        for reads in self.reads:
            for at, shard in sorted(reads):
                since = last_read.get(shard, 0.0)
                fetched.append(any(since < get <= at for get in gets[shard]))
                last_read[shard] = at
        return fetched

    def unread_gets(self) -> list[tuple[float, str]]:
        """The origin GETs of this node that no read of it followed before the shard's next GET
        (or the end): bytes fetched for nothing."""
        read_at: dict[str, list[float]] = collections.defaultdict(list)
        for reads in self.reads:
            for at, shard in reads:
                read_at[shard].append(at)
        gets: dict[str, list[float]] = collections.defaultdict(list)
        for at, shard in sorted(self.gets):
            gets[shard].append(at)
        unread = []
        for shard, times in gets.items():
            for at, following in itertools.zip_longest(times, times[1:], fillvalue=math.inf):
                if not any(at <= read < following for read in read_at[shard]):
                    unread.append((at, shard))
        return sorted(unread)

    def results(self) -> list[collections.Counter[str]]:
        """Per epoch, the daemon's `X-Shardcache` answers to this node's shard reads (from its
        access log: the i-th read of a shard is its i-th epoch in this node's share)."""
        answers: dict[str, list[str]] = collections.defaultdict(list)
        for line in self.log.splitlines():
            parts = line.split("GET /web/", 1)
            if len(parts) == 2:
                shard, _status, result = parts[1].split()[:3]
                answers[shard].append(result)
        counts: list[collections.Counter[str]] = [collections.Counter() for _ in self.reads]
        for shard, said in answers.items():
            epochs = [e for e, order in enumerate(self.orders[: len(self.reads)]) if shard in order]
            for epoch, result in zip(epochs, said, strict=False):
                counts[epoch][result] += 1
        return counts


class _Worker:
    """One worker process and a thread turning its output lines into a queue."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> None:
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_message(self, deadline: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"worker {self.process.pid} said nothing in time") from None
        if line is None:
            raise AssertionError(f"worker {self.process.pid} ended: {self.process.wait()}")
        message: dict[str, Any] = json.loads(line)
        return message

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self._reader.join(5)


class _Monitor:
    """Samples each node's daemon every SAMPLE_EVERY_S until stopped; `window` is the epoch
    the coordinator is in (-1 before the first)."""

    def __init__(self, nodes: list[Node], alive: Callable[[], set[int]]) -> None:
        self.nodes = nodes
        self._alive = alive
        self.window = -1
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            for node in self.nodes:
                try:
                    node.samples.append(self.look(node, self.window))
                except (OSError, ValueError) as exc:  # a loaded machine: the next look
                    self.errors.append(f"node {node.rank}: {exc!r}")

    def look(self, node: Node, window: int) -> Sample:
        at, alive = time.time(), self._alive() & set(node.pids)
        prefetch = _answer(node.daemon, "/_/prefetch")
        listing = _answer(node.daemon, "/_/cache?origin=web")
        entries: list[dict[str, Any]] = listing["entries"]  # type: ignore[assignment]
        return Sample(
            at,
            (window, self.window),
            alive,
            prefetch["waiting_for"],  # type: ignore[arg-type]
            prefetch["in_flight"],  # type: ignore[arg-type]
            prefetch["held_by"],  # type: ignore[arg-type]
            [e["key"] for e in entries if "look-ahead" in e["pinned_by"]],
            prefetch["pins_ended"],  # type: ignore[arg-type]
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _answer(daemon: Daemon, path: str) -> dict[str, object]:
    """The daemon's JSON answer to `path`; ConnectionError for any status but 200."""
    status, document = daemon.get_json(path)
    if status != 200:
        raise ConnectionError(f"{path}: {status} {document}")
    return document


def settle(daemon: Daemon, timeout_s: float = 60) -> dict[str, Any]:
    """The prefetch queue's status once nothing is pending or running."""
    deadline = time.monotonic() + timeout_s
    while True:
        status: dict[str, Any] = daemon.get_json("/_/prefetch")[1]
        if status["pending"] == 0 and status["in_flight"] == 0:
            return status
        assert time.monotonic() < deadline, f"prefetch did not settle: {status}"
        time.sleep(0.05)


def cache_size(setup: Setup, shard_bytes: int) -> int:
    """A cache that holds `setup.cache_shards` shards: the index's allowance (its database and
    write-ahead log, `cache/directory.py`: 576 KiB measured, 64 KiB slack) and each entry's
    8 KiB overhead (`cache/store.py`)."""
    index_bytes = 640 * 1024
    return index_bytes + setup.cache_shards * (shard_bytes + 8 * 1024)


def run(
    setup: Setup, work: Path, start_daemon: Callable[..., Daemon], timeout_s: float = 240
) -> list[Node]:
    """Run `setup` under `work`; return each node's figures. Daemons come from `start_daemon`
    (as `tests/conftest.py`'s fixture: origins, *args, cache_dir=, cache_size=); the caller
    stops them. Raises AssertionError when a worker fails or says nothing by `timeout_s`."""
    paths = write_sample_shards(
        work / "shards", setup.shards, setup.samples_per_shard, setup.payload_bytes
    )
    deadline = time.monotonic() + timeout_s
    origin = TimedOrigin()
    origin.start()
    workers: list[list[_Worker]] = []  # by node
    try:
        nodes = _start_nodes(setup, work, start_daemon, origin, paths)
        with (work / "workers.log").open("wb") as stderr:
            workers = [_start_workers(setup, node, stderr) for node in nodes]
            for node, node_workers in zip(nodes, workers, strict=True):
                said = [worker.next_message(deadline) for worker in node_workers]
                node.pids = [hello["pid"] for hello in said]
                node.orders = [
                    [shard for hello in said for shard in hello["orders"][epoch]]
                    for epoch in range(setup.epochs + LATER_EPOCHS)
                ]
            _run_epochs(setup, nodes, workers, deadline)
        for node in nodes:
            node.log = node.daemon.log()
            prefix = f"n{node.rank}/"
            node.gets = [
                (at, key.removeprefix(prefix))
                for at, key in origin.get_started
                if key.startswith(prefix)
            ]
        return nodes
    finally:
        for worker in itertools.chain.from_iterable(workers):
            worker.stop()
        origin.stop()


def _start_workers(setup: Setup, node: Node, stderr: IO[bytes]) -> list[_Worker]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "WORKER")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env["RANK"], env["WORLD_SIZE"] = str(node.rank), str(setup.nodes)
    env["NUM_WORKERS"] = str(setup.workers)
    argv = [sys.executable, "-c", WORKER, str(node.daemon.port), str(setup.shards)]
    argv += [str(setup.epochs), str(setup.pace_s), str(setup.ahead), str(LATER_EPOCHS)]
    return [
        _Worker(argv, {**env, "WORKER": str(worker)}, stderr) for worker in range(setup.workers)
    ]


def _run_epochs(
    setup: Setup, nodes: list[Node], workers: list[list[_Worker]], deadline: float
) -> None:
    """Release each epoch once every worker finished the last; sample the daemons meanwhile,
    and until their prefetch queues settled after the last."""
    every = list(itertools.chain.from_iterable(workers))
    monitor = _Monitor(nodes, lambda: {w.process.pid for w in every if w.process.poll() is None})
    try:
        for epoch in range(setup.epochs):
            monitor.window = epoch
            for worker in every:
                worker.go()
            for node, node_workers in zip(nodes, workers, strict=True):
                said = [worker.next_message(deadline) for worker in node_workers]
                node.reads.append([(at, shard) for m in said for at, shard in m["reads"]])
                node.keys.append([key for m in said for key in m["keys"]])
                node.wait_s.append(sum(m["wait_s"] for m in said))
            now = time.time()
            for node in nodes:
                node.epoch_ends.append(now)
        for worker in every:
            assert worker.process.wait(max(1.0, deadline - time.monotonic())) == 0
        monitor.window = setup.epochs
        for node in nodes:
            settle(node.daemon, max(1.0, deadline - time.monotonic()))
    finally:
        monitor.stop()
    now = time.time()
    for node in nodes:
        node.epoch_ends[-1] = now


def _start_nodes(
    setup: Setup,
    work: Path,
    start_daemon: Callable[..., Daemon],
    origin: OriginServer,
    paths: list[Path],
) -> list[Node]:
    shards = {path.name: path.read_bytes() for path in paths}  # one copy, under every prefix
    size = cache_size(setup, max(len(data) for data in shards.values()))
    nodes = []
    for rank in range(setup.nodes):
        for name, data in shards.items():
            origin.put(f"n{rank}/{name}", data, delay_s=setup.first_byte_s)
        daemon = start_daemon(
            {"web": f"{origin.url}/n{rank}"},
            *setup.daemon_args,
            cache_dir=work / f"node{rank}",
            cache_size=str(size),
        )
        sizes = {name: len(data) for name, data in shards.items()}
        nodes.append(Node(rank, daemon, shard_bytes=sizes))
    return nodes


def windows(samples: list[Sample]) -> Iterator[tuple[set[int], Sample]]:
    """Each sample with the epochs (0-based) it may have been taken in."""
    for sample in samples:
        first, last = sample.windows
        yield set(range(first, last + 1)), sample
