"""The hit lane: a plain `GET /NAME/KEY` whose answer is a remembered, checked cache entry is
answered on the connection's protocol itself (parse, headers, `os.sendfile`), without aiohttp's
request machinery, which costs more than the hit. Anything else, from the first request the lane
does not take, goes to aiohttp on that connection for good. The answer is the one aiohttp's
handler gives (`object_fields`, the same metrics and access line); `docs/architecture.md`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable
from typing import cast

from aiohttp.http import SERVER_SOFTWARE
from aiohttp.web import BaseRequest, StreamResponse

from shardcache.cache.entry import Entry, EntryMeta
from shardcache.cache.lease import Lease, Result, info_of
from shardcache.errors import RangeNotSatisfiable, ShardcacheError
from shardcache.observability.logs import AccessLogger
from shardcache.serving.access import is_foreign_host
from shardcache.serving.conditionals import http_date
from shardcache.serving.hit_answer import HitAnswer
from shardcache.serving.lane_requests import (
    MAX_HEAD_BYTES,
    PlainGet,
    is_relayable,
    may_become_plain,
    parse_plain_get,
)
from shardcache.serving.object_headers import object_fields
from shardcache.serving.ranges import ByteRange, parse_range
from shardcache.serving.s3_names import bucket_of_host, object_view, views_of
from shardcache.serving.server_state import RelayedResponses, ServingContext

log = logging.getLogger("shardcache.server")
MAX_PIPELINED_BYTES = 65536  # read while a body is sent; past it, reading pauses
ANSWERS_PER_TURN = 32  # pipelined hits answered in one loop turn (`LaneProtocol._next_turn`)
KEPT_HEADS = 4096  # hits' heads kept, one per hot entry version (`_head_of`)
_SERVER_FIELD = f"Server: {SERVER_SOFTWARE}\r\n".encode()


def _partial_head(lease: Lease, byte_range: ByteRange) -> bytes:
    """A 206's status line and fields but `Date` and `Server`, as `object_response` makes them
    (the fields, then Content-Range; no checksums: they are the whole object's)."""
    fields = object_fields(
        Result.HIT,
        lease.etag,
        lease.content_type,
        byte_range,
        lease.checksums,
        lease.verified_by,
        lease.last_modified,
    )
    fields["Content-Range"] = byte_range.content_range(lease.size_bytes)
    lines = ["HTTP/1.1 206 Partial Content\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in fields.items()]
    lines.append(f"Content-Length: {byte_range.length}\r\n")
    return "".join(lines).encode()


class RelayingAccessLogger(AccessLogger):
    """The access log, also called (whatever the level) so the hit lane hears when aiohttp ended
    a response to a request it relayed: aiohttp calls it once the response is written, and only
    then may the lane answer on that connection again. `HitLane.access_logger_class` binds it
    to one daemon's `RelayedResponses` (aiohttp makes the instances itself)."""

    relayed: RelayedResponses

    @property
    def enabled(self) -> bool:
        return True

    def log(self, request: BaseRequest, response: StreamResponse, time_s: float) -> None:
        self.relayed.ended(request.transport, response.keep_alive is not False)
        super().log(request, response, time_s)


class HitLane:
    """Answers the plain GET hits of every connection (`protocol_factory`); one per daemon."""

    def __init__(self, context: ServingContext, clock: Callable[[], float] = time.time) -> None:
        self.context = context
        self._clock = clock
        self._date_second = -1
        self._date_field = b""
        self._tasks: set[asyncio.Task[None]] = set()
        self._heads: dict[int, tuple[EntryMeta, bytes | None]] = {}
        self.answered = 0  # requests answered here (the rest went to aiohttp)

    def access_logger_class(self) -> type[RelayingAccessLogger]:
        """The access logger class for aiohttp's runner, telling this lane's connections."""
        return type(
            "DaemonAccessLogger", (RelayingAccessLogger,), {"relayed": self.context.relayed}
        )

    def protocol_factory(
        self, make_protocol: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """Put the lane in front of aiohttp's protocol on each connection."""
        return lambda: LaneProtocol(self, make_protocol())

    def answer(self, connection: LaneProtocol, request: PlainGet) -> bool:
        """Answer `request` if it is a plain hit; False (having sent nothing) otherwise."""
        context = self.context
        if context.state.is_shutting_down or context.access.is_protected(request.path):
            return False
        if not connection.is_host_plain(request.host):
            return False
        names = self._origin_and_key(request.path)
        if names is None:
            return False
        origin, key = names
        began = asyncio.get_running_loop().time()
        wanted: list[ByteRange | None] = [None]
        if request.range is None:
            accept = self._is_sendable
        else:

            def accept(entry: Entry) -> bool:
                if not self._is_sendable(entry):
                    return False
                try:  # `object_headers.wanted_range` with no If-Range
                    wanted[0] = parse_range(request.range, entry.meta.size_bytes)
                except RangeNotSatisfiable:
                    return False  # a 416, aiohttp's to answer
                return True

        try:
            lease = context.cache.open_hit(origin, key, accept)
        except ShardcacheError:
            return False  # an unknown origin, a key refused: aiohttp's handler says so
        if lease is None:
            return False
        self.answered += 1
        context.prefetch.on_client_read(lease.origin, key)
        answer = HitAnswer(self.context, connection, request.path, key, lease, began, self.keep)
        answer.start(self.head_of(lease, request.is_s3, wanted[0]), wanted[0])
        return True

    def _origin_and_key(self, path: str) -> tuple[str, str] | None:
        """The origin and key of `/NAME/KEY` or `/BUCKET/KEY` (`s3_names`, as `s3_api` maps
        both an S3 client's and a plain client's names); None when none serves it."""
        name, _, key = path[1:].partition("/")
        if not key:
            return None
        table = self.context.state.origins
        if table.get(name) is not None:
            return name, key
        view = object_view(views_of(name, table.origins.keys(), table.specs), key)
        return None if view is None else (view.origin, view.key_of(key))

    def is_plain_host(self, host: str | None) -> bool:
        """Whether a request with this `Host` is the lane's: not one aiohttp's handler refuses
        (a foreign name on loopback), nor a virtual-hosted S3 request."""
        if self.context.access.loopback_only and is_foreign_host(host):
            return False
        return bucket_of_host(host) is None

    def _is_sendable(self, entry: Entry) -> bool:
        return entry.meta.size_bytes > 0 and self._head_of(entry.meta) is not None

    def _head_of(self, meta: EntryMeta) -> bytes | None:
        """The status line and fields of a hit of `meta`'s entry but `Date` and `Server`, as
        aiohttp's handler sends them; None when a field needs escaping (aiohttp refuses those
        itself). Kept per `EntryMeta`: a hot entry's hits share one."""
        kept = self._heads.get(id(meta))
        if kept is not None and kept[0] is meta:
            return kept[1]
        info = info_of(meta)
        fields = object_fields(
            Result.HIT,
            info.etag,
            info.content_type,
            None,
            info.checksums,
            tuple(meta.verified_by),
            info.last_modified,
        )
        if any(("\r" in v or "\n" in v or "\0" in v) for v in fields.values()):
            head = None
        else:
            lines = ["HTTP/1.1 200 OK\r\n"]
            lines += [f"{name}: {value}\r\n" for name, value in fields.items()]
            lines.append(f"Content-Length: {meta.size_bytes}\r\n")
            head = "".join(lines).encode()
        if len(self._heads) >= KEPT_HEADS:
            self._heads.clear()
        self._heads[id(meta)] = (meta, head)
        return head

    def head_of(
        self, lease: Lease, is_s3: bool = False, byte_range: ByteRange | None = None
    ) -> bytes:
        """The status line and fields of `lease`'s hit (of `byte_range`, a 206), `Date` and
        `Server` included, and an S3 client's `x-amz-request-id` (`s3_errors.add_request_id`)."""
        assert lease.entry is not None
        if byte_range is None:
            head = self._head_of(lease.entry.meta)
            assert head is not None  # `_is_sendable` made it
        else:
            head = _partial_head(lease, byte_range)
        head += self._date() + _SERVER_FIELD
        if is_s3:
            head += f"x-amz-request-id: {secrets.token_hex(8).upper()}\r\n".encode()
        return head + b"\r\n"

    def _date(self) -> bytes:
        """`Date: …`, made once a second."""
        now = int(self._clock())
        if now != self._date_second:
            self._date_second = now
            self._date_field = f"Date: {http_date(now)}\r\n".encode()
        return self._date_field

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a body still being sent until it ends (the loop keeps only weak references)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class LaneProtocol(asyncio.Protocol):
    """One connection: its requests go to the lane while it answers them, then (from the
    first it does not) to aiohttp's protocol, which saw the connection made and sees every
    event after. A request that arrives while a body is sent (or while a long pipelined run
    waits for its next loop turn) waits in `_buffer`."""

    def __init__(self, lane: HitLane, inner: asyncio.Protocol) -> None:
        self._lane = lane
        self._inner = inner
        self._buffer = b""
        self._is_handed_over = False
        self._is_paused = False
        self._eof = False
        self._relaying = False  # a request passed to aiohttp, its response not ended yet
        self.sending = False
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.socket_fd = -1
        self.remote: str | None = None
        self._plain_host: str | None = None  # the last `Host` found the lane's

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._inner.connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            self._is_handed_over = True  # no sendfile through TLS
            return
        self.socket_fd = sock.fileno()
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else None

    def data_received(self, data: bytes) -> None:
        if self._is_handed_over:
            self._inner.data_received(data)
            return
        self._buffer = self._buffer + data if self._buffer else data
        if self.sending or self._relaying:
            if len(self._buffer) > MAX_PIPELINED_BYTES and not self._is_paused:
                self._is_paused = True
                self.transport.pause_reading()
            return
        self._answer_buffered()

    def _answer_buffered(self) -> None:
        buffer, start, answers = self._buffer, 0, 0
        while start < len(buffer) and not (self.sending or self._relaying or self._is_handed_over):
            if self.transport.is_closing():
                self._buffer = b""  # aborted after a failed body: nothing more is answered
                return
            if answers == ANSWERS_PER_TURN:
                self._buffer = buffer[start:]
                self._next_turn()
                return
            end = buffer.find(b"\r\n\r\n", start, start + MAX_HEAD_BYTES + 4)
            if end < 0:
                self._buffer = rest = buffer[start:]
                if len(rest) > MAX_HEAD_BYTES or not may_become_plain(rest):
                    self._hand_over()  # aiohttp's parser refuses garbage at once, not later
                return
            head = buffer[start:end]
            request = parse_plain_get(head)
            if request is not None and self._lane.answer(self, request):
                answers += 1
                start = end + 4
                if self.sending:  # the body goes on in a task: what is left waits for it
                    self._buffer = buffer[start:]
                    return
                continue
            if is_relayable(head):
                self._buffer = buffer[end + 4 :]
                self._relay(buffer[start : end + 4])
            else:
                self._buffer = buffer[start:]
                self._hand_over()
            return
        if not self.transport.is_closing():
            self._buffer = buffer[start:]

    def _next_turn(self) -> None:
        """Answer the rest of a pipelined run in a later loop turn, as if behind a body: one
        client's run of small hits must not hold the loop for everyone else's."""
        self.sending = True
        asyncio.get_running_loop().call_soon(self.answered)

    def _relay(self, head: bytes) -> None:
        """Pass one bodiless request to aiohttp and read on only once its response ended
        (`relayed_ended`, told by `RelayingAccessLogger`): the connection stays the lane's."""
        self._relaying = True
        self._lane.context.relayed.watch(self.transport, self.relayed_ended)
        self._inner.data_received(head)

    def relayed_ended(self, keeps_alive: bool) -> None:
        """aiohttp ended the response to the request `_relay` passed it; unless it keeps the
        connection alive (it closes it next), the lane reads on."""
        if not self._relaying:
            return
        self._relaying = False
        self._lane.context.relayed.forget(self.transport)
        if not keeps_alive:
            self._hand_over()
            return
        self._go_on()

    def is_host_plain(self, host: str | None) -> bool:
        """`HitLane.is_plain_host`, asked once for the `Host` a connection keeps sending."""
        if host is not None and host == self._plain_host:
            return True
        if not self._lane.is_plain_host(host):
            return False
        self._plain_host = host
        return True

    def answered(self) -> None:
        """A body went out whole: go on with what arrived meanwhile."""
        was_sending, self.sending = self.sending, False
        if was_sending:  # else answered at once, inside `_answer_buffered`'s loop
            self._go_on()

    def _go_on(self) -> None:
        if self._is_paused:
            self._is_paused = False
            self.transport.resume_reading()
        self._answer_buffered()  # a client done sending (`_eof`) still reads its answers
        if self._eof and not (self.sending or self._relaying) and not self.transport.is_closing():
            self._hand_over()  # what the lane left is aiohttp's, with the end of the input
            if not self._inner.eof_received():
                self.transport.close()

    def abort(self, discard_unsent: bool = False) -> None:
        """End the connection after a body that did not go out whole (never a clean short
        body); `discard_unsent`: reset it (a client that stopped reading)."""
        self.sending = False
        self._buffer = b""
        if discard_unsent:
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _hand_over(self) -> None:
        """From now on aiohttp's protocol reads this connection, starting with the buffer."""
        self._is_handed_over = True
        data, self._buffer = self._buffer, b""
        if self._is_paused:
            self._is_paused = False
            self.transport.resume_reading()
        if data:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if not self._is_handed_over:
            if self.sending:
                self._eof = True
                return True  # kept open until the lane's body is out (`_go_on`)
            # A relayed request's handler must hear the end now: it watches the connection
            # for a client that left (a miss waiting for its turn gives the turn back).
            self._hand_over()
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._buffer = b""
        if self._relaying:
            self._lane.context.relayed.forget(self.transport)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
