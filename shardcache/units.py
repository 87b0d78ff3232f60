"""Byte sizes for people: `parse_size("20GiB")` and `format_size(n)` (pure)."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)  # not "１６"


def parse_size(text: str | int) -> int:
    """Return the number of bytes in `text` ("500MiB", "20GiB", "1TiB", "1.5GB", "4096").

    Raises ValueError with a readable message for anything else, including zero or negatives.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"size must be positive, got {text}")
        return text
    match = _SIZE.match(str(text))
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size (use e.g. 500MiB, 20GiB, 1TiB or bytes)")
    number, unit = match.groups()
    scaled = float(number) * _UNITS[unit.lower()]
    if not math.isfinite(scaled):  # int() of an infinity raises OverflowError, not ValueError
        raise ValueError(f"{str(text)[:40]!r}… is too large a size")
    size = int(scaled)
    if size <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return size


def format_size(size_bytes: float) -> str:
    """Return `size_bytes` in binary units with three significant figures ("1.5 GiB"), and
    whole numbers from 1000 up ("1000 MiB", never "1e+03 MiB")."""
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B" or abs(value) >= 1000:
                return f"{value:.0f} {unit}"
            return f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
