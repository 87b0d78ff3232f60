"""Blocking origin I/O on threads, and the bounds on it.

`Abort` holds the socket of the request in flight: firing it ends a blocked `recv` at once. A
`Share` bounds what one origin may hold of the shared threads, so an origin whose answers hang
cannot take the threads another needs; taken on the event loop, given back from any thread."""

from __future__ import annotations

import asyncio
import socket
import threading

# Requests in flight at once in one receiving process (`origins.receiver`), each on a thread
# of its own: each origin's `Share` keeps far fewer busy. Idle threads cost no CPU, and their
# stacks are address space, not memory, until used.
MAX_THREADS = 512


class Share:
    """At most `size` requests of one origin at once, each from before it is sent until its
    body was read or abandoned: the origin threads (and connections) it may hold.

    `take` waits on the event loop; `give_back` may be called from any thread (a body's end
    is seen by the thread that landed it), exactly once per `take`.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0  # taken and not given back: what this origin holds now
        self._semaphore = asyncio.Semaphore(size)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def take(self) -> None:
        await self._semaphore.acquire()
        self._loop = asyncio.get_running_loop()
        self.in_use += 1

    def give_back(self) -> None:
        loop = self._loop
        assert loop is not None, "given back before taken"
        try:
            loop.call_soon_threadsafe(self._given_back)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for a turn any more

    def _given_back(self) -> None:
        self.in_use -= 1
        self._semaphore.release()


class Aborted(Exception):
    """Raised on a worker thread whose request was abandoned (its task was cancelled)."""


class Abort:
    """Stops the blocking work of one request from another thread: fired, it shuts down the
    request's socket, so a `recv` or `send` blocked on it returns at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self.fired = False

    def watch(self, sock: socket.socket | None) -> None:
        """Follow `sock` from now on (None: no socket to stop); raises Aborted if already
        fired, so the worker stops before its next blocking call."""
        with self._lock:
            self._socket = sock
            if self.fired:
                raise Aborted()

    def watch_nothing(self) -> None:
        """Stop following the socket (its connection goes back to the pool, and may carry
        another request by the time this abort fires)."""
        with self._lock:
            self._socket = None

    def check(self) -> None:
        if self.fired:
            raise Aborted()

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            sock = self._socket
        if sock is not None:
            _shut_down(sock)


def _shut_down(sock: socket.socket) -> None:
    """Shut the connection down under the TLS layer, if any: the thread reading it may hold
    its SSL object, which must not be touched from here."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed, or never connected


__all__ = ["MAX_THREADS", "Abort", "Aborted", "Share"]
