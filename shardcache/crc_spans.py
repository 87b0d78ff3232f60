"""The CRC-32C of spans of a file, cut at BLOCK_BYTES boundaries: what a landing takes of the bytes
it writes (`SpanHasher`), so the cache keeps one CRC-32C per block without reading the body back.
Each span's CRC is the running CRC with the earlier one taken off (`crc32c_tail`): the bytes are
hashed once, as they land. Pure: no I/O."""

from __future__ import annotations

import functools

from shardcache.checksums import crc32c, crc32c_combine

BLOCK_BYTES = 1 << 20  # a hit checks its blocks (`cache.blocks`); a landing cuts spans at them

# (offset, length, CRC-32C) of bytes [offset, offset + length) of a file, inside one block.
Span = tuple[int, int, int]


@functools.cache
def _shift_tables(length: int) -> tuple[tuple[int, ...], ...]:
    """Four 256-entry tables for `crc32c_shift(·, length)`: the shift is linear over GF(2),
    so it is the XOR of the shifts of each of the value's four bytes."""
    bits = [crc32c_combine(1 << bit, 0, length) for bit in range(32)]
    tables = []
    for byte in range(4):
        table = [0] * 256
        for value in range(1, 256):
            low = value & -value  # built from the value less its lowest bit
            table[value] = table[value ^ low] ^ bits[8 * byte + low.bit_length() - 1]
        tables.append(tuple(table))
    return tuple(tables)


def crc32c_shift(crc: int, length: int) -> int:
    """What `crc` (of some bytes A) contributes to the CRC-32C of A followed by `length` more
    bytes: crc32c(A+B) == crc32c_shift(crc32c(A), len(B)) ^ crc32c(B)."""
    if crc == 0 or length == 0:
        return crc
    if length != BLOCK_BYTES:
        return crc32c_combine(crc, 0, length)
    t0, t1, t2, t3 = _shift_tables(BLOCK_BYTES)
    return t0[crc & 0xFF] ^ t1[(crc >> 8) & 0xFF] ^ t2[(crc >> 16) & 0xFF] ^ t3[crc >> 24]


def crc32c_tail(whole: int, head: int, length: int) -> int:
    """The CRC-32C of the last `length` bytes B of A+B, from crc32c(A+B) and crc32c(A)."""
    return whole ^ crc32c_shift(head, length)


class SpanHasher:
    """The running CRC-32C of one landing, carried on from `crc` (that of its segment's bytes
    before `position`), and the CRC-32C of each span it wrote, cut at block boundaries and at
    `close`. Feed it the bytes in the order they are written at `position` on."""

    def __init__(self, position: int, crc: int) -> None:
        self.position = position
        self.crc = crc
        self._start, self._start_crc = position, crc  # where the open span began
        self._spans: list[Span] = []

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            part = view[: BLOCK_BYTES - self.position % BLOCK_BYTES]
            self.crc = crc32c(part, self.crc)
            self.position += len(part)
            view = view[len(part) :]
            if self.position % BLOCK_BYTES == 0:
                self._close_span()

    def close(self) -> None:
        """The landing wrote its last byte: its open span (a block's head) is complete."""
        if self.position > self._start:
            self._close_span()

    def take(self) -> list[Span]:
        """The spans completed since the last `take`."""
        spans, self._spans = self._spans, []
        return spans

    def _close_span(self) -> None:
        length = self.position - self._start
        self._spans.append((self._start, length, crc32c_tail(self.crc, self._start_crc, length)))
        self._start, self._start_crc = self.position, self.crc


__all__ = ["BLOCK_BYTES", "Span", "SpanHasher", "crc32c_shift", "crc32c_tail"]
