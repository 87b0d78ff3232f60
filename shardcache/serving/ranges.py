"""Parse one HTTP `Range` header into a `ByteRange` (pure).

RFC 9110 §14.2: a server may ignore a Range it does not support, so multi-range and malformed
headers give None (serve the whole object); only a syntactically valid single range that starts
past the end raises RangeNotSatisfiable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardcache.errors import RangeNotSatisfiable

# ASCII whitespace only: the hit lane reads a field as latin-1 and aiohttp as UTF-8 with
# surrogates, and NEL or NBSP (0x85, 0xA0) must mean the same to both (not a space).
_SINGLE = re.compile(r"^\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*$", re.IGNORECASE | re.ASCII)
# Past any object's size; also keeps int() off numbers of thousands of digits (slow, and over
# Python's 4,300-digit limit a ValueError).
_MAX_DIGITS = 18


def _offset(digits: str) -> int:
    return int(digits) if len(digits) <= _MAX_DIGITS else 10**_MAX_DIGITS


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes `start` .. `end` inclusive, as in Content-Range."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size_bytes: int) -> str:
        return f"bytes {self.start}-{self.end}/{size_bytes}"


def parse_range(header: str | None, size_bytes: int) -> ByteRange | None:
    """Return the range `header` selects from an object of `size_bytes`, or None for all of it.

    Raises RangeNotSatisfiable when the range starts at or past the end, or is a zero suffix.
    """
    if not header:
        return None
    match = _SINGLE.match(header)
    if match is None:
        return None  # multi-range or malformed: ignored, the whole object is served
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix range: the last N bytes
        suffix = _offset(last)
        if suffix == 0 or size_bytes == 0:
            raise RangeNotSatisfiable(size_bytes)
        return ByteRange(max(0, size_bytes - suffix), size_bytes - 1)
    start = _offset(first)
    if last and _offset(last) < start:
        return None  # RFC 9110 §14.1.1: an invalid range-spec; ignore the header
    if start >= size_bytes:
        raise RangeNotSatisfiable(size_bytes)
    end = _offset(last) if last else size_bytes - 1
    return ByteRange(start, min(end, size_bytes - 1))
