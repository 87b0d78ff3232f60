"""Fixtures the cache's fill and flight tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.cache.store import Store

MiB = 1 << 20


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An 8 MiB store that must be sound and hold no reservation when the test ends (a fill
    that kept its reservation, or left the index and files disagreeing, fails the test).
    Test modules with a store of their own override it."""
    store = Store(tmp_path / "cache", 8 * MiB)
    yield store
    assert store.check() == []
    assert store.usage().reserved_bytes == 0, "a fill kept its reservation"
    store.close()
