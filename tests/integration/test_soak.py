"""Soak: integrity under origin faults (issue 9), over an HTTP origin and over S3 (moto).

The daemon runs as users start it (`--origin-read-timeout 1 --origin-retries 2 --segment-size
1MiB`, a cache smaller than the object set, so misses, hits and evictions go on throughout) in
front of an origin that injects every fault kind of `tests.fault_origin` at random: 5xx on GET
and HEAD, resets, stalls, short bodies, flipped bytes, objects changing between and during
requests (with `If-Match` ignored: the splicing case) and 206s with the wrong Content-Range.
Many clients at once (half `curl -s -f` processes, as WebDataset's `pipe:curl` runs, half aiohttp)
ask for whole objects and byte ranges (to the end, in the middle, suffixes) of hot and cold keys.

Asserted: every response a client takes as successful is byte-identical to one published version
of the object (a range: the same slice of one version) — zero corrupt bodies where a checksum is
published, and on S3; for non-checksummed HTTP objects (ETag only; no bytes flipped on them) zero
for whole-object reads; every failure visible (an HTTP error status or an aborted transfer, never
a short body reported as success); no 500; no traceback or unretrieved task exception in the
log; the daemon still serves afterwards; `shardcache verify` finds the cache clean once the
daemon stopped; and every fault kind was injected at least once.

A third origin kind, `failover` (issue 23), puts the origin behind a tier member and a mirror,
all three injecting every fault, besides answers without their ETag and bodies dripping under
the read timeout, each changing versions on its own: every body must still be one version whole.

Short (CI) mode by default: 2,000 requests from 32 clients per origin kind. Long mode via the
environment:

    SHARDCACHE_SOAK_REQUESTS=50000 SHARDCACHE_SOAK_CLIENTS=64 SHARDCACHE_SOAK_SEED=7 \\
    SHARDCACHE_SOAK_REPORT=/tmp/soak.json \\
        python3 -m pytest tests/integration/test_soak.py -q -s -p no:cacheprovider

- `SHARDCACHE_SOAK_REQUESTS` (1200), `SHARDCACHE_SOAK_CLIENTS` (32), `SHARDCACHE_SOAK_OBJECTS`
  (36), `SHARDCACHE_SOAK_SEED` (20260509; seeds the objects, the requests and the faults);
- `SHARDCACHE_SOAK_TIMEOUT`: the test's timeout in seconds (default max(300, requests / 5));
- `SHARDCACHE_SOAK_REPORT`: a JSON file the summary is written to, one key per origin kind.

The summary is printed too (`-s` shows it; a failure shows it as captured output).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.daemon_process import Daemon
from tests.fault_origin import FAULT_KINDS, STALE_IF_MATCH, FaultOrigin, Faults
from tests.integration.helpers import curl
from tests.s3_fault_proxy import S3FaultProxy
from tests.s3_stores import client_for, env_for

KiB, MiB = 1024, 1024 * 1024
REQUESTS = int(os.environ.get("SHARDCACHE_SOAK_REQUESTS", "1200"))
CLIENTS = int(os.environ.get("SHARDCACHE_SOAK_CLIENTS", "32"))
OBJECTS = int(os.environ.get("SHARDCACHE_SOAK_OBJECTS", "36"))
SEED = int(os.environ.get("SHARDCACHE_SOAK_SEED", "20260509"))
TIMEOUT_S = int(os.environ.get("SHARDCACHE_SOAK_TIMEOUT", str(max(300, REQUESTS // 5))))
REPORT = os.environ.get("SHARDCACHE_SOAK_REPORT")
HOT_KEYS = 8  # asked for half the time: they fit the cache, so they are mostly hits
CLIENT_TIMEOUT_S = 120  # a request slower than this is a hang, and reported as one
# Behind failover, a read waits for at most a few read timeouts and retries before the next
# upstream serves it: longer is an upstream holding it (a drip under the read timeout).
FAILOVER_HANG_S = 30
DAEMON_ARGS = (
    "--origin-read-timeout",
    "1",
    "--origin-retries",
    "2",
    "--segment-size",
    "1MiB",
)
CACHE_SIZE = "24MiB"
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_LOG_PROBLEMS = ("Traceback", "Task exception was never retrieved", "unhandled error")


@dataclass
class SoakOrigin:
    """One origin kind behind a common face: what the daemon is given, and the ground truth."""

    kind: str
    daemon_origin: str  # NAME's URL for `--origin NAME=URL`
    env: dict[str, str]
    faults: Faults
    injected: Counter[str]
    origin_requests: Counter[str]
    versions: Callable[[str], list[bytes]]  # every version ever published, oldest first
    checksummed: Callable[[str], bool]
    publish: Callable[[str, bytes], object]  # a new object or a new version, faults aside
    keys: list[str] = field(default_factory=list)
    config: str = ""  # a TOML [origins.soak] table, for origins a flag cannot describe


class _Summed(Counter[str]):
    """The counts of several origins, read as one (nothing is ever stored in it)."""

    def __init__(self, *parts: Counter[str]) -> None:
        super().__init__()
        self._parts = parts

    def __missing__(self, key: str) -> int:
        return sum(part[key] for part in self._parts)


def _objects(rng: random.Random, count: int) -> dict[str, tuple[bytes, bool]]:
    """`count` objects of 0.3-3 MiB; one in five publishes no checksum (HTTP only)."""
    return {
        f"shard-{n:03d}.tar": (rng.randbytes(rng.randint(300 * KiB, 3 * MiB)), n % 5 != 4)
        for n in range(count)
    }


def _http_origin() -> Iterator[SoakOrigin]:
    rng = random.Random(SEED)
    origin = FaultOrigin(faults=Faults.soak(), seed=SEED + 1)
    objects = _objects(rng, OBJECTS)
    for key, (data, checksummed) in objects.items():
        origin.put(key, data, checksummed=checksummed)
    origin.start()
    try:
        yield SoakOrigin(
            kind="http",
            daemon_origin=origin.url,
            env={},
            faults=origin.faults,
            injected=origin.injected,
            origin_requests=origin.requests,
            versions=lambda key: list(origin.versions[key]),
            checksummed=lambda key: origin.checksummed[key],
            publish=lambda key, data: origin.put(key, data),
            keys=list(objects),
        )
    finally:
        origin.stop()


def _s3_origin(s3_client, s3_env: dict[str, str]) -> Iterator[SoakOrigin]:  # type: ignore[no-untyped-def]
    bucket, prefix = f"soak-{SEED % 100000}", "data"
    if bucket not in [b["Name"] for b in s3_client.list_buckets().get("Buckets", [])]:
        s3_client.create_bucket(Bucket=bucket)
    rng = random.Random(SEED)
    versions: dict[str, list[bytes]] = {}
    lock = threading.Lock()

    def publish(key: str, data: bytes) -> None:
        with lock:  # recorded before moto has it: any body moto serves is a known version
            versions.setdefault(key, []).append(data)
        s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)

    def change(bucket_name: str, object_key: str, seed: int) -> None:
        key = object_key.removeprefix(prefix + "/")
        with lock:
            if key not in versions:
                return
            old = versions[key][-1]
        dice = random.Random(seed)
        size = (
            len(old) if dice.random() < 0.5 else dice.randint(len(old) * 3 // 4, len(old) * 5 // 4)
        )
        publish(key, dice.randbytes(max(1, size)))

    objects = _objects(rng, OBJECTS)
    for key, (data, _) in objects.items():
        publish(key, data)
    proxy = S3FaultProxy(s3_env["AWS_ENDPOINT_URL"], Faults.soak(), seed=SEED + 1, on_change=change)
    proxy.start()
    try:
        yield SoakOrigin(
            kind="s3",
            daemon_origin=f"s3://{bucket}/{prefix}",
            env={**s3_env, "AWS_ENDPOINT_URL": proxy.url},
            faults=proxy.faults,
            injected=proxy.injected,
            origin_requests=proxy.requests,
            versions=lambda key: list(versions[key]),
            checksummed=lambda key: True,  # S3's single-part ETag is the body's MD5
            publish=publish,
            keys=list(objects),
        )
    finally:
        proxy.stop()


def _failover_origin() -> Iterator[SoakOrigin]:
    """An origin behind a tier member and a mirror (issue 23): all three inject every fault,
    and besides answer without their ETag (`drop_etag`, so with `ignore_if_match` a resume
    cannot prove its version) and drip bodies under the read timeout (`drip`). Each changes
    versions on its own, so the upstreams disagree; every body served must still be one
    version whole, of one of them."""
    rng = random.Random(SEED)
    faults = dataclasses.replace(Faults.soak(), change=0.05, drop_etag=0.2, drip=0.01)
    member = FaultOrigin(faults=faults, seed=SEED + 11, path_prefix="soak/")
    mirror = FaultOrigin(faults=faults, seed=SEED + 12)
    home = FaultOrigin(faults=faults, seed=SEED + 13)
    everyone = (member, mirror, home)
    objects = _objects(rng, OBJECTS)
    for key, (data, checksummed) in objects.items():
        for upstream in everyone:
            upstream.put(key, data, checksummed=checksummed)
    for upstream in everyone:
        upstream.start()
    try:
        yield SoakOrigin(
            kind="failover",
            daemon_origin="",
            env={},
            faults=faults,
            injected=_Summed(*(u.injected for u in everyone)),
            origin_requests=_Summed(*(u.requests for u in everyone)),
            versions=lambda key: [v for u in everyone for v in u.versions[key]],
            checksummed=lambda key: home.checksummed[key],
            publish=lambda key, data: [u.put(key, data) for u in everyone],
            keys=list(objects),
            config=(
                f'[origins.soak]\nurls = ["{mirror.url}", "{home.url}"]\ntier = ["{member.url}"]\n'
            ),
        )
    finally:
        for upstream in everyone:
            upstream.stop()


@pytest.fixture(params=["http", "s3", "failover"])
def soak_origin(request: pytest.FixtureRequest) -> Iterator[SoakOrigin]:
    if request.param == "http":
        yield from _http_origin()
    elif request.param == "failover":
        yield from _failover_origin()
    else:
        # moto only: the soak's S3 half tests the daemon under faults, which the proxy injects
        # the same over any store; a second store would double its minutes for no new fault.
        endpoint = request.getfixturevalue("moto_endpoint")
        yield from _s3_origin(client_for(endpoint), env_for(endpoint))


# -- the requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    key: str
    shape: str  # whole, tail (bytes=a-), suffix (bytes=-n), mid (bytes=a-b, b before the end)
    range: str | None  # the Range header


def _plan(rng: random.Random, origin: SoakOrigin, count: int) -> list[Ask]:
    hot = origin.keys[:HOT_KEYS]
    asks = []
    for _ in range(count):
        key = rng.choice(hot) if rng.random() < 0.5 else rng.choice(origin.keys)
        size = len(origin.versions(key)[0])
        shape = rng.choices(("whole", "tail", "suffix", "mid"), (40, 20, 10, 30))[0]
        length = rng.randint(1, min(size - 1, MiB))
        if shape == "whole":
            header = None
        elif shape == "tail":
            header = f"bytes={size - length}-"
        elif shape == "suffix":
            header = f"bytes=-{length}"
        else:
            start = rng.randrange(0, size - length)
            header = f"bytes={start}-{start + length - 1}"
        asks.append(Ask(key, shape, header))
    return asks


def _wanted(header: str | None, total: int) -> tuple[int, int] | None:
    """The inclusive [first, last] a Range header selects from an object of `total` bytes."""
    if header is None:
        return None
    first, _, last = header.removeprefix("bytes=").partition("-")
    if not first:
        return max(0, total - int(last)), total - 1
    return int(first), min(total - 1, int(last)) if last else total - 1


def _problem_with_body(
    ask: Ask, status: int, headers: dict[str, str], body: bytes, versions: list[bytes]
) -> str | None:
    """Why a body the client took as complete is not (a slice of) one published version."""
    if status == 200:
        if ask.range is not None:
            return "200 for a Range request"
        return None if any(body == v for v in versions) else "whole body matches no version"
    if status != 206:
        return f"success with status {status}"
    match = _CONTENT_RANGE.match(headers.get("content-range", ""))
    if match is None:
        return f"206 with Content-Range {headers.get('content-range')!r}"
    first, last, total = (int(g) for g in match.groups())
    if (first, last) != _wanted(ask.range, total):
        return f"206 {first}-{last}/{total} for {ask.range}"
    if last - first + 1 != len(body):
        return "206 body length differs from its Content-Range"
    for version in versions:
        if len(version) == total and version[first : last + 1] == body:
            return None
    return f"range matches no version's slice (served as {headers.get('x-shardcache')}; " + (
        _first_difference(body, [v[first : last + 1] for v in versions if len(v) == total]) + ")"
    )


def _first_difference(body: bytes, slices: list[bytes]) -> str:
    """Where a corrupt body first parts from each version's slice: the clue to which path
    (a hit, a fill, a stream-through) and which piece of it went wrong."""
    offsets = [
        next((i for i, (a, b) in enumerate(zip(body, piece, strict=True)) if a != b), -1)
        for piece in slices
    ]
    return f"first differing byte per version: {offsets}"


@dataclass
class Tally:
    driven: int = 0
    successes: int = 0
    by_shape: Counter[str] = field(default_factory=Counter)  # successes
    failures: Counter[str] = field(default_factory=Counter)  # visible, by kind
    statuses: Counter[str] = field(default_factory=Counter)
    served_as: Counter[str] = field(default_factory=Counter)  # X-Shardcache of complete bodies
    corrupt: Counter[str] = field(default_factory=Counter)  # checksummed|etag-only:shape
    corrupt_examples: list[str] = field(default_factory=list)
    invisible: int = 0
    invisible_examples: list[str] = field(default_factory=list)
    status_500: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    slowest_s: float = 0.0

    def outcome(
        self,
        origin: SoakOrigin,
        ask: Ask,
        client: str,
        status: int,
        headers: dict[str, str],
        body: bytes | None,
        failure: str | None,
    ) -> None:
        self.statuses[str(status)] += 1
        if status == 500:
            self.status_500 += 1
        if failure is not None:
            self.failures[failure] += 1
            return
        assert body is not None
        self.served_as[headers.get("x-shardcache", "none")] += 1
        versions = origin.versions(ask.key)
        expected = _announced_length(status, headers)
        cut_short = (
            len(body) < expected
            if expected is not None
            else status == 200 and any(len(body) < len(v) and v.startswith(body) for v in versions)
        )
        if cut_short:
            self.invisible += 1
            self.invisible_examples.append(
                f"{client} {ask}: {status}, {len(body)} of {expected} bytes taken as success"
            )
            return
        problem = _problem_with_body(ask, status, headers, body, versions)
        if problem is not None:
            sort = "checksummed" if origin.checksummed(ask.key) else "etag-only"
            self.corrupt[f"{sort}:{ask.shape}"] += 1
            if len(self.corrupt_examples) < 20:
                self.corrupt_examples.append(f"{client} {ask}: {problem}")
            return
        self.successes += 1
        self.by_shape[ask.shape] += 1


def _announced_length(status: int, headers: dict[str, str]) -> int | None:
    """The body length the response announced: Content-Length, or a 206's Content-Range."""
    if (length := headers.get("content-length", "")).isdigit():
        return int(length)
    match = _CONTENT_RANGE.match(headers.get("content-range", ""))
    if status == 206 and match is not None:
        return int(match.group(2)) - int(match.group(1)) + 1
    return None


def _failure_kind(status: int, what: str) -> str:
    return f"http_{status}" if status >= 400 else what


async def _by_curl(url: str, ask: Ask) -> tuple[int, dict[str, str], bytes | None, str | None]:
    args = ["curl", "-s", "-f", "-D", "/dev/stderr", "--max-time", str(CLIENT_TIMEOUT_S)]
    if ask.range is not None:
        args += ["-H", f"Range: {ask.range}"]
    process = await asyncio.create_subprocess_exec(
        *args, url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    code = process.returncode
    status, headers = 0, dict[str, str]()
    for line in err.decode(errors="replace").splitlines():  # as helpers.curl parses them
        if line.startswith("HTTP/"):
            status, headers = int(line.split()[1]), {}
        elif ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if code != 0:
        return status, headers, None, _failure_kind(status, f"curl_exit_{code}")
    return status, headers, out, None


async def _by_aiohttp(
    session: aiohttp.ClientSession, url: str, ask: Ask
) -> tuple[int, dict[str, str], bytes | None, str | None]:
    status, headers = 0, {}
    try:
        async with session.get(url, headers={"Range": ask.range} if ask.range else {}) as answer:
            status = answer.status
            headers = {k.lower(): v for k, v in answer.headers.items()}
            if status not in (200, 206):
                await answer.read()
                return status, headers, None, _failure_kind(status, f"status_{status}")
            return status, headers, await answer.read(), None
    except (aiohttp.ClientError, TimeoutError) as exc:
        return status, headers, None, f"aiohttp_{exc.__class__.__name__}"


async def _drive(daemon_url: str, name: str, origin: SoakOrigin, asks: list[Ask]) -> Tally:
    tally = Tally()
    queue = iter(enumerate(asks))
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, auto_decompress=False
    ) as session:

        async def client(number: int) -> None:
            kind = "curl" if number % 2 == 0 else "aiohttp"
            for _, ask in queue:
                url = f"{daemon_url}/{name}/{ask.key}"
                tally.driven += 1
                tally.in_flight += 1
                tally.max_in_flight = max(tally.max_in_flight, tally.in_flight)
                began = time.monotonic()
                try:
                    if kind == "curl":
                        result = await _by_curl(url, ask)
                    else:
                        result = await _by_aiohttp(session, url, ask)
                finally:
                    tally.in_flight -= 1
                tally.slowest_s = max(tally.slowest_s, time.monotonic() - began)
                tally.outcome(origin, ask, kind, *result)

        await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    return tally


# -- the soak -------------------------------------------------------------------------------------


def _log_problems(log: str) -> dict[str, list[str]]:
    lines = log.splitlines()
    found: dict[str, list[str]] = {}
    for n, line in enumerate(lines):
        for needle in _LOG_PROBLEMS:
            if needle in line:
                found.setdefault(needle, []).append("\n".join(lines[max(0, n - 2) : n + 12]))
    return found


def _upstreams_down(daemon: Daemon) -> int:
    """How many upstreams /_/status shows not up (0 for an origin without upstreams)."""
    try:
        _, status = daemon.get_json("/_/status")
        rows = status["origins"]["soak"].get("upstreams", [])  # type: ignore[index, union-attr]
    except (OSError, KeyError, TypeError, ValueError):
        return -1
    return sum(1 for row in rows if row.get("state") != "up")


def _write_report(kind: str, summary: dict[str, object]) -> None:
    if not REPORT:
        return
    path = Path(REPORT)
    try:
        document = json.loads(path.read_text())
        assert isinstance(document, dict)
    except (OSError, ValueError, AssertionError):
        document = {}
    document[kind] = summary
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


@pytest.mark.timeout(TIMEOUT_S)
def test_soak_integrity_under_faults(
    soak_origin: SoakOrigin, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    origin, name = soak_origin, "soak"
    flags: tuple[str, ...] = DAEMON_ARGS
    if origin.config:
        (tmp_path / "soak.toml").write_text(origin.config)
        flags += ("--config", str(tmp_path / "soak.toml"))
    origins = {name: origin.daemon_origin} if origin.daemon_origin else {}
    daemon = start_daemon(origins, *flags, cache_size=CACHE_SIZE, env=origin.env)
    asks = _plan(random.Random(SEED + 2), origin, REQUESTS)
    began = time.monotonic()
    tally = asyncio.run(_drive(daemon.url, name, origin, asks))
    soak_s = time.monotonic() - began
    problems: list[str] = []

    # Afterwards, with the faults off: the daemon still serves, a new object comes back intact.
    origin.faults.enabled = False
    fresh = random.Random(SEED + 3).randbytes(2 * MiB + 17)
    origin.publish("fresh.tar", fresh)
    miss, hit = (curl(f"{daemon.url}/{name}/fresh.tar") for _ in range(2))
    if (miss.exit_code, miss.body == fresh, hit.exit_code, hit.body == fresh) != (0, True, 0, True):
        problems.append(
            f"after the soak a new object came back as exit {miss.exit_code}/{hit.exit_code},"
            f" intact {miss.body == fresh}/{hit.body == fresh}"
        )
    hot = curl(f"{daemon.url}/{name}/{origin.keys[0]}")
    if hot.exit_code != 0 or not any(hot.body == v for v in origin.versions(origin.keys[0])):
        problems.append(f"after the soak {origin.keys[0]} came back as exit {hot.exit_code}")
    try:
        with urllib.request.urlopen(daemon.url + "/healthz", timeout=10) as answer:
            healthz = answer.status
    except urllib.error.HTTPError as exc:
        healthz = exc.code
    if healthz != 200:
        problems.append(f"/healthz answered {healthz} after the soak")

    evictions = daemon.metric("shardcache_cache_evictions_total")
    retries = daemon.metric("shardcache_origin_retries_total", origin=name)
    log_problems = _log_problems(daemon.log())
    upstreams_down = _upstreams_down(daemon)
    exit_code = daemon.stop()
    if exit_code != 0:
        problems.append(f"the daemon exited {exit_code} on SIGTERM")
    verify = subprocess.run(
        [sys.executable, "-m", "shardcache", "verify", "--cache-dir", str(daemon.cache_dir)]
        + ["--json"],
        capture_output=True,
        timeout=120,
    )
    try:
        report = json.loads(verify.stdout)
        verify_problems = report.get("problems")
        verify_entries = report.get("entries")
    except ValueError:
        verify_problems, verify_entries = None, None
    if verify.returncode != 0 or verify_problems != []:
        problems.append(
            f"shardcache verify exited {verify.returncode}, problems {verify_problems!r}:"
            f" {verify.stdout.decode(errors='replace')[-2000:]}"
            f" {verify.stderr.decode(errors='replace')[-2000:]}"
        )

    summary: dict[str, object] = {
        "origin": origin.kind,
        "seed": SEED,
        "clients": CLIENTS,
        "objects": len(origin.keys),
        "requests_driven": tally.driven,
        "max_in_flight": tally.max_in_flight,
        "soak_seconds": round(soak_s, 1),
        "slowest_request_seconds": round(tally.slowest_s, 1),
        "successes": tally.successes,
        "successes_by_shape": dict(tally.by_shape),
        "visible_failures": dict(tally.failures),
        "statuses": dict(tally.statuses),
        "served_as": dict(tally.served_as),
        "evictions": evictions,
        "origin_retries": retries,
        "status_500": tally.status_500,
        "corrupt_bodies": dict(tally.corrupt),
        "corrupt_examples": tally.corrupt_examples,
        "invisible_failures": tally.invisible,
        "invisible_examples": tally.invisible_examples[:20],
        "faults_injected": {kind: origin.injected[kind] for kind in FAULT_KINDS},
        "upstreams_down_at_end": upstreams_down,
        "fault_probabilities": origin.faults.probabilities(),
        "origin_requests": {m: origin.origin_requests[m] for m in ("GET", "HEAD")},
        "versions_published": sum(len(origin.versions(k)) for k in origin.keys),
        "log_problems": {k: len(v) for k, v in log_problems.items()},
        "verify_exit": verify.returncode,
        "verify_entries": verify_entries,
        "verify_problems": verify_problems,
    }
    print(f"\nsoak summary ({origin.kind}):\n" + json.dumps(summary, indent=2))
    _write_report(origin.kind, summary)

    if tally.driven != len(asks):
        problems.append(f"drove {tally.driven} of {len(asks)} requests")
    if tally.max_in_flight < min(CLIENTS, len(asks)):
        problems.append(f"only {tally.max_in_flight} requests were ever in flight at once")
    if tally.successes < len(asks) // 4:
        problems.append(f"only {tally.successes} of {len(asks)} requests succeeded")
    if not (tally.served_as["hit"] and tally.served_as["miss"] and evictions):
        problems.append(f"no mix of hits, misses and evictions: {tally.served_as}, {evictions}")
    for shape in ("whole", "tail", "suffix", "mid"):
        if not tally.by_shape[shape]:
            problems.append(f"no {shape} read succeeded")
    must_be_clean = {
        k: n
        for k, n in tally.corrupt.items()
        if origin.kind == "s3" or k.startswith("checksummed:") or k == "etag-only:whole"
    }
    if must_be_clean:
        problems.append(f"corrupt bodies served as complete: {must_be_clean}")
        problems += tally.corrupt_examples
    if tally.invisible:
        problems.append(f"{tally.invisible} invisible failures (short bodies taken as success)")
        problems += tally.invisible_examples[:10]
    if origin.kind == "failover" and tally.slowest_s > FAILOVER_HANG_S:
        problems.append(f"a read took {tally.slowest_s:.0f} s: a dripping upstream held it")
    if tally.status_500:
        problems.append(f"{tally.status_500} responses with status 500")
    for needle, where in log_problems.items():
        problems.append(f"{len(where)}x {needle!r} in the daemon log; first:\n{where[0]}")
    rolled = origin.faults.probabilities()
    # `ignore_if_match` needs an occasion (a resume after the object changed), which a short
    # run may not bring: the HTTP origins count them and always take the first; the S3 proxy
    # strips If-Match blind, before the store says whether it was stale, and counts none.
    no_occasion = set() if origin.origin_requests[STALE_IF_MATCH] else {"ignore_if_match"}
    never = [
        kind
        for kind in FAULT_KINDS
        if rolled[kind] and not origin.injected[kind] and kind not in no_occasion
    ]
    if never:
        problems.append(f"fault kinds never injected: {never}")
    assert not problems, "\n".join(problems)
