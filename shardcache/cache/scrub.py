"""The online scrub: re-reads cached entries at a bounded rate and drops those whose bytes no
longer match the digest kept at commit, so bit rot becomes a miss instead of a hit.

One dedicated low-priority thread does every read; entries are walked in rowid order; an entry
is dropped only if it is still the version read (`Walks.drop_if_unchanged`). Knows nothing of
HTTP or metrics; the daemon reads `stats`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shardcache.cache.entry import StoredEntry
from shardcache.cache.scrub_check import DAMAGE, Check, ScrubPacer, check_entry
from shardcache.cache.store import Store
from shardcache.errors import CacheError

log = logging.getLogger("shardcache.scrub")
T = TypeVar("T")
BATCH_ENTRIES = 256  # index rows read per query
PASS_PAUSE_S = 1.0  # between passes: an empty or tiny cache costs one query a second
SHUTDOWN_WAIT_S = 5.0  # for the entry being read when the daemon stops (one chunk, normally)
MAX_LISTED_PROBLEMS = 1000  # an on-demand report lists this many damaged keys at most
NICE = 10  # the scrub thread's niceness: fills and hits come first (CFQ/BFQ derive I/O priority)

MAX_POSITION_BYTES = 4096  # the kept place is a line of JSON
SKIP_WARNING_EVERY_S = 60.0  # a skipped entry is a WARNING at most this often, else DEBUG


@dataclass(slots=True)
class Tally:
    """One pass's progress (the report `shardcache verify` prints for a running daemon)."""

    started_at: float  # time.time()
    entries: int = 0
    checked_bytes: int = 0
    digest_checked: int = 0
    length_only: int = 0
    problems: list[dict[str, object]] = field(default_factory=list)
    damaged: int = 0
    skipped: int = 0  # not checked: an open or read failed for want of resources; next pass
    finished_at: float | None = None
    error: str | None = None
    id: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"is_finished": self.finished_at is not None}


@dataclass(slots=True)
class ScrubStats:
    """Totals since start, for `/metrics` and `/_/status`; written only by the scrub."""

    checked_bytes: int = 0
    checked_entries: int = 0
    corrupt: int = 0
    skipped: int = 0
    passes: int = 0
    last_full_pass_at: float | None = None  # time.time() when the last background pass ended
    last_full_pass_s: float | None = None


class Scrubber:
    """The background scrub at `rate_bytes_per_s` (0: off) and on-demand full passes.

    `sleep(seconds)` is the pacer's (tests inject one; it runs on the scrub thread).
    `start()` on the event loop; `stop()` asks the scrub thread to stop at its next chunk (call
    it first thing on shutdown), `aclose()` waits for it, at most SHUTDOWN_WAIT_S.
    """

    def __init__(
        self,
        store: Store,
        rate_bytes_per_s: int,
        wall_clock: Callable[[], float] = time.time,
        pass_pause_s: float = PASS_PAUSE_S,
        sleep: Callable[[float], object] | None = None,
        position_file: Path | None = None,
    ) -> None:
        self.store = store
        self.rate_bytes_per_s = rate_bytes_per_s
        self.stats = ScrubStats()
        self.current: Tally | None = None  # the background pass under way
        self.last_verify: Tally | None = None  # the latest on-demand pass
        self._wall = wall_clock
        # Where the background pass is, kept across restarts: a daemon restarted more often
        # than a pass takes (10 GiB at 32 MiB/s: 5 minutes) would otherwise re-read the head
        # of its index every time and never reach the tail.
        self._position = _Position(position_file)
        self._pass_pause_s = pass_pause_s
        self._stopping = threading.Event()
        # An on-demand pass under way: the background pass steps aside (its entry's read
        # stops, its pacing sleep ends) so that `verify` runs at full speed and alone, and
        # every damaged entry is in its report (a background pass dropping one meanwhile
        # would leave it out).
        self._verifying = threading.Event()
        self._wake = threading.Event()  # set by stop() and by an on-demand pass
        self._sleep = sleep or self._wake.wait  # the pacer's: returns early on either
        self._thread = _Runner("shardcache-scrub", initializer=_lower_priority)
        self._tasks: set[asyncio.Task[None]] = set()
        self._verify_task: asyncio.Task[None] | None = None
        self._in_flight: asyncio.Future[Any] | None = None
        self._verify_ids = 0
        self._skip_warned_at = -float("inf")  # time.monotonic() of the last WARNING for one

    def start(self) -> None:
        """Start the background pass (nothing when the rate is 0)."""
        if self.rate_bytes_per_s > 0:
            self._own(asyncio.create_task(self._run(), name="scrub"))

    def verify_now(self) -> tuple[Tally, bool]:
        """Start a full pass at full speed over every entry, or join the one under way; the
        bool is True when joined. Poll the tally (`last_verify`) until it is finished."""
        if self._verify_task is not None and not self._verify_task.done():
            assert self.last_verify is not None
            return self.last_verify, True
        self._verify_ids += 1
        tally = Tally(self._wall(), id=self._verify_ids)
        self.last_verify = tally
        self._verifying.set()
        self._wake.set()
        self._verify_task = asyncio.create_task(self._verify(tally), name="scrub verify")
        self._own(self._verify_task)
        return tally, False

    def stop(self) -> None:
        """Make the scrub thread stop at its next chunk or pacing sleep."""
        self._stopping.set()
        self._wake.set()

    async def aclose(self) -> None:
        self.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._in_flight is not None and not self._in_flight.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(SHUTDOWN_WAIT_S):
                    await asyncio.shield(self._in_flight)
        self._thread.close()  # a read stuck in the kernel stays there; the exit does not wait

    def status(self) -> dict[str, object]:
        """The scrub's part of `/_/status`."""
        stats, current = self.stats, self.current
        return {
            "rate_bytes_per_s": self.rate_bytes_per_s,
            "is_on": self.rate_bytes_per_s > 0,
            "passes": stats.passes,
            "last_full_pass_at": stats.last_full_pass_at,
            "last_full_pass_s": stats.last_full_pass_s,
            "checked_entries": stats.checked_entries,
            "checked_bytes": stats.checked_bytes,
            "corrupt": stats.corrupt,
            "skipped": stats.skipped,
            "current_pass": None
            if current is None
            else {
                "started_at": current.started_at,
                "entries": current.entries,
                "checked_bytes": current.checked_bytes,
            },
            "verify": None if self.last_verify is None else self.last_verify.as_dict(),
        }

    # -- the passes ----------------------------------------------------------------------

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        pacer = ScrubPacer(self.rate_bytes_per_s, sleep=self._sleep)
        resumed = await self._on_thread(self._position.read)  # the daemon thread: never hangs exit
        while not self._stopping.is_set():
            started_at, cursor = resumed or (self._wall(), 0)
            resumed = None
            tally = self.current = Tally(started_at)
            try:
                await self._walk(tally, pacer, skip_newer=True, cursor=cursor)
            except CacheError as exc:  # the directory is unusable: the store watch says why
                log.debug("scrub pass interrupted: %s", exc)
            else:
                tally.finished_at = self._wall()
                self.stats.passes += 1
                self.stats.last_full_pass_at = tally.finished_at
                self.stats.last_full_pass_s = tally.finished_at - tally.started_at
                log.debug(
                    "scrub pass done: %d entries, %d bytes in %.1f s, %d damaged",
                    tally.entries,
                    tally.checked_bytes,
                    self.stats.last_full_pass_s,
                    tally.damaged,
                )
            await asyncio.sleep(self._pass_pause_s)

    async def _verify(self, tally: Tally) -> None:
        try:
            await self._walk(tally, ScrubPacer(0), skip_newer=False)
        except CacheError as exc:
            tally.error = str(exc)
        finally:
            tally.finished_at = self._wall()
            self._verifying.clear()
            if not self._stopping.is_set():
                self._wake.clear()

    async def _step_aside(self) -> None:
        """(The background pass) wait for an on-demand pass to end."""
        task = self._verify_task
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def _walk(
        self, tally: Tally, pacer: ScrubPacer, skip_newer: bool, cursor: int = 0
    ) -> None:
        """Check every entry in index order once, after row `cursor`. With `skip_newer`,
        entries committed since the pass began are left to the next one (their fill verified
        them): the background pass, which steps aside for an on-demand one and keeps its
        position (`_Position`) a batch at a time."""
        is_background = skip_newer
        while True:
            if is_background:
                await self._on_thread(
                    functools.partial(self._position.write, tally.started_at, cursor)
                )
            batch = await self._on_thread(
                functools.partial(self.store.walks.entries_after, cursor, BATCH_ENTRIES)
            )
            if not batch:
                if is_background:
                    await self._on_thread(self._position.clear)
                return
            for entry in batch:
                cursor = entry.rowid
                if skip_newer and entry.stored_at >= tally.started_at:
                    continue
                while True:
                    if is_background and self._verifying.is_set():
                        await self._step_aside()
                    check = functools.partial(self._check, entry, tally, pacer, is_background)
                    is_done = await self._on_thread(check)
                    if is_done or self._stopping.is_set():
                        break  # else an on-demand pass cut it short: check it again after
                if self._stopping.is_set():
                    return

    async def _on_thread(self, call: Callable[[], T]) -> T:
        """Run `call` on the scrub thread (one hop per entry, or per batch of index rows)."""
        future = self._thread.submit(call)
        self._in_flight = future
        # Shielded: a cancelled pass leaves the call's future for `aclose` to wait on (it was
        # cancelled with the task before, and aclose never waited for the entry being read).
        return await asyncio.shield(future)

    def _check(
        self, entry: StoredEntry, tally: Tally, pacer: ScrubPacer, is_background: bool
    ) -> bool:
        """Check one entry and drop it when damaged (on the scrub thread); False when the
        background pass stopped it part-way for an on-demand one."""

        def is_stopping() -> bool:
            return self._stopping.is_set() or (is_background and self._verifying.is_set())

        def counted(size_bytes: int) -> None:  # as each chunk is hashed: progress shows
            self.stats.checked_bytes += size_bytes
            tally.checked_bytes += size_bytes
            pacer(size_bytes)

        check = check_entry(entry, counted, is_stopping)
        if check.verdict == "stopped":
            return False
        if check.verdict == "skipped":
            self._skipped(entry, check, tally)
            return True
        dropped = self._drop(entry, check) if check.verdict in DAMAGE else None
        if dropped is False and check.verdict == "missing":
            return True  # evicted or re-filled since it was listed: nothing was lost
        self.stats.checked_entries += 1
        tally.entries += 1
        if check.verdict == "sound":
            tally.digest_checked += 1
        elif check.verdict == "length_only":
            tally.length_only += 1
        else:
            self._damaged(entry, check, tally, dropped)
        return True

    def _skipped(self, entry: StoredEntry, check: Check, tally: Tally) -> None:
        """Count an entry left unchecked; say so at WARNING once a minute at most: when the
        daemon runs out of descriptors, every entry fails alike and one line tells it all."""
        self.stats.skipped += 1
        tally.skipped += 1
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._skip_warned_at >= SKIP_WARNING_EVERY_S:
            self._skip_warned_at, level = now, logging.WARNING
        log.log(level, "scrub: skipped %s: %s (checked next pass)", entry.key, check.detail)

    def _drop(self, entry: StoredEntry, check: Check) -> bool | None:
        """Drop a damaged entry if it is still the version read: True when dropped, False
        when evicted or re-filled meanwhile, None when the index refused."""
        try:
            dropped = self.store.walks.drop_if_unchanged(entry.key, entry.filename)
        except CacheError as exc:
            log.warning(
                "scrub: %s is damaged (%s) and cannot be dropped: %s", entry.key, check.detail, exc
            )
            return None
        if dropped and check.detail == "not a regular file: a directory":
            # The index's own removal only unlinks files: an empty directory would stay as
            # litter in the index tree (the next version of the key has another name). Removed
            # as the index removes a file: with its parents while empty (the index folder
            # holds the database, so that is where it stops). One with something in it is
            # left alone: its contents are not ours to judge.
            with contextlib.suppress(OSError):
                os.removedirs(entry.path)
        return dropped

    def _damaged(
        self, entry: StoredEntry, check: Check, tally: Tally, dropped: bool | None
    ) -> None:
        if dropped is False:  # re-filled or evicted meanwhile: the damage went with that version
            log.debug("scrub: %s changed while it was read; not dropped", entry.key)
            return
        self.stats.corrupt += 1
        tallies = [tally]
        report = self.last_verify
        if report is not None and report is not tally and self._verifying.is_set():
            tallies.append(report)  # found as an on-demand pass began: it belongs in its report
        for each in tallies:
            each.damaged += 1
        if dropped:
            log.warning(
                "scrub: dropped %s: %s: %s (it is refetched on its next read)",
                entry.key,
                check.verdict.replace("_", " "),
                check.detail,
            )
        problem = {
            "kind": check.verdict,
            "detail": check.detail,
            "key": entry.key,
            "dropped": bool(dropped),
        }
        for each in tallies:
            if len(each.problems) < MAX_LISTED_PROBLEMS:
                each.problems.append(problem)


_Call = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[[], Any]]


class _Position:
    """The background pass's place (when it began, the last index row done), in a small file
    beside the index; best effort: an unreadable or unwritable file means starting over."""

    def __init__(self, path: Path | None) -> None:
        self._path = path

    def read(self) -> tuple[float, int] | None:
        """The kept place, or None to start over: anything but a small regular file holding a
        sane place (a FIFO would block, /dev/zero never end, a row id past SQLite's range
        would kill the pass) is ignored."""
        if self._path is None:
            return None
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                text = os.read(fd, MAX_POSITION_BYTES)
            finally:
                os.close(fd)
            document = json.loads(text)
            started_at, rowid = float(document["started_at"]), int(document["rowid"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None
        sane = 0 <= rowid < 2**63 and math.isfinite(started_at) and started_at <= time.time()
        return (started_at, rowid) if sane else None

    def write(self, started_at: float, rowid: int) -> None:
        if self._path is None:
            return
        with contextlib.suppress(OSError):  # a full or read-only disk: the store says so
            partial = self._path.with_suffix(".tmp")
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOFOLLOW
            fd = os.open(partial, flags | os.O_CLOEXEC, 0o644)  # a FIFO there: ENXIO, not a hang
            try:
                os.write(fd, json.dumps({"started_at": started_at, "rowid": rowid}).encode())
            finally:
                os.close(fd)
            os.replace(partial, self._path)

    def clear(self) -> None:
        if self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink(missing_ok=True)


class _Runner:
    """One daemon thread that runs the calls submitted to it, one at a time, in order.

    Not a ThreadPoolExecutor: Python joins those threads at exit, so one read stuck in the
    kernel (a FIFO, a hung disk) kept the daemon alive after SIGTERM until kill -9. A daemon
    thread is abandoned at exit; `Scrubber.aclose` has already waited as long as it should.
    """

    def __init__(self, name: str, initializer: Callable[[], None]) -> None:
        self._name = name
        self._initializer = initializer
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # started by the first call
        self._is_closed = False

    def submit(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """Queue `call`; the future is completed on the calling (running) loop."""
        if self._is_closed:
            raise RuntimeError(f"{self._name} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._calls.put((loop, future, call))
        return future

    def close(self) -> None:
        """Let the thread end after the call it is running (without waiting for it)."""
        self._is_closed = True
        self._calls.put(None)

    def _serve(self) -> None:
        self._initializer()
        while (item := self._calls.get()) is not None:
            loop, future, call = item
            try:
                result, error = call(), None
            except BaseException as exc:  # handed to the awaiting task, as an executor does
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    """(On the loop) complete `future`, unless its awaiting task was cancelled meanwhile."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _lower_priority() -> None:
    """Make the scrub thread yield the CPU (and, under CFQ/BFQ, the disk) to fills and hits."""
    with contextlib.suppress(OSError):  # refused in some sandboxes: the pacing still bounds it
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
