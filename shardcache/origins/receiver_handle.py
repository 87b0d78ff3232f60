"""The daemon's handle of one receiving process (`origins.receiver`): starts it, sends it requests
without blocking the event loop, and reads its answers on a thread of its own.

A receiver that dies fails only its requests in flight (OriginUnavailable), its death reported
to the pool first; no write of a dead receiver can follow its death being seen."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardcache.crc_spans import Span
from shardcache.errors import OriginUnavailable
from shardcache.origins.wire import Message, error_from, receive, send_message, socket_pair

log = logging.getLogger(__name__)

# (bytes written, running CRC-32C, the spans of blocks completed: `crc_spans`), on any thread
Progress = Callable[[int, int, list[Span]], None]


@dataclass(slots=True)
class _Call:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    on_started: Callable[[], None] | None = None
    on_progress: Progress | None = None


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class ReceiverHandle:
    """One receiving process, as the daemon sees it."""

    def __init__(self, on_death: Callable[[ReceiverHandle], None], threads: int) -> None:
        ours, theirs = socket_pair()
        self._sock = ours
        command = ["-m", "shardcache.origins.receiver", str(theirs.fileno()), str(threads)]
        self.process = subprocess.Popen(
            [sys.executable, *command],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            # Its own process group: a terminal's Ctrl-C signals the foreground group, and
            # a receiver still importing (before it ignores SIGINT) died of it with a
            # traceback. The daemon drains and then lets its receivers go.
            process_group=0,
        )
        theirs.close()
        self.pid = self.process.pid
        self._lock = threading.Lock()
        self._pending: dict[int, _Call] = {}
        self.open: set[int] = set()  # requests asked and not yet finished
        self.is_dead = False
        self.is_retired = False  # takes no new request; closed once `open` is empty
        self.last_heard = time.monotonic()  # when it last said anything (the heartbeat)
        self.has_spoken = threading.Event()  # it answered once: imported and reading requests
        self._on_death = on_death
        self._reader = threading.Thread(
            target=self._read, name=f"shardcache-receiver-{self.pid}", daemon=True
        )
        self._reader.start()

    def call(
        self,
        message: Message,
        fd: int | None = None,
        on_started: Callable[[], None] | None = None,
        on_progress: Progress | None = None,
    ) -> asyncio.Future[Any]:
        """Send `message` and return the future of its answer (on the running loop)."""
        loop = asyncio.get_running_loop()
        call = _Call(loop, loop.create_future(), on_started, on_progress)
        call_id = int(message["id"])
        with self._lock:
            if self.is_dead:
                raise self._gone()
            self._pending[call_id] = call
        try:
            self.send(message, fd)
        except BaseException:
            with self._lock:
                self._pending.pop(call_id, None)
            raise
        return call.future

    def send(self, message: Message, fd: int | None = None) -> None:
        """Send without waiting; raises OriginUnavailable when the receiver is gone, or kills
        it when its socket is full (it stopped reading)."""
        try:
            send_message(self._sock, message, fd=fd, flags=socket.MSG_DONTWAIT)
        except BlockingIOError:
            self.kill()
            raise OriginUnavailable(f"receiver process {self.pid} stopped reading") from None
        except OSError:
            raise self._gone() from None

    def finish(self, call_id: int, complete: bool) -> None:
        """End request `call_id` in the receiver (its connection kept or closed)."""
        with self._lock:
            self.open.discard(call_id)
            closing = self.is_retired and not self.open
        try:
            self.send({"op": "finish", "id": call_id, "complete": complete})
        except OriginUnavailable:
            pass  # gone: nothing of the request is left there
        if closing:
            self.close()

    def retire(self) -> None:
        """Take no new request; close once the open ones are finished."""
        with self._lock:
            self.is_retired = True
            closing = not self.open
        if closing:
            self.close()

    def close(self) -> None:
        """Close the daemon's end: the receiver reads EOF and exits."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def kill(self) -> None:
        try:
            self.process.send_signal(signal.SIGKILL)
        except OSError:
            pass  # already gone

    def _gone(self) -> OriginUnavailable:
        return OriginUnavailable(f"receiver process {self.pid} {self._how_it_ended()}")

    def _how_it_ended(self) -> str:
        code = self.process.poll()
        if code is None:
            return "is closing"
        if code < 0:
            return f"died ({signal.Signals(-code).name})"
        return f"exited ({code})"

    # -- on the reader thread ------------------------------------------------------------------

    def _read(self) -> None:
        while True:
            try:
                received = receive(self._sock)
            except (OSError, ValueError):
                received = None
            if received is None:
                break
            self.last_heard = time.monotonic()
            if not self.has_spoken.is_set():
                self.has_spoken.set()
            message, payload, fd = received
            if fd is not None:
                os.close(fd)  # a receiver sends none
            self._deliver(message, payload)
        self._ended()

    def _deliver(self, message: Message, payload: memoryview) -> None:
        op, call_id = message.get("op"), message.get("id")
        if not isinstance(call_id, int):
            return
        with self._lock:
            call = self._pending.get(call_id)
            if call is None:
                return
            if op not in ("started", "progress"):
                del self._pending[call_id]
        if op == "started":
            if call.on_started is not None:
                try:
                    call.loop.call_soon_threadsafe(call.on_started)
                except RuntimeError:
                    pass  # its loop is closed: nobody awaits it
            return
        if op == "progress":
            if call.on_progress is not None:
                spans = [(int(o), int(n), int(c)) for o, n, c in message.get("spans", ())]
                call.on_progress(int(message["bytes"]), int(message["crc"]), spans)
            return
        outcome: Any
        if op == "error":
            outcome = error_from(message)
        elif op == "chunk":
            outcome = bytes(payload)
        elif op == "answer":
            outcome = message
        else:  # "landed", "end"
            outcome = None
        self._post(call, outcome)

    def _post(self, call: _Call, outcome: Any) -> None:
        try:
            call.loop.call_soon_threadsafe(_settle, call.future, outcome)
        except RuntimeError:
            pass  # its loop is closed: nobody awaits it

    def _ended(self) -> None:
        self._sock.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its socket closed, yet it lives: end it
            self.kill()
            self.process.wait()
        with self._lock:
            self.is_dead = True
            calls, self._pending = list(self._pending.values()), {}
            self.open.clear()
        gone = self._gone()
        if not self.is_retired:
            log.warning("%s; its %d requests in flight fail and are retried", gone, len(calls))
        self._on_death(self)  # counted and replaced before its callers hear of it
        for call in calls:
            self._post(call, OriginUnavailable(str(gone)))
