"""Per-block CRC-32C digests: taken in any pieces, encoded in the metadata, checked per block."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardcache.cache.blocks import (
    BLOCK_BYTES,
    BlockHasher,
    block_count,
    check_blocks,
    covering,
    decode,
    encode,
)
from shardcache.checksums import crc32c

SIZE = 3 * BLOCK_BYTES + 1234


def _digests_of(data: bytes) -> bytes:
    return b"".join(
        crc32c(data[at : at + BLOCK_BYTES]).to_bytes(4, "big")
        for at in range(0, len(data), BLOCK_BYTES)
    )


@pytest.mark.parametrize("piece", [1 << 20, 4096, 777_777, SIZE])
def test_digests_are_per_block_whatever_the_pieces(piece: int) -> None:
    data = os.urandom(SIZE)
    hasher = BlockHasher()
    for at in range(0, SIZE, piece):
        hasher.update(memoryview(data)[at : at + piece])
    assert hasher.digests() == _digests_of(data)
    assert len(hasher.digests()) == 4 * block_count(SIZE) == 16


def test_an_empty_body_has_no_blocks() -> None:
    assert BlockHasher().digests() == b"" and block_count(0) == 0
    assert decode(encode(b""), 0) == b""


def test_decode_refuses_digests_that_do_not_fit_the_size() -> None:
    digests = _digests_of(os.urandom(SIZE))
    assert decode(encode(digests), SIZE) == digests
    with pytest.raises(ValueError, match="3 block digests for 4 blocks"):
        decode(encode(digests[:-4]), SIZE)
    with pytest.raises(ValueError, match="base64"):
        decode("not base64!", SIZE)


def test_covering_names_the_blocks_a_range_touches() -> None:
    assert covering(0, 0) == range(0)
    assert covering(0, 1) == range(0, 1)
    assert covering(BLOCK_BYTES - 1, BLOCK_BYTES + 1) == range(0, 2)
    assert covering(BLOCK_BYTES, 2 * BLOCK_BYTES) == range(1, 2)
    assert covering(0, SIZE) == range(0, 4)


def test_check_blocks_finds_a_flipped_byte_only_in_its_block(tmp_path: Path) -> None:
    data = bytearray(os.urandom(SIZE))
    digests = _digests_of(bytes(data))
    data[2 * BLOCK_BYTES + 5] ^= 0x01
    path = tmp_path / "entry"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert check_blocks(fd, [0, 1, 3], digests, SIZE) is None
        assert check_blocks(fd, [1, 2, 3], digests, SIZE) == 2
    finally:
        os.close(fd)


def test_check_blocks_says_a_short_file_is_not_the_entry(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    path = tmp_path / "entry"
    path.write_bytes(data[: 3 * BLOCK_BYTES + 10])
    fd = os.open(path, os.O_RDONLY)
    try:
        assert check_blocks(fd, [3], _digests_of(data), SIZE) == 3
    finally:
        os.close(fd)
