"""Block digests from the landings' spans: combined per block, read back where they do not
tile a block, all read back when they disagree with the body's CRC-32C."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.cache import body_check
from shardcache.cache.blocks import block_count, decode
from shardcache.cache.body_check import block_digests, combine_spans, whole_crc
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.checksums import crc32c
from shardcache.crc_spans import BLOCK_BYTES, Span, SpanHasher
from shardcache.observer import NullObserver
from tests.unit.cache.test_shard_cache import read_all, settle
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

SIZE = 4 * BLOCK_BYTES + 12345  # a short final block
DATA = os.urandom(SIZE)


def _digests_of(data: bytes) -> bytes:
    return b"".join(
        crc32c(data[at : at + BLOCK_BYTES]).to_bytes(4, "big")
        for at in range(0, len(data), BLOCK_BYTES)
    )


def _landed(start: int, end: int, piece: int = 300_000) -> list[Span]:
    """The spans one landing of [start, end) reports (a segment of its own)."""
    hasher = SpanHasher(start, 0)
    for at in range(start, end, piece):
        hasher.update(DATA[at : min(at + piece, end)])
    hasher.close()
    return hasher.take()


@pytest.fixture
def fd(tmp_path: Path) -> Iterator[int]:
    path = tmp_path / "body"
    path.write_bytes(DATA)
    descriptor = os.open(path, os.O_RDONLY)
    yield descriptor
    os.close(descriptor)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The blocks read back, by call."""
    calls: list[list[int]] = []
    real = body_check.read_blocks

    def counted(fd: int, blocks: list[int], size: int, digests: bytearray) -> None:
        calls.append(list(blocks))
        real(fd, blocks, size, digests)

    monkeypatch.setattr(body_check, "read_blocks", counted)
    return calls


def test_segments_straddling_blocks_landed_out_of_order_combine_without_reading(
    fd: int, reads: list[list[int]]
) -> None:
    """Segments cut off the block boundaries (2 MiB + 700,001 ...), their spans reported in
    the order the segments finished, not the file's: every block from spans, nothing read."""
    cuts = [0, 2 * BLOCK_BYTES, 2 * BLOCK_BYTES + 700_001, 3 * BLOCK_BYTES + 5, SIZE]
    segments = [_landed(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    spans = [span for segment in reversed(segments) for span in segment]
    digests = asyncio.run(block_digests(spans, fd, SIZE, crc32c(DATA)))
    assert digests == _digests_of(DATA)
    assert reads == []
    assert whole_crc(digests, SIZE) == crc32c(DATA)


def test_a_block_the_spans_leave_a_gap_in_is_read_back_alone(
    fd: int, reads: list[list[int]]
) -> None:
    """A landing that failed inside block 2 after reporting some of it, resumed from its
    last report: block 2's spans leave a gap; it alone is read back."""
    failed = _landed(0, 2 * BLOCK_BYTES)  # its open span of block 2 never reported
    resumed = _landed(2 * BLOCK_BYTES + 400_000, SIZE)
    digests = asyncio.run(block_digests(failed + resumed, fd, SIZE, crc32c(DATA)))
    assert digests == _digests_of(DATA)
    assert reads == [[2]]


@pytest.mark.parametrize(
    "spans",
    [
        [(0, BLOCK_BYTES, 0)],  # a wrong CRC: combines, but not into the body's
        [(0, 1000, crc32c(DATA[:1000])), (500, BLOCK_BYTES - 500, 0)],  # overlapping
        [(SIZE - 10, 20, 0)],  # past the body's end
    ],
)
def test_spans_that_do_not_add_up_are_never_kept(
    fd: int, reads: list[list[int]], spans: list[Span]
) -> None:
    """Whatever the spans say, the digests kept are those of the bytes in the file."""
    everything = _landed(0, SIZE)
    block = spans[0][0] // BLOCK_BYTES
    spans = [span for span in everything if span[0] // BLOCK_BYTES != block] + spans
    digests = asyncio.run(block_digests(spans, fd, SIZE, crc32c(DATA)))
    assert digests == _digests_of(DATA)
    assert reads  # read back: the block alone, or every block


def test_combine_spans_says_which_blocks_it_cannot_tell() -> None:
    digests, missing = combine_spans(_landed(BLOCK_BYTES, SIZE), SIZE)
    assert missing == [0]
    assert digests[4:] == _digests_of(DATA)[4:]
    assert combine_spans([], 0) == (bytearray(), [])
    assert block_count(SIZE) == 5


@pytest.mark.parametrize("with_md5", [False, True])
@pytest.mark.parametrize("fails_at", [None, 2 * BLOCK_BYTES + 300_000])
async def test_a_fill_keeps_the_landings_block_digests_reading_nothing_back(
    tmp_path: Path, reads: list[list[int]], with_md5: bool, fails_at: int | None
) -> None:
    """Segments of 700,001 bytes over 4 connections (most blocks straddle two, landed out of
    order): the entry's block digests are the body's, and no block was read back for them;
    but the one a connection failed in, once (resumed from its last report)."""
    origin = FakeOrigin(accepts_ranges=True)
    origin.put("a.tar", DATA, with_md5=with_md5)
    if fails_at is not None:
        origin.fail_at["a.tar"], origin.failures_left["a.tar"] = fails_at, 1
    store = Store(tmp_path / "cache", 16 * BLOCK_BYTES)
    policy = make_policy(
        retries=2,
        base_s=0.001,
        connections=4,
        segment_bytes=700_001,
        first_segment_bytes=700_001,
    )
    cache = ShardCache(store, {"fake": origin}, policy, NullObserver())
    try:
        assert await read_all(await cache.open("fake", "a.tar")) == DATA
        await settle(cache)
        meta = await asyncio.to_thread(store.peek, "fake://fake/a.tar")
        assert meta is not None
        assert decode(meta.block_crc32c, SIZE) == _digests_of(DATA)
        assert reads == ([] if fails_at is None else [[fails_at // BLOCK_BYTES]])
    finally:
        await cache.aclose()
        store.close()
