"""Integrity under faults (issue 9): kill -9 mid-fill, a full disk, a cache dir deleted or made
read-only under the daemon, and a commit that fails for want of space.

Whatever breaks, a client gets either the exact object or a failed transfer (never a short or
mixed body, never a 500), the daemon recovers by itself once the disk does, and the offline
`shardcache verify` finds the cache sound afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardcache.cache.index import WAL_ALLOWANCE_BYTES
from shardcache.cache.store import ENTRY_OVERHEAD_BYTES
from tests.daemon_process import Daemon
from tests.integration.disk_helpers import (
    MiB,
    assert_no_crash,
    count,
    entry_files,
    fill_up,
    has_written_bytes,
    index_db_bytes,
    partial_files,
    read_only,
    readyz,
    tmpfs,
    verify,
)
from tests.integration.helpers import CurlResult, curl, sha256, wait_for
from tests.origin_server import OriginServer

FIGURE = re.compile(r"\b\d+(\.\d+)? ?(bytes|[KMGT]i?B)\b")  # "2834432 bytes", "2.7 MiB"
SLOW = {"chunk_bytes": 64 * 1024, "chunk_delay_s": 0.5}  # ~8 s a MiB: killed long before the end


def _prefetch(daemon: Daemon, origin_name: str, keys: list[str]) -> int:
    body = json.dumps({"origin": origin_name, "keys": keys}).encode()
    request = urllib.request.Request(daemon.url + "/_/prefetch", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def _in_background(url: str, results: dict[str, CurlResult]) -> threading.Thread:
    worker = threading.Thread(target=lambda: results.update({url: curl(url)}))
    worker.start()
    return worker


def _is_hit(daemon: Daemon, key: str) -> bool:
    """Whether `key` is committed to the index (HEAD answers from the index, not a fill)."""
    return curl(f"{daemon.url}/web/{key}", "-I").headers.get("x-shardcache") == "hit"


def _fills_have_bytes(origin: OriginServer, cache_dir: Path, keys: list[str]) -> bool:
    """Whether the fills of `keys` have all received bytes and written them to disk."""
    written = sum(map(has_written_bytes, partial_files(cache_dir)))
    return all(origin.served[k] for k in keys) and written >= len(keys)


def _read_exactly(daemon: Daemon, path: str, data: bytes) -> CurlResult:
    result = curl(f"{daemon.url}{path}")
    assert (result.exit_code, result.status) == (0, 200), (path, result.status, result.exit_code)
    assert result.sha256 == sha256(data), f"{path}: wrong bytes"
    return result


def _cache_status(daemon: Daemon) -> dict[str, Any]:
    cache: dict[str, Any] = daemon.get_json("/_/status")[1]["cache"]  # type: ignore[assignment]
    return cache


def _assert_verify_clean(cache_dir: Path) -> None:
    code, report, stderr = verify(cache_dir)
    assert code == 0, f"verify exited {code}: {stderr or report}"
    assert report.get("problems") == [], report
    assert count(report["entries"]) == len(entry_files(cache_dir)), report


# -- 1. kill -9 during fills and prefetches ---------------------------------------------------


def test_kill_9_during_fills_and_prefetches_never_serves_partial_data(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    blobs: dict[str, bytes] = {}
    seen: list[CurlResult] = []
    committed: list[str] = []  # keys whose entry was indexed before a kill
    previous_round: list[str] = []
    for round_number in range(10):
        daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=cache_dir)
        assert not partial_files(cache_dir), "start-up must sweep the killed fills' partial files"
        # Whatever the last kill interrupted reads back whole now (the origin is fast again);
        # what was committed before it is still a hit.
        for key in previous_round + committed:
            result = _read_exactly(daemon, f"/web/{key}", blobs[key])
            seen.append(result)
            if key in committed:
                assert result.headers["x-shardcache"] == "hit", key

        rng = random.Random(round_number)
        slow = [f"slow_{round_number}_{i}.tar" for i in range(3)]
        prefetched = [f"pre_{round_number}_{i}.tar" for i in range(2)]
        # Ends anywhere from well before the kill to well after it: in some rounds the kill
        # lands while this fill verifies or commits.
        medium = f"medium_{round_number}.tar"
        fast = f"fast_{round_number}.tar"
        for key in [*slow, *prefetched]:
            blobs[key] = os.urandom(2 * MiB)
            origin.put(key, blobs[key], **SLOW)
        blobs[medium] = os.urandom(MiB)
        origin.put(medium, blobs[medium], chunk_bytes=64 * 1024, chunk_delay_s=rng.uniform(0, 0.08))
        blobs[fast] = os.urandom(512 * 1024)
        origin.put(fast, blobs[fast])

        seen.append(_read_exactly(daemon, f"/web/{fast}", blobs[fast]))
        wait_for("the fast shard's commit", functools.partial(_is_hit, daemon, fast))
        committed.append(fast)

        results: dict[str, CurlResult] = {}
        clients = [_in_background(f"{daemon.url}/web/{k}", results) for k in [*slow, medium]]
        assert _prefetch(daemon, "web", prefetched) == 202
        # Kill only once every slow fill (client and prefetch) has bytes in its partial file.
        wait_for(
            "bytes of every slow fill on disk",
            functools.partial(_fills_have_bytes, origin, cache_dir, [*slow, *prefetched]),
        )
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        for client in clients:
            client.join(60)
        for key in [*slow, medium]:
            result = results[f"{daemon.url}/web/{key}"]
            seen.append(result)
            # The kill cuts a transfer short: curl must see a failure, never a clean short body.
            if result.exit_code == 0:
                assert result.sha256 == sha256(blobs[key]), f"{key}: served partial or wrong"
            else:
                assert len(result.body) < len(blobs[key])
        assert all(results[f"{daemon.url}/web/{k}"].exit_code != 0 for k in slow)
        for key in [*slow, *prefetched, medium]:
            origin.behaviour[key].chunk_delay_s = 0
        previous_round = [*slow, *prefetched, medium]
        assert_no_crash(daemon.log(), seen)

    daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=cache_dir)
    assert not partial_files(cache_dir), "start-up must sweep the killed fills' partial files"
    for key in previous_round + committed:
        seen.append(_read_exactly(daemon, f"/web/{key}", blobs[key]))
    wait_for(
        "every fill committed",
        lambda: all(_is_hit(daemon, k) for k in previous_round),
    )

    # Size accounting matches the files: at least their bytes, at most the index's allowances.
    cache = _cache_status(daemon)
    files = entry_files(cache_dir)
    file_bytes = sum(p.stat().st_size for p in files)
    assert cache["entries"] == len(files) == len(blobs)  # every object read is cached
    assert cache["reserved_bytes"] == 0
    allowance = index_db_bytes(cache_dir) + WAL_ALLOWANCE_BYTES + ENTRY_OVERHEAD_BYTES * len(files)
    assert file_bytes <= cache["size_bytes"] <= file_bytes + allowance, (cache, file_bytes)
    assert daemon.stop() == 0
    assert_no_crash(daemon.log(), seen)
    _assert_verify_clean(cache_dir)


# -- 2. a disk smaller than --cache-size ------------------------------------------------------


def test_a_full_filesystem_evicts_and_keeps_caching(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    blobs = {f"s_{i:03d}.tar": os.urandom(3 * MiB) for i in range(20)}  # 60 MiB: 2.5 disks
    for key, data in blobs.items():
        origin.put(key, data)
    origin.put("late_1.tar", os.urandom(3 * MiB))
    origin.put("late_2.tar", os.urandom(3 * MiB))
    blobs.update({k: origin.objects[k] for k in ("late_1.tar", "late_2.tar")})
    seen: list[CurlResult] = []
    with tmpfs(tmp_path / "cache", 24 * MiB) as cache_dir:
        daemon = start_daemon(
            {"web": origin.url}, "--readahead", "0", cache_size="1GiB", cache_dir=cache_dir
        )
        try:
            # Every miss is cached, also once the filesystem (not the bound) is what is full:
            # read straight after, each is a hit rather than another trip to the origin.
            for round_number in range(2):
                for i in range(20):
                    key = f"s_{i:03d}.tar"
                    first = _read_exactly(daemon, f"/web/{key}", blobs[key])
                    if round_number == 0:
                        assert first.headers["x-shardcache"] == "miss"
                    if first.headers["x-shardcache"] == "miss":
                        again = _read_exactly(daemon, f"/web/{key}", blobs[key])
                        assert again.headers["x-shardcache"] == "hit", f"{key} was not cached"
                        seen.append(again)
                    seen.append(first)
            assert daemon.metric("shardcache_cache_evictions_total") >= 20 - 24 // 3
            assert daemon.metric("shardcache_cache_evicted_bytes_total") >= 12 * 3 * MiB
            # A warning with figures when the disk ran out, not only one at start-up.
            after_first_read = daemon.log().partition("aiohttp.access: GET /web/")[2]
            warnings = [
                line
                for line in after_first_read.splitlines()
                if " WARNING " in line and "filesystem" in line.lower() and FIGURE.search(line)
            ]
            assert warnings, "no warning giving the filesystem's figures when it ran out"

            # Full to the last block with someone else's file: requests still succeed (streamed
            # through, or cached after eviction), and caching resumes once the space is back.
            ballast = cache_dir / "ballast"
            fill_up(ballast)
            for key in ("late_1.tar", "s_000.tar", "s_019.tar"):
                result = _read_exactly(daemon, f"/web/{key}", blobs[key])
                seen.append(result)
                if key == "late_1.tar":
                    assert result.headers["x-shardcache"] == "miss"
            ballast.unlink()
            first = _read_exactly(daemon, "/web/late_2.tar", blobs["late_2.tar"])
            again = _read_exactly(daemon, "/web/late_2.tar", blobs["late_2.tar"])
            assert (first.headers["x-shardcache"], again.headers["x-shardcache"]) == ("miss", "hit")
            seen += [first, again]
        finally:
            code = daemon.stop()
        assert code == 0, daemon.log()[-4000:]
        assert_no_crash(daemon.log(), seen)
        _assert_verify_clean(cache_dir)


# -- 3. the cache dir deleted, or made read-only, under the daemon ----------------------------


def test_a_deleted_cache_dir_streams_through_and_recovers(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    blobs = {f"s_{i}.tar": os.urandom(MiB) for i in range(4)}
    for key, data in blobs.items():
        origin.put(key, data)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=cache_dir)
    seen = [_read_exactly(daemon, "/web/s_0.tar", blobs["s_0.tar"])]
    wait_for("the first shard's commit", functools.partial(_is_hit, daemon, "s_0.tar"))

    shutil.rmtree(cache_dir)

    for key in ("s_0.tar", "s_1.tar", "s_0.tar"):  # cached before, and a miss
        seen.append(_read_exactly(daemon, f"/web/{key}", blobs[key]))
    status, answer = readyz(daemon.url)
    assert status == 503 and str(cache_dir) in str(answer["error"]), answer
    assert not cache_dir.exists(), "the daemon must not recreate a deleted cache dir itself"

    cache_dir.mkdir()
    wait_for("/readyz after the cache dir came back", lambda: readyz(daemon.url)[0] == 200)
    first = _read_exactly(daemon, "/web/s_2.tar", blobs["s_2.tar"])
    again = _read_exactly(daemon, "/web/s_2.tar", blobs["s_2.tar"])
    assert (first.headers["x-shardcache"], again.headers["x-shardcache"]) == ("miss", "hit")
    seen += [first, again, _read_exactly(daemon, "/web/s_0.tar", blobs["s_0.tar"])]
    assert daemon.stop() == 0, daemon.log()[-4000:]
    assert_no_crash(daemon.log(), seen)
    _assert_verify_clean(cache_dir)


def test_a_read_only_cache_dir_streams_through_and_recovers(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    blobs = {f"s_{i}.tar": os.urandom(MiB) for i in range(4)}
    for key, data in blobs.items():
        origin.put(key, data)
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=cache_dir)
    seen = [_read_exactly(daemon, "/web/s_0.tar", blobs["s_0.tar"])]
    wait_for("the first shard's commit", functools.partial(_is_hit, daemon, "s_0.tar"))

    with read_only(cache_dir):
        for key in ("s_0.tar", "s_1.tar", "s_1.tar"):  # cached before, and a miss twice
            seen.append(_read_exactly(daemon, f"/web/{key}", blobs[key]))
        status, answer = readyz(daemon.url)
        assert status == 503 and str(cache_dir) in str(answer["error"]), answer

    wait_for("/readyz once writable again", lambda: readyz(daemon.url)[0] == 200)
    first = _read_exactly(daemon, "/web/s_2.tar", blobs["s_2.tar"])
    again = _read_exactly(daemon, "/web/s_2.tar", blobs["s_2.tar"])
    assert (first.headers["x-shardcache"], again.headers["x-shardcache"]) == ("miss", "hit")
    seen += [first, again]
    assert daemon.stop() == 0, daemon.log()[-4000:]
    assert_no_crash(daemon.log(), seen)
    _assert_verify_clean(cache_dir)


# -- 4. a verified fill whose commit fails -----------------------------------------------------


def _open_files(daemon: Daemon, cache_dir: Path) -> list[str]:
    """Files under `cache_dir` that the daemon holds open, apart from its index and lock: none
    once no response and no fill is under way."""
    targets = []
    for fd in Path(f"/proc/{daemon.process.pid}/fd").iterdir():
        try:
            targets.append(os.readlink(fd))
        except FileNotFoundError:  # closed meanwhile
            continue
    own = re.compile(r"/v1/(lock|index/cache\.db(-wal|-shm)?)$")
    return [t for t in targets if t.startswith(f"{cache_dir}/") and not own.search(t)]


def test_a_commit_that_finds_the_disk_full_strands_nothing(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """The fill's data blocks are claimed (fallocate) before its body arrives; the filesystem
    then fills up, so the fill completes and verifies but its index write finds no space."""
    data = os.urandom(MiB)
    body_released = threading.Event()
    origin.put("s.tar", data, hold=body_released)
    origin.put("t.tar", os.urandom(MiB))
    seen: list[CurlResult] = []
    with tmpfs(tmp_path / "cache", 16 * MiB) as cache_dir:
        daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=cache_dir)
        try:
            results: dict[str, CurlResult] = {}
            client = _in_background(f"{daemon.url}/web/s.tar", results)
            wait_for(
                "the fill's space claimed",
                lambda: any(p.stat().st_blocks * 512 >= MiB for p in partial_files(cache_dir)),
            )
            ballast = cache_dir / "ballast"
            fill_up(ballast)
            body_released.set()
            client.join(60)
            (result,) = results.values()
            # The body was verified: failing to index it must not fail the client.
            assert (result.exit_code, result.status) == (0, 200) and result.sha256 == sha256(data)
            wait_for(
                "the fill's end",
                lambda: (
                    _cache_status(daemon)["reserved_bytes"] == 0 and not partial_files(cache_dir)
                ),
            )
            assert _cache_status(daemon)["entries"] == len(entry_files(cache_dir)), (
                "an entry file without a row"
            )
            wait_for(
                "the daemon to close the fill's file", lambda: not _open_files(daemon, cache_dir)
            )
            ballast.unlink()

            # Nothing is stranded: the same key (and another) is fetched and cached again.
            seen.append(result)
            for key in ("s.tar", "t.tar"):
                first = _read_exactly(daemon, f"/web/{key}", origin.objects[key])
                again = _read_exactly(daemon, f"/web/{key}", origin.objects[key])
                assert again.headers["x-shardcache"] == "hit", f"{key} was not cached"
                seen += [first, again]
        finally:
            code = daemon.stop()
        assert code == 0, daemon.log()[-4000:]
        assert_no_crash(daemon.log(), seen)
        _assert_verify_clean(cache_dir)


# -- 5. what an attack on the fixes found ------------------------------------------------------


def test_a_commit_refused_by_a_read_only_dir_gives_its_space_back(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """The directory turns read-only while a fill is in flight: the client still gets the
    verified bytes, and the fill's reservation and partial file do not outlive it."""
    data = os.urandom(2 * MiB)
    body_released = threading.Event()
    origin.put("s.tar", data, hold=body_released)
    origin.put("t.tar", os.urandom(MiB))
    cache_dir = tmp_path / "cache"
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=cache_dir)
    results: dict[str, CurlResult] = {}
    client = _in_background(f"{daemon.url}/web/s.tar", results)
    wait_for("the fill's partial file", lambda: bool(partial_files(cache_dir)))
    with read_only(cache_dir):
        body_released.set()
        client.join(60)
        (result,) = results.values()
        assert (result.exit_code, result.status) == (0, 200) and result.sha256 == sha256(data)
        wait_for("the fill's end", lambda: "could not cache it" in daemon.log())
    wait_for("/readyz once writable again", lambda: readyz(daemon.url)[0] == 200)
    wait_for("the reservation given back", lambda: _cache_status(daemon)["reserved_bytes"] == 0)
    wait_for("the partial file removed", lambda: not partial_files(cache_dir))
    seen = [result]
    for key in ("s.tar", "t.tar"):  # space is not held by a dead reservation: both cache
        seen.append(_read_exactly(daemon, f"/web/{key}", origin.objects[key]))
        again = _read_exactly(daemon, f"/web/{key}", origin.objects[key])
        assert again.headers["x-shardcache"] == "hit", f"{key} was not cached"
        seen.append(again)
    assert daemon.stop() == 0, daemon.log()[-4000:]
    assert_no_crash(daemon.log(), seen)
    _assert_verify_clean(cache_dir)


def test_a_disk_full_to_the_last_block_still_evicts(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Something else fills the disk to zero: SQLite cannot write an eviction, yet cached
    entries are the room a new fill needs; /readyz says the disk is full meanwhile."""
    blobs = {f"s_{i}.tar": os.urandom(2 * MiB) for i in range(5)}
    for key, data in blobs.items():
        origin.put(key, data)
    seen: list[CurlResult] = []
    with tmpfs(tmp_path / "cache", 16 * MiB) as cache_dir:
        daemon = start_daemon(
            {"web": origin.url}, "--readahead", "0", cache_dir=cache_dir, cache_size="1GiB"
        )
        try:
            for key in ("s_0.tar", "s_1.tar", "s_2.tar"):
                seen.append(_read_exactly(daemon, f"/web/{key}", blobs[key]))
            wait_for("three entries", lambda: _cache_status(daemon)["entries"] == 3)
            fill_up(cache_dir / "ballast")  # kept: only evictions can make room now
            wait_for("/readyz to name the full disk", lambda: readyz(daemon.url)[0] == 503)
            assert "full" in str(readyz(daemon.url)[1]["error"])
            first = _read_exactly(daemon, "/web/s_3.tar", blobs["s_3.tar"])
            again = _read_exactly(daemon, "/web/s_3.tar", blobs["s_3.tar"])
            assert (first.headers["x-shardcache"], again.headers["x-shardcache"]) == (
                "miss",
                "hit",
            )
            seen += [first, again]
            (cache_dir / "ballast").unlink()
        finally:
            code = daemon.stop()
        assert code == 0, daemon.log()[-4000:]
        assert_no_crash(daemon.log(), seen)
        _assert_verify_clean(cache_dir)


def test_an_unmounted_cache_dir_is_not_recreated_on_the_disk_underneath(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    data = os.urandom(MiB)
    origin.put("s.tar", data)
    mount_point = tmp_path / "cache"
    seen: list[CurlResult] = []
    with tmpfs(mount_point, 16 * MiB):
        daemon = start_daemon({"web": origin.url}, "--readahead", "0", cache_dir=mount_point)
        seen.append(_read_exactly(daemon, "/web/s.tar", data))
        subprocess.run(["umount", "-l", str(mount_point)], check=True)
        try:
            wait_for("/readyz to say unmounted", lambda: readyz(daemon.url)[0] == 503)
            assert "another filesystem" in str(readyz(daemon.url)[1]["error"])
            for _ in range(2):  # served, streamed through, never written underneath
                result = _read_exactly(daemon, "/web/s.tar", data)
                assert result.headers["x-shardcache"] == "miss"
                seen.append(result)
            assert list(mount_point.iterdir()) == []
            assert daemon.stop() == 0, daemon.log()[-4000:]
        finally:
            daemon.stop()
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount_point)], check=True)
    assert_no_crash(daemon.log(), seen)
