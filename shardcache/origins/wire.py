"""Messages between the daemon and its receiving processes: one JSON message (optionally a NUL and
raw bytes, and at most one passed file descriptor) per datagram on a SOCK_SEQPACKET pair.

Errors cross as their `shardcache.errors` class name, message and plain attributes and are
rebuilt as the same class: a receiver's OriginTimeout is the daemon's."""

from __future__ import annotations

import json
import socket
from typing import Any

from shardcache import errors

Message = dict[str, Any]
MAX_MESSAGE_BYTES = 1 << 20  # a body chunk (CHUNK_BYTES) and its header fit with room to spare
MAX_HEADER_BYTES = 256 << 10  # an answer's headers beyond this are refused, not sent
SOCKET_BUFFER_BYTES = 4 << 20  # a datagram larger than the send buffer cannot be sent at all


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair for one receiver: the daemon's end and the child's."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    return ours, theirs


def send_message(
    sock: socket.socket,
    message: Message,
    payload: bytes | memoryview = b"",
    fd: int | None = None,
    flags: int = 0,
) -> None:
    """Send one message (with `payload` after it, and `fd` beside it). Raises OSError;
    with `flags=socket.MSG_DONTWAIT`, BlockingIOError when the peer's buffer is full."""
    parts: list[bytes | memoryview] = [json.dumps(message, separators=(",", ":")).encode()]
    if payload:
        parts += [b"\0", payload]
    if fd is None:
        sock.sendmsg(parts, [], flags)
    else:
        socket.send_fds(sock, parts, [fd], flags)


def receive(sock: socket.socket) -> tuple[Message, memoryview, int | None] | None:
    """The next message, its payload and the descriptor passed with it; None once the other
    end has closed (or died). A message cut short, or carrying more than one descriptor, is
    a broken peer: ValueError (its descriptors are closed first)."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 1)
    if not data and not fds:
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            socket.close(fd)
        raise ValueError("a message was cut short")
    end = data.find(b"\0")
    head, payload = (data, b"") if end < 0 else (data[:end], memoryview(data)[end + 1 :])
    message = json.loads(head)
    if not isinstance(message, dict):
        raise ValueError("a message is not an object")
    return message, memoryview(payload), (fds[0] if fds else None)


def error_message(call_id: int, exc: BaseException) -> Message:
    """`exc` as an error message about call `call_id`: its class in `shardcache.errors` (any
    other exception crosses as OriginUnavailable, saying what it was), message, attributes."""
    if isinstance(exc, errors.ShardcacheError):
        name, text = type(exc).__name__, str(exc)
    else:
        name, text = "OriginUnavailable", f"receiver: {type(exc).__name__}: {exc}"[:500]
    plain = {
        key: value
        for key, value in vars(exc).items()
        if isinstance(value, (int, float, str, bool)) or value is None
    }
    return {"op": "error", "id": call_id, "class": name, "message": text, "attrs": plain}


def error_from(message: Message) -> errors.ShardcacheError:
    """The exception an error message stands for, rebuilt as its own class (unknown or
    malformed: OriginUnavailable), without calling its constructor (whose arguments vary)."""
    found = getattr(errors, str(message.get("class")), None)
    cls = (
        found
        if isinstance(found, type) and issubclass(found, errors.ShardcacheError)
        else errors.OriginUnavailable
    )
    exc = cls.__new__(cls)
    exc.args = (str(message.get("message", "receiver failed")),)
    attrs = message.get("attrs")
    if isinstance(attrs, dict):
        for key, value in attrs.items():
            if isinstance(key, str) and not key.startswith("_"):
                setattr(exc, key, value)
    return exc


__all__ = [
    "MAX_HEADER_BYTES",
    "Message",
    "error_from",
    "error_message",
    "receive",
    "send_message",
    "socket_pair",
]
