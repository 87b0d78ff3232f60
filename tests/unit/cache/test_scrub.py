"""The online scrub on a real store in a temp dir: pacing (with a fake clock), damage found and
dropped, a re-filled entry spared, read errors, and a prompt stop."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from shardcache.cache import scrub
from shardcache.cache.entry import EntryMeta
from shardcache.cache.scrub import Scrubber, ScrubPacer
from shardcache.cache.store import Store
from shardcache.checksums import crc32c

KiB = 1024
MiB = 1024 * KiB


class FakeClock:
    """Time that moves only when the pacer sleeps (or the test says so)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_pacer_keeps_the_average_rate() -> None:
    clock = FakeClock()
    pace = ScrubPacer(1000, clock=lambda: clock.now, sleep=clock.sleep)
    read = 0
    for _ in range(50):
        # Bytes read by now never exceed the rate's allowance plus the chunk just read.
        assert read <= 1000 * clock.now + 100 + 1e-6  # (float rounding)
        pace(100)
        read += 100
    assert clock.now == pytest.approx(4.9)  # 5000 bytes at 1000 bytes/s, the first chunk free


def test_the_pacer_banks_no_credit_while_idle() -> None:
    clock = FakeClock()
    pace = ScrubPacer(1000, clock=lambda: clock.now, sleep=clock.sleep)
    pace(500)
    clock.now += 100.0  # idle between passes: no burst of 100 s worth afterwards
    start = clock.now
    for _ in range(10):
        pace(100)
    assert clock.now - start == pytest.approx(0.9)


def test_the_pacer_does_not_sleep_when_reading_is_slower_than_the_rate() -> None:
    clock = FakeClock()
    pace = ScrubPacer(1000, clock=lambda: clock.now, sleep=clock.sleep)
    for _ in range(10):
        clock.now += 0.2  # the disk took 0.2 s for 100 bytes: below the bound already
        pace(100)
    assert clock.slept == []
    unlimited = ScrubPacer(0, clock=lambda: clock.now, sleep=clock.sleep)
    before = len(clock.slept)
    unlimited(10 * MiB)
    assert len(clock.slept) == before


def _put(store: Store, key: str, data: bytes) -> Path:
    """Commit `data` as `key` with its CRC-32C kept, as a fill does; return its file."""
    reservation = store.reserve(len(data))
    os.pwrite(reservation.fd, data, 0)
    meta = EntryMeta(len(data), digests={"crc32c": f"{crc32c(data):08x}"}, verified_by=["length"])
    store.commit(reservation, key, meta)
    os.close(reservation.fd)
    return next(e.path for e in store.walks.entries_after(0, 100) if e.key == key)


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 1]))


def _read(store: Store, key: str) -> bytes | None:
    entry = store.lookup(key)
    if entry is None:
        return None
    try:
        return os.pread(entry.fd, entry.meta.size_bytes, 0)
    finally:
        entry.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = Store(tmp_path / "cache", 64 * MiB)
    yield opened
    assert opened.check() == []
    opened.close()


async def _until(condition: Callable[[], object]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


async def test_verify_now_finds_a_flipped_byte_and_drops_only_that_entry(store: Store) -> None:
    data = {f"http://o/{n}.tar": os.urandom(MiB + n) for n in range(3)}
    files = {key: _put(store, key, body) for key, body in data.items()}
    _flip(files["http://o/1.tar"], 4321)
    scrubber = Scrubber(store, 0)
    try:
        tally, joined = scrubber.verify_now()
        assert not joined
        await _until(lambda: tally.finished_at is not None)
    finally:
        await scrubber.aclose()
    assert tally.entries == 3 and tally.digest_checked == 2 and tally.damaged == 1
    assert tally.checked_bytes == sum(len(body) for body in data.values())
    assert [p["key"] for p in tally.problems] == ["http://o/1.tar"]
    assert tally.problems[0]["kind"] == "corrupt" and tally.problems[0]["dropped"] is True
    assert _read(store, "http://o/1.tar") is None  # a miss now: refetched on its next read
    assert _read(store, "http://o/0.tar") == data["http://o/0.tar"]
    assert scrubber.stats.corrupt == 1


async def test_an_entry_refilled_while_it_is_read_is_not_dropped(store: Store) -> None:
    old, new = os.urandom(3 * MiB), os.urandom(3 * MiB)  # three chunks: paced between
    _flip(_put(store, "http://o/a.tar", old), 10)
    refilled: list[bool] = []

    def sleep(seconds: float) -> None:
        """The pacer's sleep, mid-read: a fill commits a new version of the key meanwhile."""
        if not refilled:
            refilled.append(True)
            _put(store, "http://o/a.tar", new)

    scrubber = Scrubber(store, 1 << 30, sleep=sleep)
    scrubber.start()
    try:
        await _until(lambda: scrubber.stats.passes >= 1)
    finally:
        await scrubber.aclose()
    assert refilled  # the damaged old version was read to its end …
    assert scrubber.stats.checked_bytes >= len(old)
    assert scrubber.stats.corrupt == 0  # … and the new version, not the one read, stayed
    assert _read(store, "http://o/a.tar") == new


async def test_the_background_pass_drops_damage_and_counts_it(store: Store) -> None:
    body = os.urandom(300 * KiB)
    _flip(_put(store, "http://o/bad.tar", body), 299 * KiB)
    _put(store, "http://o/good.tar", body)
    scrubber = Scrubber(store, 1 << 30, sleep=lambda seconds: None)
    scrubber.start()
    try:
        await _until(lambda: scrubber.stats.passes >= 1)
    finally:
        await scrubber.aclose()
    assert scrubber.stats.corrupt == 1 and scrubber.stats.checked_bytes >= 2 * len(body)
    assert _read(store, "http://o/bad.tar") is None and _read(store, "http://o/good.tar") == body
    status = scrubber.status()
    assert status["corrupt"] == 1 and status["last_full_pass_at"] is not None


async def test_a_read_error_is_damage_and_the_walk_goes_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = os.urandom(100 * KiB)
    failing = _put(store, "http://o/eio.tar", body)
    _put(store, "http://o/fine.tar", body)
    real_pread = os.pread
    failing_inode = os.stat(failing).st_ino

    def pread(fd: int, size: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino == failing_inode:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(scrub.os, "pread", pread)
    scrubber = Scrubber(store, 0)
    try:
        tally, _ = scrubber.verify_now()
        await _until(lambda: tally.finished_at is not None)
    finally:
        await scrubber.aclose()
    assert tally.entries == 2 and tally.damaged == 1 and tally.digest_checked == 1
    assert "read error" in str(tally.problems[0]["detail"])
    assert _read(store, "http://o/eio.tar") is None and _read(store, "http://o/fine.tar") == body


async def test_close_does_not_wait_for_a_slow_pass(store: Store) -> None:
    _put(store, "http://o/big.tar", os.urandom(4 * MiB))
    scrubber = Scrubber(store, 64 * KiB)  # a 64-second read of this entry
    scrubber.start()
    await _until(lambda: scrubber.stats.checked_bytes > 0)
    async with asyncio.timeout(2):  # one chunk, then it notices the stop
        await scrubber.aclose()
    assert scrubber.stats.checked_bytes < 4 * MiB


async def test_verify_now_runs_at_full_speed_beside_a_slow_background_pass(store: Store) -> None:
    """Review of issue 24: `verify` through a daemon scrubbing at its (slow) rate was held to
    that rate (4 MiB/s: not done in 20 s); and damage the background pass dropped as it began
    was missing from its report. The background pass steps aside until the verify is done."""
    data = {f"http://o/{n}.tar": os.urandom(4 * MiB) for n in range(4)}
    files = {key: _put(store, key, body) for key, body in data.items()}
    _flip(files["http://o/3.tar"], 3 * MiB)
    scrubber = Scrubber(store, 64 * KiB)  # 16 MiB would take 256 s at this rate
    scrubber.start()
    try:
        await _until(lambda: scrubber.stats.checked_bytes > 0)  # mid-way into the first entry
        tally, joined = scrubber.verify_now()
        assert not joined
        async with asyncio.timeout(5):
            await _until(lambda: tally.finished_at is not None)
    finally:
        await scrubber.aclose()
    assert tally.entries == 4 and tally.damaged == 1 and tally.digest_checked == 3
    assert [p["key"] for p in tally.problems] == ["http://o/3.tar"]
    assert scrubber.stats.corrupt == 1  # found once, not by both passes


async def _verified(scrubber: Scrubber) -> scrub.Tally:
    """Run an on-demand pass to its end (or fail after 10 s)."""
    tally, _ = scrubber.verify_now()
    await _until(lambda: tally.finished_at is not None)
    return tally


def _failing_open(monkeypatch: pytest.MonkeyPatch, path: Path, exc: OSError) -> None:
    """Make the scrub's `os.open` of `path` (only) raise `exc`."""
    real_open = os.open

    def fake_open(file: str | os.PathLike[str], flags: int, *args: int) -> int:
        if os.fspath(file) == os.fspath(path):
            raise exc
        return real_open(file, flags, *args)

    monkeypatch.setattr(scrub.os, "open", fake_open)


@pytest.mark.parametrize(
    "code",
    [errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.EACCES, errno.ELOOP],
    ids=errno.errorcode.get,
)
async def test_a_resource_error_at_open_skips_the_entry_and_keeps_it(
    store: Store, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Attack on the daemon (`ulimit -n 120`, 200 idle connections): every entry was dropped
    as "corrupt: cannot open its file: Too many open files". No fd is not damage."""
    body = os.urandom(100 * KiB)
    busy = _put(store, "http://o/busy.tar", body)
    _put(store, "http://o/fine.tar", body)
    _failing_open(monkeypatch, busy, OSError(code, os.strerror(code)))
    scrubber = Scrubber(store, 0)
    try:
        tally = await _verified(scrubber)
    finally:
        await scrubber.aclose()
    assert tally.damaged == 0 and tally.problems == []
    assert tally.entries == 1 and tally.skipped == 1  # not counted as checked
    assert scrubber.stats.corrupt == 0 and scrubber.stats.skipped == 1
    assert scrubber.status()["skipped"] == 1
    monkeypatch.undo()  # (os.open is the store's too) the next pass checks it
    assert _read(store, "http://o/busy.tar") == body
    scrubber = Scrubber(store, 0)
    try:
        again = await _verified(scrubber)
    finally:
        await scrubber.aclose()
    assert again.entries == 2 and again.skipped == 0 and again.digest_checked == 2


@pytest.mark.parametrize("code", [errno.EIO, errno.EBADMSG, errno.EUCLEAN], ids=errno.errorcode.get)
async def test_a_media_error_at_open_is_damage(
    store: Store, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    body = os.urandom(10 * KiB)
    bad = _put(store, "http://o/bad.tar", body)
    _failing_open(monkeypatch, bad, OSError(code, os.strerror(code)))
    scrubber = Scrubber(store, 0)
    try:
        tally = await _verified(scrubber)
    finally:
        await scrubber.aclose()
    assert tally.entries == 1 and tally.damaged == 1 and tally.skipped == 0
    assert tally.problems[0]["kind"] == "corrupt" and tally.problems[0]["dropped"] is True
    assert _read(store, "http://o/bad.tar") is None


async def test_a_resource_error_from_pread_skips_and_eio_drops(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = os.urandom(100 * KiB)
    short = _put(store, "http://o/enomem.tar", body)
    broken = _put(store, "http://o/eio.tar", body)
    failing = {os.stat(short).st_ino: errno.ENOMEM, os.stat(broken).st_ino: errno.EIO}
    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        code = failing.get(os.fstat(fd).st_ino)
        if code is not None:
            raise OSError(code, os.strerror(code))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(scrub.os, "pread", pread)
    scrubber = Scrubber(store, 0)
    try:
        tally = await _verified(scrubber)
    finally:
        await scrubber.aclose()
    assert tally.entries == 1 and tally.skipped == 1 and tally.damaged == 1
    assert [p["key"] for p in tally.problems] == ["http://o/eio.tar"]
    monkeypatch.undo()
    assert _read(store, "http://o/enomem.tar") == body
    assert _read(store, "http://o/eio.tar") is None


async def test_a_fifo_in_place_of_an_entry_file_is_damage_and_does_not_hang(
    store: Store,
) -> None:
    """Attack: a FIFO where an entry's file was hung the scrub thread in `open` (no writer
    ever comes), so `verify` never finished and the daemon never exited after SIGTERM."""
    path = _put(store, "http://o/fifo.tar", os.urandom(10 * KiB))
    _put(store, "http://o/fine.tar", b"fine")
    os.unlink(path)
    os.mkfifo(path)
    scrubber = Scrubber(store, 0)
    try:
        tally = await _verified(scrubber)
    finally:
        with contextlib.suppress(OSError):  # (before the fix) a writer frees the stuck open
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        await scrubber.aclose()
    assert tally.entries == 2 and tally.damaged == 1 and tally.digest_checked == 1
    assert tally.problems[0]["key"] == "http://o/fifo.tar"
    assert tally.problems[0]["kind"] == "corrupt" and tally.problems[0]["dropped"] is True
    assert "not a regular file" in str(tally.problems[0]["detail"])
    assert not os.path.lexists(path)  # the drop removed it
    assert _read(store, "http://o/fifo.tar") is None


async def test_close_gives_up_on_a_read_stuck_in_the_kernel_and_its_thread_is_a_daemon(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that never returns (a hung disk, NFS) must not keep the daemon from exiting:
    `aclose` waits SHUTDOWN_WAIT_S, and the thread stuck in it does not hold up the exit
    (Python joins a ThreadPoolExecutor's threads at exit, so SIGTERM logged "stopped" and
    the process stayed until kill -9)."""
    _put(store, "http://o/stuck.tar", os.urandom(10 * KiB))
    never = threading.Event()
    stuck: list[threading.Thread] = []

    def pread(fd: int, size: int, offset: int) -> bytes:
        stuck.append(threading.current_thread())
        never.wait()  # set only to let the thread go once the test is done
        return b""

    monkeypatch.setattr(scrub.os, "pread", pread)
    monkeypatch.setattr(scrub, "SHUTDOWN_WAIT_S", 0.2)
    scrubber = Scrubber(store, 0)
    try:
        scrubber.verify_now()
        await _until(lambda: stuck)
        async with asyncio.timeout(2):
            await scrubber.aclose()
        assert stuck[0].is_alive() and stuck[0].daemon
    finally:
        never.set()


async def test_an_entry_whose_file_was_deleted_is_damage_and_its_row_is_dropped(
    store: Store,
) -> None:
    """Attack: a deleted entry file was taken for an eviction ("gone") and its row stayed,
    a hit that can only fail, listed as no problem."""
    path = _put(store, "http://o/lost.tar", os.urandom(10 * KiB))
    os.unlink(path)
    scrubber = Scrubber(store, 0)
    try:
        tally = await _verified(scrubber)
    finally:
        await scrubber.aclose()
    assert tally.entries == 1 and tally.damaged == 1 and scrubber.stats.corrupt == 1
    (problem,) = tally.problems
    assert problem["key"] == "http://o/lost.tar" and problem["kind"] == "missing"
    assert problem["dropped"] is True and problem["detail"] == "its file is missing"
    assert store.walks.entries_after(0, 10) == []


async def test_an_entry_refilled_as_its_file_is_opened_is_not_missing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _put(store, "http://o/a.tar", b"old")
    real_open = os.open
    refilled: list[bool] = []

    def refilled_first(file: str | os.PathLike[str], flags: int, *args: int) -> int:
        if os.fspath(file) == os.fspath(path) and not refilled:
            refilled.append(True)
            _put(store, "http://o/a.tar", b"new")  # a re-fill removes the old file
        return real_open(file, flags, *args)

    monkeypatch.setattr(scrub.os, "open", refilled_first)
    scrubber = Scrubber(store, 0)
    try:
        tally = await _verified(scrubber)
    finally:
        await scrubber.aclose()
    monkeypatch.undo()
    assert tally.damaged == 0 and tally.problems == [] and tally.entries == 0
    assert _read(store, "http://o/a.tar") == b"new"


async def test_a_directory_in_place_of_an_entry_file_is_dropped_and_removed(
    store: Store,
) -> None:
    path = _put(store, "http://o/dir.tar", os.urandom(10 * KiB))
    os.unlink(path)
    os.mkdir(path)
    scrubber = Scrubber(store, 0)
    try:
        tally = await _verified(scrubber)
    finally:
        await scrubber.aclose()
    assert tally.damaged == 1 and tally.problems[0]["dropped"] is True
    assert tally.problems[0]["detail"] == "not a regular file: a directory"
    assert not os.path.lexists(path)  # empty: removed with its row


def test_skipped_entries_are_a_metric_apart_from_damage() -> None:
    """Entries the scrub could not read now (EMFILE…) are counted, and not as corrupt."""
    from prometheus_client import CollectorRegistry

    from shardcache.observability.metrics import Metrics
    from shardcache.observability.scrub_metrics import ScrubGauges

    metrics = Metrics(CollectorRegistry(), ["o"])
    metrics.watch_scrub(lambda: ScrubGauges(1 << 25, 10, 2, 0, 1, None, skipped=3))
    text = metrics.render().decode()
    assert "shardcache_scrub_skipped_total 3.0" in text.splitlines()
    assert "shardcache_scrub_corrupt_total 0.0" in text.splitlines()


async def test_the_background_pass_resumes_where_the_last_daemon_left_it(
    store: Store, tmp_path: Path
) -> None:
    """A daemon restarted more often than a pass takes must still reach the tail of its
    cache: the pass's place is kept in a file and taken up again, then forgotten at its end."""
    keys = [f"http://o/{n}.tar" for n in range(3)]
    for key in keys:
        _put(store, key, os.urandom(64 * KiB))
    rowids = [e.rowid for e in store.walks.entries_after(0, 10)]
    position = tmp_path / "scrub-position.json"
    position.write_text(json.dumps({"started_at": time.time(), "rowid": rowids[1]}))
    scrubber = Scrubber(
        store, 1 << 30, sleep=lambda seconds: None, pass_pause_s=60, position_file=position
    )
    scrubber.start()
    try:
        await _until(lambda: scrubber.stats.passes >= 1)
    finally:
        await scrubber.aclose()
    assert scrubber.stats.checked_entries == 1  # the third entry only: the first two were done
    assert not position.exists()  # a pass that ended leaves no place to resume


@pytest.mark.parametrize(
    "plant",
    ["garbage", "huge-rowid", "fifo", "endless"],
)
async def test_a_hostile_position_file_starts_the_pass_over(
    store: Store, tmp_path: Path, plant: str
) -> None:
    """Re-attack: a row id past SQLite's range killed the pass for good (OverflowError); a
    FIFO blocked the read (and the daemon's exit); a link to /dev/zero never ended."""
    for n in range(2):
        _put(store, f"http://o/{n}.tar", os.urandom(64 * KiB))
    position = tmp_path / "scrub-position.json"
    if plant == "garbage":
        position.write_text("{not json")
    elif plant == "huge-rowid":
        position.write_text(json.dumps({"started_at": time.time(), "rowid": 10**24}))
    elif plant == "fifo":
        os.mkfifo(position)
    else:
        position.symlink_to("/dev/zero")
    scrubber = Scrubber(
        store, 1 << 30, sleep=lambda seconds: None, pass_pause_s=60, position_file=position
    )
    scrubber.start()
    try:
        async with asyncio.timeout(10):
            await _until(lambda: scrubber.stats.passes >= 1)
    finally:
        await scrubber.aclose()
    assert scrubber.stats.checked_entries == 2
