"""The options table: every setting's flag, environment variable, TOML key, default, parser
and whether a reload applies it. The one place a setting's default lives: `Settings` has none
of its own, and code that needs a default outside a loaded Settings reads it here (`default`).

Every row becomes `--name-with-dashes`, `SHARDCACHE_NAME` and the TOML key `name`.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardcache.units import parse_size

ENV_PREFIX = "SHARDCACHE_"
EVICTION_POLICIES = ("auto", "plan", "lru")
LOG_LEVELS = ("debug", "info", "warning", "error")
MIN_TOKEN_CHARS = 16

# -- parsers: each takes the raw value (str from flags/env, any TOML type) -------------------


def _parse_listen(value: Any) -> tuple[str, int]:
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


def _parse_count(value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return number


def _parse_choice(choices: Sequence[str]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return parse


def _parse_workers(value: Any) -> int:
    number = _parse_count(value)
    if number == 0:
        raise ValueError("must be at least 1")
    return number


MAX_RECEIVERS = 256  # receiving processes; past the cores, more only cost memory


def _parse_receivers(value: Any) -> int:
    """`auto` (0: one per core this process may run on, at most 16) or a number, 1 or more."""
    if str(value).strip().lower() == "auto":
        return 0
    number = _parse_workers(value)
    if number > MAX_RECEIVERS:
        raise ValueError(f"must be at most {MAX_RECEIVERS}")
    return number


MAX_PREFETCH_CONCURRENCY = 256  # each may hold --origin-connections requests


def _parse_prefetch_concurrency(value: Any) -> int | None:
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


def _parse_listen_backlog(value: Any) -> int | None:
    """`auto` (None: the system's bound, net.core.somaxconn) or a queue length, 1 or more."""
    if str(value).strip().lower() == "auto":
        return None
    number = _parse_workers(value)
    if number > MAX_LISTEN_BACKLOG:
        raise ValueError(f"must be at most {MAX_LISTEN_BACKLOG}")
    return number


def _parse_optional_size(value: Any) -> int | None:
    return None if str(value).strip().lower() == "auto" else parse_size(value)


def _parse_path(value: Any) -> Path:
    return Path(os.path.expanduser(str(value)))


def _parse_optional_path(value: Any) -> Path | None:
    return _parse_path(value) if str(value).strip() else None


def _parse_switch(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


MAX_MIN_SPEED = 1 << 30  # a floor above 1 GiB/s per connection no upstream could meet


def _parse_speed(value: Any) -> int:
    """A speed floor in bytes per second ("16KiB", "1MB", 4096), or 0 for none."""
    if str(value).strip() == "0":
        return 0
    speed = parse_size(value)
    if speed > MAX_MIN_SPEED:
        raise ValueError(f"{value!r} is more than one connection carries (at most 1GiB)")
    return speed


def _parse_scrub_rate(value: Any) -> int:
    """Bytes per second the scrub may read ("64MiB", "64MiB/s", 1048576), or 0 for off."""
    text = str(value).strip().removesuffix("/s")
    return 0 if text == "0" else parse_size(text)


def _parse_seconds_or_zero(value: Any) -> float:
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


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str = ""
    is_switch: bool = False  # a flag without a value: `--require-token-for-reads`
    # Whether SIGHUP applies a changed value (`Daemon.reload`); a change to any other setting
    # is reported as needing a restart (`settings_needing_restart`). Given for every row.
    reloads: bool = field(kw_only=True)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "listen", _parse_listen, "127.0.0.1:8470", "address to serve on", "HOST:PORT", reloads=False
    ),
    Option(
        "cache_dir",
        _parse_path,
        "~/.cache/shardcache",
        "where cached shards live",
        "PATH",
        reloads=False,
    ),
    Option(
        "cache_size",
        parse_size,
        "20GiB",
        "disk bound: 500MiB, 20GiB, 1TiB or bytes",
        "SIZE",
        reloads=False,
    ),
    Option(
        "log_level",
        _parse_choice(LOG_LEVELS),
        "info",
        "debug, info, warning or error",
        "LVL",
        reloads=True,
    ),
    Option(
        "log_format", _parse_choice(("text", "json")), "text", "text or json", "FMT", reloads=True
    ),
    Option("origin_connect_timeout", parse_seconds, 10.0, "seconds to connect", "S", reloads=False),
    Option(
        "origin_read_timeout",
        parse_seconds,
        30.0,
        "seconds without a byte = stalled",
        "S",
        reloads=False,
    ),
    Option(
        "origin_retries",
        _parse_count,
        4,
        "retries per fill, resuming with Range",
        "N",
        reloads=False,
    ),
    Option(
        "origin_min_speed",
        _parse_speed,
        "16KiB",
        "bytes/s an origin body must average over each read timeout; 0 = no floor",
        "SIZE",
        reloads=False,
    ),
    Option(
        "prefetch_concurrency",
        _parse_prefetch_concurrency,
        "auto",
        "prefetches at once; auto = as many as raise what the origin delivers (8, up to 32)",
        "N",
        reloads=False,
    ),
    Option(
        "prefetch_max_bytes",
        _parse_optional_size,
        "auto",
        "prefetched-but-unread bytes at most; auto = a quarter of the cache",
        "SIZE",
        reloads=False,
    ),
    Option(
        "prefetch_pin_max_seconds",
        parse_seconds,
        300.0,
        "seconds a look-ahead pin lasts at most when no loader reads its shard (the job's pace "
        "sets a shorter bound where a plan names it)",
        "S",
        reloads=False,
    ),
    Option(
        "readahead",
        _parse_count,
        2,
        "next N shards to queue on a read: the reading plan's next where a plan covers the "
        "origin, else numbered neighbours, warmed (not pinned); 0 = off",
        "N",
        reloads=False,
    ),
    Option(
        "eviction",
        _parse_choice(EVICTION_POLICIES),
        "auto",
        "auto (loaders' plans where posted, else LRU that spares what is in use: no thrash "
        "when the dataset outgrows the cache), plan (plans, else plain LRU) or lru",
        "POLICY",
        reloads=False,
    ),
    Option(
        "origin_connections",
        _parse_workers,
        8,
        "connections per fill: large objects come as parallel ranged segments",
        "N",
        reloads=False,
    ),
    Option(
        "segment_size",
        parse_size,
        "16MiB",
        "bytes per ranged segment of a fill",
        "SIZE",
        reloads=False,
    ),
    Option(
        "shutdown_grace",
        parse_seconds,
        30.0,
        "seconds in-flight responses get to finish on SIGTERM (a second signal: none)",
        "S",
        reloads=False,
    ),
    Option(
        "worker_threads",
        _parse_workers,
        64,
        "threads for blocking work (disk writes, S3 reads, the index)",
        "N",
        reloads=False,
    ),
    Option(
        "receivers",
        _parse_receivers,
        "auto",
        "processes that receive misses from origins (TLS, writing, CRC): a miss's bytes use "
        "this many cores; auto = one per core available (a container's CPU limit counts), at "
        "most 16; a number: 1 to 256",
        "N",
        reloads=True,
    ),
    Option(
        "client_idle_timeout",
        parse_seconds,
        60.0,
        "seconds a connection may wait between requests (keep-alive) before it is closed",
        "S",
        reloads=False,
    ),
    Option(
        "client_header_timeout",
        parse_seconds,
        15.0,
        "seconds a client may take to send a request's headers once it has begun",
        "S",
        reloads=False,
    ),
    Option(
        "client_body_timeout",
        parse_seconds,
        30.0,
        "seconds to receive a request body",
        "S",
        reloads=False,
    ),
    Option(
        "client_send_timeout",
        parse_seconds,
        120.0,
        "seconds a client may read nothing of a response before its connection is closed",
        "S",
        reloads=False,
    ),
    Option(
        "max_connections",
        _parse_workers,
        1024,
        "client connections at once; more are answered 503 and closed",
        "N",
        reloads=False,
    ),
    Option(
        "listen_backlog",
        _parse_listen_backlog,
        "auto",
        "connections the kernel queues until the daemon accepts them (a burst of loader "
        "workers starting); auto = the system's bound, net.core.somaxconn",
        "N",
        reloads=False,
    ),
    Option(
        "max_connections_per_client",
        _parse_workers,
        256,
        "connections at once from one client address (a neighbour cannot take every slot)",
        "N",
        reloads=False,
    ),
    Option(
        "scrub_rate",
        _parse_scrub_rate,
        # ~1-3% of a local NVMe drive's 1.5-3.5 GB/s and <1% of a core (CRC-32C): a 20 GiB
        # cache is re-read every 11 minutes; 0 = off. Lower it on a throughput-capped volume.
        "32MiB",
        "bytes/s the background scrub re-reads cached shards at, to drop bit rot before it is "
        "served; 0 = off (a few percent of a local SSD; lower it on a throughput-capped volume)",
        "SIZE",
        reloads=False,
    ),
    Option(
        "verify_hits",
        _parse_switch,
        "on",
        "check each hit's bytes against the CRC-32C per 1 MiB block kept at commit before its "
        "last byte leaves (a mismatch aborts the response and drops the entry); off: hits as "
        "fast as sendfile goes, bit rot caught by the scrub only",
        "BOOL",
        reloads=False,
    ),
    Option(
        "verify_hits_window",
        _parse_seconds_or_zero,
        # Bounds a hot shard's cost: each block checked at most once per window however
        # many readers send it; rot is served clean for at most this long after a check.
        2.0,
        "seconds a block a hit checked counts as checked for the next hits of that entry "
        "(each block is read at most once per window, however many readers); 0: every hit "
        "checks every block it sends (concurrent hits still share one check)",
        "S",
        reloads=False,
    ),
    Option(
        "admin_token",
        parse_token,
        "",
        "bearer token for /_/ (required to listen beyond loopback); prefer the env or a file",
        "TOKEN",
        reloads=False,
    ),
    Option(
        "admin_token_file",
        _parse_optional_path,
        "",
        "read the admin token from this file",
        "FILE",
        reloads=False,
    ),
    Option(
        "require_token_for_reads",
        _parse_switch,
        False,
        "shard reads need the token too",
        is_switch=True,
        reloads=False,
    ),
    Option(
        "insecure_no_token",
        _parse_switch,
        False,
        "allow a non-loopback listen without a token",
        is_switch=True,
        reloads=False,
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config`, `--origin` and one flag per option; unset flags stay None."""
    parser.add_argument("--config", metavar="FILE", help="TOML file (env SHARDCACHE_CONFIG)")
    parser.add_argument(
        "--origin",
        action="append",
        metavar="NAME=URL",
        help="origin to serve at /NAME/ (repeatable): s3://BUCKET[/PREFIX], http(s)://HOST[/PREFIX]"
        ", file:///PATH (env SHARDCACHE_ORIGIN, comma-separated)",
    )
    for option in OPTIONS:
        if option.is_switch:
            parser.add_argument(
                option.flag,
                dest=option.name,
                action="store_const",
                const=True,
                help=f"{option.help} (env {option.env}=true)",
            )
            continue
        default = option.default if option.default != "" else "none"
        parser.add_argument(
            option.flag,
            dest=option.name,
            metavar=option.metavar or None,
            help=f"{option.help} (default {default}; env {option.env})",
        )


_BY_NAME = {option.name: option for option in OPTIONS}


def default(name: str) -> Any:
    """The parsed default of the option `name`, for a value built without loaded Settings (a
    `RetryPolicy()` in a test), so no second copy of it is written down. KeyError if unknown."""
    option = _BY_NAME[name]
    return option.parse(option.default)
