"""Origins: `OriginSpec` (one configured origin) and the per-origin keys of the TOML file's
`[origins.NAME]` tables, read and checked here; `--origin NAME=URL` and `SHARDCACHE_ORIGIN`
give a name and a URL only.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from shardcache.config.parsers import parse_seconds
from shardcache.errors import ConfigError, InvalidKey
from shardcache.keys import validate_origin_name

ORIGIN_SCHEMES = ("s3", "http", "https", "file")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class OriginOption:
    """One key of an `[origins.NAME]` table in the TOML file (the file only: a flag or
    `SHARDCACHE_ORIGIN` gives a name and a URL). `parse` checks a plain value and raises
    ValueError; None for a key with a reader of its own (url/urls, the header tables, tier).
    `needs_tier`: meaningless, so refused, without `tier`."""

    key: str
    default: Any  # what an origin without the key gets; None: none
    help: str
    parse: Callable[[Any], Any] | None = None
    needs_tier: bool = False


def _parse_string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _parse_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _tier_origin(value: Any) -> str:
    return validate_origin_name(_parse_string(value))


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


ORIGIN_OPTIONS: tuple[OriginOption, ...] = (
    OriginOption(
        "url",
        None,
        "the object's home: s3://BUCKET[/PREFIX], http(s)://HOST[/PREFIX] or file:///PATH",
    ),
    OriginOption("urls", None, "instead of url: upstreams asked in order, the object's home last"),
    OriginOption(
        "endpoint_url", None, "an S3 origin's endpoint (a MinIO, another provider)", _parse_string
    ),
    OriginOption(
        "headers",
        None,
        "request headers (a table of strings; ${VARIABLE} read from the environment, never logged)",
    ),
    OriginOption(
        "follow_redirects",
        False,
        "follow a 3xx to the origin URL's own scheme, host and port (http(s) origins only)",
        _parse_bool,
    ),
    OriginOption(
        "tier",
        None,
        "shardcache tier members: a list of http(s)://HOST:PORT, or one "
        "URL whose host name resolves to them",
    ),
    OriginOption(
        "tier_origin",
        None,
        "the name the tier serves this origin under (default: the same name)",
        _tier_origin,
        needs_tier=True,
    ),
    OriginOption(
        "tier_refresh",
        30.0,
        "seconds between lookups of a tier given as one name",
        parse_seconds,
        needs_tier=True,
    ),
    OriginOption(
        "tier_headers", None, "headers sent to the tier members (never headers)", needs_tier=True
    ),
    OriginOption(
        "max_requests",
        None,
        "GETs open at the origin at once, each until its body ends; HEADs take none (1 to 100000)",
        _parse_max_requests,
    ),
    OriginOption(
        "max_requests_per_second",
        None,
        "requests a second to the origin at most (0.01 to 1000000)",
        _parse_rate,
    ),
    OriginOption(
        "ca_file",
        None,
        "PEM certificates its https:// URLs are verified against "
        "(besides the system's), checked at start",
        _parse_ca_file,
    ),
)
_ORIGIN_OPTION = {option.key: option for option in ORIGIN_OPTIONS}


def origin_default(key: str) -> Any:
    """The default of the per-origin key `key`, for a value built without a loaded spec (a
    `TierMembers` in a test), so no second copy of it is written down. KeyError if unknown."""
    return _ORIGIN_OPTION[key].default


@dataclass(frozen=True, slots=True)
class OriginSpec:
    """One configured origin. Header values may hold secrets, so `repr` never shows them.

    `follow_redirects` (http(s) origins only, TOML only): follow a 3xx whose target has the
    origin URL's own scheme, host and port; any other redirect is an error either way.

    The rest are TOML only (see `cluster.upstreams`): `mirrors` are asked before `url`, the
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
    follow_redirects: bool = _ORIGIN_OPTION["follow_redirects"].default
    mirrors: tuple[str, ...] = ()
    tier: tuple[str, ...] = ()
    tier_dns: str | None = None
    tier_origin: str | None = None
    tier_refresh_s: float = _ORIGIN_OPTION["tier_refresh"].default
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


def origin_from_pair(pair: str, where: str) -> OriginSpec:
    name, sep, url = pair.strip().partition("=")
    if not sep or not name or not url:
        raise ConfigError(f"{where}: expected NAME=URL, got {pair!r}")
    return OriginSpec(_checked_name(name, where), parse_origin_url(name, url, where))


def _checked_name(name: str, where: str) -> str:
    try:
        return validate_origin_name(name)
    except InvalidKey as exc:
        raise ConfigError(f"{where}: {exc}") from None


MAX_UPSTREAMS = 64


def origins_from_file(table: Any, environ: Mapping[str, str], where: str) -> dict[str, OriginSpec]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [origins] must be tables like [origins.NAME]")
    origins: dict[str, OriginSpec] = {}
    for name, body in table.items():
        at = f"{where} [origins.{name}]"
        if not isinstance(body, dict):
            raise ConfigError(f'{at}: needs url = "s3://…", "http(s)://…" or "file:///…"')
        unknown = set(body) - set(_ORIGIN_OPTION)
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {', '.join(sorted(unknown))}")
        urls = _origin_urls(name, body, at)
        plain = {o.key: _value(body, o, at) for o in ORIGIN_OPTIONS if o.parse is not None}
        if plain["follow_redirects"] and any(
            urlsplit(u).scheme not in ("http", "https") for u in urls
        ):
            raise ConfigError(f"{at}: follow_redirects applies to http(s) origins only")
        tier, tier_dns = _tier(body.get("tier"), at)
        orphans = sorted(o.key for o in ORIGIN_OPTIONS if o.needs_tier and o.key in body)
        if orphans and not (tier or tier_dns):
            raise ConfigError(f"{at}: {', '.join(orphans)} without a tier")
        origins[name] = OriginSpec(
            name=_checked_name(name, at),
            url=urls[-1],
            mirrors=urls[:-1],
            endpoint_url=plain["endpoint_url"],
            follow_redirects=plain["follow_redirects"],
            headers=_header_table(body, "headers", environ, at),
            tier=tier,
            tier_headers=_header_table(body, "tier_headers", environ, at),
            tier_dns=tier_dns,
            tier_origin=plain["tier_origin"],
            tier_refresh_s=plain["tier_refresh"],
            max_requests=plain["max_requests"],
            max_requests_per_second=plain["max_requests_per_second"],
            ca_file=plain["ca_file"],
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


def _value(body: dict[str, Any], option: OriginOption, at: str) -> Any:
    """The key's parsed value, or the table's default when the origin does not give it."""
    if option.key not in body:
        return option.default
    assert option.parse is not None  # only keys with a parser come here
    try:
        return option.parse(body[option.key])
    except (ValueError, InvalidKey) as exc:
        raise ConfigError(f"{at}: {option.key}: {exc}") from None


def merge_origin(from_file: OriginSpec | None, override: OriginSpec) -> OriginSpec:
    """A flag or env origin replaces the URL; a file's endpoint, headers and follow_redirects
    stay if the URL does."""
    if from_file is None or from_file.url != override.url:
        return override
    return from_file
