"""The object path, `GET|HEAD /NAME/KEY`, from the cache's lease to the last byte in named steps
(lease, respond, send, settle). Before the first body byte a failure is a JSON error; after it
the connection is aborted, never a clean but short body. Must not know how a miss is filled or
verified (it asks `ShardCache`), the `/_/` routes, or how the application is assembled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from shardcache.cache.fill import FillState
from shardcache.cache.lease import Lease, Result
from shardcache.checksums import Checksum
from shardcache.errors import (
    FillAbandoned,
    IntegrityError,
    OriginError,
    OriginNotFound,
    ShardcacheError,
    ShuttingDown,
    TierLoop,
)
from shardcache.keys import TIER_REQUEST_HEADER
from shardcache.observability.logs import BODY_BYTES, CLIENT_GONE
from shardcache.observability.metrics import Metrics
from shardcache.serving.body import (
    ClientGone,
    ClientStalled,
    FileSender,
    send_checked,
    send_fill,
    send_stream,
    settle_empty,
)
from shardcache.serving.conditionals import (
    Validators,
    is_conditional,
)
from shardcache.serving.object_headers import (
    object_response,
    precondition_response,
    wanted_range,
)
from shardcache.serving.ranges import ByteRange
from shardcache.serving.server_state import CONTEXT_KEY, ServerState, ServingContext

log = logging.getLogger("shardcache.server")
CHECKSUM_MODE_HEADER = "x-amz-checksum-mode"


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


async def _answer_before_fetching(
    request: web.Request, context: ServingContext
) -> web.StreamResponse | None:
    """A conditional GET's 304 or 412 from the object's validators (the cached entry's, a
    fill's, or the origin's HEAD), before a miss starts a GET for bytes it will not send.

    None lets the GET go on; it evaluates the preconditions again against the validators of
    what it reads (the object may change in between). An origin that cannot answer a HEAD
    leaves the answer to the GET."""
    origin, key = request.match_info["origin"], request.match_info["key"]
    try:
        result, info = await context.cache.head(origin, key, wants_checksums=False)
    except OriginNotFound:
        raise
    except OriginError as exc:
        log.debug("no validators for %s before its GET: %s", request.path, exc)
        return None
    answer = precondition_response(request, result, Validators(info.etag, info.last_modified))
    if answer is not None:
        context.metrics.request_counted(origin, result.value)
    return answer


async def get_object(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT_KEY]
    if context.state.is_shutting_down:
        raise ShuttingDown("the daemon is shutting down")
    with context.state.in_flight:
        return await _get_object(request, context)


def _refuse_tier_loop(request: web.Request, state: ServerState) -> None:
    """Refuse a request from another shardcache (asking this one as a tier member or a mirror)
    for an origin that has a tier or mirrors here too: tiers are one level deep, and two daemons
    must not be each other's mirror. Logged once per origin."""
    origin = request.match_info["origin"]
    if not request.headers.get(TIER_REQUEST_HEADER) or not state.origins.has_upstreams(origin):
        return
    problem = (
        f"origin {origin!r} was asked by another shardcache (as a tier member or mirror), but "
        "has a tier or mirrors here too: a tier member's or mirror's config must list neither "
        "(a request loop)"
    )
    if origin not in state.tier_loops_logged:
        state.tier_loops_logged.add(origin)
        log.error("%s; answering such requests 508", problem)
    raise TierLoop(problem)


async def _get_object(request: web.Request, context: ServingContext) -> web.StreamResponse:
    """A GET in named steps: `_lease` (the cache's answer), `_respond` (preconditions, range,
    status and headers), `_send` (the body), `_settle_gone` / `_settle_failed` (after the
    headers, a failure aborts the connection). The lease is closed whatever happens."""
    _refuse_tier_loop(request, context.state)
    began = asyncio.get_running_loop().time()
    guard = context.guard
    reader_left = guard.lost(request.transport) if guard is not None else None
    conditional = is_conditional(request.headers)
    if conditional:
        early = await _answer_before_fetching(request, context)
        if early is not None:
            return early
    lease = await _lease(request, context, reader_left, began)
    if lease is None:  # the client closed its connection while the origin was asked
        return web.Response(status=FillAbandoned.status)
    try:
        return await _respond(request, context, lease, conditional, reader_left, began)
    finally:
        await lease.aclose()


async def _lease(
    request: web.Request,
    context: ServingContext,
    reader_left: asyncio.Event | None,
    began: float,
) -> Lease | None:
    """The cache's lease on the object (a hit, a fill to tail, or a stream through); None when
    the client left while the origin was asked (counted as gone). The caller closes it."""
    origin, key = request.match_info["origin"], request.match_info["key"]
    try:
        lease = await context.cache.open(origin, key, reader_left)
    except FillAbandoned:
        _client_left(request, context.metrics, origin)
        return None
    if not request.headers.get(TIER_REQUEST_HEADER):
        # A tier member sees only its share of a numbered run: the next number belongs to
        # another member, and the node that asked reads ahead itself.
        context.prefetch.on_client_read(lease.origin, key)
    if lease.result is not Result.HIT:  # waiting for the origin's first byte is loader stall
        context.metrics.waited(lease.origin, asyncio.get_running_loop().time() - began)
    return lease


async def _respond(
    request: web.Request,
    context: ServingContext,
    lease: Lease,
    conditional: bool,
    reader_left: asyncio.Event | None,
    began: float,
) -> web.StreamResponse:
    """The answer to a leased GET: a 304 or 412 when a precondition fails against what was
    leased, else the status and headers, then the body (`_send`)."""
    metrics = context.metrics
    validators = Validators(lease.etag, lease.last_modified)
    answer = precondition_response(request, lease.result, validators) if conditional else None
    if answer is not None:  # the object changed since the check before the GET
        await _confirmed(lease)
        metrics.request_counted(lease.origin, lease.result.value)
        return answer
    byte_range = wanted_range(request, validators, lease.size_bytes)
    start, end = (byte_range.start, byte_range.end + 1) if byte_range else (0, lease.size_bytes)
    if start == end:  # an empty object (ranges of it are 416)
        await settle_empty(lease.fill, lease.stream, context.state.origin_timeouts.read_s)
    is_hit = lease.result is Result.HIT
    published = lease.checksums if is_hit else await _asked(request, lease, byte_range)
    response = object_response(
        lease.result,
        lease.size_bytes,
        lease.etag,
        lease.content_type,
        byte_range,
        published,
        lease.verified_by,
        lease.last_modified,
    )
    try:
        writer = await response.prepare(request)
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one
        writer = None
    transport = request.transport
    if writer is None or transport is None:
        _client_left(request, metrics, lease.origin)  # before the headers went out
        return response
    # Counted by result once it is known (`_send`): a read that fails after its headers is
    # an "error", not the miss it started as (its first byte's time is a miss's, though).
    metrics.first_byte(lease.result.value, asyncio.get_running_loop().time() - began)
    sender = FileSender(transport, response.write, context.state.client_send_timeout_s)
    if await _send(request, context, lease, response, writer, sender, start, end, reader_left):
        metrics.request_finished(lease.result.value, asyncio.get_running_loop().time() - began)
    return response


async def _send(
    request: web.Request,
    context: ServingContext,
    lease: Lease,
    response: web.StreamResponse,
    writer: AbstractStreamWriter,
    sender: FileSender,
    start: int,
    end: int,
    reader_left: asyncio.Event | None,
) -> bool:
    """Send bytes [start, end) and end the response; True when it went out whole. A request
    is counted under its result once its body is out (the client may see it end); a failure
    after the headers is settled here and the connection aborted, never a clean short body."""
    metrics = context.metrics
    is_counted = False
    try:
        await _send_body(lease, sender, start, end, request, context, reader_left)
        metrics.request_counted(lease.origin, lease.result.value)
        is_counted = True
        await sender.drained()  # so that write_eof has nothing left to wait for
        writer.output_size += sender.take_bypassed_bytes()  # before write_eof reads it
        await response.write_eof()
        return True
    except (ClientGone, ConnectionResetError) as exc:  # origin errors are never these
        _settle_gone(request, metrics, lease, exc, is_counted)
        return False
    except Exception as exc:  # any failure after the headers: never a clean short body
        await _settle_failed(
            request, context, lease, exc, is_counted, sender.sent_bytes, end - start
        )
        return False
    finally:
        sender.close()
        source = "cache" if lease.result is Result.HIT else "origin"
        metrics.body_sent(lease.origin, source, sender.sent_bytes)
        writer.output_size += sender.take_bypassed_bytes()
        request[BODY_BYTES] = sender.sent_bytes  # for the access log: the body alone


def _settle_gone(
    request: web.Request, metrics: Metrics, lease: Lease, exc: BaseException, is_counted: bool
) -> None:
    """A client that left, or stopped reading (closed by us: a timeout, not a departure, but a
    499 all the same): counted under the result, as the client's choice, not a failure."""
    stalled = isinstance(exc, ClientStalled)
    if stalled:
        metrics.client_timed_out("send")
        request[CLIENT_GONE] = True
    else:
        _client_left(request, metrics, lease.origin)
    if not is_counted:
        metrics.request_counted(lease.origin, lease.result.value)
    log.debug("client left during %s: %s", request.path, exc)
    _abort(request, discard_unsent=stalled)


async def _settle_failed(
    request: web.Request,
    context: ServingContext,
    lease: Lease,
    exc: Exception,
    is_counted: bool,
    sent_bytes: int,
    length: int,
) -> None:
    """A read that failed after its headers: counted as an error, logged, and a hit whose file
    is short or failed its block check dropped (before the client hears of the failure and
    retries, so the next request refetches); then the connection is aborted."""
    if not is_counted:
        context.metrics.request_counted(lease.origin, "error")
    _failed_after_headers(request, context, lease, exc, sent_bytes, length)
    if lease.result is Result.HIT and isinstance(exc, EOFError | IntegrityError):
        if isinstance(exc, IntegrityError):
            _count_corrupt_hit(request, context.metrics, lease.origin, exc)
        origin, key = request.match_info["origin"], request.match_info["key"]
        if lease.entry is not None:  # only the version it read, never a refetch
            await context.cache.drop_damaged(origin, key, lease.entry)
        else:
            with contextlib.suppress(ShardcacheError):  # nothing may escape: see _abort
                await context.cache.purge(origin, key)
    _abort(request)


async def _asked(
    request: web.Request, lease: Lease, byte_range: ByteRange | None
) -> tuple[Checksum, ...]:
    """The checksums a miss or a join publishes: none (the daemon verifies the body before
    its last byte), unless the client asked as S3 clients ask (`x-amz-checksum-mode:
    ENABLED`, boto3's default): then the fill's, once learned from the origin (its first
    answer, or a HEAD beside the GET), so the client checks the body as it does against S3.
    Only those the fill verifies against: one the daemon set aside is never published."""
    mode = request.headers.get(CHECKSUM_MODE_HEADER)
    if byte_range is not None or lease.fill is None or mode is None:
        return ()  # a range publishes none (`object_response`)
    if mode.strip().upper() != "ENABLED":
        return ()
    return await lease.fill.wait_checksums()


async def _confirmed(lease: Lease) -> None:
    """Return once the validators of `lease` may answer a 304 or 412: at once, unless a tier
    member or mirror sent its fill's first answer; then once its body verified. Raises the
    fill's error when it did not (the fill failed): a stale mirror's ETag is no validator of
    the object, and a mirror's ETags may be its own (then only the home's checksum tells)."""
    fill = lease.fill
    if fill is None or fill.info is None or fill.info.sent_by is None:
        return
    await fill.wait_finished()
    if fill.state is FillState.FAILED and fill.error is not None:
        raise fill.error


def _failed_after_headers(
    request: web.Request,
    context: ServingContext,
    lease: Lease,
    exc: Exception,
    sent_bytes: int,
    length: int,
) -> None:
    """Log a read that failed after its headers (a WARNING, rate-limited per origin and kind;
    a bug is an ERROR with its traceback), and count what only this read saw: a streamed-through
    body that failed its checksum (a fill's failure is counted by the fill, once)."""
    if not isinstance(exc, ShardcacheError | OSError | EOFError):
        log.error(
            "aborting %s after %d of %d bytes: %s",
            request.path,
            sent_bytes,
            length,
            exc,
            exc_info=True,
        )
        return
    # A local file shorter than its index says, or unreadable: the cache's failure.
    kind = exc.kind if isinstance(exc, ShardcacheError) else "cache"
    if lease.stream is not None and isinstance(exc, IntegrityError):
        context.metrics.origin_failed(lease.origin, kind)
    context.failures.failed(
        lease.origin,
        kind,
        "%s %s aborted after %d of %d bytes (%s, origin %s): %s",
        request.method,
        request.path,
        sent_bytes,
        length,
        kind,
        lease.origin,
        exc,
    )


def _count_corrupt_hit(
    request: web.Request, metrics: Metrics, origin: str, exc: IntegrityError
) -> None:
    """A hit whose bytes failed their block check: counted, and a WARNING naming the key."""
    metrics.hit_corrupt(origin)
    log.warning("dropping cached %s/%s: %s", origin, request.match_info["key"], exc)


def _client_left(request: web.Request, metrics: Metrics, origin: str) -> None:
    """A client going away mid-response is normal (`tar t | head`): a 499 and a counter, never an
    error; a fill it started goes on for the cache and for other readers."""
    request[CLIENT_GONE] = True
    metrics.client_left(origin)


async def _send_body(
    lease: Lease,
    sender: FileSender,
    start: int,
    end: int,
    request: web.Request,
    context: ServingContext,
    reader_left: asyncio.Event | None,
) -> None:
    """Send bytes [start, end) from where the lease has them: the cached file (block-checked
    when `verify_hits` asks), a fill being written, or a stream through."""
    metrics = context.metrics
    state = context.state

    def on_wait(seconds: float) -> None:
        metrics.waited(lease.origin, seconds)

    if start == end:
        return  # settled before the headers
    checker = state.hit_checker
    entry = lease.entry
    if entry is not None and checker is not None and checker.can_check(entry.meta):
        name = f"{lease.origin}/{request.match_info['key']}"
        if checker.is_checked(name, entry.fd, entry.meta, start, end):
            await sender.send(entry.fd, start, end - start)  # nothing to wait for
            return

        def check(first: int, last: int) -> Awaitable[int]:
            return checker.check(name, entry.fd, entry.meta, first, last)

        await send_checked(sender, entry.fd, start, end, check, metrics.hit_checked)
    elif lease.entry is not None:
        await sender.send(lease.entry.fd, start, end - start)
    elif lease.fill is not None:
        await send_fill(sender, lease.fill, lease.fill_fd, start, end, on_wait, reader_left)
    elif lease.stream is not None:
        await send_stream(
            lease.stream,
            sender.write,
            start,
            end,
            state.origin_timeouts.read_s,
            on_wait,
            sender.count_written,
            state.origin_timeouts.min_bytes_per_s,
        )


async def head_object(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT_KEY]
    _refuse_tier_loop(request, context.state)
    cache = context.cache
    result, info = await cache.head(request.match_info["origin"], request.match_info["key"])
    validators = Validators(info.etag, info.last_modified)
    answer = precondition_response(request, result, validators)
    if answer is not None:
        return answer
    byte_range = wanted_range(request, validators, info.size_bytes)
    return object_response(
        result,
        info.size_bytes,
        info.etag,
        info.content_type,
        byte_range,
        info.checksums,
        last_modified=info.last_modified,
    )
