"""Client connections: how many may be open (in all, and per address) and how long each may sit
idle or spend on its headers. `ConnectionGuard` wraps the protocol factory, so it sees every
connection from accept to close without touching the HTTP parser; plain asyncio otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

log = logging.getLogger("shardcache.connections")
SWEEP_INTERVAL_S = 0.5
ROOM_AGAIN_FRACTION = 0.9  # log "room again" once below this share of the limit
_REFUSAL_BODY = b'{"error": "too many client connections; retry shortly"}'
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 1\r\n"
    b"X-Shardcache-Error: too_many_connections\r\n"  # not a store's throttling (`keys`)
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY
)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The client limits, from `--client-idle-timeout`, `--client-header-timeout`,
    `--max-connections` and `--max-connections-per-client` (their defaults are config's)."""

    idle_s: float
    header_s: float
    max_connections: int
    max_per_client: int


class _Connection:
    """What the guard knows of one open connection."""

    __slots__ = ("transport", "client", "idle_since", "head_started", "active_requests", "lost")

    def __init__(self, transport: asyncio.BaseTransport, client: str, now: float) -> None:
        self.transport = transport
        self.client = client
        self.idle_since = now  # when it last had no request in progress
        self.head_started: float | None = None  # first byte of a request not yet handed over
        self.active_requests = 0
        self.lost = asyncio.Event()  # the client closed it (or it was closed)


class ConnectionGuard:
    """Counts, limits and times out the connections of one listening socket."""

    def __init__(
        self,
        limits: ConnectionLimits,
        on_close: Callable[[str], None] = lambda reason: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._on_close = on_close  # told "idle", "header" or "limit" for each connection closed
        self._clock = clock
        self._connections: dict[asyncio.BaseTransport, _Connection] = {}
        self._per_client: dict[str, int] = {}
        self._clients_refused: set[str] = set()  # at their limit, warned about once
        self._is_refusing = False
        self.refused = 0
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def open_count(self) -> int:
        return len(self._connections)

    def protocol_factory(
        self, make_protocol: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """Wrap the server's factory (`loop.create_server(guard.protocol_factory(...))`)."""
        return lambda: _GuardedProtocol(self, make_protocol)

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="connection sweep")

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    # -- called by the HTTP layer --------------------------------------------------------------

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._connections.get(transport) if transport is not None else None
        if connection is not None:
            connection.active_requests += 1
            connection.head_started = None

    def lost(self, transport: asyncio.BaseTransport | None) -> asyncio.Event | None:
        """Set once the connection closes: a handler waiting for something (an origin's
        first byte) notices a client that left without writing to it. Already set when the
        connection closed before its handler asked (aiohttp then gives no transport); None
        for an open transport this guard does not know."""
        if transport is None or transport.is_closing():
            gone = asyncio.Event()
            gone.set()
            return gone
        connection = self._connections.get(transport)
        return connection.lost if connection is not None else None

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._connections.get(transport) if transport is not None else None
        if connection is not None:
            connection.active_requests = max(0, connection.active_requests - 1)
            connection.idle_since = self._clock()

    # -- called by _GuardedProtocol ------------------------------------------------------------

    def _admit(self, transport: asyncio.BaseTransport) -> bool:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self._per_client.get(client, 0) >= self.limits.max_per_client:
            self.refused += 1
            if client not in self._clients_refused:
                self._clients_refused.add(client)
                log.warning(
                    "client %s holds %d connections, the per-client limit: its new ones are "
                    "answered 503 until some close (--max-connections-per-client)",
                    client,
                    self._per_client[client],
                )
            self._on_close("client_limit")
            return False
        if len(self._connections) >= self.limits.max_connections:
            self.refused += 1
            if not self._is_refusing:
                self._is_refusing = True
                log.warning(
                    "connection limit reached: %d client connections open; new ones are "
                    "answered 503 until some close (--max-connections)",
                    len(self._connections),
                )
            self._on_close("limit")
            return False
        self._connections[transport] = _Connection(transport, client, self._clock())
        self._per_client[client] = self._per_client.get(client, 0) + 1
        return True

    def _data_received(self, transport: asyncio.BaseTransport) -> None:
        connection = self._connections.get(transport)
        if connection is not None and not connection.active_requests:
            if connection.head_started is None:
                connection.head_started = self._clock()

    def _lost(self, transport: asyncio.BaseTransport) -> None:
        connection = self._connections.get(transport)
        if connection is not None:
            connection.lost.set()
        self._forget(transport)
        room = len(self._connections) < self.limits.max_connections * ROOM_AGAIN_FRACTION
        if self._is_refusing and room:
            self._is_refusing = False
            log.info(
                "below the connection limit again: %d open, %d refused so far",
                len(self._connections),
                self.refused,
            )

    # -- the sweep -----------------------------------------------------------------------------

    def sweep(self) -> int:
        """Close every connection past its idle or header deadline; return how many."""
        now = self._clock()
        expired: list[tuple[_Connection, str]] = []
        for connection in self._connections.values():
            if connection.active_requests:
                continue  # the handler bounds a request's body and response itself
            if connection.head_started is not None:
                if now - connection.head_started >= self.limits.header_s:
                    expired.append((connection, "header"))
            elif now - connection.idle_since >= self.limits.idle_s:
                expired.append((connection, "idle"))
        for connection, reason in expired:
            log.debug("closing a client connection: %s timeout", reason)
            self._on_close(reason)
            connection.transport.close()
            self._forget(connection.transport)
        return len(expired)

    def _forget(self, transport: asyncio.BaseTransport) -> None:
        connection = self._connections.pop(transport, None)
        if connection is None:
            return
        left = self._per_client[connection.client] - 1
        if left:
            self._per_client[connection.client] = left
        else:
            del self._per_client[connection.client]
        if left < self.limits.max_per_client * ROOM_AGAIN_FRACTION:
            self._clients_refused.discard(connection.client)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.sweep()


class _GuardedProtocol(asyncio.Protocol):
    """Passes every event to the HTTP protocol, telling the guard first."""

    def __init__(self, guard: ConnectionGuard, make_protocol: Callable[[], asyncio.Protocol]):
        self._guard = guard
        self._make_protocol = make_protocol
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard._admit(transport):
            writable = cast(asyncio.WriteTransport, transport)  # uvloop's subclasses neither
            writable.write(REFUSAL)
            writable.close()
            return
        self._transport = transport
        self._inner = self._make_protocol()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None and self._transport is not None:
            self._guard._data_received(self._transport)
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None and self._transport is not None:
            self._guard._lost(self._transport)
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
