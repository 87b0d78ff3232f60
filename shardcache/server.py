"""The HTTP contract: routes, JSON errors, `X-Shardcache`, Range, and aborting on mid-body failure.

    GET|HEAD /NAME/KEY            the object; X-Shardcache: hit | miss | coalesced
    DELETE   /_/cache/NAME/KEY    purge one entry
    POST|GET|DELETE /_/prefetch   queue shards ahead of the loader / show / empty the queue
    GET      /_/origins           origin names and URLs (for `shardcache url`)
    GET      /_/status            one JSON document for people and `shardcache stats`
    GET      /healthz, /readyz    probes;  GET /metrics  Prometheus text format

With an admin token configured, every `/_/` endpoint (and with `--require-token-for-reads` every
shard read) needs `Authorization: Bearer TOKEN`; a request without it is a 401 (`access.py`).

Before the first body byte every failure is a JSON error with the status its exception class
carries. After it, the connection is aborted: headers promised a Content-Length, and a client
such as `curl -f` must see a failed transfer, never a clean but short body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shardcache.access import AccessPolicy
from shardcache.body import (
    ClientGone,
    ClientStalled,
    FileSender,
    send_fill,
    send_stream,
    settle_empty,
)
from shardcache.cache import Lease, Result, ShardCache
from shardcache.checksums import Checksum, to_headers
from shardcache.connections import ConnectionGuard
from shardcache.errors import (
    BadRequest,
    NotCached,
    OriginError,
    QueueFull,
    RangeNotSatisfiable,
    RequestTimeout,
    ShardcacheError,
    ShuttingDown,
    Unauthorized,
)
from shardcache.logs import CLIENT_GONE, redact
from shardcache.metrics import CONTENT_TYPE, Metrics
from shardcache.prefetch import PrefetchQueue, parse_targets
from shardcache.ranges import ByteRange, parse_range

log = logging.getLogger("shardcache.server")
DEFAULT_CONTENT_TYPE = "application/octet-stream"
MAX_BODY_BYTES = 4 << 20  # a prefetch list of 100,000 keys; a larger body is a 413
_BODY_HEADERS = {"content-type", "content-length"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CACHE_KEY = web.AppKey("cache", ShardCache)
PREFETCH_KEY = web.AppKey("prefetch", PrefetchQueue)
METRICS_KEY = web.AppKey("metrics", Metrics)
STATE_KEY = web.AppKey("state", dict)
ACCESS_KEY = web.AppKey("access", AccessPolicy)
GUARD_KEY = web.AppKey("guard", ConnectionGuard)


class InFlight:
    """Counts shard responses under way, so shutdown can wait for them to finish."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __enter__(self) -> InFlight:
        self.count += 1
        self._idle.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no response is in flight; return False if `timeout_s` ran out first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


def _abort(request: web.Request, discard_unsent: bool = False) -> None:
    """Abort the connection (never a clean short body); it may be gone already.

    `discard_unsent` (a client that stopped reading): reset the connection now. A plain close
    leaves what the socket buffer holds to the kernel, which keeps the orphaned connection
    open, probing a zero window, for minutes after the descriptor is gone.
    """
    if request.transport is None:
        return
    if discard_unsent:
        sock = request.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.transport.abort()


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error. Messages can quote origin URLs: any credentials in them are masked."""
    return web.json_response({"error": redact(message)}, status=status, headers=headers)


def redacted(document: Any) -> Any:
    """`document` with credentials masked in every string (failures quote origin URLs)."""
    if isinstance(document, str):
        return redact(document)
    if isinstance(document, dict):
        return {key: redacted(value) for key, value in document.items()}
    if isinstance(document, list):
        return [redacted(value) for value in document]
    return document


def _origin_error_message(request: web.Request, exc: OriginError) -> str:
    """What a client is told of an origin failure. Behind an admin token, a client without it
    learns the kind, not the origin's host, prefix or root: those are configuration."""
    access = request.app[ACCESS_KEY]
    if access.is_enabled and not access.is_authorized(request.headers.get("Authorization")):
        what = request.path if len(request.path) <= 200 else request.path[:200] + "…"
        return f"{what}: {exc.kind.replace('_', ' ')} at the origin (details in the daemon's log)"
    return str(exc)


@web.middleware
async def track_connection(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection guard a request is in progress: its idle and header clocks stop."""
    guard = request.app.get(GUARD_KEY)
    if guard is None:
        return await handler(request)
    guard.request_started(request.transport)
    try:
        return await handler(request)
    finally:
        guard.request_finished(request.transport)


@web.middleware
async def admit_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse, before anything else is done for it, a request with an encoded body (none is
    taken; the daemon runs aiohttp with auto_decompress off, so nothing inflates one meanwhile)
    and one for a protected path without the admin token. One middleware: each layer costs
    every request, and 64 KiB hits are counted in requests per second."""
    encoding = request.headers.get("Content-Encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        response = json_error(415, f"request bodies may not be encoded ({encoding[:40]!r})")
        response.force_close()
        return response
    access = request.app[ACCESS_KEY]
    if access.is_protected(request.path):
        if not access.is_authorized(request.headers.get("Authorization")):
            request.app[METRICS_KEY].client_refused.labels("unauthorized").inc()
            raise Unauthorized("this endpoint needs the admin token: Authorization: Bearer TOKEN")
    return await handler(request)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error raised before the response started into `{"error": "..."}`."""
    try:
        return await handler(request)
    except Unauthorized as exc:
        return json_error(exc.status, str(exc), {"WWW-Authenticate": 'Bearer realm="shardcache"'})
    except RequestTimeout as exc:
        request.app[METRICS_KEY].client_timeouts.labels("body").inc()
        response = json_error(exc.status, str(exc), {"Connection": "close"})
        response.force_close()  # the rest of the body may never come: do not wait for it
        return response
    except RangeNotSatisfiable as exc:
        # RFC 9110 §15.5.17: a 416 carries Content-Range: bytes */<length>
        return json_error(416, str(exc), {"Content-Range": f"bytes */{exc.size_bytes}"})
    except (ShuttingDown, QueueFull) as exc:
        return json_error(exc.status, str(exc), {"Retry-After": "5"})
    except OriginError as exc:
        _count_error(request, exc)
        log.info("%s %r: %s", request.method, request.path, exc)
        return json_error(exc.status, _origin_error_message(request, exc))
    except ShardcacheError as exc:
        _count_error(request, exc)
        return json_error(exc.status, str(exc))
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            # Its own Content-Type and length describe the text body it would have sent.
            kept = {k: v for k, v in exc.headers.items() if k.lower() not in _BODY_HEADERS}
            return json_error(exc.status, exc.reason, kept)
        raise
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error for %s %s", request.method, request.path)
        return json_error(500, "internal error; see the daemon's log")


def _count_error(request: web.Request, exc: ShardcacheError) -> None:
    origin = request.match_info.get("origin")
    cache = request.app[CACHE_KEY]
    if origin in cache.origins and request.match_info.get("key") is not None:
        request.app[METRICS_KEY].requests.labels(origin, "error").inc()


def object_response(
    result: Result,
    size_bytes: int,
    etag: str | None,
    content_type: str | None,
    byte_range: ByteRange | None,
    checksums: tuple[Checksum, ...] = (),
    verified_by: tuple[str, ...] = (),
) -> web.StreamResponse:
    """The status and headers of a GET or HEAD of an object (the HTTP contract's one place).

    A whole-object answer republishes the checksums the cache verified (`Content-MD5`,
    `x-amz-checksum-*`), so a shardcache tier below can verify end to end as well; a hit says
    what its entry was verified against (`X-Shardcache-Verified: length, Content-MD5`).
    """
    headers = {
        "Accept-Ranges": "bytes",
        "Content-Type": content_type or DEFAULT_CONTENT_TYPE,
        "X-Shardcache": result.value,
    }
    if etag:
        headers["ETag"] = etag
    if verified_by:
        headers["X-Shardcache-Verified"] = ", ".join(verified_by)
    if byte_range is None:
        headers.update(to_headers(checksums))
    response = web.StreamResponse(status=206 if byte_range else 200, headers=headers)
    if byte_range is not None:
        response.headers["Content-Range"] = byte_range.content_range(size_bytes)
    response.content_length = byte_range.length if byte_range else size_bytes
    return response


async def get_object(request: web.Request) -> web.StreamResponse:
    if request.app[STATE_KEY].get("is_shutting_down"):
        raise ShuttingDown("the daemon is shutting down")
    with request.app[STATE_KEY]["in_flight"]:
        return await _get_object(request)


async def _get_object(request: web.Request) -> web.StreamResponse:
    cache = request.app[CACHE_KEY]
    metrics = request.app[METRICS_KEY]
    loop = asyncio.get_running_loop()
    began = loop.time()
    lease = await cache.open(request.match_info["origin"], request.match_info["key"])
    request.app[PREFETCH_KEY].on_client_read(lease.origin, request.match_info["key"])
    if lease.result is not Result.HIT:  # waiting for the origin's first byte is loader stall
        metrics.client_wait.labels(lease.origin).inc(loop.time() - began)
    try:
        byte_range = parse_range(request.headers.get("Range"), lease.size_bytes)
        start, end = (byte_range.start, byte_range.end + 1) if byte_range else (0, lease.size_bytes)
        if start == end:  # an empty object (ranges of it are 416)
            await settle_empty(lease.fill, lease.stream, request.app[STATE_KEY]["read_timeout_s"])
        response = object_response(
            lease.result,
            lease.size_bytes,
            lease.etag,
            lease.content_type,
            byte_range,
            lease.checksums if lease.result is Result.HIT else (),
            lease.verified_by,
        )
        try:
            writer = await response.prepare(request)
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one
            writer = None
        if writer is None or request.transport is None:
            _client_left(request, lease.origin)  # before the headers went out
            return response
        metrics.requests.labels(lease.origin, lease.result.value).inc()
        metrics.ttfb.labels(lease.result.value).observe(loop.time() - began)
        state = request.app[STATE_KEY]
        sender = FileSender(request.transport, response.write, state["client_send_timeout_s"])
        try:
            await _send_body(lease, sender, start, end, request, metrics)
            await sender.drained()  # so that write_eof has nothing left to wait for
            writer.output_size += sender.take_bypassed_bytes()  # before write_eof reads it
            await response.write_eof()
        except (ClientGone, ConnectionResetError) as exc:  # origin errors are never these
            stalled = isinstance(exc, ClientStalled)
            if stalled:
                metrics.client_timeouts.labels("send").inc()
            else:
                _client_left(request, lease.origin)
            request[CLIENT_GONE] = True  # the access line says 499, not the 200 it began as
            log.debug("client left during %r: %s", request.path, exc)
            _abort(request, discard_unsent=stalled)
            return response
        except Exception as exc:  # any failure after the headers: never a clean short body
            expected = isinstance(exc, ShardcacheError | OSError | EOFError)
            log.log(
                logging.ERROR,
                "aborting %r after %d of %d bytes: %s",
                request.path,
                sender.sent_bytes,
                end - start,
                exc,
                exc_info=not expected,
            )
            if lease.result is Result.HIT and isinstance(exc, EOFError):
                # The entry's file is shorter than its index says: drop it (before the client
                # hears of the failure and retries), so the next request refetches.
                with contextlib.suppress(NotCached):
                    await cache.purge(request.match_info["origin"], request.match_info["key"])
            _abort(request)
            return response
        finally:
            sender.close()
            source = "cache" if lease.result is Result.HIT else "origin"
            metrics.response_bytes.labels(lease.origin, source).inc(sender.sent_bytes)
            writer.output_size += sender.take_bypassed_bytes()  # for the access log
        metrics.duration.labels(lease.result.value).observe(loop.time() - began)
        return response
    finally:
        await lease.aclose()


def _client_left(request: web.Request, origin: str) -> None:
    """A client going away mid-response is normal (`tar t | head`): a 499 and a counter, never an
    error; a fill it started goes on for the cache and for other readers."""
    request[CLIENT_GONE] = True
    request.app[METRICS_KEY].client_disconnects.labels(origin).inc()


async def _send_body(
    lease: Lease,
    sender: FileSender,
    start: int,
    end: int,
    request: web.Request,
    metrics: Metrics,
) -> None:
    def on_wait(seconds: float) -> None:
        if seconds > 0:
            metrics.client_wait.labels(lease.origin).inc(seconds)

    if start == end:
        return  # settled before the headers
    if lease.entry is not None:
        await sender.send(lease.entry.fd, start, end - start)
    elif lease.fill is not None:
        await send_fill(sender, lease.fill, lease.fill_fd, start, end, on_wait)
    elif lease.stream is not None:
        read_timeout = request.app[STATE_KEY]["read_timeout_s"]
        await send_stream(
            lease.stream, sender.write, start, end, read_timeout, on_wait, sender.count_written
        )


async def head_object(request: web.Request) -> web.StreamResponse:
    cache = request.app[CACHE_KEY]
    result, info = await cache.head(request.match_info["origin"], request.match_info["key"])
    byte_range = parse_range(request.headers.get("Range"), info.size_bytes)
    return object_response(
        result, info.size_bytes, info.etag, info.content_type, byte_range, info.checksums
    )


async def delete_object(request: web.Request) -> web.Response:
    await request.app[CACHE_KEY].purge(request.match_info["origin"], request.match_info["key"])
    return web.json_response(
        {"deleted": f"{request.match_info['origin']}/{request.match_info['key']}"}
    )


async def post_prefetch(request: web.Request) -> web.Response:
    queue = request.app[PREFETCH_KEY]
    raw = await _read_body(request)
    origins = set(request.app[CACHE_KEY].origins)
    # Parsing and expanding up to MAX_EXPANSION keys takes longer than the loop may be held.
    targets, warm = await asyncio.to_thread(_parse_prefetch_body, raw, origins)
    submitted = await queue.submit(targets, warm=warm)
    return web.json_response(
        {
            "queued": submitted.queued,
            "cached": submitted.cached,
            "in_flight": submitted.in_flight,
            "batch": submitted.batch,
        },
        status=202,
    )


async def _read_body(request: web.Request) -> bytes:
    """The request body: at most MAX_BODY_BYTES (413 beyond, before reading when announced),
    within the body timeout (408: a client announcing a body and sending nothing)."""
    announced = request.content_length
    if announced is not None and announced > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=announced)
    timeout_s = request.app[STATE_KEY]["client_body_timeout_s"]
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()  # aiohttp answers 413 past client_max_size
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None


def _parse_prefetch_body(raw: bytes, origins: set[str]) -> tuple[list[tuple[str, str]], bool]:
    """The (origin, key) targets of a POST /_/prefetch body, and whether it asks to warm."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        raise BadRequest("the body is not JSON (or is nested too deep)") from None
    targets = parse_targets(body, origins)
    warm = body.get("warm", False)  # a dict: parse_targets said so
    if not isinstance(warm, bool):
        raise BadRequest('"warm" must be true or false')
    return targets, warm


def _batch_id(request: web.Request) -> int | None:
    """The `?batch=N` of a request, or None when absent; a 404 for one that names no batch."""
    if "batch" not in request.query:
        return None
    batch_id = request.query["batch"]
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if (
        re.fullmatch(r"[0-9]{1,18}", batch_id) is None
        or request.app[PREFETCH_KEY].batch(int(batch_id)) is None
    ):
        raise web.HTTPNotFound(reason=f"no prefetch batch {batch_id[:40]!r}")
    return int(batch_id)


async def get_prefetch(request: web.Request) -> web.Response:
    queue = request.app[PREFETCH_KEY]
    document = queue.status()
    batch_id = _batch_id(request)
    if batch_id is not None:
        document["batch"] = queue.batch_status(batch_id)
    return web.json_response(redacted(document))


async def delete_prefetch(request: web.Request) -> web.Response:
    """Drop what is queued (of one batch, with `?batch=N`). Emptying the whole queue also
    releases the look-ahead budget: prefetched, unread shards stay cached, unpinned."""
    batch_id = _batch_id(request)
    dropped = request.app[PREFETCH_KEY].clear(batch_id)
    released = request.app[CACHE_KEY].release_unread() if batch_id is None else 0
    return web.json_response({"dropped": dropped, "released_bytes": released})


async def get_status(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response(redacted(await asyncio.to_thread(state["status"])))


async def get_origins(request: web.Request) -> web.Response:
    return web.json_response({"origins": request.app[STATE_KEY]["origin_urls"]})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if state.get("is_shutting_down"):
        return json_error(503, "shutting down")
    problem = await asyncio.to_thread(state["check_ready"])
    if problem:
        return json_error(503, problem)
    return web.json_response({"status": "ready"})


async def metrics_page(request: web.Request) -> web.Response:
    # Rendering reads the store's usage (SQLite, stat): off the event loop.
    body = await asyncio.to_thread(request.app[METRICS_KEY].render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def not_found(request: web.Request) -> web.Response:
    return json_error(404, f"no such endpoint: {request.path}")


def make_app(
    cache: ShardCache,
    prefetch: PrefetchQueue,
    metrics: Metrics,
    state: dict[str, Any],
    access: AccessPolicy | None = None,
    guard: ConnectionGuard | None = None,
) -> web.Application:
    """Return the aiohttp application; `state` holds `read_timeout_s`, `client_body_timeout_s`,
    `client_send_timeout_s`, `check_ready()`, `status()`, `origin_urls` and the
    `is_shutting_down` flag the daemon sets."""
    app = web.Application(
        middlewares=[track_connection, errors_as_json, admit_request],
        client_max_size=MAX_BODY_BYTES,
    )
    app[ACCESS_KEY] = access or AccessPolicy(None)
    if guard is not None:
        app[GUARD_KEY] = guard
    app[CACHE_KEY] = cache
    app[PREFETCH_KEY] = prefetch
    app[METRICS_KEY] = metrics
    app[STATE_KEY] = state
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_delete("/_/cache/{origin}/{key:.*}", delete_object)
    app.router.add_post("/_/prefetch", post_prefetch)
    app.router.add_get("/_/prefetch", get_prefetch)
    app.router.add_delete("/_/prefetch", delete_prefetch)
    app.router.add_get("/_/origins", get_origins)
    app.router.add_get("/_/status", get_status)
    app.router.add_route("*", "/_/{rest:.*}", not_found)
    app.router.add_get("/{origin}/{key:.*}", get_object, allow_head=False)
    app.router.add_head("/{origin}/{key:.*}", head_object)
    return app
