"""A plain-HTTP body moved from its socket into the fill's file inside the kernel: `splice(2)` into
a pipe, then from the pipe into the file at the landing's offset (one copy instead of two).

Linux only; TLS bodies and skipped prefixes keep the copying path. A refused splice (EINVAL)
turns the pipe off: what it holds is written by `pwrite`. `landing.Body` decides the bytes."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import time

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ and F_GETPIPE_SZ (named from Python 3.10, on Linux)
F_GETPIPE_SZ = 1032
MIN_PIPE_BYTES = 64 << 10  # a pipe smaller than the default is not worth splicing through
_REFUSED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
AVAILABLE = hasattr(os, "splice")
# The longest one gather goes on, bytes coming or not. An origin dripping a byte every
# millisecond never pauses for a gather window: the gather went on until the buffer (or the
# pipe's slots) was full, and the landing judged its speed, looked for an abort and reported
# to the fill's readers only then (512 KiB at a byte per 1.9 ms: 17 minutes).
GATHER_MOST_S = 0.1


class SplicePipe:
    """The pipe one landing's bytes pass through, from `sock_fd` to a file. Holds at most
    `capacity` bytes (the landing's buffer size: the memory bound is the same as copying)."""

    def __init__(self, sock_fd: int, capacity: int) -> None:
        self._sock_fd = sock_fd
        self._read_end, self._write_end = os.pipe2(os.O_CLOEXEC)
        try:
            fcntl.fcntl(self._write_end, F_SETPIPE_SZ, capacity)
        except OSError:  # over pipe-max-size, or the user's pipe-user-pages-soft: as it is
            pass
        try:
            # What the kernel gave: past the user's soft limit (a non-root daemon with more
            # than ~128 such pipes) a new pipe holds only a page or two; a splice that small
            # per round costs more than copying.
            # Never more than asked: the landing reads each move back into a buffer that
            # size for its CRC, which must cover every byte moved.
            self.capacity = min(capacity, fcntl.fcntl(self._write_end, F_GETPIPE_SZ))
        except BaseException:
            os.close(self._read_end)
            os.close(self._write_end)
            raise
        self._poll = select.poll()
        self._poll.register(sock_fd, select.POLLIN)
        self.held = 0  # bytes in the pipe, not yet in the file
        # The socket or the file refused a splice, or the pipe is too small: copy from now on.
        self.refused = self.capacity < MIN_PIPE_BYTES

    def fill(self, most: int, first_wait_s: float, gather_s: float) -> tuple[int, bool]:
        """Move up to `most` bytes from the socket into the (empty) pipe: wait up to
        `first_wait_s` for the first byte, then take what else comes, each within `gather_s`
        of the one before, for at most GATHER_MOST_S.

        Returns (bytes moved, paused): paused when the gather ended because nothing more came
        or GATHER_MOST_S passed (a slow origin: the caller reports at once) or the socket
        reached its end (the next fill returns 0). 0 bytes: the socket's end, or `refused`
        was set. Raises TimeoutError when no byte came within `first_wait_s`, OSError when
        the socket failed."""
        most = min(most, self.capacity)
        moved = 0
        deadline = time.monotonic() + first_wait_s
        gather_end = deadline  # set once the first byte moved
        woken = False  # the last wait ended readable
        while moved < most:
            try:
                count = os.splice(self._sock_fd, self._write_end, most - moved, flags=_FLAGS)
            except BlockingIOError:
                if moved and self._readable(0.0):
                    return moved, False  # the socket has more: the pipe's slots are full
                if moved:
                    left_s = gather_end - time.monotonic()
                    if left_s > 0 and self._readable(min(gather_s, left_s)):
                        continue
                    return moved, True
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    raise TimeoutError() from None
                if woken:  # readable, yet nothing moved: do not spin on it
                    time.sleep(min(gather_s, left_s))
                woken = self._readable(left_s)
                continue
            except OSError as exc:
                if moved == 0 and exc.errno in _REFUSED:
                    self.refused = True
                    return 0, False
                raise
            if count == 0:
                return moved, True  # the socket's end; the next fill says so
            if not moved:
                gather_end = time.monotonic() + GATHER_MOST_S
            moved += count
            self.held += count
        return moved, False

    def empty_into(self, fd: int, position: int) -> None:
        """Write everything the pipe holds into `fd` at `position`."""
        while self.held:
            if self.refused:
                self._copy_into(fd, position)
                return
            try:
                count = os.splice(self._read_end, fd, self.held, offset_dst=position)
            except OSError as exc:
                if exc.errno not in _REFUSED:
                    raise
                self.refused = True
                continue
            if count == 0:  # a pipe holding bytes never reads empty
                raise OSError(errno.EIO, "splice moved nothing out of a pipe holding bytes")
            position += count
            self.held -= count

    def close(self) -> None:
        self._poll.unregister(self._sock_fd)
        os.close(self._read_end)
        os.close(self._write_end)

    def _copy_into(self, fd: int, position: int) -> None:
        while self.held:
            data = memoryview(os.read(self._read_end, self.held))
            if not data:
                raise OSError(errno.EIO, "a pipe holding bytes read empty")
            self.held -= len(data)
            while data:
                written = os.pwrite(fd, data, position)
                position += written
                data = data[written:]

    def _readable(self, wait_s: float) -> bool:
        return bool(self._poll.poll(max(0, round(wait_s * 1000))))


__all__ = ["AVAILABLE", "SplicePipe"]
