"""One hit the hit lane answers (`hit_lane`): its head, then its body with `os.sendfile`, at
once while the socket takes it, else in a task bounded by the send timeout and checked as
aiohttp's handler checks. The same metrics and access line as there; a failure after the head
aborts the connection (never a clean short body) and drops a damaged entry."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp.log import access_logger

from shardcache.cache.entry import Entry
from shardcache.cache.lease import Lease
from shardcache.errors import IntegrityError, ShardcacheError
from shardcache.observability.logs import CLIENT_CLOSED_STATUS, log_access
from shardcache.serving.body import ClientGone, ClientStalled, FileSender, send_checked
from shardcache.serving.ranges import ByteRange
from shardcache.serving.server_state import ServingContext

log = logging.getLogger("shardcache.server")


class LaneConnection(Protocol):
    """What an answer needs of its connection (`hit_lane.LaneProtocol`)."""

    transport: asyncio.Transport
    socket_fd: int
    remote: str | None
    sending: bool

    def answered(self) -> None: ...

    def abort(self, discard_unsent: bool = False) -> None: ...


class HitAnswer:
    """One hit the lane answers: its head, then its body with `os.sendfile` at once while the
    socket takes it and no block check is due, else in a task (`FileSender`, `send_checked`:
    bounded by the send timeout, checked as aiohttp's handler checks). A failure after the
    head aborts the connection, as there."""

    def __init__(
        self,
        context: ServingContext,
        connection: LaneConnection,
        path: str,
        key: str,
        lease: Lease,
        began: float,
        keep: Callable[[asyncio.Task[None]], None],
    ) -> None:
        self._context = context
        self._connection = connection
        self._path = path
        self._key = key
        self._lease = lease
        self._keep = keep
        self._began = began
        self._sent = 0
        self._status = 200
        self._offset = 0
        self._stop = lease.size_bytes

    def start(self, head: bytes, byte_range: ByteRange | None = None) -> None:
        """Send `head` (the status line and fields), then the body, or `byte_range` of it."""
        if byte_range is not None:
            self._offset, self._stop = byte_range.start, byte_range.end + 1
            self._status = 206
        lease = self._lease
        entry = lease.entry
        assert entry is not None
        context = self._context
        connection = self._connection
        transport = connection.transport
        if context.guard is not None:
            context.guard.request_started(transport)
        transport.write(head)
        loop = asyncio.get_running_loop()
        context.metrics.first_byte("hit", loop.time() - self._began)
        checker = context.state.hit_checker
        check_due = checker is not None and checker.can_check(entry.meta)
        if check_due:
            assert checker is not None
            name = f"{lease.origin}/{self._key}"
            check_due = not checker.is_checked(name, entry.fd, entry.meta, self._offset, self._stop)
        if not check_due and not transport.get_write_buffer_size():  # the head is out
            try:
                self._send_now(entry.fd)
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError) as exc:
                self._gone(exc)
                return
            except (OSError, EOFError) as exc:
                self._failed(exc)
                return
            if self._sent == self._stop - self._offset:
                self._finished()
                return
        connection.sending = True
        self._keep(loop.create_task(self._send_rest(check_due), name="hit lane body"))

    def _send_now(self, fd: int) -> None:
        socket_fd = self._connection.socket_fd
        length = self._stop - self._offset
        while self._sent < length:
            sent = os.sendfile(socket_fd, fd, self._offset + self._sent, length - self._sent)
            if sent == 0:
                raise EOFError(f"file ended {length - self._sent} bytes early")
            self._sent += sent

    async def _send_rest(self, check_due: bool) -> None:
        lease = self._lease
        entry = lease.entry
        assert entry is not None
        context = self._context
        checker = context.state.hit_checker
        sender = FileSender(
            self._connection.transport, _unused_write, context.state.client_send_timeout_s
        )
        try:
            with context.state.in_flight:
                if check_due and checker is not None:
                    name = f"{lease.origin}/{self._key}"

                    def check(first: int, last: int) -> Awaitable[int]:
                        return checker.check(name, entry.fd, entry.meta, first, last)

                    await send_checked(
                        sender,
                        entry.fd,
                        self._offset,
                        self._stop,
                        check,
                        context.metrics.hit_checked,
                    )
                else:
                    offset = self._offset + self._sent
                    await sender.send(entry.fd, offset, self._stop - offset)
        except ClientGone as exc:
            self._sent += sender.sent_bytes
            self._gone(exc)
            return
        except IntegrityError as exc:
            self._sent += sender.sent_bytes
            context.metrics.hit_corrupt(lease.origin)
            log.warning("dropping cached %s/%s: %s", lease.origin, self._key, exc)
            self._failed(exc)
            return
        except (OSError, EOFError, ShardcacheError) as exc:
            self._sent += sender.sent_bytes
            self._failed(exc)
            return
        except Exception as exc:  # a bug: never a clean short body, and its traceback
            self._sent += sender.sent_bytes
            log.error(
                "aborting GET %s after %d bytes: %s",
                self._path,
                self._sent,
                exc,
                exc_info=True,
            )
            self._failed(exc)
            return
        finally:
            sender.close()
        self._sent += sender.sent_bytes
        self._finished()

    def _finished(self) -> None:
        metrics = self._context.metrics
        origin = self._lease.origin
        metrics.request_counted(origin, "hit")
        self._end()
        metrics.request_finished("hit", asyncio.get_running_loop().time() - self._began)
        self._connection.answered()

    def _gone(self, exc: BaseException) -> None:
        """The client left (or read nothing for the send timeout): a 499, not a failure."""
        metrics = self._context.metrics
        if isinstance(exc, ClientStalled):
            metrics.client_timed_out("send")
        else:
            metrics.client_left(self._lease.origin)
        metrics.request_counted(self._lease.origin, "hit")
        self._status = CLIENT_CLOSED_STATUS
        log.debug("client left during %s: %s", self._path, exc)
        self._end()
        self._connection.abort(discard_unsent=isinstance(exc, ClientStalled))

    def _failed(self, exc: BaseException) -> None:
        """The entry's file failed under the read (shorter than its row, unreadable): counted
        and logged as aiohttp's handler does, the version dropped, the connection aborted."""
        context = self._context
        lease = self._lease
        kind = exc.kind if isinstance(exc, ShardcacheError) else "cache"
        context.metrics.request_counted(lease.origin, "error")
        context.failures.failed(
            lease.origin,
            kind,
            "GET %s aborted after %d of %d bytes (%s, origin %s): %s",
            self._path,
            self._sent,
            self._stop - self._offset,
            kind,
            lease.origin,
            exc,
        )
        entry = lease.entry
        if entry is not None and isinstance(exc, EOFError | IntegrityError):
            # Dropped before the client hears of the failure and retries (as `objects` does),
            # so its retry is a miss, never the same damaged hit; nothing more is read meanwhile.
            lease.entry = None
            self._connection.sending = True
            self._keep(asyncio.get_running_loop().create_task(self._drop_then_abort(entry)))
            return
        self._end()
        self._connection.abort()

    async def _drop_then_abort(self, entry: Entry) -> None:
        try:
            await self._context.cache.drop_damaged(self._lease.origin, self._key, entry)
        finally:
            entry.close()
            self._end()
            self._connection.abort()

    def _end(self) -> None:
        """What every answer does last: the body counted, the lease closed, the access line."""
        context = self._context
        lease = self._lease
        context.metrics.body_sent(lease.origin, "cache", self._sent)
        if lease.entry is not None:
            lease.entry.close()
            lease.entry = None
        if context.guard is not None:
            context.guard.request_finished(self._connection.transport)
        if access_logger.isEnabledFor(logging.INFO):
            log_access(
                access_logger,
                logging.INFO,
                "GET",
                self._path,
                self._status,
                "hit",
                self._sent,
                asyncio.get_running_loop().time() - self._began,
                self._connection.remote,
            )


async def _unused_write(data: bytes) -> None:
    raise AssertionError("the hit lane sends bodies with sendfile only")  # plain sockets only
