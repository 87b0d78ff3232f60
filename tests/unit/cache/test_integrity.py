"""Integrity under origin and disk faults (issue 9), on the core with no sockets: a temp-dir
store and the in-memory fake origin. Each test reproduces one defect found by a fault soak."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardcache.cache.fill import FillState
from shardcache.cache.lease import Result
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.errors import (
    CacheError,
    IntegrityError,
    OriginChanged,
    OriginError,
    OriginUnavailable,
)
from shardcache.observer import NullObserver
from tests.unit.cache.test_shard_cache import read_all, settle
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy
from tests.unit.waiting import until

MiB = 1024 * 1024
SEGMENTED = make_policy(
    retries=2, base_s=0.001, connections=4, segment_bytes=256 * 1024, first_segment_bytes=256 * 1024
)


class CountingObserver(NullObserver):
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()

    def origin_request(self, origin: str, status: str) -> None:
        self.requests[status] += 1


@pytest.fixture
def origin() -> FakeOrigin:
    return FakeOrigin(accepts_ranges=True, chunk_bytes=64 * 1024)


@pytest.fixture
def observer() -> CountingObserver:
    return CountingObserver()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "cache", 8 * MiB)


@pytest.fixture
async def cache(
    store: Store, origin: FakeOrigin, observer: CountingObserver
) -> AsyncIterator[ShardCache]:
    shard_cache = ShardCache(store, {"fake": origin}, SEGMENTED, observer)
    yield shard_cache
    await shard_cache.aclose()
    assert store.check() == []
    store.close()


async def test_a_failed_head_is_retried_and_the_corrupt_body_caught(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(MiB)
    origin.put("a.tar", data)
    origin.corrupt("a.tar", 700_000)
    origin.head_failures["a.tar"] = 1  # one 5xx, then the HEAD answers with Content-MD5

    with pytest.raises(IntegrityError):
        await read_all(await cache.open("fake", "a.tar"))
    await settle(cache)
    assert origin.heads["a.tar"] == 2
    assert await asyncio.to_thread(cache.store.peek, "fake://fake/a.tar") is None


async def test_a_head_that_never_answers_fails_the_fill_instead_of_skipping_checksums(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(MiB)
    origin.put("a.tar", data)
    origin.corrupt("a.tar", 10)
    origin.head_failures["a.tar"] = 100

    with pytest.raises(OriginUnavailable):
        await read_all(await cache.open("fake", "a.tar"))
    await settle(cache)
    assert origin.heads["a.tar"] == 3  # the first try and two retries: one policy
    assert await asyncio.to_thread(cache.store.peek, "fake://fake/a.tar") is None


async def test_an_object_changed_mid_fill_is_never_spliced(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """The origin ignores If-Match: the third GET (a later segment) gets the new version."""
    old, new = os.urandom(MiB), os.urandom(MiB)
    origin.put("a.tar", old, with_md5=False)  # no checksum: only the validators can tell
    origin.ignore_if_match = True
    origin.replace_on_open["a.tar"] = (2, new)

    with pytest.raises(OriginChanged):
        await read_all(await cache.open("fake", "a.tar"))
    await settle(cache)
    assert await asyncio.to_thread(cache.store.peek, "fake://fake/a.tar") is None
    lease = await cache.open("fake", "a.tar")  # the next fill gets the new version, whole
    assert await read_all(lease) == new


async def test_one_retry_policy_counts_each_request_once(
    cache: ShardCache, origin: FakeOrigin, observer: CountingObserver
) -> None:
    """A segment the origin refuses: --origin-retries 2 means three requests, counted once."""
    origin.put("a.tar", os.urandom(512 * 1024))  # two segments of 256 KiB
    origin.refuse_from["a.tar"] = 256 * 1024

    with pytest.raises(OriginUnavailable):
        await read_all(await cache.open("fake", "a.tar"))
    await settle(cache)
    assert [start for _, start in origin.opens] == [0, 256 * 1024, 256 * 1024, 256 * 1024]
    # The first segment's request is counted "ok" when its body is done; when the second
    # segment's three refusals end the fill first, it is cancelled and counted as nothing.
    assert observer.requests["unavailable"] == 3
    assert set(observer.requests) <= {"unavailable", "ok"} and observer.requests["ok"] <= 1


async def test_a_segment_failure_counts_one_failed_request_per_request(
    cache: ShardCache, origin: FakeOrigin, observer: CountingObserver
) -> None:
    data = os.urandom(MiB)
    origin.put("a.tar", data)
    origin.fail_at["a.tar"] = 600_000
    origin.failures_left["a.tar"] = 1  # one mid-body reset, then the segment resumes

    assert await read_all(await cache.open("fake", "a.tar")) == data
    await settle(cache)
    assert observer.requests["unavailable"] == 1
    assert observer.requests["ok"] == len(origin.opens) - 1


async def test_a_range_never_completes_before_the_object_verified(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """A range ending well before the object's end must not complete from a corrupt fill."""
    data = os.urandom(MiB)
    origin.put("a.tar", data)
    origin.corrupt("a.tar", MiB - 5)
    lease = await cache.open("fake", "a.tar")
    assert lease.fill is not None
    body = b""
    with pytest.raises(IntegrityError):
        while len(body) < 100_000:
            limit = await lease.fill.wait_readable(len(body), 100_000)
            body += os.pread(lease.fill_fd, limit - len(body), len(body))
    await lease.aclose()
    assert len(body) < 100_000


async def test_objects_streamed_through_uncached_are_verified(
    tmp_path: Path, origin: FakeOrigin
) -> None:
    store = Store(tmp_path / "small", 4 * MiB)
    cache = ShardCache(store, {"fake": origin}, SEGMENTED, NullObserver())
    data = os.urandom(8 * MiB)
    origin.put("big.tar", data)
    origin.corrupt("big.tar", 5 * MiB)
    try:
        lease = await cache.open("fake", "big.tar")
        assert not lease.is_cached
        assert lease.stream is not None and lease.stream.info.checksums  # from a HEAD
        from shardcache.serving.body import send_stream

        sent = bytearray()

        async def write(chunk: bytes) -> None:
            sent.extend(chunk)

        with pytest.raises(IntegrityError):
            await send_stream(
                lease.stream, write, 0, len(data), 5.0, lambda s: None, lambda n: None
            )
        assert len(sent) < len(data)
        await lease.aclose()
    finally:
        await cache.aclose()
        store.close()


@pytest.mark.parametrize("ignore_if_match", [False, True])
async def test_a_second_reader_streamed_through_never_gets_another_version_unchecked(
    tmp_path: Path, origin: FakeOrigin, ignore_if_match: bool
) -> None:
    """Found by the fault soak (issue 12: admission made stream-through the common miss). A
    reader that joins an uncacheable object's fill gets its own GET. The object changed in
    between and that GET carried no checksum (S3 publishes them on HEAD with ChecksumMode):
    its corrupt bytes were checked against the length alone, and relayed as complete."""
    store = Store(tmp_path / "small", 4 * MiB)
    cache = ShardCache(store, {"fake": origin}, SEGMENTED, NullObserver())
    origin.checksums_on_get = False
    origin.ignore_if_match = ignore_if_match
    first, second = os.urandom(8 * MiB), os.urandom(8 * MiB)
    origin.put("big.tar", first)

    def change_before_the_joiners_get(nth_open: int) -> None:
        if nth_open == 2:  # the starter's first segment was open 1
            origin.put("big.tar", second)
            origin.corrupt("big.tar", 5 * MiB)

    origin.on_open["big.tar"] = change_before_the_joiners_get
    from shardcache.serving.body import send_stream

    try:
        origin.head_gate = asyncio.Event()  # the fill waits for its checksums…
        misses = 0
        note_request = store.note_request

        def counting(url: str, found: bool) -> None:
            nonlocal misses
            misses += not found
            note_request(url, found=found)

        store.note_request = counting  # type: ignore[method-assign]
        starting = asyncio.create_task(cache.open("fake", "big.tar"))
        await until("the starter's HEAD", lambda: origin.heads["big.tar"])
        joining = asyncio.create_task(cache.open("fake", "big.tar"))
        # …while the second reader's lookup misses and joins it (in the step that notes it):
        await until("the joiner's miss", lambda: misses == 2)
        origin.head_gate.set()
        starter = await starting
        assert starter.result is Result.MISS and starter.stream is not None
        try:
            joiner = await joining
        except OriginChanged:  # refused before any header: the client sees a 502
            joiner = None
        assert ("big.tar", 0, None) in origin.ranges  # the joiner's own whole-object GET
        if joiner is not None:
            assert joiner.result is Result.COALESCED and joiner.stream is not None
            sent = bytearray()

            async def write(chunk: bytes) -> None:
                sent.extend(chunk)

            with pytest.raises((IntegrityError, OriginChanged)):
                await send_stream(
                    joiner.stream, write, 0, 8 * MiB, 5.0, lambda s: None, lambda n: None
                )
            assert len(sent) < 8 * MiB
            await joiner.aclose()
        await starter.aclose()
    finally:
        await cache.aclose()
        store.close()


async def test_a_failed_index_write_discards_the_fill_without_strands_or_orphans(
    cache: ShardCache, origin: FakeOrigin, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(MiB)
    origin.put("a.tar", data)
    index = store._index._cache  # the diskcache Cache behind the index adapter

    def index_full(key: str, value: object, **kwargs: object) -> bool:
        # Fault injection at the SQLite edge: the real Disk moves the file into the index
        # tree, then the row write fails as on a full disk. A real ENOSPC on the index alone
        # cannot be produced while the data files still fit (the disk-full integration test
        # covers the rest with a real small filesystem).
        index._disk.store(value, False, key=key)
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(index, "set", index_full)
    lease = await cache.open("fake", "a.tar")
    fill = lease.fill
    assert fill is not None
    fd = lease.fill_fd
    assert await read_all(lease) == data  # verified bytes still reach the reader
    await settle(cache)
    monkeypatch.undo()
    assert fill.state is FillState.DISCARDED
    with pytest.raises(OSError):  # the partial file's descriptor is closed, not leaked
        os.fstat(fd)
    assert store.check() == []  # no orphan file in the index tree
    assert (await cache.open("fake", "a.tar")).result is Result.MISS


def test_store_errors_are_cache_errors(store: Store, tmp_path: Path) -> None:
    with contextlib.closing(
        sqlite3.connect(tmp_path / "cache" / "v1" / "index" / "cache.db")
    ) as db:
        db.execute("DROP TABLE Cache")  # as a stranger (or a damaged file) would
    with pytest.raises(CacheError):
        store.lookup("fake://fake/a.tar")
    with pytest.raises(CacheError):
        store.peek("fake://fake/a.tar")
    with pytest.raises(CacheError):
        store.delete("fake://fake/a.tar")


def test_a_deleted_cache_dir_is_reported_then_reopened(tmp_path: Path) -> None:
    import shutil

    directory = tmp_path / "cache"
    store = Store(directory, 8 * MiB)
    shutil.rmtree(directory)
    assert "missing" in (store.problem() or "")
    with pytest.raises(CacheError):
        store.reserve(1000)
    directory.mkdir()
    assert store.problem() is None
    reservation = store.reserve(10)
    os.pwrite(reservation.fd, b"0123456789", 0)
    from shardcache.cache.entry import EntryMeta

    store.commit(reservation, "k", EntryMeta(10))
    os.close(reservation.fd)
    entry = store.lookup("k")
    assert entry is not None and os.pread(entry.fd, 10, 0) == b"0123456789"
    entry.close()
    assert store.check() == []
    store.close()


async def test_no_task_exception_is_left_unretrieved(
    cache: ShardCache, origin: FakeOrigin, caplog: pytest.LogCaptureFixture
) -> None:
    """The HEAD finds another version while the download is still running: the checksum
    task fails first, the download is cancelled, and both results are collected."""
    origin.put("a.tar", os.urandom(MiB))
    origin.gate = asyncio.Event()  # bodies wait: the download is in flight
    origin.etags["a.tar"] = '"v1"'

    async def head(key: str, **kwargs: object) -> object:
        origin.etags[key] = '"v2"'
        return origin._info(key)

    origin.head = head  # type: ignore[method-assign]
    lease_task = asyncio.create_task(cache.open("fake", "a.tar"))
    await until("the lease, or the fill's failure before it", lease_task.done)
    if lease_task.exception() is None:
        fill = lease_task.result().fill
        assert fill is not None
        await until("the HEAD's new version fails the fill", lambda: fill.state.is_final)
    origin.gate.set()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(OriginError):
            await read_all(await lease_task)
        await settle(cache)
        gc.collect()
        await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


async def test_an_object_without_validators_is_fetched_in_one_request(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """No ETag, no Last-Modified: a second request could be another version unnoticed."""
    old, new = os.urandom(MiB), os.urandom(MiB)
    origin.put("a.tar", old, with_md5=False)
    origin.without_validators.add("a.tar")
    origin.replace_on_open["a.tar"] = (1, new)  # replaced right after the first GET

    body = await read_all(await cache.open("fake", "a.tar"))
    assert body in (old, new)  # one version, never a splice of both
    assert [end for _, _, end in origin.ranges][1:] == [None]  # then one whole-object GET


async def test_an_object_without_validators_whose_origin_ignored_the_range_is_not_asked_again(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """Found by the new-user trial with `python3 -m http.server` (no ETag, no ranges): the first
    request's answer was the whole object already, yet it was dropped and asked for again."""
    data = os.urandom(MiB)
    origin.put("a.tar", data, with_md5=False)
    origin.without_validators.add("a.tar")
    origin.accepts_ranges, origin.ignores_range = False, True
    assert await read_all(await cache.open("fake", "a.tar")) == data
    await settle(cache)
    assert len(origin.opens) == 1


async def test_a_body_failing_without_validators_is_not_resumed(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(200 * 1024)
    origin.put("a.tar", data, with_md5=False)
    origin.without_validators.add("a.tar")
    origin.fail_at["a.tar"] = 100_000
    origin.failures_left["a.tar"] = 1

    with pytest.raises(OriginUnavailable, match="no ETag to resume"):
        await read_all(await cache.open("fake", "a.tar"))
    await settle(cache)
    assert len(origin.opens) == 1
    assert await read_all(await cache.open("fake", "a.tar")) == data  # afresh, whole


def test_damaged_entry_metadata_is_a_miss_and_dropped_at_start(tmp_path: Path) -> None:
    from shardcache.cache.entry import EntryMeta

    directory = tmp_path / "cache"
    store = Store(directory, 8 * MiB)
    for key, size in (("bad-tag", 10), ("short-file", 10), ("good", 10)):
        reservation = store.reserve(size)
        os.pwrite(reservation.fd, b"x" * size, 0)
        store.commit(reservation, key, EntryMeta(size))
        os.close(reservation.fd)
    with contextlib.closing(sqlite3.connect(directory / "v1" / "index" / "cache.db")) as db, db:
        db.execute("UPDATE Cache SET tag = ? WHERE key = ?", ('{"size_bytes": "x"}', "bad-tag"))
    with pytest.raises(CacheError):
        store.lookup("bad-tag")
    (path,) = [p for k, p, _ in store.walks.entries() if k == "short-file"]
    os.truncate(path, 3)
    store.close()

    reopened = Store(directory, 8 * MiB)  # drops both instead of "fixing" the size column
    assert sorted(k for k, _, _ in reopened.walks.entries()) == ["good"]
    assert reopened.check() == []
    reopened.close()


async def test_a_fill_verified_but_not_yet_indexed_answers_as_a_hit_would(
    cache: ShardCache, origin: FakeOrigin, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between VERIFIED and COMMITTED a joiner is told "hit": with the checksum the fill
    verified and what it was verified against, as a hit from the index would say."""
    import threading

    data = os.urandom(MiB)
    origin.put("a.tar", data)
    commit_may_go, real_commit = threading.Event(), store.commit

    def slow_commit(*args: object) -> None:
        commit_may_go.wait(10)
        real_commit(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "commit", slow_commit)
    first = await cache.open("fake", "a.tar")
    assert first.fill is not None
    fill = first.fill
    await until("the fill verifies", lambda: fill.state is FillState.VERIFIED)
    joiner = await cache.open("fake", "a.tar")
    commit_may_go.set()
    assert joiner.result is Result.HIT
    assert joiner.verified_by == ("length", "fake")
    assert joiner.checksums == first.fill.checksums
    assert await read_all(joiner) == data and await read_all(first) == data
