"""The daemon's wiring: the fetch policy, one backend per configured origin (and the
`OriginTable` entries holding them), the store and what makes its fills, built from `Settings`;
the open-file limit and listen backlog set before the port is bound. Apart from `lifecycle` so
that `shardcache check` builds origins exactly as the daemon does without importing the server."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import urllib.parse
from pathlib import Path

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.fill import FillFactory
from shardcache.cache.plans import PlanBook
from shardcache.cache.store import Store
from shardcache.cluster.tier import redact_url
from shardcache.config import OriginSpec, Settings
from shardcache.daemon.origin_factory import make_origin
from shardcache.errors import CacheError, ConfigError
from shardcache.fetch.origin_table import ConfiguredOrigin, OriginTable
from shardcache.fetch.policy import (
    BACK_OFF_BASE_S,
    BACK_OFF_CAP_S,
    FIRST_SEGMENT_BYTES,
    SHARED_CONNECTIONS,
    FetchPolicy,
)
from shardcache.observability.logs import redact
from shardcache.observability.metrics import Metrics
from shardcache.origins.base import Origin, Timeouts
from shardcache.origins.file import FileOrigin
from shardcache.origins.receivers import ReceiverPool

log = logging.getLogger("shardcache.daemon")


def fetch_policy(settings: Settings) -> FetchPolicy:
    """How every fill asks its origin, and what every backend's requests are held to: built
    once, from `settings` alone (the defaults are the options table's)."""
    return FetchPolicy(
        timeouts=Timeouts(
            settings.origin_connect_timeout, settings.origin_read_timeout, settings.origin_min_speed
        ),
        retries=settings.origin_retries,
        base_s=BACK_OFF_BASE_S,
        cap_s=BACK_OFF_CAP_S,
        connections=settings.origin_connections,
        segment_bytes=settings.segment_size,
        first_segment_bytes=min(settings.segment_size, FIRST_SEGMENT_BYTES),
        shared_connections=SHARED_CONNECTIONS,
    )


def build_origins(
    settings: Settings,
    receivers: ReceiverPool,
    keep: dict[str, OriginSpec] | None = None,
    existing: dict[str, Origin] | None = None,
) -> dict[str, Origin]:
    """Return one backend per configured origin, receiving through `receivers` (the caller's);
    raise ConfigError for an unusable one.

    On a reload, an origin whose spec is unchanged (`keep`) reuses its `existing` backend, so
    its connections and fills in flight carry on.
    """
    timeouts = fetch_policy(settings).timeouts
    origins: dict[str, Origin] = {}
    for spec in settings.origins:
        refuse_own_endpoint(settings, spec)
        if keep and existing and keep.get(spec.name) == spec and spec.name in existing:
            origins[spec.name] = existing[spec.name]
            continue
        origin = make_origin(spec, timeouts, receivers)
        if isinstance(origin, FileOrigin) and not origin.root.is_dir():
            raise ConfigError(f"--origin {spec.name}: {origin.root} is not a directory")
        origins[spec.name] = origin
    return origins


_SAME_MACHINE = {"localhost", "0.0.0.0", "::", "::1", "ip6-localhost"}


def refuse_own_endpoint(settings: Settings, spec: OriginSpec) -> None:
    """Raise ConfigError when an S3 origin's endpoint is this daemon's own address: S3 clients
    are pointed at the daemon with `AWS_ENDPOINT_URL`, and a daemon started in that shell
    reads the variable too (boto3's chain), then asks itself for every object and every read
    stalls until its timeout."""
    if not any(url.startswith("s3://") for url in spec.urls):
        return
    for source, endpoint in (
        ("endpoint_url", spec.endpoint_url),
        ("AWS_ENDPOINT_URL_S3", os.environ.get("AWS_ENDPOINT_URL_S3")),
        ("AWS_ENDPOINT_URL", os.environ.get("AWS_ENDPOINT_URL")),
    ):
        if not endpoint:
            continue
        try:
            parts = urllib.parse.urlsplit(endpoint)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return  # boto3 says what is wrong with it
        host = (parts.hostname or "").lower()
        same_host = (
            host in _SAME_MACHINE
            or host.startswith("127.")
            or host == settings.listen_host.lower()
            or settings.listen_host in ("0.0.0.0", "::")
            and host == socket.gethostname().lower()
        )
        if same_host and port == settings.listen_port:
            raise ConfigError(
                f"origin {spec.name!r}: its S3 endpoint {endpoint} ({source}) is this daemon's "
                f"own address {settings.listen}: it would ask itself for every object. "
                "AWS_ENDPOINT_URL is for the loaders' S3 clients; give the daemon the object "
                "store's endpoint as the origin's `endpoint_url` in the TOML file, or start it "
                "without AWS_ENDPOINT_URL"
            )
        return  # the first source set is the one boto3 uses


def configure_origins(
    settings: Settings, receivers: ReceiverPool, current: OriginTable | None = None
) -> dict[str, ConfiguredOrigin]:
    """Every configured origin, whole: its backend (`build_origins`, reusing the `current`
    table's backend where the spec did not change) and how it is shown. What an
    `OriginTable` is built, or on a reload replaced, from; raises ConfigError."""
    built = build_origins(
        settings,
        receivers,
        keep=current.specs if current else None,
        existing=current.origins if current else None,
    )
    return {
        spec.name: ConfiguredOrigin(
            built[spec.name], spec, shown_url=redact(spec.url), home_label=redact_url(spec.url)
        )
        for spec in settings.origins
    }


def open_store(settings: Settings, metrics: Metrics) -> Store:
    """Open the store with the eviction policy `--eviction` names, evictions counted in
    `metrics`; raise ConfigError for an unusable cache dir."""

    def on_evict(key: str, size_bytes: int, was_pinned: bool) -> None:
        metrics.evicted(size_bytes, was_pinned)

    admission = ScanResistantAdmission() if settings.eviction == "auto" else None
    plans = PlanBook() if settings.eviction in ("auto", "plan") else None
    try:
        return Store(
            settings.cache_dir,
            settings.cache_size,
            on_evict,
            admission=admission,
            transient_max_bytes=settings.prefetch_budget_bytes,
            plans=plans,
        )
    except CacheError as exc:
        raise ConfigError(f"--cache-dir: {exc}") from None


def build_fills(
    settings: Settings, store: Store, policy: FetchPolicy, metrics: Metrics
) -> FillFactory:
    """What makes the cache's fills: over `store`, fetching by `policy`, reporting to
    `metrics`, keeping the CRC-32C per block that hits are checked against when
    `--verify-hits` is on."""
    return FillFactory.of(store, policy, metrics, keeps_block_digests=settings.verify_hits)


def raise_open_file_limit(max_connections: int) -> None:
    """Lift the soft limit on open files to the hard one: each connection can hold three (its
    socket, a cache entry, a poll dup). Say so when even that is below `max_connections`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    needed = 3 * max_connections + 256
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "open-file limit %d is below the %d that --max-connections %d can use; "
            "raise LimitNOFILE / ulimit -n or lower --max-connections",
            soft,
            needed,
            max_connections,
        )


SOMAXCONN = Path("/proc/sys/net/core/somaxconn")
# Linux's own somaxconn since 5.4, for a system that does not say (another kernel, no /proc).
ASSUMED_SOMAXCONN = 4096


def listen_backlog(configured: int | None, somaxconn: Path = SOMAXCONN) -> int:
    """The accept queue to ask `listen()` for: `--listen-backlog`, else the system's bound.

    asyncio's default of 100 overflows when hundreds of loader workers connect at once: the
    kernel drops the SYNs past it and each waits a retransmission (a second or more), a
    health probe behind them too. The kernel caps any backlog at somaxconn, silently: a
    setting above it is logged, with what to raise."""
    system = _system_somaxconn(somaxconn)
    if configured is None:
        return system
    if configured > system:
        log.warning(
            "--listen-backlog %d is above the system's bound net.core.somaxconn=%d, which "
            "the kernel applies instead; raise it (sysctl -w net.core.somaxconn=%d)",
            configured,
            system,
            configured,
        )
    return configured


def _system_somaxconn(path: Path) -> int:
    try:
        return max(1, int(path.read_text().strip()))
    except (OSError, ValueError):  # no /proc (another kernel): Linux's default
        return ASSUMED_SOMAXCONN
