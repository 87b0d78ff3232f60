"""The daemon's pool of receiving processes (`origins.receiver`), one per core a node's misses may
use, and the handle of one request sent through it (`RemoteExchange`).

The serving process keeps every decision (status and headers checked before a body byte is
taken). Sends never block (MSG_DONTWAIT); a dead receiver fails only its requests in flight and
is replaced at once. The receive flow at length: docs/architecture.md."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from shardcache.errors import OriginUnavailable
from shardcache.origins.receiver_handle import Progress, ReceiverHandle
from shardcache.origins.threads import MAX_THREADS
from shardcache.origins.wire import (
    Message,
)

MAX_RECEIVERS = 16  # the default's cap: past this, one origin's network is the bound
ABORT_GRACE_S = 10.0  # a receiver that has not stopped an aborted request by then is killed
# Each receiver is pinged every HEARTBEAT_S; one that says nothing at all for SILENCE_LIMIT_S
# (stopped, wedged) is killed: its requests fail and are retried on the others, and it is
# replaced. A receiver enforces each request's own timeouts; this catches one that cannot.
HEARTBEAT_S = 1.0
SILENCE_LIMIT_S = 10.0

log = logging.getLogger(__name__)


def default_size(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may use, at most MAX_RECEIVERS: the CPUs it may run on, or
    fewer when its cgroup's CPU quota (a container's CPU limit) allows less, rounded up."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota to read: the affinity is the bound
    return max(1, min(cores, MAX_RECEIVERS))


class RemoteExchange:
    """One request sent through a receiver, from its answer's headers to `finish`: its body
    is landed or read there. `on_end` (the transport's share) is called once, when it ends."""

    def __init__(
        self,
        receiver: ReceiverHandle,
        call_id: int,
        answer: Message,
        on_end: Callable[[], None],
    ) -> None:
        self._receiver = receiver
        self._id = call_id
        self.status = int(answer["status"])
        pairs = answer.get("headers") or []
        self.headers = CIMultiDictProxy(CIMultiDict((str(k), str(v)) for k, v in pairs))
        self._on_end: Callable[[], None] | None = on_end

    def expect_body(self, skip: int, body_bytes: int) -> None:
        """The body is `body_bytes` long, and its first `skip` bytes are not wanted."""
        self._receiver.send({"op": "body", "id": self._id, "skip": skip, "bytes": body_bytes})

    async def land(
        self,
        fd: int,
        position: int,
        end: int,
        crc: int,
        read_s: float,
        min_bytes_per_s: float,
        on_progress: Progress,
    ) -> None:
        message = {
            "op": "land",
            "id": self._id,
            "position": position,
            "end": end,
            "crc": crc,
            "read_s": read_s,
            "min_bytes_per_s": min_bytes_per_s,
        }
        await self._until_done(self._receiver.call(message, fd, on_progress=on_progress))

    async def read(self, read_s: float) -> bytes | None:
        """The next chunk of the body, or None at its end."""
        message = {"op": "read", "id": self._id, "read_s": read_s}
        chunk: bytes | None = await self._until_done(self._receiver.call(message))
        return chunk

    def finish(self, complete: bool) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is None:
            return
        try:
            self._receiver.finish(self._id, complete)
        finally:
            on_end()

    def close(self) -> None:
        self.finish(complete=False)

    async def _until_done(self, future: asyncio.Future[Any]) -> Any:
        """Await `future`; cancelled, abort the work and wait until the receiver says it
        stopped (it writes into a file its caller will close, rename or reuse), killing it
        when it does not within ABORT_GRACE_S."""
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            try:
                self._receiver.send({"op": "abort", "id": self._id})
            except OriginUnavailable:
                pass  # gone: the future fails with it
            await _wait_out(future, self._receiver)
            raise


async def _wait_out(future: asyncio.Future[Any], receiver: ReceiverHandle) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ABORT_GRACE_S
    while not future.done():
        try:
            await asyncio.wait([future], timeout=max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            continue
        if not future.done() and loop.time() >= deadline:
            receiver.kill()  # its reader thread fails the future once the process is gone
            deadline = float("inf")
    if not future.cancelled():
        future.exception()  # retrieved: an abandoned request's error is no one's to see


class ReceiverPool:
    """`size` receiving processes, started on first use (or `start`), each request sent to
    the one with the fewest open. The daemon (or `shardcache check`) builds one, passes it to
    every transport it makes, and closes it; nothing builds one of its own."""

    def __init__(self, size: int = 0, threads: int = MAX_THREADS) -> None:
        """`threads`: each receiver's, for requests in flight (asking or landing)."""
        self.size = size or default_size()
        self._threads = threads
        self.replaced = 0  # receivers that died and were replaced
        self._lock = threading.Lock()
        self._receivers: list[ReceiverHandle] = []
        self._ids = itertools.count(1)
        self._transports = itertools.count(1)
        self._closed = False
        self._watchdog: threading.Thread | None = None

    def new_transport(self) -> int:
        """An id for one transport's connections (they are kept apart in each receiver)."""
        return next(self._transports)

    def start(self) -> None:
        with self._lock:
            self._closed = False
            self._fill_up()
            starting = list(self._receivers)
        _greet(starting)

    def wait_started(self, timeout_s: float) -> int:
        """Wait (blocking: call it on a thread) until every live receiver answered once, at
        most `timeout_s`; return how many still have not. A request sent to one still
        importing waits for its import, which on a loaded machine outlasts a short read
        timeout, so the daemon waits here before it listens."""
        deadline = time.monotonic() + timeout_s
        for receiver in self.alive():
            receiver.has_spoken.wait(max(0.0, deadline - time.monotonic()))
        return sum(1 for receiver in self.alive() if not receiver.has_spoken.is_set())

    def restart(self, size: int = 0) -> None:
        """Let the current receivers go once their open requests end, and start `size` new
        ones (0: `default_size()`), for a reload."""
        with self._lock:
            old, self._receivers = self._receivers, []
            self.size = size or default_size()
            self._closed = False
            self._fill_up()
            starting = list(self._receivers)
        _greet(starting)
        for receiver in old:
            receiver.retire()

    def forget(self, transport: int) -> None:
        """Close a transport's idle connections in every receiver, and stop its requests
        still waiting for an answer."""
        for receiver in self.alive():
            try:
                receiver.send({"op": "forget", "transport": transport})
            except OriginUnavailable:
                pass  # gone: its connections with it

    def alive(self) -> list[ReceiverHandle]:
        with self._lock:
            return [r for r in self._receivers if not r.is_dead]

    def in_flight(self) -> int:
        return sum(len(r.open) for r in self.alive())

    async def ask(
        self,
        request: Message,
        on_started: Callable[[], None],
        on_end: Callable[[], None],
    ) -> RemoteExchange:
        """Send `request` (method, url, label, headers, timeouts, transport) to a receiver and
        return the answer's exchange. `on_end` is called exactly once: when the exchange is
        finished, or when no exchange comes of it (an error, or the caller cancelled)."""
        try:
            receiver = self._pick()
            call_id = next(self._ids)
            with receiver._lock:
                receiver.open.add(call_id)
            future = receiver.call({**request, "op": "ask", "id": call_id}, on_started=on_started)
        except BaseException:
            on_end()
            raise
        try:
            answer = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(lambda done: _orphaned(done, receiver, call_id, on_end))
            try:
                receiver.send({"op": "abort", "id": call_id})
            except OriginUnavailable:
                pass  # gone: the future fails with it
            raise
        except BaseException:
            receiver.finish(call_id, complete=False)
            on_end()
            raise
        return RemoteExchange(receiver, call_id, answer, on_end)

    def close(self) -> None:
        """Let every receiver go once its open requests end; a later request starts anew."""
        with self._lock:
            old, self._receivers = self._receivers, []
            self._closed = True
        for receiver in old:
            receiver.retire()

    def kill_all(self) -> None:
        """End every receiver now (the daemon's last step, after its fills stopped)."""
        with self._lock:
            old, self._receivers = self._receivers, []
            self._closed = True
        for receiver in old:
            receiver.close()
            receiver.kill()

    def status(self) -> dict[str, Any]:
        alive = self.alive()
        return {
            "size": self.size,
            "alive": len(alive),
            "pids": [r.pid for r in alive],
            "in_flight": sum(len(r.open) for r in alive),
            "replaced": self.replaced,
        }

    def _pick(self) -> ReceiverHandle:
        with self._lock:
            self._closed = False
            self._fill_up()
            return min(self._receivers, key=lambda r: len(r.open))

    def _fill_up(self) -> None:
        """Start receivers until `size` are alive (holding the lock). One that cannot be
        started (EMFILE, EAGAIN) is tried again at the next request; with none alive, the
        request fails with OriginUnavailable."""
        # A dead one is counted here, where it leaves the list: two dying at once, the first
        # one's replacement takes the second out before its own report comes (which then
        # finds it gone, as it finds one let go), and it went uncounted.
        alive = [r for r in self._receivers if not r.is_dead]
        self.replaced += len(self._receivers) - len(alive)
        self._receivers = alive
        while len(self._receivers) < self.size:
            try:
                self._receivers.append(ReceiverHandle(self._died, self._threads))
            except OSError as exc:
                log.warning("cannot start a receiving process: %s", exc.strerror or exc)
                if not self._receivers:
                    raise OriginUnavailable(
                        f"no receiving process: cannot start one ({exc.strerror or exc})"
                    ) from None
                break
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name="shardcache-receivers-watchdog", daemon=True
            )
            self._watchdog.start()

    def _watch(self) -> None:
        """Ping every receiver each HEARTBEAT_S; kill one silent for SILENCE_LIMIT_S."""
        while True:
            time.sleep(HEARTBEAT_S)
            now = time.monotonic()
            for receiver in self.alive():
                if now - receiver.last_heard > SILENCE_LIMIT_S:
                    log.warning(
                        "receiver process %d said nothing for %.0f s: killed",
                        receiver.pid,
                        now - receiver.last_heard,
                    )
                    receiver.kill()
                    continue
                try:
                    receiver.send({"op": "ping"})
                except OriginUnavailable:
                    pass  # gone, or killed for not reading: its reader thread sees it end

    def _died(self, receiver: ReceiverHandle) -> None:
        """On `receiver`'s reader thread, once it is gone: replace it, unless it was let go."""
        with self._lock:
            if receiver not in self._receivers:
                return  # retired or closed (its end was asked for), or already counted
            try:
                self._fill_up()  # counts it, and starts its replacement
            except OriginUnavailable:
                pass  # logged; the next request tries again


def _greet(receivers: list[ReceiverHandle]) -> None:
    """Ping new receivers: the first answer of each says it is up (`ReceiverPool.starting`)."""
    for receiver in receivers:
        with contextlib.suppress(OriginUnavailable):  # dead already: replaced on use
            receiver.send({"op": "ping"})


def _orphaned(
    done: asyncio.Future[Any], receiver: ReceiverHandle, call_id: int, on_end: Callable[[], None]
) -> None:
    """An answer (or error) came for a request whose caller had left: end it there."""
    receiver.finish(call_id, complete=False)
    on_end()
    if not done.cancelled():
        done.exception()  # retrieved


__all__ = ["RemoteExchange", "ReceiverHandle", "ReceiverPool"]
