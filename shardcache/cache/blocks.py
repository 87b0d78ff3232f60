"""Per-block digests of an entry: a CRC-32C for each BLOCK_BYTES (1 MiB) of its file, kept at commit
from the spans the landings hashed as they wrote, so a hit (whole or a range) checks only the
blocks it sends. Pure but for `check_blocks`, which reads a file (blocking: call it on a worker
thread)."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence

from shardcache.checksums import crc32c
from shardcache.crc_spans import (
    BLOCK_BYTES as BLOCK_BYTES,
)  # landings cut their spans at the same blocks

DIGEST_BYTES = 4  # one big-endian CRC-32C per block
READ_BYTES = 256 << 10  # a hit's check reads blocks in pieces this large (`check_blocks`)


class BlockHasher:
    """Takes the CRC-32C of each BLOCK_BYTES block of a body fed in order, in any pieces."""

    def __init__(self) -> None:
        self._digests = bytearray()
        self._crc = 0
        self._in_block = 0  # bytes of the current block hashed so far

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            piece = view[: BLOCK_BYTES - self._in_block]
            self._crc = crc32c(piece, self._crc)
            self._in_block += len(piece)
            view = view[len(piece) :]
            if self._in_block == BLOCK_BYTES:
                self._close_block()

    def _close_block(self) -> None:
        self._digests += self._crc.to_bytes(DIGEST_BYTES, "big")
        self._crc, self._in_block = 0, 0

    def digests(self) -> bytes:
        """One digest per block of everything fed so far (the last block may be short)."""
        if self._in_block:
            return bytes(self._digests) + self._crc.to_bytes(DIGEST_BYTES, "big")
        return bytes(self._digests)


def block_count(size_bytes: int) -> int:
    return -(-size_bytes // BLOCK_BYTES)


def encode(digests: bytes) -> str:
    """The digests as kept in an entry's metadata (base64)."""
    return base64.b64encode(digests).decode()


def decode(text: str, size_bytes: int) -> bytes:
    """The digests kept for an entry of `size_bytes`; raises ValueError when they are not
    base64 or not one per block (metadata that cannot be trusted to check anything)."""
    try:
        digests = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"block digests are not base64: {exc}") from None
    if len(digests) != block_count(size_bytes) * DIGEST_BYTES:
        raise ValueError(
            f"{len(digests) // DIGEST_BYTES} block digests for {block_count(size_bytes)} blocks"
        )
    return digests


def covering(start: int, end: int) -> range:
    """The blocks that hold bytes [start, end) (empty for an empty range)."""
    if end <= start:
        return range(0)
    return range(start // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1)


def check_blocks(fd: int, blocks: Sequence[int], digests: bytes, size_bytes: int) -> int | None:
    """Read each of `blocks` of `fd` and return the first whose CRC-32C does not match
    `digests`, or whose bytes are not all there; None when all match. Blocking. Raises OSError
    for a read error.

    One reused READ_BYTES buffer: it stays in the CPU's cache between the copy out of the page
    cache and the CRC (0.13 CPU s/GB here against 0.17 with a 1 MiB buffer). `mmap` would skip
    the copy (0.10), but a file truncated under the mapping kills the process with SIGBUS."""
    buffer = memoryview(bytearray(READ_BYTES))
    for block in blocks:
        offset = block * BLOCK_BYTES
        end = min(offset + BLOCK_BYTES, size_bytes)
        crc = 0
        while offset < end:
            count = os.preadv(fd, [buffer[: end - offset]], offset)
            if count == 0:
                return block  # the file ends early: it is not the entry it was
            crc = crc32c(buffer[:count], crc)
            offset += count
        expected = int.from_bytes(digests[block * DIGEST_BYTES : (block + 1) * DIGEST_BYTES])
        if crc != expected:
            return block
    return None
