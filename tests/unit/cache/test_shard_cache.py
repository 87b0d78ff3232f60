"""ShardCache and Fill with a temp-dir store and an in-memory origin: no sockets."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardcache.cache.fill import FillState
from shardcache.cache.lease import Lease, Result
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.checksums import Checksum
from shardcache.errors import IntegrityError, OriginChanged, OriginNotFound, OriginUnavailable
from shardcache.observer import NullObserver
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

MiB = 1024 * 1024


@pytest.fixture
def origin() -> FakeOrigin:
    return FakeOrigin()


@pytest.fixture
async def cache(tmp_path: Path, origin: FakeOrigin) -> AsyncIterator[ShardCache]:
    store = Store(tmp_path / "cache", 8 * MiB)
    shard_cache = ShardCache(
        store, {"fake": origin}, make_policy(retries=2, base_s=0.001), NullObserver()
    )
    yield shard_cache
    await shard_cache.aclose()
    assert store.check() == []
    store.close()


async def read_all(lease: Lease) -> bytes:
    """Read a lease the way the server does: from the entry, or tailing the fill."""
    try:
        if lease.entry is not None:
            return os.pread(lease.entry.fd, lease.size_bytes, 0)
        if lease.stream is not None:
            return b"".join([chunk async for chunk in lease.stream])
        assert lease.fill is not None
        body = b""
        while len(body) < lease.size_bytes:
            limit = await lease.fill.wait_readable(len(body), lease.size_bytes)
            body += os.pread(lease.fill_fd, limit - len(body), len(body))
        return body
    finally:
        await lease.aclose()


async def settle(cache: ShardCache) -> None:
    while len(cache.flights):
        await asyncio.sleep(0.001)


async def test_miss_then_hit(cache: ShardCache, origin: FakeOrigin) -> None:
    data = os.urandom(MiB + 3)
    origin.put("a.tar", data)
    first = await cache.open("fake", "a.tar")
    assert first.result is Result.MISS
    assert await read_all(first) == data
    await settle(cache)
    second = await cache.open("fake", "a.tar")
    assert second.result is Result.HIT
    expected = [(c.algorithm, c.digest) for c in origin.checksums["a.tar"]]
    assert [(c.algorithm, c.digest) for c in second.checksums] == expected  # kept, republished
    assert await read_all(second) == data
    assert origin.opens == [("a.tar", 0)]
    result, info = await cache.head("fake", "a.tar")
    assert result is Result.HIT
    assert [(c.algorithm, c.digest) for c in info.checksums] == expected


async def test_concurrent_readers_share_one_fetch(cache: ShardCache, origin: FakeOrigin) -> None:
    data = os.urandom(MiB)
    origin.put("a.tar", data)
    origin.gate = asyncio.Event()  # bodies wait until every reader has joined
    opening = [asyncio.create_task(cache.open("fake", "a.tar")) for _ in range(10)]
    while len(origin.opens) == 0:
        await asyncio.sleep(0)
    leases = await asyncio.gather(*opening)
    origin.gate.set()
    bodies = await asyncio.gather(*(read_all(lease) for lease in leases))
    assert sorted(lease.result.value for lease in leases) == ["coalesced"] * 9 + ["miss"]
    assert set(bodies) == {data}
    assert origin.opens == [("a.tar", 0)]


async def test_mid_body_failure_resumes_from_the_missing_byte(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(MiB)
    origin.put("a.tar", data)
    origin.fail_at["a.tar"] = 300_000
    origin.failures_left["a.tar"] = 2
    assert await read_all(await cache.open("fake", "a.tar")) == data
    assert [start for _, start in origin.opens] == [0, 300_000, 300_000]
    await settle(cache)
    assert (await cache.open("fake", "a.tar")).result is Result.HIT


async def test_exhausted_retries_fail_readers_and_cache_nothing(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    origin.put("a.tar", os.urandom(MiB))
    origin.fail_at["a.tar"] = 100_000
    origin.failures_left["a.tar"] = 99
    lease = await cache.open("fake", "a.tar")
    with pytest.raises(OriginUnavailable):
        await read_all(lease)
    await settle(cache)
    assert len(origin.opens) == 3
    assert cache.store.usage().entries == 0


async def test_checksum_mismatch_withholds_the_last_byte(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(100_000)
    origin.put("a.tar", data)
    origin.checksums["a.tar"] = (Checksum("md5", b"\0" * 16, "test"),)
    lease = await cache.open("fake", "a.tar")
    assert lease.fill is not None
    fill = lease.fill
    received = 0
    with pytest.raises(IntegrityError):
        while True:
            received = await fill.wait_readable(received, lease.size_bytes)
    assert received == len(data) - 1, "the final byte must wait for verification"
    await lease.aclose()
    await settle(cache)
    assert fill.state is FillState.FAILED and cache.store.usage().entries == 0


async def test_not_found_is_not_retried(cache: ShardCache, origin: FakeOrigin) -> None:
    with pytest.raises(OriginNotFound):
        await cache.open("fake", "missing.tar")
    assert origin.opens == [("missing.tar", 0)]


async def test_etag_change_on_resume_fails(cache: ShardCache, origin: FakeOrigin) -> None:
    origin.put("a.tar", os.urandom(MiB))
    origin.fail_at["a.tar"] = 10_000
    origin.failures_left["a.tar"] = 1
    lease = await cache.open("fake", "a.tar")
    origin.etags["a.tar"] = '"new"'
    with pytest.raises(OriginChanged):
        await read_all(lease)


async def test_object_larger_than_the_cache_streams_through(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(9 * MiB)
    origin.put("big.tar", data)
    lease = await cache.open("fake", "big.tar")
    assert lease.stream is not None and not lease.is_cached
    assert await read_all(lease) == data
    await settle(cache)
    assert cache.store.usage().entries == 0


@pytest.fixture
async def segmented(tmp_path: Path, origin: FakeOrigin) -> AsyncIterator[ShardCache]:
    """A cache that fetches in 64 KiB segments over 4 connections, from a ranged origin."""
    origin.accepts_ranges = True
    store = Store(tmp_path / "segmented", 8 * MiB)
    policy = make_policy(
        retries=2,
        base_s=0.001,
        connections=4,
        segment_bytes=64 * 1024,
        first_segment_bytes=64 * 1024,
    )
    shard_cache = ShardCache(store, {"fake": origin}, policy, NullObserver())
    yield shard_cache
    await shard_cache.aclose()
    assert store.check() == []
    store.close()


async def test_segments_cover_each_byte_once_and_verify(
    segmented: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(MiB + 1000)
    origin.put("a.tar", data)  # with an MD5 to verify across segments
    assert await read_all(await segmented.open("fake", "a.tar")) == data
    await settle(segmented)
    # Every request is for one segment, the first included: no byte is fetched twice.
    starts = sorted(start for _, start, _ in origin.ranges)
    assert starts == list(range(0, len(data), 64 * 1024))
    assert all(end == min(start + 64 * 1024, len(data)) for _, start, end in origin.ranges)
    assert origin.heads["a.tar"] == 1  # the checksums come from a HEAD beside the first GET
    assert (await segmented.open("fake", "a.tar")).result is Result.HIT


async def test_a_failed_segment_resumes_on_its_own(
    segmented: ShardCache, origin: FakeOrigin
) -> None:
    data = os.urandom(512 * 1024)
    origin.put("a.tar", data)
    origin.fail_at["a.tar"] = 30_000  # inside the first segment, on the first connection
    origin.failures_left["a.tar"] = 1
    assert await read_all(await segmented.open("fake", "a.tar")) == data
    assert ("a.tar", 30_000, 64 * 1024) in origin.ranges  # resumed: that segment's rest only
    assert len(origin.ranges) == 512 // 64 + 1


async def test_segmented_checksum_mismatch_fails(segmented: ShardCache, origin: FakeOrigin) -> None:
    origin.put("a.tar", os.urandom(300_000))
    origin.checksums["a.tar"] = (Checksum("md5", b"\1" * 16, "test"),)
    with pytest.raises(IntegrityError):
        await read_all(await segmented.open("fake", "a.tar"))
    await settle(segmented)
    assert segmented.store.usage().entries == 0


async def test_one_connection_fetches_like_one_plain_get(
    tmp_path: Path, origin: FakeOrigin
) -> None:
    """Issue 13: with `--origin-connections 1` a fill was the first segment and then one ranged
    request per piece, each paying the origin's time to first byte again: slower than the plain
    GET a loader would have made. Now it is that GET, resumed by range only after a failure."""
    origin.accepts_ranges = True
    store = Store(tmp_path / "one", 8 * MiB)
    policy = make_policy(
        retries=2,
        base_s=0.001,
        connections=1,
        segment_bytes=64 * 1024,
        first_segment_bytes=64 * 1024,
    )
    cache = ShardCache(store, {"fake": origin}, policy, NullObserver())
    data = os.urandom(MiB + 1000)
    origin.put("a.tar", data)
    origin.put("b.tar", data[::-1])
    origin.fail_at["b.tar"] = 300_000
    origin.failures_left["b.tar"] = 1
    try:
        assert await read_all(await cache.open("fake", "a.tar")) == data
        assert await read_all(await cache.open("fake", "b.tar")) == data[::-1]
        await settle(cache)
        assert [r for r in origin.ranges if r[0] == "a.tar"] == [("a.tar", 0, None)]
        assert origin.heads["a.tar"] == 0  # a whole-object answer carries its checksums
        assert [r for r in origin.ranges if r[0] == "b.tar"] == [
            ("b.tar", 0, None),
            ("b.tar", 300_000, len(data)),  # the failure resumed from the missing byte
        ]
        hit = await cache.open("fake", "a.tar")
        assert hit.result is Result.HIT
        await hit.aclose()
    finally:
        await cache.aclose()
        store.close()


async def test_joining_a_started_fill_takes_no_step_of_the_loop(
    cache: ShardCache, origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in CI under load: a second reader right after a miss joined the fill (body
    verified, commit under way) and waited for its start through the reader-left watch, a
    step of the loop in which the fill committed, finished and closed its file: the reader
    got fd -1 and its 200 ended after 0 bytes. A fill that started is joined in one step."""
    import threading

    data = os.urandom(MiB)
    origin.put("a.tar", data)
    committing, go_on = threading.Event(), threading.Event()
    real_commit = cache.store.commit

    def slow_commit(*args, **kwargs):  # type: ignore[no-untyped-def]
        committing.set()
        go_on.wait(5)
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(cache.store, "commit", slow_commit)
    first = await cache.open("fake", "a.tar")
    assert await read_all(first) == data
    assert await asyncio.to_thread(committing.wait, 5)  # verified, in flight, committing
    opening = cache.open("fake", "a.tar", asyncio.Event())
    with pytest.raises(StopIteration) as done:  # no suspension: it completes at once
        opening.send(None)
    second = done.value.value
    go_on.set()
    assert second.result is Result.HIT and await read_all(second) == data
    await settle(cache)


async def test_validators_of_a_fill_in_flight_need_not_wait_for_its_checksums(
    cache: ShardCache, origin: FakeOrigin
) -> None:
    """A conditional GET needs only the ETag and Last-Modified: it must not wait for the HEAD
    that learns a fill's checksums (a HEAD of a tier below does)."""
    origin.put("k", b"x" * 1000)
    origin.checksums_on_get = False  # only a HEAD publishes them…
    origin.head_gate = asyncio.Event()  # …and it is held
    origin.gate = asyncio.Event()
    lease = await cache.open("fake", "k")
    result, info = await asyncio.wait_for(cache.head("fake", "k", wants_checksums=False), 10)
    assert (result, info.etag) == (Result.COALESCED, origin.etags["k"])
    origin.head_gate.set()
    origin.gate.set()
    assert await read_all(lease) == b"x" * 1000
    await settle(cache)
