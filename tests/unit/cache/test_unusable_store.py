"""A store that fails every call (its index cannot be opened: out of file descriptors) costs
the log one WARNING a minute per kind, not two per request; every request is still served,
streamed through from the origin. Before, 20 reads wrote 40 WARNINGs (163 + 61 lines in 45 s
at `ulimit -n 200`)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardcache.cache.entry import Entry, Reservation
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.errors import CacheError
from shardcache.observer import NullObserver
from tests.unit.cache.test_shard_cache import read_all
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

MiB = 1024 * 1024
READS = 20


class UnopenableIndexStore(Store):
    """Every lookup and reservation fails as a store whose index cannot be opened does."""

    def lookup(self, key: str) -> Entry | None:
        raise CacheError("cannot read the index: unable to open database file")

    def reserve(
        self, size_bytes: int, key: str | None = None, read_now: bool = False
    ) -> Reservation:
        raise CacheError("cannot make room: unable to open database file")


@pytest.fixture
async def cache(tmp_path: Path) -> AsyncIterator[ShardCache]:
    origin = FakeOrigin()
    for n in range(READS):
        origin.put(f"s{n}.tar", os.urandom(4096))
    store = UnopenableIndexStore(tmp_path / "cache", 8 * MiB)
    shard_cache = ShardCache(
        store, {"fake": origin}, make_policy(retries=2, base_s=0.001), NullObserver()
    )
    yield shard_cache
    await shard_cache.aclose()
    store.close()


async def test_a_broken_index_warns_once_a_minute_per_kind(
    cache: ShardCache, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="shardcache"):
        for n in range(READS):
            lease = await cache.open("fake", f"s{n}.tar")
            assert len(await read_all(lease)) == 4096  # served, streamed through
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "treating" in warnings[0] and "the cache is unusable" in warnings[1]
    repeats = [r for r in caplog.records if "unable to open database file" in r.getMessage()]
    assert len(repeats) == 2 * READS  # the rest at DEBUG
