"""Keep-alive connections to HTTP(S) origins, by site, for `origins.http`'s transport: the pool,
TLS, and one request's `Exchange` (its connection until its answer's body ended).

A connection is reused only when its last answer was read to the end, nothing waits on it, and
it has been quiet for QUIET_S. Interim 1xx answers are skipped (RFC 9110 §15.2)."""

from __future__ import annotations

import functools
import http.client
import select
import socket
import ssl
import threading
import time

from multidict import CIMultiDict, CIMultiDictProxy

from shardcache.origins.threads import Abort, Share

Site = tuple[str, str, int | None]  # scheme, host, port
IDLE_S = 10.0  # an idle connection older than this is not reused (servers close them)
# An idle connection younger than this is not reused: an origin that sends one more answer
# after a complete one (a forged or repeated answer; measured 30-200 ms late) would have it
# read as the next request's. Bytes that come meanwhile show at `take`, and it is closed.
QUIET_S = 0.5
MAX_IDLE_PER_SITE = 64
MAX_INTERIM = 16  # interim (1xx) answers skipped before one request's final answer


class InterimSkippingResponse(http.client.HTTPResponse):
    """An answer whose interim 1xx answers before the final one are skipped.

    http.client skips only `100 Continue`; any other 1xx (`103 Early Hints`, `102
    Processing`) came back as the answer itself, with no body, and the final answer was
    left on the connection: every request to such an origin failed (a 502). Each is read as
    a 100 here, whose headers `begin` skips. `101 Switching Protocols` is final: nothing here
    asks for an upgrade, so it is an error like any status the caller does not expect."""

    def _read_status(self) -> tuple[str, int, str]:
        interim = getattr(self, "_interim", 0)
        version, status, reason = super()._read_status()  # type: ignore[misc]
        if 100 < status < 200 and status != 101:
            if interim >= MAX_INTERIM:
                raise http.client.HTTPException(f"more than {MAX_INTERIM} interim answers")
            self._interim = interim + 1
            status = http.client.CONTINUE
        return str(version), int(status), str(reason)


class PlainConnection(http.client.HTTPConnection):
    response_class = InterimSkippingResponse


class TlsConnection(http.client.HTTPConnection):
    """HTTPS whose TLS handshake an `Abort` can stop: the TCP socket is followed before the
    handshake (http.client's HTTPSConnection does both in one call), so a server dripping
    its handshake a byte at a time cannot hold an origin thread past the request's time."""

    default_port = 443
    response_class = InterimSkippingResponse

    def __init__(self, host: str, port: int | None, timeout: float, tls: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls = tls
        self.abort: Abort | None = None

    def connect(self) -> None:
        super().connect()  # TCP, within the connect timeout
        assert self.sock is not None
        # Wrapping takes the descriptor over from the TCP socket: follow the TLS one.
        self.sock = self._tls.wrap_socket(
            self.sock, server_hostname=self.host, do_handshake_on_connect=False
        )
        if self.abort is not None:
            self.abort.watch(self.sock)
        self.sock.do_handshake()


def has_bytes_waiting(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection can be read without blocking: bytes nobody asked for, or
    the server's close."""
    sock = connection.sock
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed under it
        return True


class Connections:
    """Idle keep-alive connections by site (scheme, host, port), taken by one request at a
    time. A server closes idle connections on its own schedule; one idle longer than IDLE_S
    is not reused, nor one idle for less than QUIET_S (see the module docstring). A request
    that fails on a reused connection is not sent again here: it fails, and the caller's
    retry policy (which counts every request) decides."""

    def __init__(self, tls: ssl.SSLContext, connect_s: float) -> None:
        self._tls = tls
        self._connect_s = connect_s
        self._lock = threading.Lock()
        self._idle: dict[Site, list[tuple[http.client.HTTPConnection, float]]] = {}
        self._closed = False

    def take(self, site: Site) -> tuple[http.client.HTTPConnection, bool]:
        """A connection to `site`, and whether it carried a request before: the quiet one
        idle longest (yet under IDLE_S), or a new one."""
        now = time.monotonic()
        stale: list[http.client.HTTPConnection] = []
        chosen: http.client.HTTPConnection | None = None
        with self._lock:
            idle = self._idle.get(site, [])
            keep = []
            for connection, since in idle:
                if now - since >= IDLE_S or has_bytes_waiting(connection):
                    stale.append(connection)
                elif chosen is None and now - since >= QUIET_S:
                    chosen = connection
                else:
                    keep.append((connection, since))
            if idle:
                self._idle[site] = keep
        for connection in stale:
            connection.close()
        if chosen is not None:
            return chosen, True
        scheme, host, port = site
        if scheme == "https":
            return TlsConnection(host, port, self._connect_s, self._tls), False
        return PlainConnection(host, port, timeout=self._connect_s), False

    def give(self, site: Site, connection: http.client.HTTPConnection) -> None:
        """Keep `connection` for a later request, unless bytes already wait on it: past a
        body's announced end, they would be read as the next request's answer (another key's
        bytes); a server's close (EOF) reads the same way."""
        if has_bytes_waiting(connection):
            connection.close()
            return
        with self._lock:
            idle = self._idle.setdefault(site, [])
            if self._closed or len(idle) >= MAX_IDLE_PER_SITE:
                connection.close()
                return
            idle.append((connection, time.monotonic()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection, _ in connections:
                connection.close()


class Exchange:
    """One request's connection and response, until the body is read (the connection then
    goes back to the pool) or the stream is closed (it is closed with it). Either way its
    turn in the transport's `Share` is given back then, once."""

    def __init__(
        self,
        pool: Connections,
        site: Site,
        connection: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        sock: socket.socket,
        abort: Abort,
        label: str,
    ) -> None:
        self.pool = pool
        self.site = site
        self.connection: http.client.HTTPConnection | None = connection
        self.response = response
        self.sock = sock
        self.abort = abort
        self.label = label
        self.headers = CIMultiDictProxy(CIMultiDict(response.getheaders()))
        self.share: Share | None = None  # the turn it holds, set once it is the answer

    def finish(self, complete: bool) -> None:
        """Give the connection back when the body was read in full and the server keeps it
        open; close it otherwise. Once; safe on any thread (one at a time)."""
        connection, self.connection = self.connection, None
        if connection is None:
            return
        self.abort.watch_nothing()  # from now on it may carry another request
        response = self.response
        try:
            if complete and not response.chunked:
                complete = not self._bytes_left_over()
                response.close()  # its bytes are all read: http.client may send the next
            if complete and response.isclosed() and not response.will_close:
                self.pool.give(self.site, connection)  # unless more bytes came: see `give`
            else:
                connection.close()
        finally:
            if self.share is not None:
                self.share.give_back()

    def close(self) -> None:
        self.finish(complete=False)

    def _bytes_left_over(self) -> bool:
        """Whether bytes past the body's end were read with it (into http.client's buffer)
        or wait on the socket: the connection is then not fit for another request."""
        assert self.response.fp is not None
        timeout = self.sock.gettimeout()
        self.sock.settimeout(0)  # look, do not wait
        try:
            return bool(self.response.fp.peek(1))
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        except (OSError, ValueError):
            return True
        finally:
            self.sock.settimeout(timeout)


@functools.lru_cache(maxsize=32)
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """How https:// origins are verified: the system's CAs (and `SSL_CERT_FILE`'s, as OpenSSL
    reads it), plus `ca_file`'s; hostnames checked. Never unverified: an origin whose
    certificate does not verify fails (`OriginUntrusted`), it is never read in plain text.

    One context per `ca_file` (and one without), built once: loading CA bundles takes
    milliseconds, and transports are built on the event loop (a reload, a tier member found by
    DNS)."""
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=ca_file)
    return context


__all__ = ["Connections", "Exchange", "Site", "TlsConnection", "has_bytes_waiting", "tls_context"]
