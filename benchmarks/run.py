"""shardcache against its peers, on one machine in one run; results into BENCHMARKS.md.

    python benchmarks/run.py            # the full suite (several minutes, ~20 GiB of disk)
    python benchmarks/run.py --quick    # every scenario, tiny sizes, one run: a smoke test
    python benchmarks/run.py --only scaling  # not in the default list: needs `serve --receivers`

Absolute figures on a shared 2-core machine are noisy, so every comparison is a ratio of two
measurements taken back to back in the same run; rows give the median over runs with min-max.
Peers: nginx as an expert caching proxy and as a static file server, direct curl from the origin
(WebDataset's `pipe:curl` baseline), `aws s3 cp … -` (the `pipe:aws` baseline), and WebDataset's
own `cache_dir`. Tools missing from the machine are installed (apt-get, pip) or the run stops.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers import (  # noqa: E402
    ROOT,
    Nginx,
    Shardcache,
    SimOrigin,
    cpu_between,
    cpu_snapshot,
    descendants,
    rss_bytes,
    self_signed,
)

MB = 1_000_000
MiB = 1 << 20
GiB = 1 << 30
START, END = "<!-- results:start -->", "<!-- results:end -->"


@dataclass
class Sizes:
    runs: int
    shard: int  # hit / miss / capped scenarios
    stream: int  # the RSS scenario, per stream
    small_stream: int  # the RSS scenario at a smaller size, to show it is flat
    wds_shards: int
    wds_payload: int  # bytes per sample payload
    wrk_seconds: int
    loader_shards: int = 96  # the eight-worker scenario
    loader_payload: int = 256 * 1024
    tier_shards: int = 24  # the six-node scenario: one dataset, read by every node
    tier_shard: int = 32 * MiB
    tier_nodes: int = 6
    tier_members: int = 3
    scaling_streams: int = 8  # the receiver-pool scenario: cold HTTPS shards at once
    scaling_shard: int = 128 * MiB  # per stream: 1 GiB a measurement at eight


FULL = Sizes(
    runs=3,
    shard=512 * MiB,
    stream=GiB,
    small_stream=256 * MiB,
    wds_shards=20,
    wds_payload=256 * 1024,
    wrk_seconds=5,
)
QUICK = Sizes(
    runs=1,
    shard=8 * MiB,
    stream=4 * MiB,
    small_stream=2 * MiB,
    wds_shards=3,
    wds_payload=16 * 1024,
    wrk_seconds=1,
    loader_shards=8,
    loader_payload=16 * 1024,
    tier_shards=6,
    tier_shard=MiB,
    tier_nodes=2,
    tier_members=2,
    scaling_shard=2 * MiB,
)


@dataclass
class Row:
    scenario: str
    measure: str
    shardcache: list[float]
    peer: list[float]
    peer_name: str
    bar: str
    command: str
    ratio: list[float] = field(default_factory=list)
    unit: str = ""
    is_met: bool | None = None
    note: str = ""


def median_range(values: list[float], digits: int = 2) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def ensure_tools() -> None:
    """Install the peers this machine lacks; fail loudly if that is impossible."""
    apt = [
        pkg
        for tool, pkg in (
            ("nginx", "nginx"),
            ("wrk", "wrk"),
            ("curl", "curl"),
            ("openssl", "openssl"),
            ("taskset", "util-linux"),
        )
        if not (shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists())
    ]
    if apt:
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", *apt], check=True, stdout=subprocess.DEVNULL
        )
    if not shutil.which("aws"):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "awscli"], check=True)
    import webdataset  # noqa: F401  (installed with the test extras)


class Fetched(NamedTuple):
    """One curl download as curl reports it, and curl's own CPU."""

    seconds: float
    size: int
    ttfb: float  # time to first byte
    cpu: float  # curl's user + system seconds


def curl(url: str, *extra: str, output: str = "/dev/null") -> Fetched:
    """Run curl as a loader does. Its CPU comes from `os.wait4` on its own pid rather than a
    RUSAGE_CHILDREN delta, which would also take in any other child reaped meanwhile (the
    concurrent curls of the pair and scaling scenarios, a stopped daemon)."""
    argv = [
        "curl",
        "-s",
        "-f",
        "-o",
        output,
        "-w",
        "%{time_total} %{size_download} %{time_starttransfer}",
        *extra,
        url,
    ]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        # Both pipes read in turn, not with communicate(), which would reap curl before
        # wait4 could: with -s, curl writes nothing to stderr that could fill its pipe.
        out, err = process.stdout.read(), process.stderr.read()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, argv, out, err)
    seconds, size, ttfb = out.decode().split()
    return Fetched(float(seconds), int(size), float(ttfb), usage.ru_utime + usage.ru_stime)


def gbps(size: int, seconds: float) -> float:
    return size / seconds / 1e9


def settle_disk(rewarm: tuple[Path, ...] = ()) -> None:
    """Before a timed miss: flush dirty pages and drop the page cache, then read `rewarm`
    (an origin's files) back in.

    On these VMs a page cache growing into guest memory never touched before costs the writer
    up to 5x the system time (measured: 0.45 s of sys per 512 MiB miss on recycled memory, 2.3 s
    once the cache grows into fresh memory), so without this every run would pay for the
    previous runs' cached bytes, and the disk (0.37 GB/s synced) for their writeback.
    """
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")
    for path in rewarm:
        with path.open("rb") as stream:
            while stream.read(8 << 20):
                pass


@dataclass
class Transfer:
    """One timed download: GB/s, and the CPU seconds per GB of each process on its path."""

    rate: float
    server: float  # the serving processes themselves (the daemon; nginx's master and workers)
    below: float  # their descendants (the daemon's receivers), live or exited meanwhile
    origin: float  # the origin's processes, when they are not the server's own
    client: float  # curl

    @property
    def served(self) -> float:
        """All of the server's processes: what a host gives to serving, receivers included."""
        return self.server + self.below


def timed_transfer(
    url: str,
    size: int,
    pids: list[int],
    rewarm: tuple[Path, ...] | None = (),
    *curl_args: str,
    origin: list[int] | None = None,
) -> Transfer:
    """One curl download of `url`: GB/s, CPU per GB of `pids` and (apart) of their
    descendants, of `origin`'s processes (with theirs), and of curl. The page cache is settled
    first (rewarming `rewarm`) unless `rewarm` is None (hits: keep it warm). The descendants
    are found at both ends of the transfer, so a receiver spawned or gone meanwhile counts."""
    if rewarm is not None:
        settle_disk(rewarm)
    server_before, origin_before = cpu_snapshot(pids), cpu_snapshot(origin or [])
    fetched = curl(url, *curl_args)
    server_after, origin_after = cpu_snapshot(pids), cpu_snapshot(origin or [])
    if fetched.size != size:
        raise RuntimeError(f"{url}: {fetched.size} bytes, expected {size}")
    gb = size / 1e9
    server, below = cpu_between(server_before, server_after)
    return Transfer(
        gbps(size, fetched.seconds),
        server / gb,
        below / gb,
        sum(cpu_between(origin_before, origin_after)) / gb,
        fetched.cpu / gb,
    )


def pin_tree(pid: int, cpus: str) -> int:
    """Pin `pid` and every process below it, all their threads (`taskset -a -p -c CPUS`), and
    return how many processes were pinned. Pinning only the daemon's pid would leave its
    receivers on every core; children spawned later inherit the affinity of the thread that
    spawns them, so re-pinning right before each measurement covers those too."""
    pinned = 0
    for target in [pid, *descendants(pid)]:
        done = subprocess.run(
            ["taskset", "-a", "-p", "-c", cpus, str(target)], capture_output=True, text=True
        )
        if done.returncode == 0:
            pinned += 1
        elif target == pid or Path(f"/proc/{target}").exists():  # a descendant may just exit
            raise RuntimeError(f"taskset -a -p -c {cpus} {target}: {done.stderr.strip()}")
    return pinned


WARM_BYTES = MiB  # the warming request's file: a small, real fill


def warm_receivers(url: str) -> None:
    """One small cold request through the daemon (`url`, a tiny file at the origin about to be
    measured), so that a receiver pool spawned on first use exists before a measurement:
    its start-up otherwise lands in the first run's CPU and time, and a pinning done before
    it would miss the receivers."""
    curl(url)


def by_process_rows(
    label: str, through: list[Transfer], direct: list[Transfer], how: str
) -> list[Row]:
    """The CPU of one cold miss, per process on its path, medians over runs: the daemon's
    serving process, its receivers, the two together, the origin's nginx workers, the client
    curl; the last two against the same processes when curl fetches straight from the origin,
    and the whole path's total in a note."""

    def ratio(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b, strict=True) if y]

    def row(measure: str, ours: list[float], peer: list[float], peer_name: str) -> Row:
        return Row(
            label,
            f"CPU s/GB: {measure}",
            ours,
            peer,
            peer_name,
            "report",
            how,
            ratio=ratio(ours, peer) if peer else [],
        )

    path_total = [t.served + t.origin + t.client for t in through]
    direct_total = [t.origin + t.client for t in direct]
    rows = [
        row("serving process (the daemon's pid)", [t.server for t in through], [], "-"),
        row("receivers (the daemon's descendants)", [t.below for t in through], [], "-"),
        row("all of the daemon's processes", [t.served for t in through], [], "-"),
        row(
            "nginx, the origin's workers",
            [t.origin for t in through],
            [t.origin for t in direct],
            "the origin's workers serving curl directly",
        ),
        row(
            "curl, the client",
            [t.client for t in through],
            [t.client for t in direct],
            "curl fetching directly from the origin",
        ),
    ]
    rows[-1].note = (
        f"all processes on the path, CPU s/GB: through shardcache {median_range(path_total)}, "
        f"curl directly from the origin {median_range(direct_total)}"
    )
    return rows


# -- scenarios ----------------------------------------------------------------------------

# How the "CPU per GB served" rows count: every process of the server, so that a daemon whose
# receivers run in child processes is not flattered by leaving them out.
SERVED_HOW = (
    "user+system time of the serving processes (shardcache: the daemon and its descendants; "
    "nginx: master and workers) over the transfers above"
)


def hit_and_miss(work: Path, sizes: Sizes) -> list[Row]:
    """Hit and unthrottled-miss throughput and CPU/GB, shardcache vs nginx proxy_cache; the
    origin is nginx's own static server, serving a file from the page cache. shardcache's CPU
    is its daemon's and the daemon's descendants' (receivers); the cold miss's CPU is also
    given per process, against curl fetching straight from the origin."""
    static = work / "static"
    static.mkdir()
    base = static / "base.tar"
    with base.open("wb") as out:
        out.write(os.urandom(sizes.shard))
    (static / "warm.bin").write_bytes(os.urandom(WARM_BYTES))
    for run in range(sizes.runs):
        for who in ("sc", "ng"):
            os.link(base, static / f"miss_{run}_{who}.tar")
    ceiling, hit_sc, hit_ng, miss_sc, miss_ng = [], [], [], [], []
    cpu_hit_sc, cpu_hit_ng, cpu_miss_sc, cpu_miss_ng = [], [], [], []
    through: list[Transfer] = []  # the daemon's cold misses
    direct: list[Transfer] = []  # curl straight from the origin, page cache settled the same
    nginx = Nginx(work, None, static)  # the proxy's origin is nginx's own static server
    try:
        daemon = Shardcache(work, {"o": nginx.static_url})
        try:
            ng_pids = nginx.worker_pids()
            warm_receivers(f"{daemon.url}/o/warm.bin")
            for run in range(sizes.runs):
                miss = timed_transfer(
                    f"{daemon.url}/o/miss_{run}_sc.tar",
                    sizes.shard,
                    [daemon.pid],
                    (base,),
                    origin=ng_pids,
                )
                through.append(miss)
                miss_sc.append(miss.rate)
                cpu_miss_sc.append(miss.served)
                miss = timed_transfer(
                    f"{nginx.proxy_url}/miss_{run}_ng.tar", sizes.shard, ng_pids, (base,)
                )
                miss_ng.append(miss.rate)
                cpu_miss_ng.append(miss.served)
                direct.append(
                    timed_transfer(
                        f"{nginx.static_url}/base.tar", sizes.shard, [], (base,), origin=ng_pids
                    )
                )
            for url in (f"{daemon.url}/o/miss_0_sc.tar", f"{nginx.proxy_url}/miss_0_ng.tar"):
                curl(url)  # hits, bringing both caches' files back into the page cache
            for _ in range(sizes.runs):  # the first keys again, now cached: hits
                hit = timed_transfer(
                    f"{daemon.url}/o/miss_0_sc.tar", sizes.shard, [daemon.pid], None
                )
                hit_sc.append(hit.rate)
                cpu_hit_sc.append(hit.served)
                hit = timed_transfer(f"{nginx.proxy_url}/miss_0_ng.tar", sizes.shard, ng_pids, None)
                hit_ng.append(hit.rate)
                cpu_hit_ng.append(hit.served)
                ceiling.append(
                    timed_transfer(f"{nginx.static_url}/base.tar", sizes.shard, ng_pids, None).rate
                )
        finally:
            daemon.stop()
    finally:
        nginx.stop()
    size = f"{sizes.shard // MiB} MiB"
    return [
        Row(
            "hit, one shard, curl",
            f"GB/s ({size})",
            hit_sc,
            hit_ng,
            "nginx proxy_cache hit",
            "≥ 0.9",
            "curl -s -f -o /dev/null http://127.0.0.1:PORT/o/shard.tar",
            ratio=[a / b for a, b in zip(hit_sc, hit_ng, strict=True)],
            note=f"nginx static file server (ceiling): {median_range(ceiling)} GB/s",
        ),
        Row(
            "miss, unthrottled loopback origin",
            f"GB/s ({size})",
            miss_sc,
            miss_ng,
            "nginx proxy_cache miss",
            "≥ 2",
            "curl -s -f -o /dev/null http://127.0.0.1:PORT/o/cold-shard.tar",
            ratio=[a / b for a, b in zip(miss_sc, miss_ng, strict=True)],
        ),
        Row(
            "CPU per GB served, hit",
            "CPU s/GB",
            cpu_hit_sc,
            cpu_hit_ng,
            "nginx",
            "report",
            SERVED_HOW,
            ratio=[a / b for a, b in zip(cpu_hit_sc, cpu_hit_ng, strict=True) if b],
        ),
        Row(
            "CPU per GB served, miss",
            "CPU s/GB",
            cpu_miss_sc,
            cpu_miss_ng,
            "nginx",
            "report",
            SERVED_HOW,
            ratio=[a / b for a, b in zip(cpu_miss_sc, cpu_miss_ng, strict=True) if b],
        ),
        *by_process_rows(
            "CPU per GB, cold plain HTTP miss, by process",
            through,
            direct,
            "user+system time per process over the misses above, from /proc (curl: wait4)",
        ),
    ]


def tls_miss(work: Path, sizes: Sizes) -> list[Row]:
    """Cold misses from an HTTPS origin: nginx serving a file over TLS 1.3 from the page cache,
    with a certificate made here and trusted by each client (shardcache: SSL_CERT_FILE; nginx:
    proxy_ssl_trusted_certificate; curl: --cacert). shardcache vs nginx proxy_cache (HTTPS
    upstream) vs direct curl, CPU per GB of the serving processes (shardcache's daemon with its
    descendants, and per process against direct curl), and two cold shards at once (HTTPS, then
    plain HTTP from the same nginx) with the daemon and its descendants pinned to one core,
    then two."""
    static = work / "static"
    static.mkdir()
    base = static / "base.tar"
    with base.open("wb") as out:
        out.write(os.urandom(sizes.shard))
    warm = static / "warm.bin"
    warm.write_bytes(os.urandom(WARM_BYTES))
    names = [f"tls_{run}_{who}.tar" for run in range(sizes.runs) for who in ("sc", "ng")]
    names += [
        f"pair_{scheme}_{run}_{cores}_{i}.tar"
        for scheme in ("tls", "plain")
        for run in range(sizes.runs)
        for cores in (1, 2)
        for i in (0, 1)
    ]
    for name in names:
        os.link(base, static / name)
    for scheme in ("tls", "plain"):  # each pair measurement warms with its own cold small file
        for run in range(sizes.runs):
            for cores in (1, 2):
                os.link(warm, static / f"warm_{scheme}_{run}_{cores}.bin")
    cert, key = self_signed(work)
    nginx = Nginx(work, None, static, tls=(cert, key))
    daemon = Shardcache(
        work, {"o": nginx.tls_url, "p": nginx.static_url}, env={"SSL_CERT_FILE": str(cert)}
    )
    sc, ng, direct, cpu_sc, cpu_ng = [], [], [], [], []
    through: list[Transfer] = []  # the daemon's cold misses
    straight: list[Transfer] = []  # curl --cacert straight from the origin
    pair: dict[tuple[str, int], list[float]] = {
        (scheme, cores): [] for scheme in ("o", "p") for cores in (1, 2)
    }
    pinned: list[int] = []  # processes pinned per pair measurement: the daemon and receivers
    try:
        ng_pids = nginx.worker_pids()
        warm_receivers(f"{daemon.url}/o/warm.bin")
        for run in range(sizes.runs):
            miss = timed_transfer(
                f"{daemon.url}/o/tls_{run}_sc.tar",
                sizes.shard,
                [daemon.pid],
                (base,),
                origin=ng_pids,
            )
            through.append(miss)
            sc.append(miss.rate)
            cpu_sc.append(miss.served)
            miss = timed_transfer(
                f"{nginx.proxy_url}/tls_{run}_ng.tar", sizes.shard, ng_pids, (base,)
            )
            ng.append(miss.rate)
            cpu_ng.append(miss.served)
            miss = timed_transfer(
                f"{nginx.tls_url}/base.tar",
                sizes.shard,
                [],
                (base,),
                "--cacert",
                str(cert),
                origin=ng_pids,
            )
            straight.append(miss)
            direct.append(miss.rate)
            for (origin, cores), rates in pair.items():
                scheme = "tls" if origin == "o" else "plain"
                warm_receivers(f"{daemon.url}/{origin}/warm_{scheme}_{run}_{cores}.bin")
                settle_disk((base,))
                pinned.append(pin_tree(daemon.pid, "0" if cores == 1 else "0,1"))
                urls = [
                    f"{daemon.url}/{origin}/pair_{scheme}_{run}_{cores}_{i}.tar" for i in (0, 1)
                ]
                started = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    received = list(pool.map(lambda url: curl(url)[1], urls))
                if received != [sizes.shard] * 2:
                    raise RuntimeError(f"two cold shards: received {received}")
                rates.append(gbps(2 * sizes.shard, time.perf_counter() - started))
    finally:
        daemon.stop()
        nginx.stop()
    size = f"{sizes.shard // MiB} MiB"
    how = "curl -s -f -o /dev/null http://127.0.0.1:PORT/o/cold-shard.tar (origin https://)"
    return [
        Row(
            "miss, HTTPS origin (TLS 1.3, page cache)",
            f"GB/s ({size})",
            sc,
            ng,
            "nginx proxy_cache miss (HTTPS upstream)",
            "≥ 1.5",
            how,
            ratio=[a / b for a, b in zip(sc, ng, strict=True)],
        ),
        Row(
            "miss, HTTPS origin (TLS 1.3, page cache)",
            f"GB/s ({size})",
            sc,
            direct,
            "direct curl --cacert, one connection",
            "≥ 0.9",
            how,
            ratio=[a / b for a, b in zip(sc, direct, strict=True)],
        ),
        Row(
            "CPU per GB served, HTTPS miss",
            "CPU s/GB",
            cpu_sc,
            cpu_ng,
            "nginx",
            "report",
            SERVED_HOW,
            ratio=[a / b for a, b in zip(cpu_sc, cpu_ng, strict=True) if b],
        ),
        *by_process_rows(
            "CPU per GB, cold HTTPS miss, by process",
            through,
            straight,
            "user+system time per process over the misses above, from /proc (curl: wait4)",
        ),
    ] + [
        Row(
            f"two cold {label} shards at once, daemon given two cores vs one",
            f"GB/s in all (2 × {size})",
            pair[origin, 2],
            pair[origin, 1],
            "the daemon pinned to one core (taskset)",
            "report",
            "two curl -s -f at once; a small cold fetch first, then taskset -a -p -c 0 (or "
            "0,1) on DAEMON_PID and each of its descendants",
            ratio=[a / b for a, b in zip(pair[origin, 2], pair[origin, 1], strict=True)],
            note=f"processes pinned per measurement (daemon + descendants): {sorted(set(pinned))}"
            if origin == "p"
            else "",
        )
        for origin, label in (("o", "HTTPS"), ("p", "plain HTTP"))
    ]


def capped_miss(work: Path, sizes: Sizes) -> list[Row]:
    """A cold shard from an origin capped at 100 MB/s per connection with 30 ms to first byte:
    shardcache (parallel ranged segments) vs direct curl (one connection)."""
    origin = SimOrigin(work, ttfb_ms=30, conn_rate=100 * MB)
    daemon = Shardcache(work, {"o": origin.url})
    sc, direct = [], []
    try:
        for run in range(sizes.runs):
            key = f"b/size-{sizes.shard}/capped_{run}"
            settle_disk()
            sc.append(gbps(sizes.shard, curl(f"{daemon.url}/o/{key}.sc")[0]))
            direct.append(gbps(sizes.shard, curl(f"{origin.url}/{key}.direct")[0]))
    finally:
        daemon.stop()
        origin.stop()
    return [
        Row(
            "cold miss, origin capped 100 MB/s per connection, 30 ms first byte",
            f"GB/s ({sizes.shard // MiB} MiB)",
            sc,
            direct,
            "direct curl",
            "≥ 4",
            "curl -s -f -o /dev/null http://127.0.0.1:PORT/o/shard.tar",
            ratio=[a / b for a, b in zip(sc, direct, strict=True)],
        )
    ]


def s3_miss(work: Path, sizes: Sizes) -> list[Row]:
    """S3 GetObject path: shardcache's S3 origin vs `aws s3 cp s3://… -`, same capped origin."""
    origin = SimOrigin(work, ttfb_ms=30, conn_rate=100 * MB)
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": origin.url,
    }
    daemon = Shardcache(work, {"s3": "s3://bench"}, env=env)
    sc, aws = [], []
    try:
        for run in range(sizes.runs):
            key = f"size-{sizes.shard}/s3_{run}"
            settle_disk()
            sc.append(gbps(sizes.shard, curl(f"{daemon.url}/s3/{key}.sc")[0]))
            began = time.monotonic()
            with open(os.devnull, "wb") as sink:
                subprocess.run(
                    ["aws", "s3", "cp", f"s3://bench/{key}.aws", "-"],
                    stdout=sink,
                    check=True,
                    env={**os.environ, **env},
                )
            aws.append(gbps(sizes.shard, time.monotonic() - began))
    finally:
        daemon.stop()
        origin.stop()
    return [
        Row(
            "S3 miss from the simulated S3 origin, 100 MB/s per connection",
            f"GB/s ({sizes.shard // MiB} MiB)",
            sc,
            aws,
            "aws s3 cp … -",
            "≥ 2",
            "curl … http://127.0.0.1:PORT/s3/KEY  vs  aws s3 cp s3://bench/KEY - >/dev/null",
            ratio=[a / b for a, b in zip(sc, aws, strict=True)],
        )
    ]


def late_joiners(work: Path, sizes: Sizes) -> list[Row]:
    """Four clients ask for one cold shard 0.5 s apart: time to first byte of the later three
    over the first's, and how many bytes the origin sent (each byte once is the bar)."""
    origin = SimOrigin(work, ttfb_ms=30, conn_rate=100 * MB)
    static = work / "late-static"
    static.mkdir()
    nginx = Nginx(work, origin.url, static)
    daemon = Shardcache(work, {"o": origin.url})
    sc_extra, ng_extra, fetched = [], [], []
    try:
        for run in range(sizes.runs):
            for who, base in (("sc", f"{daemon.url}/o"), ("ng", nginx.proxy_url)):
                key = f"b/size-{sizes.shard}/late_{run}.{who}"
                settle_disk()
                ttfbs: list[float] = [0.0] * 4

                def client(n: int, url: str = f"{base}/{key}", out: list[float] = ttfbs) -> None:
                    out[n] = curl(url)[2]

                threads = []
                for n in range(4):
                    thread = threading.Thread(target=client, args=(n,))
                    thread.start()
                    threads.append(thread)
                    time.sleep(0.5)
                for thread in threads:
                    thread.join()
                extra = max(ttfbs[1:]) - ttfbs[0]
                (sc_extra if who == "sc" else ng_extra).append(extra * 1000)
                if who == "sc":
                    stats = origin.stats()["by_key"]
                    fetched.append(stats[key][1] / sizes.shard)  # type: ignore[index]
    finally:
        daemon.stop()
        nginx.stop()
        origin.stop()
    return [
        Row(
            "4 clients ask for one cold shard, 0.5 s apart, capped origin",
            "later clients' extra time to first byte (ms)",
            sc_extra,
            ng_extra,
            "nginx proxy_cache_lock",
            "≤ 50 ms; each byte fetched once",
            "4 × curl started 0.5 s apart",
            is_met=(statistics.median(sc_extra) <= 50 and all(f == 1.0 for f in fetched)),
            note=f"origin bytes / shard size for shardcache: {fetched}",
        )
    ]


def small_objects(work: Path, sizes: Sizes) -> list[Row]:
    """64 KiB hits over 32 connections with wrk: requests/s and p99 latency."""
    origin = SimOrigin(work)
    static = work / "small-static"
    static.mkdir()
    nginx = Nginx(work, origin.url, static)
    daemon = Shardcache(work, {"o": origin.url})
    rps_sc, rps_ng, p99_sc, p99_ng = [], [], [], []
    try:
        key = f"b/size-{64 * 1024}/small"
        for url in (f"{daemon.url}/o/{key}", f"{nginx.proxy_url}/{key}"):
            curl(url)  # warm
        for _ in range(sizes.runs):
            for url, rps, p99 in (
                (f"{daemon.url}/o/{key}", rps_sc, p99_sc),
                (f"{nginx.proxy_url}/{key}", rps_ng, p99_ng),
            ):
                result = subprocess.run(
                    ["wrk", "-t2", "-c32", f"-d{sizes.wrk_seconds}s", "--latency", url],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                rps.append(float(re.search(r"Requests/sec:\s+([\d.]+)", result).group(1)))  # type: ignore[union-attr]
                p99.append(_wrk_ms(re.search(r"99%\s+([\d.]+\w+)", result).group(1)))  # type: ignore[union-attr]
    finally:
        daemon.stop()
        nginx.stop()
        origin.stop()
    return [
        Row(
            "64 KiB objects, 32 connections (wrk), hits",
            "requests/s",
            rps_sc,
            rps_ng,
            "nginx",
            "≥ 0.2",  # issue 36
            "wrk -t2 -c32 -d5s --latency URL",
            ratio=[a / b for a, b in zip(rps_sc, rps_ng, strict=True)],
        ),
        Row(
            "64 KiB objects, 32 connections (wrk), hits",
            "p99 latency (ms)",
            p99_sc,
            p99_ng,
            "nginx",
            "report",
            "wrk -t2 -c32 -d5s --latency URL",
        ),
    ]


def _wrk_ms(text: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1, "s": 1000}[unit]


def memory(work: Path, sizes: Sizes) -> list[Row]:
    """Peak RSS of the daemon while 16 clients stream shards at once, misses then hits, at two
    shard sizes (flat means the data path holds no shard in memory)."""
    origin = SimOrigin(work)
    rows = []
    peaks: dict[int, list[float]] = {}
    serving_peaks: dict[int, list[float]] = {}
    try:
        for size in (sizes.small_stream, sizes.stream):
            daemon = Shardcache(work, {"o": origin.url})
            try:
                peaks[size] = []
                settle_disk()
                for _phase in ("miss", "hit"):  # the same keys twice
                    peak = [_group_rss(daemon.pid)]
                    serving_peak = [rss_bytes(daemon.pid)]
                    stop = threading.Event()

                    def sample(
                        pid: int = daemon.pid,
                        out: list[int] = peak,
                        serving: list[int] = serving_peak,
                        done: threading.Event = stop,
                    ) -> None:
                        while not done.is_set():
                            out.append(_group_rss(pid))
                            serving.append(rss_bytes(pid))
                            time.sleep(0.02)

                    sampler = threading.Thread(target=sample)
                    sampler.start()
                    threads = [
                        threading.Thread(
                            target=curl, args=(f"{daemon.url}/o/b/size-{size}/stream_{n}",)
                        )
                        for n in range(16)
                    ]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                    stop.set()
                    sampler.join()
                    peaks[size].append(max(peak) / MiB)
                    serving_peaks.setdefault(size, []).append(max(serving_peak) / MiB)
            finally:
                daemon.stop()
    finally:
        origin.stop()
    small, large = peaks[sizes.small_stream], peaks[sizes.stream]
    rows.append(
        Row(
            "16 concurrent streams, misses then hits",
            f"peak RSS MiB at {sizes.stream // MiB} MiB shards [miss, hit]",
            large,
            small,
            f"shardcache at {sizes.small_stream // MiB} MiB shards",
            "≤ 150 MiB, flat as shard size grows",
            "16 × curl at once; the daemon's RSS plus its receiving processes' PSS",
            is_met=max(large) <= 150 and max(large) <= max(small) * 1.25 + 8,
            note="the serving process alone, peak RSS MiB [miss, hit]: "
            + ", ".join(f"{v:.0f}" for v in serving_peaks[sizes.stream]),
        )
    )
    return rows


def _group_rss(pid: int) -> int:
    """What `pid` and every process below it (the receiving processes) cost the machine: the
    serving process's RSS plus each receiver's PSS (proportional set size), in which the pages
    they share with the daemon (the interpreter, libraries: ~20 MiB each) count once in all,
    not once per process as a sum of RSS would."""
    total = rss_bytes(pid)
    for child in descendants(pid):
        try:
            rollup = Path(f"/proc/{child}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def webdataset_epoch(work: Path, sizes: Sizes) -> list[Row]:
    """A WebDataset epoch over shards from the capped origin, decoding at a fixed rate: how long
    the loader waited for bytes, by the loader's own clock and the daemon's client-wait figure."""
    import webdataset as wds

    from shardcache.loader.sample import write_sample_shards
    from shardcache.loader.webdataset import prefetch_ahead

    files = work / "wds"
    samples = 32
    write_sample_shards(
        files, shards=sizes.wds_shards, samples_per_shard=samples, payload_bytes=sizes.wds_payload
    )
    shard_bytes = (files / "shards_000.tar").stat().st_size
    # Decoding consumes a shard at 250 MB/s: faster than one 100 MB/s connection can deliver.
    per_sample_s = shard_bytes / (250 * MB) / samples
    origin = SimOrigin(work, ttfb_ms=30, conn_rate=100 * MB, files=files)
    last = sizes.wds_shards - 1

    def epoch(url: str, stages: list[object] | None = None, **kwargs: object) -> float:
        """Return the seconds the loader waited (epoch time minus decode time)."""
        began = time.monotonic()
        if stages is None:
            dataset = wds.WebDataset(url, shardshuffle=False, **kwargs)
        else:
            dataset = wds.DataPipeline(wds.SimpleShardList(url), *stages, wds.tarfile_to_samples())
        count = 0
        for _ in dataset:
            time.sleep(per_sample_s)
            count += 1
        assert count == samples * sizes.wds_shards, count
        return time.monotonic() - began - count * per_sample_s

    pattern = f"shards_{{000..{last:03d}}}.tar"
    result: dict[str, list[float]] = {
        k: []
        for k in (
            "direct",
            "cold",
            "cold_daemon",
            "warm",
            "warm_daemon",
            "cache_dir_cold",
            "cache_dir_warm",
        )
    }
    try:
        for run in range(sizes.runs):
            settle_disk(tuple(files.iterdir()))
            result["direct"].append(epoch(f"pipe:curl -s -f {origin.url}/b/files/{pattern}"))
            daemon = Shardcache(work, {"o": f"{origin.url}/b"})
            try:
                url = f"pipe:curl -s -f {daemon.url}/o/files/{pattern}"
                result["cold"].append(epoch(url, [prefetch_ahead(4, daemon=daemon.url)]))
                result["cold_daemon"].append(_client_wait(daemon.url))
                result["warm"].append(epoch(url))
                result["warm_daemon"].append(_client_wait(daemon.url) - result["cold_daemon"][-1])
            finally:
                daemon.stop()
            cache_dir = work / f"wds-cache-{run}"
            cache_dir.mkdir()
            direct = f"pipe:curl -s -f {origin.url}/b/files/{pattern}"
            result["cache_dir_cold"].append(epoch(direct, cache_dir=str(cache_dir)))
            result["cache_dir_warm"].append(epoch(direct, cache_dir=str(cache_dir)))
    finally:
        origin.stop()
    # The loader's clock counts its own per-shard costs too (a curl process, tar parsing):
    # the warm epoch, whose bytes are all on local disk (the daemon counted no waiting), gives
    # that overhead; each epoch's waiting for bytes is its time beyond it.
    overhead = result["warm"]

    def waiting(raw: list[float]) -> list[float]:
        return [max(0.0, r - o) for r, o in zip(raw, overhead, strict=True)]

    cold, direct = waiting(result["cold"]), waiting(result["direct"])
    return [
        Row(
            f"WebDataset epoch, {sizes.wds_shards} shards of {shard_bytes // MiB} MiB, "
            "capped origin, decoding at 250 MB/s",
            "loader wait for bytes (s): cold shardcache + prefetch_ahead vs direct",
            cold,
            direct,
            "direct pipe:curl",
            "cold with prefetch ≤ 10% of direct; warm ≈ 0",
            "wds.DataPipeline(SimpleShardList(pipe:curl …), prefetch_ahead(4), "
            "tarfile_to_samples())",
            ratio=[a / b for a, b in zip(cold, direct, strict=True) if b],
            is_met=statistics.median(cold) <= 0.1 * statistics.median(direct)
            and statistics.median(result["warm_daemon"]) <= 0.05,
            note=(
                f"raw loader clock beyond decoding: direct {median_range(result['direct'])} s, "
                f"shardcache cold {median_range(result['cold'])} s, warm "
                f"{median_range(result['warm'])} s (= the loader's own overhead); daemon's "
                f"client-wait: cold {median_range(result['cold_daemon'])} s, warm "
                f"{median_range(result['warm_daemon'])} s; WebDataset cache_dir (raw): cold "
                f"{median_range(result['cache_dir_cold'])} s, warm "
                f"{median_range(result['cache_dir_warm'])} s"
            ),
        )
    ]


# -- eight loader workers, consumed in DataLoader order (issue 13) ----------------------------

WORKERS = 8
LOADER_BATCH = 4  # samples per batch a worker hands over
LOADER_PREFETCH_FACTOR = 2  # batches a worker may have ready (the DataLoader default)


def _loader_worker(
    number: int,
    urls: list[str],
    daemon: str | None,
    out: Any,
    start: Any,
) -> None:
    """One DataLoader worker: the real WebDataset pipeline over its split of the shards (with
    `prefetch_ahead(4)` when `daemon` is given), handing over batches through a bounded queue.
    Only sample counts cross the queue: the consumer's clock must not include pickling."""
    import webdataset as wds

    from shardcache.loader.webdataset import prefetch_ahead

    stages: list[Any] = [wds.SimpleShardList(urls[number::WORKERS])]
    if daemon is not None:
        stages.append(prefetch_ahead(4, daemon=daemon))
    stages.append(wds.tarfile_to_samples())
    pipeline = wds.DataPipeline(*stages)
    out.put("ready")
    start.wait()
    batch = 0
    for _ in pipeline:
        batch += 1
        if batch == LOADER_BATCH:
            out.put(batch)
            batch = 0
    if batch:
        out.put(batch)
    out.put(None)


def _loader_epoch(urls: list[str], per_sample_s: float, daemon: str | None) -> tuple[float, float]:
    """Run eight workers and a consumer that takes their batches in turn, as a DataLoader does,
    spending `per_sample_s` per sample; return (seconds the consumer waited, wall seconds)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queues = [context.Queue(maxsize=LOADER_PREFETCH_FACTOR) for _ in range(WORKERS)]
    start = context.Event()
    workers = [
        context.Process(target=_loader_worker, args=(n, urls, daemon, queues[n], start))
        for n in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    try:
        for queue in queues:
            if queue.get(timeout=120) != "ready":
                raise RuntimeError("a loader worker did not start")
        began = time.monotonic()
        start.set()
        waited, active = 0.0, list(range(WORKERS))
        while active:
            for n in list(active):
                asked = time.monotonic()
                item = queues[n].get(timeout=300)
                waited += time.monotonic() - asked
                if item is None:
                    active.remove(n)
                    continue
                time.sleep(item * per_sample_s)  # the training step
        return waited, time.monotonic() - began
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()


def multi_worker_epoch(work: Path, sizes: Sizes) -> list[Row]:
    """Eight WebDataset workers in DataLoader order against an origin capped per connection
    (4 MB/s, 50 ms to first byte, 200 MB/s in all), a consumer eating 48 MB/s: more than eight
    plain connections deliver, less than the origin can. Direct curl, shardcache cold without
    and with `prefetch_ahead(4)`, and warm; with `--origin-connections 1` and the default."""
    from shardcache.loader.sample import write_sample_shards

    files = work / "wds"
    shards, samples, payload = sizes.loader_shards, 16, sizes.loader_payload
    write_sample_shards(files, shards=shards, samples_per_shard=samples, payload_bytes=payload)
    shard_bytes = (files / "shards_000.tar").stat().st_size
    per_sample_s = shard_bytes / samples / (48 * MB)
    origin = SimOrigin(work, ttfb_ms=50, conn_rate=4 * MB, total_rate=200 * MB, files=files)
    names = [f"shards_{n:03d}.tar" for n in range(shards)]
    arms = ("cold", "cold_stage", "warm")
    result: dict[str, list[tuple[float, float, float]]] = {}  # (waited, wall, daemon stall)

    def record(name: str, waited: float, wall: float, stall: float) -> None:
        result.setdefault(name, []).append((waited, wall, stall))

    try:
        for _ in range(sizes.runs):
            waited, wall = _loader_epoch(
                [f"pipe:curl -s -f {origin.url}/b/files/{name}" for name in names],
                per_sample_s,
                None,
            )
            record("direct", waited, wall, float("nan"))
            for connections in ("1", "8"):
                for arm in arms:
                    if arm == "warm":
                        continue  # run right after cold, on its cache
                    daemon = Shardcache(
                        work, {"o": f"{origin.url}/b"}, "--origin-connections", connections
                    )
                    try:
                        urls = [f"pipe:curl -s -f {daemon.url}/o/files/{name}" for name in names]
                        stage = daemon.url if arm == "cold_stage" else None
                        record(
                            f"{arm}/{connections}",
                            *_measured(daemon.url, urls, per_sample_s, stage),
                        )
                        if arm == "cold":
                            record(
                                f"warm/{connections}",
                                *_measured(daemon.url, urls, per_sample_s, None),
                            )
                    finally:
                        daemon.stop()
    finally:
        origin.stop()

    def column(name: str, index: int) -> list[float]:
        return [run[index] for run in result[name]]

    def median(name: str, index: int = 0) -> float:
        return statistics.median(column(name, index))

    direct = column("direct", 0)
    consumer_s = shards * samples * per_sample_s
    label = (
        f"{WORKERS} WebDataset workers in DataLoader order, {shards} shards of "
        f"{shard_bytes / MiB:.1f} MiB, origin 4 MB/s per connection (200 MB/s in all), "
        f"consumer 48 MB/s ({consumer_s:.1f} s of steps)"
    )
    rows = []
    for connections, bar_cold in (("1", "≤ 1.0 (no slower than direct)"), ("8", "-")):
        cold, staged = column(f"cold/{connections}", 0), column(f"cold_stage/{connections}", 0)
        rows.append(
            Row(
                label,
                f"loader wait (s), cold, no stage, --origin-connections {connections}",
                cold,
                direct,
                "direct pipe:curl",
                bar_cold,
                "8 worker processes: SimpleShardList(pipe:curl …)[i::8] → tarfile_to_samples()",
                ratio=[a / b for a, b in zip(cold, direct, strict=True) if b],
                is_met=median(f"cold/{connections}") <= statistics.median(direct)
                if connections == "1"
                else None,
            )
        )
        bar = "≤ 0.25 of direct" if connections == "1" else "≤ 0.5 of cold without the stage"
        base = direct if connections == "1" else cold
        rows.append(
            Row(
                label,
                f"loader wait (s), cold, prefetch_ahead(4), --origin-connections {connections}",
                staged,
                base,
                "direct pipe:curl" if connections == "1" else "cold, no stage",
                bar,
                "… → prefetch_ahead(4) → tarfile_to_samples()",
                ratio=[a / b for a, b in zip(staged, base, strict=True) if b],
                is_met=statistics.median(staged)
                <= (0.25 if connections == "1" else 0.5) * statistics.median(base),
            )
        )
    notes = []
    for name in ("direct", "cold/1", "cold_stage/1", "warm/1", "cold/8", "cold_stage/8", "warm/8"):
        waited, wall = median(name, 0), median(name, 1)
        stall = "" if name == "direct" else f", daemon loader stall {median(name, 2):.2f} s"
        notes.append(f"{name}: wait {median_range(column(name, 0))} s, wall {wall:.2f} s{stall}")
    rows[-1].note = (
        "per arm (medians; name/connections): "
        + "; ".join(notes)
        + f"; consumer steps alone {consumer_s:.2f} s"
    )
    return rows


def _measured(
    daemon_url: str, urls: list[str], per_sample_s: float, stage: str | None
) -> tuple[float, float, float]:
    """One epoch through a daemon: (consumer wait, wall, the daemon's loader-stall figure)."""
    before = _loader_stall(daemon_url)
    waited, wall = _loader_epoch(urls, per_sample_s, stage)
    return waited, wall, _loader_stall(daemon_url) - before


def _loader_stall(daemon_url: str) -> float:
    with urllib.request.urlopen(daemon_url + "/_/status", timeout=10) as response:
        return float(json.loads(response.read())["loader_stall_s"])


def _client_wait(daemon_url: str) -> float:
    with urllib.request.urlopen(daemon_url + "/_/status", timeout=10) as response:
        return float(json.loads(response.read())["client_wait_s"])


def _nodes_read(base_urls: list[str], keys: list[str]) -> float:
    """Each node reads every key with curl, in its own shuffled order, all nodes at once;
    return the wall time until the last node is done. Raises if any read fails."""
    failures: list[str] = []

    def node(number: int, base: str) -> None:
        order = random.Random(number).sample(keys, len(keys))
        for key in order:
            process = subprocess.run(
                ["curl", "-s", "-f", "-o", "/dev/null", f"{base}/{key}"], capture_output=True
            )
            if process.returncode != 0:
                failures.append(f"node {number} {key}: curl exit {process.returncode}")

    threads = [threading.Thread(target=node, args=(n, base)) for n, base in enumerate(base_urls)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} reads failed: {failures[:3]}")
    return time.perf_counter() - started


def six_nodes_over_a_tier(work: Path, sizes: Sizes) -> list[Row]:
    """Six nodes read one dataset, each in its own order, from an origin capped at 200 MB/s in
    all (50 MB/s per connection, 20 ms to first byte): directly (curl), and through node
    daemons over a sharded tier of three members (two and two in quick mode). Origin bytes
    and the loaders' wall time."""
    origin = SimOrigin(work, ttfb_ms=20, conn_rate=50 * MB, total_rate=200 * MB)
    keys = [f"size-{sizes.tier_shard}/tier_{i:03d}.tar" for i in range(sizes.tier_shards)]
    dataset = sizes.tier_shard * len(keys)
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "node": [], "tier": []}

    def origin_bytes() -> float:
        return float(origin.stats()["bytes"])  # type: ignore[arg-type]

    def measure(arm: str, bases: list[str]) -> None:
        before = origin_bytes()
        wall = _nodes_read(bases, keys)
        results[arm].append((wall, origin_bytes() - before))

    try:
        for _ in range(sizes.runs):
            measure("direct", [f"{origin.url}/b"] * sizes.tier_nodes)
            nodes = [Shardcache(work, {"o": f"{origin.url}/b"}) for _ in range(sizes.tier_nodes)]
            try:
                measure("node", [f"{n.url}/o" for n in nodes])
            finally:
                for daemon in nodes:
                    daemon.stop()
            tier = [Shardcache(work, {"o": f"{origin.url}/b"}) for _ in range(sizes.tier_members)]
            config = work / "node.toml"
            members = ", ".join(f'"{t.url}"' for t in tier)
            config.write_text(f'[origins.o]\nurl = "{origin.url}/b"\ntier = [{members}]\n')
            nodes = [Shardcache(work, {}, "--config", str(config)) for _ in range(sizes.tier_nodes)]
            try:
                measure("tier", [f"{n.url}/o" for n in nodes])
            finally:
                for daemon in [*nodes, *tier]:
                    daemon.stop()
    finally:
        origin.stop()

    def column(arm: str, index: int) -> list[float]:
        return [run[index] for run in results[arm]]

    label = (
        f"{sizes.tier_nodes} nodes read the same {len(keys)} shards of "
        f"{sizes.tier_shard / MiB:.0f} MiB ({dataset / MB:.0f} MB), each in its own order; "
        "origin 200 MB/s in all"
    )
    rows = []
    for arm, name in (
        ("tier", f"node daemons over a {sizes.tier_members}-member tier"),
        ("node", "node daemons straight to the origin"),
    ):
        rows.append(
            Row(
                label,
                f"origin bytes, MB ({name})",
                [b / MB for b in column(arm, 1)],
                [b / MB for b in column("direct", 1)],
                "direct curl",
                "-",
                "curl -s -f http://NODE:PORT/o/KEY on every node; nodes: tier = [3 members]"
                if arm == "tier"
                else "curl -s -f http://NODE:PORT/o/KEY on every node",
                ratio=[a / b for a, b in zip(column(arm, 1), column("direct", 1), strict=True)],
                note=""
                if arm == "node"
                else (
                    f"the tier's origin bytes against the dataset's {dataset / MB:.0f} MB: "
                    f"{median_range([b / dataset for b in column(arm, 1)])}x"
                ),
            )
        )
        rows.append(
            Row(
                label,
                f"loaders' wall time, s ({name})",
                column(arm, 0),
                column("direct", 0),
                "direct curl",
                "-",
                "time until the last node has read every shard",
                ratio=[a / b for a, b in zip(column(arm, 0), column("direct", 0), strict=True)],
            )
        )
    return rows


RECEIVER_COUNTS = (1, 2, 4, 8)


def require_receivers() -> None:
    """Stop at once, saying why, when this tree's daemon has no `serve --receivers` (the
    receiver pool is not in it yet): otherwise the scaling scenario would fail only when its
    first daemon refused the option, after any scenarios run before it."""
    done = subprocess.run(
        [sys.executable, "-m", "shardcache", "serve", "--help"], capture_output=True, text=True
    )
    if "--receivers" not in done.stdout:
        raise SystemExit(
            "the scaling scenario starts daemons with `shardcache serve --receivers R`, and "
            f"this shardcache ({sys.executable} -m shardcache, from {Path.cwd()}) has no such "
            "option: run it on a tree with the receiver pool"
        )


def receiver_scaling(work: Path, sizes: Sizes) -> list[Row]:
    """N cold HTTPS shards at once (N = `sizes.scaling_streams`) from the local nginx through
    one daemon started with `--receivers R`, for R in 1, 2, 4, 8 up to this machine's cores:
    aggregate GB/s and the CPU per GB of all of the daemon's processes. Receiving processes
    exist to take TLS decryption off one process's GIL, so throughput should grow with R until
    the cores (shared with nginx and the curls) run out; R above the core count cannot show
    more. Runs alternate the pool sizes, each with a fresh daemon warmed by one small fetch."""
    counts = [r for r in RECEIVER_COUNTS if r <= (os.cpu_count() or 1)]
    streams, shard = sizes.scaling_streams, sizes.scaling_shard
    static = work / "static"
    static.mkdir()
    base = static / "base.tar"
    with base.open("wb") as out:
        out.write(os.urandom(shard))
    warm = static / "warm.bin"
    warm.write_bytes(os.urandom(WARM_BYTES))
    for run in range(sizes.runs):
        for receivers in counts:
            os.link(warm, static / f"warm_{run}_{receivers}.bin")
            for i in range(streams):
                os.link(base, static / f"scale_{run}_{receivers}_{i}.tar")
    cert, key = self_signed(work)
    nginx = Nginx(work, None, static, tls=(cert, key))
    rates: dict[int, list[float]] = {r: [] for r in counts}
    cpu: dict[int, list[float]] = {r: [] for r in counts}
    processes: dict[int, set[int]] = {r: set() for r in counts}  # daemon + descendants seen
    try:
        for run in range(sizes.runs):
            for receivers in counts:
                daemon = Shardcache(
                    work,
                    {"o": nginx.tls_url},
                    env={"SSL_CERT_FILE": str(cert)},
                    receivers=receivers,
                )
                try:
                    warm_receivers(f"{daemon.url}/o/warm_{run}_{receivers}.bin")
                    settle_disk((base,))
                    urls = [
                        f"{daemon.url}/o/scale_{run}_{receivers}_{i}.tar" for i in range(streams)
                    ]
                    before = cpu_snapshot([daemon.pid])
                    started = time.perf_counter()
                    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
                        received = list(pool.map(lambda url: curl(url).size, urls))
                    wall = time.perf_counter() - started
                    after = cpu_snapshot([daemon.pid])
                    if received != [shard] * streams:
                        raise RuntimeError(f"{streams} cold shards: received {received}")
                    rates[receivers].append(gbps(streams * shard, wall))
                    cpu[receivers].append(sum(cpu_between(before, after)) / (streams * shard / 1e9))
                    processes[receivers].add(1 + len(after.below))
                finally:
                    daemon.stop()
    finally:
        nginx.stop()
    label = (
        f"{streams} cold HTTPS shards at once through one daemon, by receiver pool size "
        f"({os.cpu_count()} cores)"
    )
    how = f"{streams} curl -s -f at once; shardcache serve --receivers R"
    rows = []
    for receivers in counts:
        one = receivers == 1
        for measure, values in (
            (f"GB/s in all ({streams} × {shard // MiB} MiB)", rates),
            ("CPU s/GB, all of the daemon's processes", cpu),
        ):
            rows.append(
                Row(
                    label,
                    f"{measure}, --receivers {receivers}",
                    values[receivers],
                    [] if one else values[1],
                    "-" if one else "--receivers 1",
                    "report",
                    how,
                    ratio=[]
                    if one
                    else [a / b for a, b in zip(values[receivers], values[1], strict=True)],
                )
            )
        rows[-1].note = (
            f"--receivers {receivers}: processes at the end of the transfers (daemon + "
            f"descendants): {sorted(processes[receivers])}"
        )
    return rows


SCENARIOS: dict[str, Callable[[Path, Sizes], list[Row]]] = {
    "hit-miss": hit_and_miss,
    "tls": tls_miss,
    "capped": capped_miss,
    "s3": s3_miss,
    "late": late_joiners,
    "small": small_objects,
    "memory": memory,
    "webdataset": webdataset_epoch,
    "loader": multi_worker_epoch,
    "tier": six_nodes_over_a_tier,
}
# Selectable with --only, not run by default: it needs a daemon with `serve --receivers`.
OPTIONAL: dict[str, Callable[[Path, Sizes], list[Row]]] = {
    "scaling": receiver_scaling,
}


# -- report ---------------------------------------------------------------------------------


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // (1024 * 1024)
    nginx = subprocess.run(
        [shutil.which("nginx") or "/usr/sbin/nginx", "-v"], capture_output=True, text=True
    ).stderr.strip()
    aws = subprocess.run(["aws", "--version"], capture_output=True, text=True).stdout.strip()
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem} GiB RAM, {platform.platform()}; "
        f"Python {platform.python_version()}; {nginx}; {aws.split()[0] if aws else 'aws ?'}"
    )


def render(rows: list[Row], quick: bool, command: str) -> str:
    lines = [
        f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {machine()}.",
        f"Command: `{command}`"
        + (" (quick mode: tiny sizes, one run; the figures mean nothing)." if quick else "."),
        "Values are medians over runs with (min-max); ratio = shardcache / peer, per run.",
        "",
        "| scenario | measure | shardcache | peer | peer value | ratio | bar | met | how |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.is_met is None and row.ratio and row.bar.startswith("≥"):
            threshold = float(re.search(r"[\d.]+", row.bar).group())  # type: ignore[union-attr]
            row.is_met = statistics.median(row.ratio) >= threshold
        met = {True: "yes", False: "**no**", None: "-"}[row.is_met]
        lines.append(
            f"| {row.scenario} | {row.measure} | {median_range(row.shardcache)} | "
            f"{row.peer_name} | {median_range(row.peer)} | {median_range(row.ratio)} | "
            f"{row.bar} | {met} | `{row.command}` |"
        )
    notes = [f"- {row.scenario}: {row.note}" for row in rows if row.note]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def write_report(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text:
        text += f"\n{START}\n{END}\n"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{START}\n{table}{END}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run")
    parser.add_argument(
        "--only",
        nargs="*",
        choices=sorted({**SCENARIOS, **OPTIONAL}),
        help="some scenarios (scaling: only this way)",
    )
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument(
        "--scaling-streams",
        type=int,
        default=Sizes.scaling_streams,
        metavar="N",
        help=f"cold shards at once in the scaling scenario (default {Sizes.scaling_streams})",
    )
    args = parser.parse_args()
    names = args.only or list(SCENARIOS)
    if "scaling" in names:
        require_receivers()
    ensure_tools()
    sizes = dataclasses.replace(QUICK if args.quick else FULL, scaling_streams=args.scaling_streams)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="shardcache-bench-") as tmp:
        for name in names:
            print(f"scenario {name}…", file=sys.stderr, flush=True)
            work = Path(tmp) / name
            work.mkdir()
            rows += {**SCENARIOS, **OPTIONAL}[name](work, sizes)
    command = (
        "python benchmarks/run.py"
        + (" --quick" if args.quick else "")
        + (f" --only {' '.join(args.only)}" if args.only else "")
        + (
            f" --scaling-streams {args.scaling_streams}"
            if args.scaling_streams != Sizes.scaling_streams
            else ""
        )
    )
    table = render(rows, args.quick, command)
    write_report(args.output, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
