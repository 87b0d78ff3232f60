"""The composition root: build store, origins, cache and server from Settings, serve on uvloop,
and shut down in one visible order.

Shutdown order: (1) `/readyz` and new shard requests answer 503, (2) stop accepting and let
in-flight responses finish within the grace period, (3) stop prefetching, (4) cancel fills
(their partial files are removed), (5) close origin clients, (6) close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from shardcache import __version__
from shardcache.cache import ShardCache
from shardcache.config import Settings
from shardcache.errors import CacheError, ConfigError
from shardcache.logs import AccessLogger, redact
from shardcache.metrics import CacheGauges, Metrics
from shardcache.origins import Origin, Timeouts, make_origin
from shardcache.origins.file import FileOrigin
from shardcache.prefetch import PrefetchQueue
from shardcache.segments import RetryPolicy
from shardcache.server import make_app
from shardcache.status import build_status
from shardcache.store import Store
from shardcache.units import format_size

log = logging.getLogger("shardcache.daemon")
SHUTDOWN_GRACE_S = 30.0


def build_origins(settings: Settings) -> dict[str, Origin]:
    """Return one backend per configured origin; raise ConfigError for an unusable one."""
    timeouts = Timeouts(settings.origin_connect_timeout, settings.origin_read_timeout)
    origins: dict[str, Origin] = {}
    for spec in settings.origins:
        origin = make_origin(spec, timeouts)
        if isinstance(origin, FileOrigin) and not origin.root.is_dir():
            raise ConfigError(f"--origin {spec.name}: {origin.root} is not a directory")
        origins[spec.name] = origin
    return origins


def open_store(settings: Settings, metrics: Metrics) -> Store:
    def on_evict(key: str, size_bytes: int, was_pinned: bool) -> None:
        metrics.evicted(size_bytes, was_pinned)

    try:
        return Store(settings.cache_dir, settings.cache_size, on_evict)
    except CacheError as exc:
        raise ConfigError(f"--cache-dir: {exc}") from None


async def serve(settings: Settings, on_ready: Callable[[], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT. Raises ConfigError for a bad cache dir, origin or port."""
    origins = build_origins(settings)
    metrics = Metrics(CollectorRegistry(), origins)
    store = await asyncio.to_thread(open_store, settings, metrics)
    if store.swept_partials:
        log.info("removed %d partial files left by an interrupted run", store.swept_partials)
    # Disk writes, S3 body reads and index calls each take a worker thread; asyncio's
    # default of cores + 4 would let a few slow S3 reads stall every disk write.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="shardcache")
    )
    policy = RetryPolicy(
        retries=settings.origin_retries,
        read_timeout_s=settings.origin_read_timeout,
        connections=settings.origin_connections,
        segment_bytes=settings.segment_size,
    )
    cache = ShardCache(store, origins, policy, metrics)
    prefetch = PrefetchQueue(
        cache, settings.prefetch_concurrency, settings.prefetch_budget_bytes, settings.readahead
    )

    def cache_gauges() -> CacheGauges:
        usage = store.usage()
        return CacheGauges(
            usage.size_bytes,
            usage.capacity_bytes,
            usage.entries,
            prefetch.depth,
            prefetch.in_flight,
            prefetch.completed,
            prefetch.failed,
            cache.unread_bytes,
        )

    def check_ready() -> str | None:
        if not os.access(settings.cache_dir, os.W_OK):
            return f"cache dir {settings.cache_dir} is not writable"
        return None

    started_at = time.monotonic()
    origin_urls = {o.name: redact(o.url) for o in settings.origins}

    def status() -> dict[str, object]:
        usage = store.usage()
        return build_status(
            version=__version__,
            uptime_s=time.monotonic() - started_at,
            listen=settings.listen,
            snapshot=metrics.snapshot(origins),
            cache={
                "dir": str(settings.cache_dir),
                "size_bytes": usage.size_bytes,
                "capacity_bytes": usage.capacity_bytes,
                "entries": usage.entries,
                "reserved_bytes": usage.reserved_bytes,
            },
            prefetch=prefetch.status(),
            origins=origin_urls,
        )

    metrics.watch_cache(cache_gauges)
    state: dict[str, Any] = {
        "is_shutting_down": False,
        "read_timeout_s": settings.origin_read_timeout,
        "check_ready": check_ready,
        "status": status,
        "origin_urls": origin_urls,
    }
    app = make_app(cache, prefetch, metrics, state)
    runner = web.AppRunner(
        app, access_log_class=AccessLogger, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.listen_host, settings.listen_port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await _close(prefetch, cache, origins, store)
        raise ConfigError(
            f"--listen: cannot listen on {settings.listen}: {exc.strerror or exc}"
        ) from None

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    usage = store.usage()
    log.info(
        "shardcache %s serving on http://%s; cache %s: %s of %s used, %d entries; origins: %s",
        __version__,
        settings.listen,
        settings.cache_dir,
        format_size(usage.size_bytes),
        format_size(usage.capacity_bytes),
        usage.entries,
        ", ".join(f"{o.name}={o.url}" for o in settings.origins) or "none",
    )
    prefetch.start()
    if on_ready is not None:
        on_ready()
    await stop.wait()

    log.info("shutting down")
    state["is_shutting_down"] = True
    await runner.cleanup()
    await _close(prefetch, cache, origins, store)
    log.info("stopped")


async def _close(
    prefetch: PrefetchQueue, cache: ShardCache, origins: dict[str, Origin], store: Store
) -> None:
    await prefetch.aclose()
    await cache.aclose()
    for origin in origins.values():
        with contextlib.suppress(Exception):  # closing a client must not stop the others
            await origin.aclose()
    await asyncio.to_thread(store.close)


def run(settings: Settings, on_ready: Callable[[], None] | None = None) -> None:
    """Run the daemon on uvloop until it is told to stop."""
    uvloop.run(serve(settings, on_ready))
