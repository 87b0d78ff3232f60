"""The daemon's lifecycle: build store, origins, cache and server from Settings, serve on uvloop,
reload on SIGHUP, and shut down in one visible order (`Daemon.stop`: 503s, drain within
`--shutdown-grace`, stop listening, cancel prefetch and fills, close origins and store).
What it builds from is in `wiring`; what it reads out of the parts, in `readouts`."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from shardcache import __version__
from shardcache.cache.directory import LAYOUT_VERSION
from shardcache.cache.hit_check import HitChecker
from shardcache.cache.scrub import Scrubber
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.config import Settings, settings_needing_restart
from shardcache.daemon.buckets import BucketsOnDemand
from shardcache.daemon.notify import monotonic_usec, notify
from shardcache.daemon.readouts import Readouts, upstream_rows
from shardcache.daemon.wiring import (
    build_fills,
    configure_origins,
    fetch_policy,
    listen_backlog,
    open_store,
    raise_open_file_limit,
)
from shardcache.errors import ConfigError, ShardcacheError
from shardcache.fetch.origin_table import OriginTable
from shardcache.observability import logs
from shardcache.observability.metrics import Metrics
from shardcache.origins.receivers import ReceiverPool
from shardcache.prefetch.queue import PrefetchQueue
from shardcache.serving.access import AccessPolicy
from shardcache.serving.connections import ConnectionGuard, ConnectionLimits
from shardcache.serving.hit_lane import HitLane
from shardcache.serving.server import make_app
from shardcache.serving.server_state import InFlight, ServerState, ServingContext
from shardcache.units import format_size

log = logging.getLogger("shardcache.daemon")
STORE_CHECK_INTERVAL_S = 2.0
# How long start-up waits for the receiving processes' first answer before it listens (they
# import while the store opens; a few tenths of a second on an idle machine).
RECEIVER_START_S = 30.0


AIOHTTP_KEEPALIVE_S = 365 * 24 * 3600.0  # never first: `ConnectionGuard` times idle connections


@dataclass(frozen=True, slots=True)
class Started:
    """What `Daemon.start` builds once the store is open; `Daemon._started` is None before."""

    store: Store
    cache: ShardCache
    prefetch: PrefetchQueue
    scrub: Scrubber
    runner: web.AppRunner
    readouts: Readouts  # the status document and the scrape-time gauges, read from the above
    lane: HitLane  # answers plain hits in front of the runner's protocol


class Daemon:
    """One running shardcache: the parts, wired, and their lifecycle."""

    def __init__(self, settings: Settings, reload_settings: Callable[[], Settings] | None) -> None:
        self.settings = settings
        self._reload_settings = reload_settings
        self.fetch_policy = fetch_policy(settings)  # none of its settings reloads
        # The process's receiving processes: every HTTP(S) and S3 transport sends through
        # them; started in `start`, restarted by a reload, let go at the end.
        self.receivers = ReceiverPool(settings.receivers)
        configured = configure_origins(settings, self.receivers)
        self.metrics = Metrics(CollectorRegistry(), configured)
        # The one owner of the set of origins, replaced whole on reload; the cache closes it.
        self.origins = OriginTable(configured, self.metrics)
        self.metrics.watch_upstreams(
            lambda: upstream_rows(self.origins.origins), self.origins.lone_homes
        )
        self.started_at = time.monotonic()
        self.in_flight = InFlight()
        self.metrics.watch_receivers(self.receivers.status)
        self._started: Started | None = None
        self._store_watch: asyncio.Task[None] | None = None
        self._stop_now = asyncio.Event()  # a second stop signal: the grace is over
        self._listener: asyncio.Server | None = None
        self.listen_backlog = listen_backlog(settings.listen_backlog)
        self.guard = ConnectionGuard(
            ConnectionLimits(
                idle_s=settings.client_idle_timeout,
                header_s=settings.client_header_timeout,
                max_connections=settings.max_connections,
                max_per_client=settings.max_connections_per_client,
            ),
            on_close=self._count_closed_connection,
        )
        self.state = ServerState(
            origin_timeouts=self.fetch_policy.timeouts,
            client_body_timeout_s=settings.client_body_timeout,
            client_send_timeout_s=settings.client_send_timeout,
            check_ready=self._check_ready,
            status=self._status,
            origins=self.origins,
            in_flight=self.in_flight,
            hit_checker=(HitChecker(settings.verify_hits_window) if settings.verify_hits else None),
        )
        self.buckets = BucketsOnDemand(
            settings.s3_buckets_on_demand,
            self.origins,
            self.fetch_policy.timeouts,
            self.receivers,
            self.metrics,
        )
        if settings.s3_buckets_on_demand:
            self.state.add_bucket = self.buckets.add

    async def start(self) -> None:
        """Open the store and start serving; raise ConfigError for a bad cache dir or port."""
        settings = self.settings
        # Disk writes, S3 body reads and index calls each take a worker thread; asyncio's
        # default of cores + 4 would let a few slow S3 reads stall every disk write.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="shardcache")
        )
        self.receivers.start()
        store = await asyncio.to_thread(open_store, settings, self.metrics)
        if store.swept_partials:
            log.info("removed %d partial files left by an interrupted run", store.swept_partials)
        silent = await asyncio.to_thread(self.receivers.wait_started, RECEIVER_START_S)
        if silent:  # served all the same: a request to one waits for it, or fails over
            log.warning("%d receiving processes not up after %g s", silent, RECEIVER_START_S)
        started = self._started = self._build(store)
        await started.runner.setup()
        raise_open_file_limit(settings.max_connections)
        try:
            # aiohttp's low-level server as its docs show it (`loop.create_server(server, …)`),
            # behind the hit lane, wrapped so the guard sees every connection.
            assert started.runner.server is not None
            self._listener = await asyncio.get_running_loop().create_server(
                self.guard.protocol_factory(started.lane.protocol_factory(started.runner.server)),
                settings.listen_host,
                settings.listen_port,
                reuse_address=True,
                backlog=self.listen_backlog,
            )
        except OSError as exc:
            await started.runner.cleanup()
            await self._close()
            raise ConfigError(
                f"--listen: cannot listen on {settings.listen}: {exc.strerror or exc}"
            ) from None
        if not self.origins:
            log.warning(
                "no origins configured: every shard request will be a 404; add one with "
                "--origin NAME=URL, SHARDCACHE_ORIGIN or [origins.NAME] in --config"
            )
        if settings.admin_token is None and not settings.is_loopback:
            log.warning(
                "listening on %s without an admin token (--insecure-no-token): anyone who can "
                "reach the port can prefetch, purge and read the configuration",
                settings.listen,
            )
        started.prefetch.start()
        started.scrub.start()
        self.guard.start()
        self._store_watch = asyncio.create_task(self._watch_store(store), name="store watch")
        usage = store.usage()
        log.info(
            "shardcache %s serving on http://%s (%s); cache %s: %s in %d %s of %s "
            "(index %s), --eviction %s; origins: %s",
            __version__,
            settings.listen,
            _access_summary(settings),
            settings.cache_dir,
            format_size(usage.entry_bytes),
            usage.entries,
            "entry" if usage.entries == 1 else "entries",
            format_size(usage.capacity_bytes),
            format_size(usage.size_bytes - usage.entry_bytes),
            settings.eviction,
            ", ".join(f"{n}={u}" for n, u in self.origins.shown_urls().items()) or "none",
        )
        notify(f"READY=1\nSTATUS=serving on http://{settings.listen}\nMAINPID={os.getpid()}")

    def _build(self, store: Store) -> Started:
        """Wire the parts over the open store: cache, prefetch queue, scrub, the app."""
        settings = self.settings
        policy = self.fetch_policy
        fills = build_fills(settings, store, policy, self.metrics)
        cache = ShardCache(store, self.origins, policy, self.metrics, fills=fills)
        prefetch = PrefetchQueue(
            cache,
            settings.prefetch_concurrency,
            settings.prefetch_budget_bytes,
            settings.readahead,
            max_pin_s=settings.prefetch_pin_max_seconds,
        )
        scrub = Scrubber(
            store,
            settings.scrub_rate,
            position_file=settings.cache_dir / LAYOUT_VERSION / "scrub-position.json",
        )
        self.state.scrub = scrub  # POST /_/verify
        access = AccessPolicy(
            settings.admin_token,
            settings.require_token_for_reads,
            settings.is_loopback,
            settings.s3_access_keys,
        )
        context = ServingContext(cache, prefetch, self.metrics, self.state, access, self.guard)
        lane = HitLane(context)
        readouts = Readouts(
            listen=settings.listen,
            cache_dir=str(settings.cache_dir),
            eviction=settings.eviction,
            started_at=self.started_at,
            metrics=self.metrics,
            store=store,
            cache=cache,
            prefetch=prefetch,
            scrub=scrub,
            guard=self.guard,
            lane=lane,
            receivers=self.receivers,
            origins=self.origins,
        )
        self.metrics.watch_cache(readouts.cache_gauges)
        self.metrics.watch_scrub(readouts.scrub_gauges)
        app = make_app(context)
        # In-flight responses are drained before cleanup, so cleanup's own wait is short.
        runner = web.AppRunner(
            app,
            access_log_class=lane.access_logger_class(),
            handle_signals=False,
            shutdown_timeout=1.0,
            # The guard closes idle connections (and counts them). aiohttp's own timer runs from
            # a connection's start until it sees a request, and it never sees the hit lane's:
            # it would close a connection the lane keeps busy. Out of its way, then.
            keepalive_timeout=AIOHTTP_KEEPALIVE_S,
            # aiohttp inflates a gzip/deflate request body on the event loop as it arrives,
            # read or not (500 KB of gzip holds the loop for 1.5 s). Bodies stay raw, and an
            # encoded one is refused (`middleware.admit_request`).
            auto_decompress=False,
        )
        return Started(store, cache, prefetch, scrub, runner, readouts, lane)

    async def stop(self) -> None:
        """Drain and stop, in order: (1) refuse new work with 503 and fail /readyz, stop the
        scrub and the prefetch queue (and the fills only it wanted), (2) let responses in
        flight finish within the grace period (or until `stop_now`), (3) stop listening,
        (4) discard unfinished fills, (5) close origins and the store."""
        notify("STOPPING=1")
        # (1)
        self.state.is_shutting_down = True
        started = self._started
        if started is not None:
            started.scrub.stop()  # at its next chunk: SIGTERM never waits for a scrub pass
            # Nothing new is fetched for the rest of the drain: queued and read-ahead shards
            # would only be discarded unfinished at its end, and read-ahead must not keep a
            # drain busy. Fills a draining response reads go on.
            await started.prefetch.aclose()
            started.cache.stop_unread_fills()
        # (2)
        grace = self.settings.shutdown_grace
        log.info(
            "shutting down: %s in flight, %.0f s grace (a second signal stops at once)",
            _responses(self.in_flight.count),
            grace,
        )
        if not await self._drained(grace) and not self._stop_now.is_set():
            log.warning(
                "grace period over with %s in flight; closing them",
                _responses(self.in_flight.count),
            )
        # (3)
        if self._listener is not None:
            self._listener.close()
        await self.guard.aclose()
        if started is not None:
            await started.runner.cleanup()
        # (4) and (5)
        await self._close()
        log.info("stopped")

    async def _drained(self, grace_s: float) -> bool:
        """Wait until no response is in flight; False once `grace_s` ran out or `stop_now()`
        was called."""
        idle = asyncio.create_task(self.in_flight.wait_idle(grace_s))
        now = asyncio.create_task(self._stop_now.wait())
        await asyncio.wait((idle, now), return_when=asyncio.FIRST_COMPLETED)
        now.cancel()
        idle.cancel()
        await asyncio.gather(idle, now, return_exceptions=True)
        return idle.done() and not idle.cancelled() and idle.result()

    def stop_now(self) -> None:
        """A second stop signal (Ctrl-C twice): end the drain without waiting out the grace."""
        if not self._stop_now.is_set():
            log.warning(
                "second signal: stopping now, closing %s in flight",
                _responses(self.in_flight.count),
            )
            self._stop_now.set()

    def reload(self) -> None:
        """Re-read the config file: apply the origin list and log level, keep connections.

        Settings that need a restart (listen, cache dir and size, …) are reported, not applied.
        A bad file leaves everything as it was.
        """
        if self._reload_settings is None:
            log.warning("SIGHUP ignored: no settings to reload")
            return
        notify(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}")
        try:
            new = self._reload_settings()
            configured = self.buckets.kept_over(
                configure_origins(new, self.receivers, self.origins)
            )
        except ShardcacheError as exc:
            log.error("reload failed, nothing changed: %s", exc)
            notify("READY=1")
            return
        logs.configure(new.log_level, new.log_format)
        # New requests go to new receivers (of the new size); the old ones finish theirs.
        self.receivers.restart(new.receivers)
        # One step: the whole table, with everything kept per origin; a replaced backend is
        # closed once the fills using it end.
        gone = set(self.origins.origins) - set(configured)
        self.origins.replace(configured)
        self.metrics.touch(configured)
        self.metrics.forget(gone)  # a removed or renamed origin's series leave /metrics
        # What a reload applies is the `reloads` column of config's OPTIONS (log level and
        # format, receivers, above); every other changed setting is reported, not applied.
        restart_needed = settings_needing_restart(self.settings, new)
        if restart_needed:
            log.warning("reload: %s changed; restart to apply", ", ".join(restart_needed))
        log.info(
            "reloaded: origins %s, log level %s",
            ", ".join(sorted(configured)) or "none",
            new.log_level,
        )
        notify("READY=1")

    async def _close(self) -> None:
        """Steps (4) and (5) of `stop`, and the end of a start that could not listen: stop
        the store watch, the scrub and the prefetch queue, close the cache (its unfinished
        fills, then the origins) and the store, let the receiving processes go."""
        if self._store_watch is not None:
            self._store_watch.cancel()
            await asyncio.gather(self._store_watch, return_exceptions=True)
        started = self._started
        if started is not None:
            await started.scrub.aclose()
            await started.prefetch.aclose()
            await started.cache.aclose()  # and the origins, which it owns
            await asyncio.to_thread(started.store.close)
        else:
            await self.origins.aclose()
        self.receivers.close()  # each exits once its open requests end (none are left)

    def _running(self) -> Started:
        """The started parts: the routes, probes and reloads that read them come after start."""
        if self._started is None:
            raise RuntimeError("the daemon is not started")
        return self._started

    def _count_closed_connection(self, reason: str) -> None:
        if reason == "limit":
            self.metrics.client_refusal("connection_limit")
        elif reason == "client_limit":
            self.metrics.client_refusal("client_connection_limit")
        else:
            self.metrics.client_timed_out(reason)

    def _check_ready(self) -> str | None:
        """Why the daemon is not fully ready (it still serves, uncached), or None."""
        problem = self._running().store.problem()
        return f"{problem}; serving uncached until it is usable" if problem else None

    async def _watch_store(self, store: Store) -> None:
        """Check the cache directory every few seconds, so a replaced or repaired directory
        is taken back into use without a restart (or a readiness probe) and a broken one is
        logged once, when it breaks."""
        reported: str | None = None
        while True:
            problem = await asyncio.to_thread(store.problem)
            if problem != reported:
                if problem:
                    log.warning("the cache is unusable, serving uncached: %s", problem)
                else:
                    log.info("the cache dir %s is usable again", self.settings.cache_dir)
                reported = problem
            await asyncio.sleep(STORE_CHECK_INTERVAL_S)

    def _status(self) -> dict[str, object]:
        return self._running().readouts.status()


def _access_summary(settings: Settings) -> str:
    if settings.admin_token is None:
        return "no admin token" + (": INSECURE" if not settings.is_loopback else "")
    reads = " and reads" if settings.require_token_for_reads else ""
    if settings.s3_access_keys:
        reads += f" (or an S3 signature by one of {len(settings.s3_access_keys)} access keys)"
    return f"admin token required for /_/{reads}"


def _responses(count: int) -> str:
    return f"{count} response" + ("" if count == 1 else "s")


async def serve(
    settings: Settings,
    reload_settings: Callable[[], Settings] | None = None,
    on_ready: Callable[[], None] | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> None:
    """Serve until SIGTERM/SIGINT (drain, then exit); SIGHUP reloads. Raises ConfigError for a
    bad cache dir, origin or port. `on_ready()` runs once the port is bound and serving."""
    daemon = Daemon(settings, reload_settings)
    stop = asyncio.Event()

    def on_stop_signal() -> None:
        if stop.is_set():
            daemon.stop_now()
        stop.set()

    # Before start-up, which may take a while on a large cache: a stop asked for meanwhile is
    # a clean stop once it is done (exit 0), not the signal's default death (exit 143).
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_stop_signal)
    if stop_requested():  # a signal the caller noted before these handlers took over
        stop.set()
    await daemon.start()
    loop.add_signal_handler(signal.SIGHUP, daemon.reload)
    gc.collect()  # what start-up built stays: later full collections skip it
    gc.freeze()
    if on_ready is not None and not stop.is_set():
        on_ready()
    await stop.wait()
    await daemon.stop()


def run(
    settings: Settings,
    reload_settings: Callable[[], Settings] | None = None,
    on_ready: Callable[[], None] | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> None:
    """Run the daemon on uvloop until it is told to stop (or `stop_requested()` says a stop
    signal came before the loop handled them)."""
    uvloop.run(serve(settings, reload_settings, on_ready, stop_requested))
