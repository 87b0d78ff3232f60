"""`HitChecker`: a hit's blocks checked against the digests kept at commit; the cost bound (each
block of an entry version read at most once per window, however many readers); old entries
(a whole-object digest only) checked whole once, then per block."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.cache.blocks import BLOCK_BYTES, BlockHasher, encode
from shardcache.cache.entry import EntryMeta
from shardcache.cache.hit_check import HitChecker
from shardcache.checksums import crc32c
from shardcache.errors import IntegrityError

SIZE = 20 * BLOCK_BYTES + 99  # 21 blocks: three batches of 8


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture
def fd(tmp_path: Path, data: bytes) -> Iterator[int]:
    path = tmp_path / "entry"
    path.write_bytes(data)
    opened = os.open(path, os.O_RDWR)
    yield opened
    os.close(opened)


def _meta(data: bytes) -> EntryMeta:
    hasher = BlockHasher()
    hasher.update(data)
    return EntryMeta(len(data), block_crc32c=encode(hasher.digests()))


def _old_meta(data: bytes) -> EntryMeta:
    return EntryMeta(len(data), digests={"crc32c": f"{crc32c(data):08x}"})


def _flip(fd: int, at: int) -> None:
    byte = os.pread(fd, 1, at)
    os.pwrite(fd, bytes([byte[0] ^ 0x40]), at)


async def test_a_sound_entry_passes_and_a_range_reads_only_its_blocks(fd: int, data: bytes) -> None:
    checker = HitChecker(clock=Clock())
    meta = _meta(data)
    assert await checker.check("o/a", fd, meta, BLOCK_BYTES + 5, 3 * BLOCK_BYTES) == 2 * BLOCK_BYTES
    assert await checker.check("o/a", fd, meta, 0, SIZE) == SIZE - 2 * BLOCK_BYTES  # the rest


async def test_a_flipped_byte_fails_its_block_only_and_the_version_is_forgotten(
    fd: int, data: bytes
) -> None:
    checker = HitChecker(clock=Clock())
    meta = _meta(data)
    _flip(fd, 9 * BLOCK_BYTES + 1)
    await checker.check("o/a", fd, meta, 0, 9 * BLOCK_BYTES)  # blocks 0-8: clean
    with pytest.raises(IntegrityError, match="o/a"):
        await checker.check("o/a", fd, meta, 9 * BLOCK_BYTES, 9 * BLOCK_BYTES + 10)
    _flip(fd, 9 * BLOCK_BYTES + 1)  # a refetch of the same bytes: checked again from scratch
    assert await checker.check("o/a", fd, meta, 0, SIZE) == SIZE


async def test_sequential_readers_within_the_window_read_each_block_once(
    fd: int, data: bytes
) -> None:
    clock = Clock()
    checker = HitChecker(window_s=2.0, clock=clock)
    meta = _meta(data)
    for _ in range(10):
        await checker.check("o/a", fd, meta, 0, SIZE)
        clock.now += 0.1
    assert checker.read_bytes == SIZE
    clock.now += 2.0  # past the window: the next reader checks again
    assert await checker.check("o/a", fd, meta, 0, SIZE) == SIZE
    assert checker.read_bytes == 2 * SIZE


async def test_concurrent_readers_share_one_check_of_each_block(fd: int, data: bytes) -> None:
    checker = HitChecker(clock=Clock())
    meta = _meta(data)
    reads = await asyncio.gather(*(checker.check("o/a", fd, meta, 0, SIZE) for _ in range(32)))
    assert checker.read_bytes == SIZE == sum(reads)


async def test_concurrent_readers_of_a_rotten_block_all_fail(fd: int, data: bytes) -> None:
    checker = HitChecker(clock=Clock())
    meta = _meta(data)
    _flip(fd, 3)
    outcomes = await asyncio.gather(
        *(checker.check("o/a", fd, meta, 0, SIZE) for _ in range(8)), return_exceptions=True
    )
    assert all(isinstance(outcome, IntegrityError) for outcome in outcomes), outcomes
    assert checker.read_bytes == 8 * BLOCK_BYTES  # the first batch, once


async def test_an_old_entry_is_checked_whole_once_then_per_block(fd: int, data: bytes) -> None:
    clock = Clock()
    checker = HitChecker(window_s=2.0, clock=clock)
    meta = _old_meta(data)
    assert checker.can_check(meta) and not checker.can_check(EntryMeta(SIZE))
    assert await checker.check("o/old", fd, meta, 0, 10) == SIZE  # whole, for a 10-byte range
    clock.now += 5.0
    assert await checker.check("o/old", fd, meta, 0, 10) == BLOCK_BYTES  # its block only


async def test_a_rotten_old_entry_fails_its_whole_check(fd: int, data: bytes) -> None:
    checker = HitChecker(clock=Clock())
    meta = _old_meta(data)
    _flip(fd, SIZE - 1)
    with pytest.raises(IntegrityError, match="whole object"):
        await checker.check("o/old", fd, meta, 0, 10)


async def test_with_no_window_every_hit_checks_but_concurrent_ones_share(
    fd: int, data: bytes
) -> None:
    clock = Clock()
    checker = HitChecker(window_s=0.0, clock=clock)
    meta = _meta(data)
    await checker.check("o/a", fd, meta, 0, SIZE)
    clock.now += 0.001
    await checker.check("o/a", fd, meta, 0, SIZE)
    assert checker.read_bytes == 2 * SIZE
    clock.now += 0.001
    await asyncio.gather(*(checker.check("o/a", fd, meta, 0, SIZE) for _ in range(8)))
    assert checker.read_bytes == 3 * SIZE


async def test_unreadable_block_digests_fail_the_hit(fd: int, data: bytes) -> None:
    checker = HitChecker(clock=Clock())
    meta = EntryMeta(SIZE, block_crc32c=encode(b"\0" * 8))  # two digests for 21 blocks
    with pytest.raises(IntegrityError, match="unusable"):
        await checker.check("o/a", fd, meta, 0, 10)


async def test_is_checked_only_for_blocks_checked_within_the_window(fd: int, data: bytes) -> None:
    """`is_checked` (a hit sent whole, with no check to wait for) holds exactly when `check`
    would read nothing: every block it covers found sound within the window."""
    clock = Clock()
    checker = HitChecker(window_s=2.0, clock=clock)
    meta = _meta(data)
    assert not checker.is_checked("k", fd, meta, 0, BLOCK_BYTES)  # never checked
    await checker.check("k", fd, meta, 0, BLOCK_BYTES)
    assert checker.is_checked("k", fd, meta, 0, BLOCK_BYTES)
    assert checker.is_checked("k", fd, meta, 10, 20)
    assert not checker.is_checked("k", fd, meta, 0, BLOCK_BYTES + 1)  # the next block: not yet
    clock.now += 2.5
    assert not checker.is_checked("k", fd, meta, 0, BLOCK_BYTES)  # the window passed
    assert await checker.check("k", fd, meta, 0, BLOCK_BYTES) == BLOCK_BYTES


async def test_is_checked_is_per_file_version(fd: int, data: bytes, tmp_path: Path) -> None:
    """A refetched file (another inode, the same digests) has checked nothing yet."""
    checker = HitChecker(window_s=2.0, clock=Clock())
    meta = _meta(data)
    await checker.check("k", fd, meta, 0, SIZE)
    other = tmp_path / "refetched"
    other.write_bytes(data)
    refetched = os.open(other, os.O_RDONLY)
    try:
        assert not checker.is_checked("k", refetched, meta, 0, SIZE)
    finally:
        os.close(refetched)


async def test_an_old_entry_is_never_checked_before_its_whole_check(fd: int, data: bytes) -> None:
    checker = HitChecker(window_s=2.0, clock=Clock())
    old = EntryMeta(len(data), digests={"crc32c": f"{crc32c(data):08x}"})
    assert not checker.is_checked("k", fd, old, 0, 10)
    await checker.check("k", fd, old, 0, 10)
    assert checker.is_checked("k", fd, old, 0, SIZE)  # the whole check covered every block
