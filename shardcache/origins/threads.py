"""Blocking origin I/O on worker threads, cancellable from the event loop.

One event loop is one core: with TLS, decrypting a miss's bytes there capped a node near
0.3 GB/s however many segments ran. On a thread, a blocking socket's `recv_into` (and OpenSSL's
`SSL_read`), `pwrite` and the CRC run without the GIL, so each origin connection can use its
own core (see `origins.http`).

A thread cannot be cancelled, but its socket can be shut down: `Abort` holds the socket of
the request in flight, and `run_blocking` fires it when the awaiting task is cancelled.

The threads are shared by every origin; a `Share` bounds what one origin may hold of them
(every request from its sending to its body's end), so that an origin whose answers hang or
drip cannot take the threads another origin needs (issue 23, item 4).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Threads for origin requests, shared by every origin. Each holds one request at a time, so
# this bounds the origin requests in flight; the fill's own limits (segment connections, the
# shared extra connections, caps) and each origin's `Share` keep far fewer busy. Idle threads
# cost no CPU, and their stacks are address space, not memory, until used.
MAX_THREADS = 512

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="shardcache-origin")
        return _executor


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


async def run_blocking(
    work: Callable[[Abort], T],
    abort: Abort | None = None,
    *,
    wait_when_cancelled: bool = False,
    orphaned: Callable[[T], None] | None = None,
) -> T:
    """Run `work(abort)` on an origin thread and return its result.

    Cancelled, the abort is fired. With `wait_when_cancelled` the task then waits for the
    thread to stop (work that writes to a file descriptor must be over before its owner
    closes it); otherwise it returns at once, and a result the thread still produces is given
    to `orphaned` (to close its connection), on the thread.
    """
    abort = abort or Abort()
    future = asyncio.get_running_loop().run_in_executor(executor(), work, abort)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        abort.fire()
        if wait_when_cancelled:
            await _wait_out(future)
        elif orphaned is not None:
            future.add_done_callback(lambda done: _hand_over(done, orphaned))
        raise


async def _wait_out(future: asyncio.Future[T]) -> None:
    """Wait for `future` to finish, through further cancellations (the socket is shut down:
    the thread is at most one write from its end)."""
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            continue
    if not future.cancelled():
        future.exception()  # retrieved: an abandoned request's error is no one's to see


def _hand_over(done: asyncio.Future[T], orphaned: Callable[[T], None]) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    orphaned(done.result())


__all__ = ["Abort", "Aborted", "Share", "executor", "run_blocking"]
