"""A receiving process (`python -m shardcache.origins.receiver FD`): sends the daemon's origin
requests on its own connections and lands their bodies in the fills' files, one thread per
request, so TLS, `pwrite` and CRC-32C run outside the serving process's interpreter.

The daemon keeps every decision; this process keeps no state beyond its connections, ignores
SIGINT and SIGTERM (the daemon drains first), and exits when its socket closes."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from shardcache.crc_spans import Span
from shardcache.errors import OriginUnavailable
from shardcache.origins.landing import Body
from shardcache.origins.pool import Connections, Exchange, TlsConnection, tls_context
from shardcache.origins.responses import map_http_errors, site_of
from shardcache.origins.threads import MAX_THREADS, Abort, Aborted
from shardcache.origins.wire import (
    MAX_HEADER_BYTES,
    Message,
    error_message,
    receive,
    send_message,
)


@dataclass(slots=True)
class _Request:
    """One request of the daemon's, from `ask` to `finish`."""

    transport: int
    abort: Abort = field(default_factory=Abort)
    exchange: Exchange | None = None
    body: Body | None = None


class ReceiverProcess:
    """Serves one daemon over `sock` until it closes."""

    def __init__(self, sock: socket.socket, threads: int = MAX_THREADS) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._requests: dict[int, _Request] = {}
        self._pools: dict[int, Connections] = {}  # by the daemon's transport
        self._work = ThreadPoolExecutor(threads, thread_name_prefix="shardcache-receive")

    def serve(self) -> None:
        while True:
            try:
                received = receive(self._sock)
            except (OSError, ValueError):
                return
            if received is None:
                return
            message, _, fd = received
            try:
                self._dispatch(message, fd)
            except (KeyError, TypeError, ValueError) as exc:  # a daemon bug: say so, go on
                if fd is not None:
                    os.close(fd)
                print(f"shardcache receiver: bad message {message!r}: {exc}", file=sys.stderr)

    def _dispatch(self, message: Message, fd: int | None) -> None:
        op, call_id = message["op"], int(message.get("id", 0))
        if op == "ask":
            with self._lock:
                request = self._requests[call_id] = _Request(int(message["transport"]))
            self._work.submit(self._ask, call_id, request, message)
        elif op == "body":
            request = self._requests[call_id]
            assert request.exchange is not None
            request.body = Body(request.exchange, int(message["skip"]), int(message["bytes"]), 30.0)
        elif op == "land":
            assert fd is not None
            self._work.submit(self._land, call_id, self._requests[call_id], message, fd)
        elif op == "read":
            self._work.submit(
                self._read, call_id, self._requests[call_id], float(message["read_s"])
            )
        elif op == "ping":  # the daemon's heartbeat: this process still reads and answers
            self._send({"op": "pong"})
        elif op == "abort":
            request_or_none = self._requests.get(call_id)
            if request_or_none is not None:
                request_or_none.abort.fire()
        elif op == "finish":
            with self._lock:
                done = self._requests.pop(call_id, None)
            if done is not None and done.exchange is not None:
                done.exchange.finish(complete=bool(message["complete"]))
        elif op == "forget":  # the transport closed: its idle connections, and its asking
            transport = int(message["transport"])
            pool = self._pools.pop(transport, None)
            if pool is not None:
                pool.close()
            with self._lock:
                asking = [
                    r
                    for r in self._requests.values()
                    if r.transport == transport and not r.exchange
                ]
            for request in asking:
                request.abort.fire()
        else:
            raise ValueError(f"unknown op {op!r}")

    def _send(self, message: Message, payload: bytes = b"") -> None:
        with self._send_lock:
            try:
                send_message(self._sock, message, payload)
            except OSError:
                pass  # the daemon is gone: this process ends when its socket reads EOF

    def _failed(self, call_id: int, exc: BaseException) -> None:
        self._send(error_message(call_id, exc))

    # -- on a request's thread -----------------------------------------------------------------

    def _ask(self, call_id: int, request: _Request, message: Message) -> None:
        self._send({"op": "started", "id": call_id})
        try:
            exchange = self._exchange(request.abort, message)
        except BaseException as exc:
            with self._lock:
                self._requests.pop(call_id, None)
            self._failed(call_id, _origin_error(exc, str(message["label"])))
            return
        request.exchange = exchange
        headers = [[k, v] for k, v in exchange.response.getheaders()]
        answer = {"op": "answer", "id": call_id, "status": exchange.response.status}
        answer["headers"] = headers
        # Bounded as encoded (JSON writes a byte of 0x80-0xff as six): a message too large
        # for the daemon's read would be cut short and end this process.
        if len(json.dumps(answer)) > MAX_HEADER_BYTES:
            exchange.close()
            with self._lock:
                self._requests.pop(call_id, None)
            self._failed(
                call_id, OriginUnavailable(f"{message['label']}: answer headers too large")
            )
            return
        self._send(answer)

    def _exchange(self, abort: Abort, message: Message) -> Exchange:
        """One request on one connection of this process's pool for the daemon's transport."""
        url, label = str(message["url"]), str(message["label"])
        transport = int(message["transport"])
        with self._lock:
            pool = self._pools.get(transport)
            if pool is None:
                ca_file = message.get("ca_file")
                context = tls_context(None if ca_file is None else str(ca_file))
                pool = self._pools[transport] = Connections(context, float(message["connect_s"]))
        site = site_of(url)
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with map_http_errors(label):
            connection, _ = pool.take(site)
            try:
                if connection.sock is None:
                    abort.check()
                    if isinstance(connection, TlsConnection):
                        connection.abort = abort
                    connection.connect()  # bounded by the connect timeout, and by `abort`
                sock = connection.sock
                assert sock is not None
                abort.watch(sock)
                sock.settimeout(float(message["read_s"]))
                connection.request(str(message["method"]), target, headers=message["headers"])
                response = connection.getresponse()
            except BaseException:
                connection.close()
                raise
        return Exchange(pool, site, connection, response, sock, abort, label)

    def _land(self, call_id: int, request: _Request, message: Message, fd: int) -> None:
        def progress(count: int, crc: int, spans: list[Span]) -> None:
            message = {"op": "progress", "id": call_id, "bytes": count, "crc": crc}
            self._send({**message, "spans": spans} if spans else message)

        try:
            assert request.body is not None and request.exchange is not None
            request.body.land(
                fd,
                int(message["position"]),
                int(message["end"]),
                int(message["crc"]),
                float(message["read_s"]),
                float(message["min_bytes_per_s"]),
                progress,
            )
        except BaseException as exc:
            os.close(fd)  # first: once the daemon reads the answer, no write of ours follows
            label = request.exchange.label if request.exchange else "receiver"
            self._failed(call_id, _origin_error(exc, label))
        else:
            os.close(fd)
            self._send({"op": "landed", "id": call_id})

    def _read(self, call_id: int, request: _Request, read_s: float) -> None:
        try:
            assert request.body is not None and request.exchange is not None
            chunk = request.body.next_chunk(read_s)
        except BaseException as exc:
            label = request.exchange.label if request.exchange else "receiver"
            self._failed(call_id, _origin_error(exc, label))
            return
        if chunk is None:
            self._send({"op": "end", "id": call_id})
        else:
            self._send({"op": "chunk", "id": call_id}, chunk)


def _origin_error(exc: BaseException, label: str) -> BaseException:
    if isinstance(exc, Aborted):
        return OriginUnavailable(f"{label}: stopped")
    return exc


def main(argv: list[str]) -> None:
    """`receiver FD [THREADS]`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[1]))
    ReceiverProcess(sock, int(argv[2]) if len(argv) > 2 else MAX_THREADS).serve()
    os._exit(0)  # request threads still blocked on a socket must not hold the exit


if __name__ == "__main__":
    main(sys.argv)
