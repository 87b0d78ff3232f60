"""The value parsers the OPTIONS table names (`options`; `origins` keeps its per-origin ones and
borrows `parse_seconds`): each takes the raw value (a str from a flag or the environment, any
TOML type) and returns it typed, or raises ValueError saying what was expected, which the loader
reports naming the setting. The bounds a value must keep (`MAX_*`, `MIN_TOKEN_CHARS`) live beside
the parser that holds it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shardcache.units import parse_size

MIN_TOKEN_CHARS = 16


def parse_listen(value: Any) -> tuple[str, int]:
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_seconds(value: Any) -> float:
    try:
        seconds = float(str(value).strip().removesuffix("s"))
    except ValueError:
        raise ValueError(f"expected seconds, got {value!r}") from None
    if not 0 < seconds < math.inf:  # also refuses nan, which every comparison fails
        raise ValueError(f"must be positive, got {value!r}")
    return seconds


def parse_count(value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return number


def parse_choice(choices: Sequence[str]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return parse


def parse_workers(value: Any) -> int:
    number = parse_count(value)
    if number == 0:
        raise ValueError("must be at least 1")
    return number


MAX_RECEIVERS = 256  # receiving processes; past the cores, more only cost memory


def parse_receivers(value: Any) -> int:
    """`auto` (0: one per core this process may run on, at most 16) or a number, 1 or more."""
    if str(value).strip().lower() == "auto":
        return 0
    number = parse_workers(value)
    if number > MAX_RECEIVERS:
        raise ValueError(f"must be at most {MAX_RECEIVERS}")
    return number


MAX_PREFETCH_CONCURRENCY = 256  # each may hold --origin-connections requests


def parse_prefetch_concurrency(value: Any) -> int | None:
    """`auto` (None: tuned) or a fixed number of prefetches at once."""
    if str(value).strip().lower() == "auto":
        return None
    wanted = f"expected auto or a whole number from 1 to {MAX_PREFETCH_CONCURRENCY}, got {value!r}"
    if isinstance(value, bool):
        raise ValueError(wanted)
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(wanted) from None
    if not 1 <= number <= MAX_PREFETCH_CONCURRENCY:
        raise ValueError(wanted)
    return number


MAX_LISTEN_BACKLOG = 65535


def parse_listen_backlog(value: Any) -> int | None:
    """`auto` (None: the system's bound, net.core.somaxconn) or a queue length, 1 or more."""
    if str(value).strip().lower() == "auto":
        return None
    number = parse_workers(value)
    if number > MAX_LISTEN_BACKLOG:
        raise ValueError(f"must be at most {MAX_LISTEN_BACKLOG}")
    return number


def parse_optional_size(value: Any) -> int | None:
    return None if str(value).strip().lower() == "auto" else parse_size(value)


def parse_path(value: Any) -> Path:
    return Path(os.path.expanduser(str(value)))


def parse_optional_path(value: Any) -> Path | None:
    return parse_path(value) if str(value).strip() else None


def parse_switch(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


MAX_MIN_SPEED = 1 << 30  # a floor above 1 GiB/s per connection no upstream could meet


def parse_speed(value: Any) -> int:
    """A speed floor in bytes per second ("16KiB", "1MB", 4096), or 0 for none."""
    if str(value).strip() == "0":
        return 0
    speed = parse_size(value)
    if speed > MAX_MIN_SPEED:
        raise ValueError(f"{value!r} is more than one connection carries (at most 1GiB)")
    return speed


def parse_scrub_rate(value: Any) -> int:
    """Bytes per second the scrub may read ("64MiB", "64MiB/s", 1048576), or 0 for off."""
    text = str(value).strip().removesuffix("/s")
    return 0 if text == "0" else parse_size(text)


def parse_seconds_or_zero(value: Any) -> float:
    """Seconds, or 0 for none."""
    if str(value).strip().removesuffix("s") in ("0", "0.0"):
        return 0.0
    return parse_seconds(value)


def parse_token(value: Any) -> str | None:
    """A token is printable ASCII without spaces, at least 16 characters; "" means none."""
    if not isinstance(value, str):  # TOML: a number or a list is a mistake, not a token
        raise ValueError("must be a string")
    text = value.strip()
    if not text:
        return None
    if len(text) < MIN_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in text):
        # The message must not echo the value: it is a secret, however badly formed.
        raise ValueError(
            f"must be at least {MIN_TOKEN_CHARS} printable ASCII characters without spaces "
            "(try: openssl rand -hex 32)"
        )
    return text
