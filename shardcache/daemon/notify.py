"""systemd's readiness protocol (sd_notify) in a few lines over the socket in $NOTIFY_SOCKET.

`Type=notify` units wait for READY=1 before they count as started; STOPPING=1 and RELOADING=1
tell systemd what the daemon is doing. Without NOTIFY_SOCKET (not under systemd) it does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("shardcache.notify")


def notify(message: str, socket_path: str | None = None) -> bool:
    """Send `message` (e.g. "READY=1") to systemd; return whether it was sent."""
    path = socket_path or os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", path, exc)
        return False
    return True


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, as RELOADING=1 wants in MONOTONIC_USEC."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
