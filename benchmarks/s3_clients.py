"""S3 clients through the daemon's S3 API against the same clients straight from the origin, and
64 KiB hits by HTTP and by S3 against nginx (issue 36). Prints a table for BENCHMARKS.md.

    python benchmarks/s3_clients.py            # 256 MiB objects, 3 runs (about 5 minutes)
    python benchmarks/s3_clients.py --quick    # tiny sizes, one run: a smoke test

The origin is benchmarks/simorigin.py as an S3 store (bucket `bench`, 30 ms to first byte,
100 MB/s per connection, as S3 caps a connection), served by the daemon as `sim`
(`--origin sim=s3://bench`): S3 clients name `s3://bench/KEY`, plain clients `/sim/KEY`. Each
client's arms run back to back in one run, their order rotated between runs; every cold read is
a key nobody read, every warm one a key just read through the daemon.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers import Nginx, Shardcache, SimOrigin  # noqa: E402
from benchmarks.run import MB, MiB, Row, _wrk_ms, curl, gbps, render, settle_disk  # noqa: E402

BUCKET = "bench"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_REGION": "us-east-1",
}


@dataclass
class Sizes:
    runs: int
    shard: int
    wrk_seconds: int


FULL = Sizes(runs=3, shard=256 * MiB, wrk_seconds=5)
QUICK = Sizes(runs=1, shard=8 * MiB, wrk_seconds=1)


class Bench:
    """One origin and one daemon for every scenario; keys are unique per arm and run."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.origin = SimOrigin(work, ttfb_ms=30, conn_rate=100 * MB)
        self.daemon = Shardcache(
            work,
            {"sim": f"s3://{BUCKET}"},
            env={**CREDENTIALS, "AWS_ENDPOINT_URL": self.origin.url},
        )
        self.target = work / "downloaded"

    def stop(self) -> None:
        self.daemon.stop()
        self.origin.stop()

    def endpoint(self, through_daemon: bool) -> str:
        return self.daemon.url if through_daemon else self.origin.url

    def origin_bytes(self, key: str) -> int:
        by_key = self.origin.stats()["by_key"]
        return int(by_key.get(f"{BUCKET}/{key}", [0, 0])[1])  # type: ignore[attr-defined]

    def timed(self, download: Callable[[], None], size: int, cold: bool) -> float:
        """GB/s of one download to `self.target` (removed after); the page cache settled first
        for a cold one, kept for a warm one."""
        if cold:
            settle_disk()
        began = time.monotonic()
        download()
        seconds = time.monotonic() - began
        got = self.target.stat().st_size
        self.target.unlink()
        if got != size:
            raise RuntimeError(f"{got} bytes downloaded, expected {size}")
        return gbps(size, seconds)


def _run(argv: list[str], endpoint: str) -> None:
    env = {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr[-2000:]}")


Fetch = Callable[[str, str], Callable[[], None]]  # (key, endpoint) -> one download


def _measure(bench: Bench, sizes: Sizes, name: str, fetch: Fetch) -> dict[str, list[float]]:
    """GB/s of `fetch` per run: from the origin ("direct", a key of its own), cold through the
    daemon, then warm (the same key again); and "fetched", the origin's bytes for the daemon's
    key over the object's size. The first two alternate in order between runs."""
    got: dict[str, list[float]] = {"direct": [], "cold": [], "warm": [], "fetched": []}
    for run in range(sizes.runs):
        key = f"size-{sizes.shard}/{name}_{run}"
        arms = [("direct", f"{key}.o", bench.origin.url), ("cold", key, bench.daemon.url)]
        for arm, arm_key, endpoint in arms[run % 2 :] + arms[: run % 2]:
            got[arm].append(bench.timed(fetch(arm_key, endpoint), sizes.shard, cold=True))
        _wait_cached(bench, f"{bench.daemon.url}/sim/{key}")  # a hit, not a join of the commit
        got["warm"].append(bench.timed(fetch(key, bench.daemon.url), sizes.shard, cold=False))
        got["fetched"].append(bench.origin_bytes(key) / sizes.shard)
    return got


def aws_cp(bench: Bench, sizes: Sizes) -> list[Row]:
    """`aws s3 cp s3://bench/KEY FILE` (8 MiB ranges, 10 at once): cold and warm through the
    daemon, against the same command from the origin."""

    def cp(key: str, endpoint: str) -> Callable[[], None]:
        argv = ["aws", "s3", "cp", "--only-show-errors", f"s3://{BUCKET}/{key}"]
        return lambda: _run([*argv, str(bench.target)], endpoint)

    return _rows(
        "`aws s3 cp s3://bench/KEY FILE`, simulated S3 origin, 100 MB/s per connection",
        sizes,
        _measure(bench, sizes, "cp", cp),
        "aws s3 cp from the origin",
        "AWS_ENDPOINT_URL=http://127.0.0.1:PORT aws s3 cp s3://bench/KEY FILE",
    )


def download_file(bench: Bench, sizes: Sizes) -> list[Row]:
    """boto3 `download_file` with `max_concurrency=10` (8 MiB ranges): cold (origin bytes:
    1.0x the object) and warm through the daemon, against the same call from the origin."""
    import boto3
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(max_concurrency=10)

    def fetch(key: str, endpoint: str) -> Callable[[], None]:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        return lambda: client.download_file(BUCKET, key, str(bench.target), Config=config)

    return _rows(
        "boto3 `download_file(max_concurrency=10)`, simulated S3 origin, 100 MB/s per connection",
        sizes,
        _measure(bench, sizes, "df", fetch),
        "download_file from the origin",
        "client.download_file(B, KEY, FILE, Config=TransferConfig(max_concurrency=10))",
    )


def s5cmd_warm(bench: Bench, sizes: Sizes) -> list[Row]:
    """`s5cmd cp` (50 MiB parts, 5 at once: its defaults) of an object the daemon has cached,
    against s5cmd from the origin (the cold arm only fills the cache, it is not reported)."""

    def cp(key: str, endpoint: str) -> Callable[[], None]:
        argv = ["s5cmd", "--endpoint-url", endpoint, "cp", f"s3://{BUCKET}/{key}"]
        return lambda: _run([*argv, str(bench.target)], endpoint)

    got = _measure(bench, sizes, "s5", cp)
    return [
        Row(
            "`s5cmd cp s3://bench/KEY FILE`, simulated S3 origin, 100 MB/s per connection",
            f"warm through the daemon, GB/s ({sizes.shard // MiB} MiB)",
            got["warm"],
            got["direct"],
            "s5cmd from the origin",
            "report",
            "s5cmd --endpoint-url http://127.0.0.1:PORT cp s3://bench/KEY FILE",
            ratio=[a / b for a, b in zip(got["warm"], got["direct"], strict=True)],
        )
    ]


def _rows(
    scenario: str, sizes: Sizes, got: dict[str, list[float]], peer: str, how: str
) -> list[Row]:
    size = f"GB/s ({sizes.shard // MiB} MiB)"
    direct = got["direct"]
    return [
        Row(
            scenario,
            f"cold through the daemon, {size}",
            got["cold"],
            direct,
            peer,
            "report; origin bytes 1.0x",
            how,
            ratio=[a / b for a, b in zip(got["cold"], direct, strict=True)],
            is_met=all(f == 1.0 for f in got["fetched"]),
            note=f"origin bytes / object size, cold through the daemon: {got['fetched']}",
        ),
        Row(
            scenario,
            f"warm through the daemon, {size}",
            got["warm"],
            direct,
            peer,
            "report",
            how,
            ratio=[a / b for a, b in zip(got["warm"], direct, strict=True)],
        ),
    ]


def large_by_name_and_by_s3(bench: Bench, sizes: Sizes) -> list[Row]:
    """curl of a large object by S3 (a SigV4-signed GET of `/BUCKET/KEY`) against by HTTP
    (`/NAME/KEY`), cold then warm, each a key of its own; the issue's bar: within 10%."""
    got: dict[str, list[float]] = {"cold-s3": [], "cold-http": [], "warm-s3": [], "warm-http": []}
    for run in range(sizes.runs):
        urls = {
            "s3": f"{bench.daemon.url}/{BUCKET}/size-{sizes.shard}/curl_s3_{run}",
            "http": f"{bench.daemon.url}/sim/size-{sizes.shard}/curl_http_{run}",
        }
        headers = {"s3": _signed_headers(urls["s3"]), "http": []}
        order = ["s3", "http"][run % 2 :] + ["s3", "http"][: run % 2]
        for phase in ("cold", "warm"):
            for way in order:
                if phase == "cold":
                    settle_disk()
                else:  # a hit, not a join of the fill still committing (its fsync)
                    _wait_cached(bench, urls["http"] if way == "http" else urls["s3"])
                fetched = curl(urls[way], *headers[way])
                if fetched.size != sizes.shard:
                    raise RuntimeError(f"{urls[way]}: {fetched.size} bytes")
                got[f"{phase}-{way}"].append(gbps(sizes.shard, fetched.seconds))
    how = "curl -H 'Authorization: AWS4-HMAC-SHA256 …' URL/bench/KEY  vs  curl URL/sim/KEY"
    return [
        Row(
            f"A {sizes.shard // MiB} MiB object by S3 (`/BUCKET/KEY`, signed) and by HTTP "
            "(`/NAME/KEY`), curl, simulated S3 origin",
            f"{phase} GB/s",
            got[f"{phase}-s3"],
            got[f"{phase}-http"],
            "the same by /NAME/KEY",
            "≥ 0.9",
            how,
            ratio=[a / b for a, b in zip(got[f"{phase}-s3"], got[f"{phase}-http"], strict=True)],
        )
        for phase in ("cold", "warm")
    ]


def _wait_cached(bench: Bench, url: str, timeout_s: float = 120.0) -> None:
    """Wait until a HEAD of `url` is a hit (the object's fill committed), with a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.headers.get("X-Shardcache") == "hit":
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} was not cached {timeout_s:.0f} s after its cold read")
        time.sleep(0.1)


def _signed_headers(url: str) -> list[str]:
    """The headers of a GET of `url` signed with SigV4 as boto3 signs one (`wrk -H` args): the
    same signature on every request, which the daemon takes unchecked on loopback."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest("GET", url)
    S3SigV4Auth(Credentials("bench", "bench"), "s3", "us-east-1").add_auth(request)
    headers = []
    for name in ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256"):
        headers += ["-H", f"{name}: {request.headers[name]}"]
    return headers


def small_hits(bench: Bench, sizes: Sizes) -> list[Row]:
    """64 KiB hits over 32 connections (wrk): `/NAME/KEY`, and SigV4-signed S3 GETs of
    `/BUCKET/KEY` (S3's XML error mode, `x-amz-request-id`), each against nginx's proxy_cache
    hits of the same object in the same run."""
    static = bench.work / "small-static"
    static.mkdir()
    nginx = Nginx(bench.work, bench.origin.url, static)
    key = f"size-{64 * 1024}/small"
    arms = {
        "http": (f"{bench.daemon.url}/sim/{key}", []),
        "s3": (
            f"{bench.daemon.url}/{BUCKET}/{key}",
            _signed_headers(f"{bench.daemon.url}/{BUCKET}/{key}"),
        ),
        "nginx": (f"{nginx.proxy_url}/{BUCKET}/{key}", []),
    }
    rps: dict[str, list[float]] = {name: [] for name in arms}
    p99: dict[str, list[float]] = {name: [] for name in arms}
    try:
        for url, headers in arms.values():
            curl(url, *headers)  # warm
            curl(url, *headers)
        order = list(arms)
        for run in range(sizes.runs):
            for name in order[run % 3 :] + order[: run % 3]:
                url, headers = arms[name]
                argv = ["wrk", "-t2", "-c32", f"-d{sizes.wrk_seconds}s", "--latency", *headers]
                out = subprocess.run([*argv, url], capture_output=True, text=True, check=True)
                if "Non-2xx" in out.stdout:
                    raise RuntimeError(f"{name}: errors under wrk:\n{out.stdout}")
                rps[name].append(float(re.search(r"Requests/sec:\s+([\d.]+)", out.stdout).group(1)))  # type: ignore[union-attr]
                p99[name].append(_wrk_ms(re.search(r"99%\s+([\d.]+\w+)", out.stdout).group(1)))  # type: ignore[union-attr]
    finally:
        nginx.stop()
    rows = []
    for name, scenario, how in (
        ("http", "64 KiB hits by HTTP (`/NAME/KEY`), 32 connections (wrk)", "wrk -t2 -c32 URL"),
        (
            "s3",
            "64 KiB hits by S3 (SigV4-signed GETs of `/BUCKET/KEY`), 32 connections (wrk)",
            "wrk -t2 -c32 -H 'Authorization: AWS4-HMAC-SHA256 …' -H 'X-Amz-Date: …' URL",
        ),
    ):
        rows.append(
            Row(
                scenario,
                "requests/s",
                rps[name],
                rps["nginx"],
                "nginx",
                "≥ 0.2",
                how,
                ratio=[a / b for a, b in zip(rps[name], rps["nginx"], strict=True)],
            )
        )
        rows.append(
            Row(scenario, "p99 latency (ms)", p99[name], p99["nginx"], "nginx", "report", how)
        )
    return rows


SCENARIOS: dict[str, Callable[[Bench, Sizes], list[Row]]] = {
    "aws-cp": aws_cp,
    "download-file": download_file,
    "s5cmd": s5cmd_warm,
    "large": large_by_name_and_by_s3,
    "small": small_hits,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="some scenarios")
    args = parser.parse_args()
    for tool in ("aws", "s5cmd", "wrk", "curl"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: see scripts/test (the test extra, apt-get)")
    sizes = QUICK if args.quick else FULL
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="shardcache-s3-bench-") as tmp:
        bench = Bench(Path(tmp))
        try:
            for name in args.only or list(SCENARIOS):
                print(f"scenario {name}…", file=sys.stderr, flush=True)
                rows += SCENARIOS[name](bench, sizes)
        finally:
            bench.stop()
    command = (
        "python benchmarks/s3_clients.py"
        + (" --quick" if args.quick else "")
        + (f" --only {' '.join(args.only)}" if args.only else "")
    )
    print(render(rows, args.quick, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
