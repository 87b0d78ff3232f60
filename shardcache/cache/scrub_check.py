"""One entry's check for the online scrub (`scrub`): read its file in chunks, at a pace, and
say whether its bytes still match the digest kept at commit. Blocking; the scrub runs it on
its own thread. Only errors that say the medium lost the bytes are damage (see MEDIA_ERRNOS).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from shardcache.cache.entry import StoredEntry
from shardcache.cache.verify import expected_checksums
from shardcache.checksums import Verifier, cheapest
from shardcache.errors import IntegrityError

CHUNK_BYTES = 1 << 20  # per pread: a bounded buffer, and the unit the pacer sleeps between
# O_NONBLOCK: a FIFO left where an entry's file was would block `open` until a writer came,
# which is never (the scrub thread hung, and the daemon with it at exit); for a regular file it
# changes nothing. No O_NOFOLLOW: hits open entries without it (`_AdoptingDisk.fetch`), and
# the scrub checks what a hit would serve.
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
Verdict = Literal[
    "sound", "length_only", "stopped", "skipped", "missing", "corrupt", "wrong_size", "bad_metadata"
]
DAMAGE: frozenset[str] = frozenset({"missing", "corrupt", "wrong_size", "bad_metadata"})
# Errors that say the medium lost the bytes: the file cannot be served either, so it is
# dropped. Any other error (EMFILE, ENFILE, ENOMEM, EAGAIN, EACCES, one never seen) says
# nothing about the bytes: an attacker holding the daemon's descriptors made every entry
# "corrupt" and dropped the whole cache. Those entries are skipped and read next pass.
MEDIA_ERRNOS: frozenset[int] = frozenset({errno.EIO, errno.EBADMSG, errno.EUCLEAN})


class ScrubPacer:
    """Keeps the average read rate at `rate_bytes_per_s` (0: unlimited): after each `n` bytes
    read, sleeps until `n / rate` seconds past the last deadline, unless the read itself took
    longer (a slow disk is not slowed further). No credit is banked while idle, so a pause
    never turns into a burst: over any window, at most one chunk more than the rate allows is
    read. `clock` and `sleep` are injectable for tests."""

    def __init__(
        self,
        rate_bytes_per_s: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.rate_bytes_per_s = rate_bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._due = -float("inf")

    def __call__(self, size_bytes: int) -> None:
        if self.rate_bytes_per_s <= 0:
            return
        now = self._clock()
        self._due = max(self._due + size_bytes / self.rate_bytes_per_s, now)
        if self._due > now:
            self._sleep(self._due - now)


@dataclass(frozen=True, slots=True)
class Check:
    """What one entry's check found; `read_bytes` were hashed (counted even when stopped)."""

    verdict: Verdict
    detail: str = ""
    read_bytes: int = 0


def check_entry(
    entry: StoredEntry,
    pace: Callable[[int], None],
    is_stopping: Callable[[], bool] = lambda: False,
    chunk_bytes: int = CHUNK_BYTES,
) -> Check:
    """Hash `entry`'s file in chunks against the cheapest digest it kept (the local CRC-32C, or
    the published checksum it was verified against). Blocking: call it on the scrub thread.
    A media error (EIO) is damage, never an exception; any other error (no descriptor left, no
    memory) is "skipped"; a file not there is "missing" (the caller asks the index whether
    it was evicted or re-filled meanwhile: then nothing is lost)."""
    meta = entry.meta
    if meta is None:
        return Check("bad_metadata", "the index row's metadata is unreadable")
    try:
        expected = cheapest(expected_checksums(meta))
    except ValueError as exc:  # a digest that is not hex
        return Check("bad_metadata", f"unreadable digest: {exc}")
    try:
        fd = os.open(entry.path, OPEN_FLAGS)
    except FileNotFoundError:  # lost, or evicted or re-filled since listed: the drop tells
        return Check("missing", "its file is missing")
    except OSError as exc:
        with contextlib.suppress(OSError):  # a socket cannot be opened at all (ENXIO)
            if kind := _irregular(os.stat(entry.path).st_mode):
                return Check("corrupt", f"not a regular file: {kind}")
        return _failed(exc, "cannot open its file", 0)
    offset = 0
    try:
        status = os.fstat(fd)
        if kind := _irregular(status.st_mode):
            return Check("corrupt", f"not a regular file: {kind}")
        size = status.st_size
        if size != meta.size_bytes:
            return Check("wrong_size", f"the file has {size} bytes, expected {meta.size_bytes}")
        if not expected:  # committed by a version that kept no digest
            return Check("length_only")
        verifier = Verifier(expected)
        while offset < size:
            if is_stopping():
                return Check("stopped", read_bytes=offset)
            data = os.pread(fd, min(chunk_bytes, size - offset), offset)
            if not data:
                return Check("wrong_size", f"the file ends at {offset} bytes", offset)
            verifier.update(data)
            offset += len(data)
            pace(len(data))
        verifier.verify()
    except IntegrityError as exc:
        return Check("corrupt", str(exc), offset)
    except OSError as exc:
        return _failed(exc, f"read error at byte {offset}", offset)
    finally:
        os.close(fd)
    return Check("sound", read_bytes=offset)


def _irregular(mode: int) -> str:
    """What a file that is not a regular file is ("" for a regular file)."""
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else f"mode {mode:o}"


def _failed(exc: OSError, what: str, offset: int) -> Check:
    """The verdict on a failed open or read: damage only for a media error (EIO from a
    failing disk), else "skipped": the entry is left alone and read again next pass."""
    reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    verdict: Verdict = "corrupt" if exc.errno in MEDIA_ERRNOS else "skipped"
    return Check(verdict, f"{what}: {reason}", offset)
