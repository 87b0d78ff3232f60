"""Hits checked per block before their last byte (issue 34, item 1): a byte flipped in a cached
file is never served as a clean hit, whole or ranged; the entry is dropped and counted, and the
next read is a correct miss. `--verify-hits off` serves hits as before (the scrub's job)."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable
from pathlib import Path

from shardcache.cache.entry import EntryMeta
from shardcache.cache.store import Store
from shardcache.checksums import crc32c
from tests.daemon_process import Daemon
from tests.integration.disk_helpers import MiB, entry_files, flip_byte
from tests.integration.helpers import curl, sha256, wait_for
from tests.origin_server import OriginServer


def _cached(daemon: Daemon, origin: OriginServer, key: str, size: int) -> tuple[bytes, Path]:
    """Put `key` on the origin and read it through the daemon (a miss); return its bytes and
    its file in the cache once committed."""
    data = os.urandom(size)
    origin.put(key, data)
    before = set(entry_files(daemon.cache_dir))
    miss = curl(f"{daemon.url}/o/{key}")
    assert miss.headers["x-shardcache"] == "miss" and miss.sha256 == sha256(data)
    wait_for("the fill's commit", lambda: set(entry_files(daemon.cache_dir)) - before)
    (path,) = set(entry_files(daemon.cache_dir)) - before
    return data, path


def _corrupt_hits(daemon: Daemon) -> float:
    return daemon.metric("shardcache_hit_corrupt_total", origin="o")


def test_a_flipped_byte_aborts_the_hit_drops_the_entry_and_the_next_read_is_a_miss(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0")
    key = "shards/rot-000.tar"
    data, path = _cached(daemon, origin, key, 17 * MiB + 7)  # three checked pieces
    flip_byte(path, 3 * MiB + 3)  # before any hit: none has checked a block of it yet

    rotten = curl(f"{daemon.url}/o/{key}")
    assert rotten.headers["x-shardcache"] == "hit"
    assert rotten.exit_code != 0, "a rotten hit ended cleanly"  # curl 18: a partial transfer
    assert len(rotten.body) < len(data)
    assert _corrupt_hits(daemon) == 1
    warnings = [line for line in daemon.log().splitlines() if " WARNING " in line]
    assert any(key in line and "digests" in line for line in warnings), warnings
    again = curl(f"{daemon.url}/o/{key}")
    assert again.exit_code == 0 and again.headers["x-shardcache"] == "miss"
    assert again.sha256 == sha256(data)

    def is_a_clean_hit() -> bool:
        read = curl(f"{daemon.url}/o/{key}")
        assert read.exit_code == 0 and read.sha256 == sha256(data)
        return read.headers["x-shardcache"] == "hit"

    wait_for("a hit of the refetched entry", is_a_clean_hit)
    assert daemon.metric("shardcache_hit_checked_bytes_total") >= len(data)
    assert _corrupt_hits(daemon) == 1


def test_a_range_over_a_flipped_block_fails_and_one_over_clean_blocks_does_not(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0")
    key = "rot-001.tar"
    data, path = _cached(daemon, origin, key, 6 * MiB)
    flip_byte(path, 4 * MiB + 100)  # block 4

    clean = curl(f"{daemon.url}/o/{key}", "-r", f"{MiB}-{3 * MiB - 1}")  # blocks 1-2
    assert clean.exit_code == 0 and clean.status == 206
    assert clean.headers["x-shardcache"] == "hit" and clean.body == data[MiB : 3 * MiB]
    assert _corrupt_hits(daemon) == 0

    rotten = curl(f"{daemon.url}/o/{key}", "-r", f"{4 * MiB + 50}-{4 * MiB + 199}")
    assert rotten.headers["x-shardcache"] == "hit" and rotten.exit_code != 0
    assert _corrupt_hits(daemon) == 1
    again = curl(f"{daemon.url}/o/{key}", "-r", f"{4 * MiB + 50}-{4 * MiB + 199}")
    assert again.exit_code == 0 and again.headers["x-shardcache"] == "miss"
    assert again.body == data[4 * MiB + 50 : 4 * MiB + 200]


def test_with_verify_hits_off_a_hit_is_served_as_before(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0", "--verify-hits", "off")
    key = "rot-002.tar"
    data, path = _cached(daemon, origin, key, 2 * MiB)
    flip_byte(path, 12345)

    served = curl(f"{daemon.url}/o/{key}")  # the scrub's to find: nothing checks this hit
    assert served.exit_code == 0 and served.headers["x-shardcache"] == "hit"
    assert served.sha256 != sha256(data) and len(served.body) == len(data)
    assert _corrupt_hits(daemon) == 0
    assert daemon.metric("shardcache_hit_checked_bytes_total") == 0


def test_many_readers_of_a_hot_shard_check_each_block_once_a_window(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0", "--verify-hits-window", "600")
    key = "hot-000.tar"
    data, _ = _cached(daemon, origin, key, 8 * MiB + 1)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        reads = list(pool.map(lambda _: curl(f"{daemon.url}/o/{key}"), range(16)))
    assert all(r.exit_code == 0 and r.sha256 == sha256(data) for r in reads)
    assert [r.headers["x-shardcache"] for r in reads] == ["hit"] * 16
    assert daemon.metric("shardcache_hit_checked_bytes_total") == len(data)  # not 16 times


def _cached_before_block_digests(cache_dir: Path, url: str, data: bytes) -> Path:
    """Commit `data` as an entry of a version that kept a whole-object digest only."""
    store = Store(cache_dir, 64 * MiB)
    try:
        before = set(entry_files(cache_dir))
        reservation = store.reserve(len(data))
        os.pwrite(reservation.fd, data, 0)
        meta = EntryMeta(len(data), digests={"crc32c": f"{crc32c(data):08x}"})
        store.commit(reservation, url, meta)
        os.close(reservation.fd)
        (path,) = set(entry_files(cache_dir)) - before
        return path
    finally:
        store.close()


def test_an_entry_cached_before_block_digests_is_checked_whole_on_its_first_hit(
    start_daemon: Callable[..., Daemon], origin: OriginServer, tmp_path: Path
) -> None:
    clean, rotten = os.urandom(3 * MiB + 5), os.urandom(2 * MiB)
    origin.put("old-000.tar", clean)
    origin.put("old-001.tar", rotten)
    cache_dir = tmp_path / "cache"
    _cached_before_block_digests(cache_dir, f"{origin.url}/old-000.tar", clean)
    path = _cached_before_block_digests(cache_dir, f"{origin.url}/old-001.tar", rotten)
    flip_byte(path, MiB + 1)
    daemon = start_daemon({"o": origin.url}, "--scrub-rate", "0", cache_dir=cache_dir)

    ranged = curl(f"{daemon.url}/o/old-000.tar", "-r", "0-99")
    assert ranged.exit_code == 0 and ranged.headers["x-shardcache"] == "hit"
    assert ranged.body == clean[:100]
    assert daemon.metric("shardcache_hit_checked_bytes_total") == len(clean)  # whole, once
    again = curl(f"{daemon.url}/o/old-000.tar", "-r", f"{2 * MiB}-{2 * MiB + 9}")
    assert again.exit_code == 0 and again.body == clean[2 * MiB : 2 * MiB + 10]

    bad = curl(f"{daemon.url}/o/old-001.tar", "-r", "0-99")  # the flip is in another block
    assert bad.headers["x-shardcache"] == "hit" and bad.exit_code != 0
    assert _corrupt_hits(daemon) == 1
    refetched = curl(f"{daemon.url}/o/old-001.tar")
    assert refetched.headers["x-shardcache"] == "miss" and refetched.sha256 == sha256(rotten)
