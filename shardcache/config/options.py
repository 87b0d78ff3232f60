"""The options table: every setting's flag, environment variable, TOML key, default, parser
and whether a reload applies it. The one place a setting's default lives: `Settings` has none
of its own, and code that needs a default outside a loaded Settings reads it here (`default`).

Every row becomes `--name-with-dashes`, `SHARDCACHE_NAME` and the TOML key `name`; each row's
parser (what a raw value must look like) is in `parsers`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardcache.config.parsers import (
    parse_choice,
    parse_count,
    parse_listen,
    parse_listen_backlog,
    parse_optional_path,
    parse_optional_size,
    parse_path,
    parse_prefetch_concurrency,
    parse_receivers,
    parse_scrub_rate,
    parse_seconds,
    parse_seconds_or_zero,
    parse_speed,
    parse_switch,
    parse_token,
    parse_workers,
)
from shardcache.units import parse_size

ENV_PREFIX = "SHARDCACHE_"
EVICTION_POLICIES = ("auto", "plan", "lru")
LOG_LEVELS = ("debug", "info", "warning", "error")


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
        "listen", parse_listen, "127.0.0.1:8470", "address to serve on", "HOST:PORT", reloads=False
    ),
    Option(
        "cache_dir",
        parse_path,
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
        parse_choice(LOG_LEVELS),
        "info",
        "debug, info, warning or error",
        "LVL",
        reloads=True,
    ),
    Option(
        "log_format", parse_choice(("text", "json")), "text", "text or json", "FMT", reloads=True
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
        parse_count,
        4,
        "retries per fill, resuming with Range",
        "N",
        reloads=False,
    ),
    Option(
        "origin_min_speed",
        parse_speed,
        "16KiB",
        "bytes/s an origin body must average over each read timeout; 0 = no floor",
        "SIZE",
        reloads=False,
    ),
    Option(
        "prefetch_concurrency",
        parse_prefetch_concurrency,
        "auto",
        "prefetches at once; auto = as many as raise what the origin delivers (8, up to 32)",
        "N",
        reloads=False,
    ),
    Option(
        "prefetch_max_bytes",
        parse_optional_size,
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
        parse_count,
        2,
        "next N shards to queue on a read: the reading plan's next where a plan covers the "
        "origin, else numbered neighbours, warmed (not pinned); 0 = off",
        "N",
        reloads=False,
    ),
    Option(
        "eviction",
        parse_choice(EVICTION_POLICIES),
        "auto",
        "auto (loaders' plans where posted, else LRU that spares what is in use: no thrash "
        "when the dataset outgrows the cache), plan (plans, else plain LRU) or lru",
        "POLICY",
        reloads=False,
    ),
    Option(
        "origin_connections",
        parse_workers,
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
        parse_workers,
        64,
        "threads for blocking work (disk writes, S3 reads, the index)",
        "N",
        reloads=False,
    ),
    Option(
        "receivers",
        parse_receivers,
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
        parse_workers,
        1024,
        "client connections at once; more are answered 503 and closed",
        "N",
        reloads=False,
    ),
    Option(
        "listen_backlog",
        parse_listen_backlog,
        "auto",
        "connections the kernel queues until the daemon accepts them (a burst of loader "
        "workers starting); auto = the system's bound, net.core.somaxconn",
        "N",
        reloads=False,
    ),
    Option(
        "max_connections_per_client",
        parse_workers,
        256,
        "connections at once from one client address (a neighbour cannot take every slot)",
        "N",
        reloads=False,
    ),
    Option(
        "scrub_rate",
        parse_scrub_rate,
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
        parse_switch,
        "on",
        "check each hit's bytes against the CRC-32C per 1 MiB block kept at commit before its "
        "last byte leaves (a mismatch aborts the response and drops the entry); off: hits as "
        "fast as sendfile goes, bit rot caught by the scrub only",
        "BOOL",
        reloads=False,
    ),
    Option(
        "verify_hits_window",
        parse_seconds_or_zero,
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
        "s3_buckets_on_demand",
        parse_count,
        0,
        "S3 buckets an S3 client may name with no origin configured for them, each made an "
        "origin s3://BUCKET (the daemon's own credentials) on first use; 0: configured origins "
        "only",
        "N",
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
        parse_optional_path,
        "",
        "read the admin token from this file",
        "FILE",
        reloads=False,
    ),
    Option(
        "require_token_for_reads",
        parse_switch,
        False,
        "shard reads need the token too",
        is_switch=True,
        reloads=False,
    ),
    Option(
        "s3_access_keys_file",
        parse_optional_path,
        "",
        "S3 access keys (one `KEY_ID SECRET` a line) whose SigV4 signature lets an S3 client "
        "read where reads need the token",
        "FILE",
        reloads=False,
    ),
    Option(
        "insecure_no_token",
        parse_switch,
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
    `FetchPolicy` in a test), so no second copy of it is written down. KeyError if unknown."""
    option = _BY_NAME[name]
    return option.parse(option.default)
