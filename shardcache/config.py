"""Settings: one frozen, typed object, validated once at load time.

Every setting has a flag (`--cache-size`), an environment variable (`SHARDCACHE_CACHE_SIZE`) and a
TOML key (`cache_size`) of the same name, all generated from `OPTIONS`, where every default lives.
Precedence: flag > environment > file > default. Origins merge by name with the same precedence.
This is the only module that reads `os.environ` for the daemon.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import socket
import ssl
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from shardcache.errors import ConfigError, InvalidKey
from shardcache.keys import validate_origin_name
from shardcache.units import parse_size

ENV_PREFIX = "SHARDCACHE_"
ORIGIN_SCHEMES = ("s3", "http", "https", "file")
EVICTION_POLICIES = ("auto", "plan", "lru")
LOG_LEVELS = ("debug", "info", "warning", "error")
MIN_TOKEN_CHARS = 16
T = TypeVar("T")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class OriginSpec:
    """One configured origin. Header values may hold secrets, so `repr` never shows them.

    `follow_redirects` (http(s) origins only, TOML only): follow a 3xx whose target has the
    origin URL's own scheme, host and port; any other redirect is an error either way.

    The rest are TOML only (see `origins.upstreams`): `mirrors` are asked before `url`, the
    object's home, which names it in the cache (`urls = [mirror, …, home]` in the file);
    `tier` lists shardcache tier daemons (base URLs) that share the keys out by rendezvous
    hashing, `tier_dns` is one URL whose host resolves to them, again every `tier_refresh`
    seconds; the tier serves this origin under `tier_origin` (default: the same name), and
    gets `tier_headers`, never `headers` (which may be the object store's credentials).
    `max_requests` and `max_requests_per_second` cap what the origin is sent; `ca_file` adds
    the certificates its https:// URLs are verified against (besides the system's).
    """

    name: str
    url: str
    endpoint_url: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    follow_redirects: bool = False
    mirrors: tuple[str, ...] = ()
    tier: tuple[str, ...] = ()
    tier_dns: str | None = None
    tier_origin: str | None = None
    tier_refresh_s: float = 30.0
    tier_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    max_requests: int | None = None
    max_requests_per_second: float | None = None
    ca_file: str | None = None  # PEM certificates to trust for this origin's https:// URLs

    @property
    def urls(self) -> tuple[str, ...]:
        """Every configured URL in the order they are asked, the home last."""
        return (*self.mirrors, self.url)

    @property
    def has_upstreams(self) -> bool:
        """Whether objects may come from somewhere besides `url` (a mirror or a tier)."""
        return bool(self.mirrors or self.tier or self.tier_dns)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme


@dataclass(frozen=True, slots=True)
class Settings:
    listen_host: str
    listen_port: int
    cache_dir: Path
    cache_size: int
    origins: tuple[OriginSpec, ...]
    log_level: str
    log_format: Literal["text", "json"]
    origin_connect_timeout: float
    origin_read_timeout: float
    origin_retries: int
    origin_min_speed: int = 16 << 10
    prefetch_concurrency: int | None = None  # None: auto, tuned to what the origin delivers
    prefetch_max_bytes: int | None = None  # None: a quarter of cache_size
    readahead: int = 2
    eviction: str = "auto"
    origin_connections: int = 8
    segment_size: int = 16 << 20
    worker_threads: int = 64
    receivers: int = 0  # receiving processes; 0: one per core available (origins.receivers)
    shutdown_grace: float = 30.0
    client_idle_timeout: float = 60.0
    client_header_timeout: float = 15.0
    client_body_timeout: float = 30.0
    client_send_timeout: float = 120.0
    max_connections: int = 1024
    max_connections_per_client: int = 256
    admin_token: str | None = field(default=None, repr=False)  # never shown, never logged
    require_token_for_reads: bool = False
    insecure_no_token: bool = False
    scrub_rate: int = 0  # bytes/s; OPTIONS holds the default (a Settings built by hand: off)
    config: Path | None = None

    @property
    def prefetch_budget_bytes(self) -> int:
        return self.prefetch_max_bytes or self.cache_size // 4

    @property
    def is_loopback(self) -> bool:
        """Whether only this machine can reach the listen address (127.0.0.0/8, ::1)."""
        if self.listen_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.listen_host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to anything

    @property
    def listen(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"


# -- parsers: each takes the raw value (str from flags/env, any TOML type) -------------------


def _parse_listen(value: Any) -> tuple[str, int]:
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _parse_seconds(value: Any) -> float:
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


def _parse_token(value: Any) -> str | None:
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

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("listen", _parse_listen, "127.0.0.1:8470", "address to serve on", "HOST:PORT"),
    Option("cache_dir", _parse_path, "~/.cache/shardcache", "where cached shards live", "PATH"),
    Option("cache_size", parse_size, "20GiB", "disk bound: 500MiB, 20GiB, 1TiB or bytes", "SIZE"),
    Option("log_level", _parse_choice(LOG_LEVELS), "info", "debug, info, warning or error", "LVL"),
    Option("log_format", _parse_choice(("text", "json")), "text", "text or json", "FMT"),
    Option("origin_connect_timeout", _parse_seconds, 10.0, "seconds to connect", "S"),
    Option("origin_read_timeout", _parse_seconds, 30.0, "seconds without a byte = stalled", "S"),
    Option("origin_retries", _parse_count, 4, "retries per fill, resuming with Range", "N"),
    Option(
        "origin_min_speed",
        _parse_speed,
        "16KiB",
        "bytes/s an origin body must average over each read timeout; 0 = no floor",
        "SIZE",
    ),
    Option(
        "prefetch_concurrency",
        _parse_prefetch_concurrency,
        "auto",
        "prefetches at once; auto = as many as raise what the origin delivers (8, up to 32)",
        "N",
    ),
    Option(
        "prefetch_max_bytes",
        _parse_optional_size,
        "auto",
        "prefetched-but-unread bytes at most; auto = a quarter of the cache",
        "SIZE",
    ),
    Option("readahead", _parse_count, 2, "next N numbered shards to queue on a read; 0 = off", "N"),
    Option(
        "eviction",
        _parse_choice(EVICTION_POLICIES),
        "auto",
        "auto (loaders' plans where posted, else LRU that spares what is in use: no thrash "
        "when the dataset outgrows the cache), plan (plans, else plain LRU) or lru",
        "POLICY",
    ),
    Option(
        "origin_connections",
        _parse_workers,
        8,
        "connections per fill: large objects come as parallel ranged segments",
        "N",
    ),
    Option("segment_size", parse_size, "16MiB", "bytes per ranged segment of a fill", "SIZE"),
    Option(
        "shutdown_grace",
        _parse_seconds,
        30.0,
        "seconds in-flight responses get to finish on SIGTERM (a second signal: none)",
        "S",
    ),
    Option(
        "worker_threads",
        _parse_workers,
        64,
        "threads for blocking work (disk writes, S3 reads, the index)",
        "N",
    ),
    Option(
        "receivers",
        _parse_receivers,
        "auto",
        "processes that receive misses from origins (TLS, writing, CRC): a miss's bytes use "
        "this many cores; auto = one per core available, at most 16",
        "N",
    ),
    Option(
        "client_idle_timeout",
        _parse_seconds,
        60.0,
        "seconds a connection may wait between requests (keep-alive) before it is closed",
        "S",
    ),
    Option(
        "client_header_timeout",
        _parse_seconds,
        15.0,
        "seconds a client may take to send a request's headers once it has begun",
        "S",
    ),
    Option("client_body_timeout", _parse_seconds, 30.0, "seconds to receive a request body", "S"),
    Option(
        "client_send_timeout",
        _parse_seconds,
        120.0,
        "seconds a client may read nothing of a response before its connection is closed",
        "S",
    ),
    Option(
        "max_connections",
        _parse_workers,
        1024,
        "client connections at once; more are answered 503 and closed",
        "N",
    ),
    Option(
        "max_connections_per_client",
        _parse_workers,
        256,
        "connections at once from one client address (a neighbour cannot take every slot)",
        "N",
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
    ),
    Option(
        "admin_token",
        _parse_token,
        "",
        "bearer token for /_/ (required to listen beyond loopback); prefer the env or a file",
        "TOKEN",
    ),
    Option(
        "admin_token_file", _parse_optional_path, "", "read the admin token from this file", "FILE"
    ),
    Option(
        "require_token_for_reads",
        _parse_switch,
        False,
        "shard reads need the token too",
        is_switch=True,
    ),
    Option(
        "insecure_no_token",
        _parse_switch,
        False,
        "allow a non-loopback listen without a token",
        is_switch=True,
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


def _expand_env(value: str, environ: Mapping[str, str], where: str) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        return environ[name]

    return _ENV_REFERENCE.sub(substitute, value)


def parse_origin_url(name: str, url: str, where: str) -> str:
    """Return `url` if its scheme and shape can back an origin; raise ConfigError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ORIGIN_SCHEMES:
        raise ConfigError(
            f"{where}: origin {name!r} has unknown scheme in {url!r} "
            f"(use {', '.join(s + '://' for s in ORIGIN_SCHEMES)})"
        )
    if parts.scheme in ("s3", "http", "https") and not parts.netloc:
        raise ConfigError(f"{where}: origin {name!r}: {url!r} has no bucket or host")
    if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
        raise ConfigError(f"{where}: origin {name!r}: use file:///ABSOLUTE/PATH, got {url!r}")
    return url


def _origin_from_pair(pair: str, where: str) -> OriginSpec:
    name, sep, url = pair.strip().partition("=")
    if not sep or not name or not url:
        raise ConfigError(f"{where}: expected NAME=URL, got {pair!r}")
    return OriginSpec(_checked_name(name, where), parse_origin_url(name, url, where))


def _checked_name(name: str, where: str) -> str:
    try:
        return validate_origin_name(name)
    except InvalidKey as exc:
        raise ConfigError(f"{where}: {exc}") from None


_ORIGIN_KEYS = {
    "url",
    "urls",
    "endpoint_url",
    "headers",
    "follow_redirects",
    "tier",
    "tier_origin",
    "tier_refresh",
    "tier_headers",
    "max_requests",
    "max_requests_per_second",
    "ca_file",
}
MAX_UPSTREAMS = 64


def _origins_from_file(table: Any, environ: Mapping[str, str], where: str) -> dict[str, OriginSpec]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [origins] must be tables like [origins.NAME]")
    origins: dict[str, OriginSpec] = {}
    for name, body in table.items():
        at = f"{where} [origins.{name}]"
        if not isinstance(body, dict):
            raise ConfigError(f'{at}: needs url = "s3://…", "http(s)://…" or "file:///…"')
        unknown = set(body) - _ORIGIN_KEYS
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {', '.join(sorted(unknown))}")
        urls = _origin_urls(name, body, at)
        headers = _header_table(body, "headers", environ, at)
        endpoint = body.get("endpoint_url")
        if endpoint is not None and not isinstance(endpoint, str):
            raise ConfigError(f"{at}: endpoint_url must be a string")
        follow_redirects = body.get("follow_redirects", False)
        if not isinstance(follow_redirects, bool):
            raise ConfigError(f"{at}: follow_redirects must be true or false")
        if follow_redirects and any(urlsplit(u).scheme not in ("http", "https") for u in urls):
            raise ConfigError(f"{at}: follow_redirects applies to http(s) origins only")
        tier, tier_dns = _tier(body.get("tier"), at)
        orphans = sorted(k for k in ("tier_origin", "tier_refresh", "tier_headers") if k in body)
        if orphans and not (tier or tier_dns):
            raise ConfigError(f"{at}: {', '.join(orphans)} without a tier")
        origins[name] = OriginSpec(
            name=_checked_name(name, at),
            url=urls[-1],
            mirrors=urls[:-1],
            endpoint_url=endpoint,
            follow_redirects=follow_redirects,
            headers=headers,
            tier=tier,
            tier_headers=_header_table(body, "tier_headers", environ, at),
            tier_dns=tier_dns,
            tier_origin=_optional(body, "tier_origin", _tier_origin, at),
            tier_refresh_s=_optional(body, "tier_refresh", _parse_seconds, at) or 30.0,
            max_requests=_optional(body, "max_requests", _parse_max_requests, at),
            max_requests_per_second=_optional(body, "max_requests_per_second", _parse_rate, at),
            ca_file=_optional(body, "ca_file", _parse_ca_file, at),
        )
    return origins


def _header_table(
    body: dict[str, Any], key: str, environ: Mapping[str, str], at: str
) -> tuple[tuple[str, str], ...]:
    table = body.get(key, {})
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ConfigError(f"{at}: {key} must be a table of strings")
    return tuple((str(k), _expand_env(v, environ, f"{at} {key}.{k}")) for k, v in table.items())


def _origin_urls(name: str, body: dict[str, Any], at: str) -> tuple[str, ...]:
    """`url = "…"` or `urls = ["…", …]` (asked in order; the last is the object's home)."""
    if "url" in body and "urls" in body:
        raise ConfigError(f"{at}: has both url and urls; give one (urls lists the home last)")
    if "url" not in body and "urls" not in body:
        raise ConfigError(
            f'{at}: needs url = "s3://…", "http(s)://…" or "file:///…" (or urls = [...])'
        )
    urls = body.get("urls", [body.get("url")])
    if (
        not isinstance(urls, list)
        or not urls
        or len(urls) > MAX_UPSTREAMS
        or not all(isinstance(u, str) for u in urls)
    ):
        raise ConfigError(f"{at}: urls must be a list of 1 to {MAX_UPSTREAMS} URL strings")
    checked = tuple(parse_origin_url(name, url, at) for url in urls)
    if len({(_place(u), urlsplit(u).path.rstrip("/")) for u in checked}) != len(checked):
        raise ConfigError(f"{at}: urls lists the same URL twice")
    if len(checked) > 1 and any(urlsplit(u).scheme == "file" for u in checked):
        raise ConfigError(f"{at}: urls may list s3:// and http(s):// upstreams, not file://")
    return checked


def _tier(value: Any, at: str) -> tuple[tuple[str, ...], str | None]:
    """`tier = ["http://sc-0.sc:8470", …]` (these members) or `tier = "http://sc.sc:8470"` (a
    name resolved to all its addresses)."""
    if value is None:
        return (), None
    members = [value] if isinstance(value, str) else value
    if (
        not isinstance(members, list)
        or not members
        or len(members) > MAX_UPSTREAMS
        or not all(isinstance(m, str) for m in members)
    ):
        raise ConfigError(
            f"{at}: tier must be a list of 1 to {MAX_UPSTREAMS} member URLs, or one URL whose "
            "host name resolves to the members"
        )
    for member in members:
        parts = urlsplit(member)
        if (
            member != member.strip()
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.query
            or parts.fragment
        ):
            raise ConfigError(f"{at}: tier member {member!r} is not an http(s)://HOST:PORT URL")
        if parts.path.strip("/"):
            raise ConfigError(
                f"{at}: tier member {member!r} has a path; give http(s)://HOST:PORT: the origin's "
                "name (or tier_origin) is added to it"
            )
        try:
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError:
            raise ConfigError(f"{at}: tier member {member!r} has a bad port") from None
    if isinstance(value, str):
        return (), value.rstrip("/")
    stripped = tuple(m.rstrip("/") for m in members)
    places = {_place(m) for m in stripped}  # one member spelled two ways would count twice
    if len(places) != len(stripped):
        raise ConfigError(f"{at}: tier lists the same member twice")
    return stripped, None


def _place(url: str) -> tuple[str, str, int]:
    """Where a member URL points: scheme, host and port (the scheme's default when none is
    given). The host is case-folded, `localhost` is 127.0.0.1, and an IPv4 address in any
    spelling the resolver takes (127.1, 127.0.0.01, 2130706433, 0x7f.1) is written as dotted
    quads, an IPv6 one compressed: one member spelled two ways must not get two shares."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host == "localhost" else host
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        try:
            host = socket.inet_ntoa(socket.inet_aton(host))  # the forms getaddrinfo accepts
        except OSError:
            pass  # a host name: compared as written
    return parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80)


def _optional(body: dict[str, Any], key: str, parse: Callable[[Any], T], at: str) -> T | None:
    if key not in body:
        return None
    try:
        return parse(body[key])
    except (ValueError, InvalidKey) as exc:
        raise ConfigError(f"{at}: {key}: {exc}") from None


def _tier_origin(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return validate_origin_name(value)


def _parse_ca_file(value: Any) -> str:
    """A PEM file of certificates to trust, checked now: a file that cannot be read or holds no
    certificate is a bad setting, not a failure at the first request."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be the path of a PEM file of CA certificates")
    path = os.path.expanduser(value.strip())
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use {path} as CA certificates ({exc})") from None
    return path


def _parse_max_requests(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ValueError(f"expected a whole number from 1 to 100000, got {value!r}")
    return value


def _parse_rate(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected requests a second, got {value!r}")
    if not 0.01 <= value <= 1_000_000:
        raise ValueError(f"expected from 0.01 to 1000000 requests a second, got {value!r}")
    return float(value)


def read_config_file(path: Path) -> dict[str, Any]:
    """Return the parsed TOML at `path`; raise ConfigError with the file and problem."""
    try:
        with path.open("rb") as stream:
            return tomllib.load(stream)
    except FileNotFoundError:
        raise ConfigError(f"--config: {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc}") from None


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config_path: str | None = None,
    for_daemon: bool = True,
) -> Settings:
    """Return validated Settings from flags (None = unset), the environment and a TOML file.

    `for_daemon=False`: a command only reads where the daemon listens and its origins, so the
    rules for serving (an admin token beyond loopback) are not its to enforce.
    Raises ConfigError whose message names the offending setting and where it came from.
    """
    path_text = config_path or flags.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    path = Path(path_text) if path_text else None
    file_values = read_config_file(path) if path else {}
    known = {o.name for o in OPTIONS} | {"origins"}
    unknown = set(file_values) - known
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}")

    values: dict[str, Any] = {}
    sources: dict[str, tuple[int, str]] = {}  # option → (precedence level, where it was set)
    for option in OPTIONS:
        candidates = (
            (flags.get(option.name), option.flag),
            (environ.get(option.env), option.env),
            (file_values.get(option.name), f"{option.name} in {path}"),
            (option.default, f"default {option.name}"),
        )
        level, raw, where = next((i, v, w) for i, (v, w) in enumerate(candidates) if v is not None)
        sources[option.name] = (level, where)
        try:
            values[option.name] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    origins = _origins_from_file(file_values.get("origins", {}), environ, str(path))
    env_origins = environ.get(ENV_PREFIX + "ORIGIN", "")
    env_pairs = re.split(r"[,\s]+", env_origins.strip()) if env_origins.strip() else []
    for pairs, where in (
        (env_pairs, ENV_PREFIX + "ORIGIN"),
        (flags.get("origin") or [], "--origin"),
    ):
        given: set[str] = set()
        for pair in pairs:
            spec = _origin_from_pair(pair, where)
            if spec.name in given:  # one source naming it twice: which one was meant?
                raise ConfigError(f"{where}: origin {spec.name!r} is given twice")
            given.add(spec.name)
            origins[spec.name] = _merge(origins.get(spec.name), spec)

    host, port = values.pop("listen")
    values["admin_token"] = _admin_token(
        (values.pop("admin_token"), *sources["admin_token"]),
        (values.pop("admin_token_file"), *sources["admin_token_file"]),
    )
    settings = Settings(
        listen_host=host,
        listen_port=port,
        origins=tuple(origins.values()),
        config=path,
        **values,
    )
    if for_daemon:
        _check_access(settings)
    return settings


def _check_access(settings: Settings) -> None:
    """Refuse a daemon that anyone on the network could drive with the node's credentials."""
    if settings.admin_token is not None:
        return
    if settings.require_token_for_reads:
        raise ConfigError("--require-token-for-reads: needs --admin-token-file or --admin-token")
    if not settings.is_loopback and not settings.insecure_no_token:
        raise ConfigError(
            f"--listen {settings.listen}: other machines can reach this address, so an admin "
            "token is required (--admin-token-file FILE or SHARDCACHE_ADMIN_TOKEN); "
            "--insecure-no-token runs without one"
        )


def _admin_token(
    token: tuple[str | None, int, str], token_file: tuple[Path | None, int, str]
) -> str | None:
    """The token from the one of the two settings given with the higher precedence (flag >
    environment > file); both at the same level is an error, since one would be ignored."""
    value, level, where = token
    path, file_level, file_where = token_file
    if path is not None and (value is None or file_level < level):
        return _read_token_file(path, file_where)
    if path is not None and file_level == level:
        raise ConfigError(f"{where} and {file_where}: give one, not both")
    return value


def _read_token_file(path: Path, where: str) -> str:
    """The token in `path` (a Kubernetes Secret, a systemd credential), stripped of space."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not ASCII text"
        raise ConfigError(f"{where}: cannot read {path}: {reason}") from None
    try:
        token = _parse_token(text)
    except ValueError as exc:
        raise ConfigError(f"{where} {path}: the token {exc}") from None
    if token is None:
        raise ConfigError(f"{where}: {path} is empty")
    return token


def _merge(from_file: OriginSpec | None, override: OriginSpec) -> OriginSpec:
    """A flag or env origin replaces the URL; a file's endpoint, headers and follow_redirects
    stay if the URL does."""
    if from_file is None or from_file.url != override.url:
        return override
    return from_file
