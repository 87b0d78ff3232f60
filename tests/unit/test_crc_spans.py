"""CRC-32C algebra of spans, against awscrt's CRC-32C of the bytes themselves."""

from __future__ import annotations

import os
import random

import pytest

from shardcache.checksums import crc32c, crc32c_combine
from shardcache.crc_spans import BLOCK_BYTES, SpanHasher, crc32c_shift, crc32c_tail

DATA = os.urandom(3 * BLOCK_BYTES + 4321)


@pytest.mark.parametrize("cut", [0, 1, 4321, BLOCK_BYTES - 1, BLOCK_BYTES, 2 * BLOCK_BYTES + 7])
def test_shift_and_tail_agree_with_the_crc_of_the_bytes(cut: int) -> None:
    head, tail = DATA[:cut], DATA[cut : cut + BLOCK_BYTES]
    assert crc32c_shift(crc32c(head), len(tail)) ^ crc32c(tail) == crc32c(head + tail)
    assert crc32c_tail(crc32c(head + tail), crc32c(head), len(tail)) == crc32c(tail)


def test_the_block_shift_by_tables_is_the_general_one() -> None:
    rng = random.Random(7)
    block = DATA[:BLOCK_BYTES]
    for _ in range(200):
        crc = rng.getrandbits(32)  # awscrt carries a CRC on over the block's bytes
        assert crc32c_shift(crc, BLOCK_BYTES) ^ crc32c(block) == crc32c(block, crc)
        assert crc32c_shift(crc, BLOCK_BYTES) == crc32c_combine(crc, 0, BLOCK_BYTES)


@pytest.mark.parametrize("start", [0, 1000, BLOCK_BYTES, BLOCK_BYTES + 17])
@pytest.mark.parametrize("piece", [1, 65536, 700_000, 2 * BLOCK_BYTES + 5])
def test_a_landing_cuts_its_spans_at_block_boundaries_and_at_its_end(
    start: int, piece: int
) -> None:
    """A landing from `start` (its segment's CRC so far carried on), fed in any pieces: the
    running CRC is the segment's, and the spans tile what it wrote, each with its bytes' CRC."""
    segment_start = start // 2
    hasher = SpanHasher(start, crc32c(DATA[segment_start:start]))
    for at in range(start, len(DATA), piece):
        hasher.update(DATA[at : at + piece])
    hasher.close()
    assert hasher.crc == crc32c(DATA[segment_start:])
    spans = hasher.take()
    assert [offset for offset, _, _ in spans][0] == start
    ends = [offset + length for offset, length, _ in spans]
    assert [offset for offset, _, _ in spans][1:] == ends[:-1] and ends[-1] == len(DATA)
    assert all(end % BLOCK_BYTES == 0 for end in ends[:-1])
    assert all(crc == crc32c(DATA[o : o + n]) for o, n, crc in spans)
    assert hasher.take() == []


def test_a_span_is_only_taken_once_complete() -> None:
    hasher = SpanHasher(0, 0)
    hasher.update(DATA[: BLOCK_BYTES - 1])
    assert hasher.take() == []
    hasher.update(DATA[BLOCK_BYTES - 1 : BLOCK_BYTES + 1])
    assert hasher.take() == [(0, BLOCK_BYTES, crc32c(DATA[:BLOCK_BYTES]))]
