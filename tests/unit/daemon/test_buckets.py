"""Buckets made origins on an S3 client's first use: once each however many ask at once, never
past the limit, a refused one not asked again for a minute, and kept over a reload."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from shardcache.daemon import buckets
from shardcache.daemon.buckets import REFUSED_FOR_S, BucketsOnDemand
from shardcache.errors import BucketNotFound, QueueFull, UnknownOrigin
from shardcache.fetch.origin_table import ConfiguredOrigin, OriginTable
from shardcache.observability.metrics import Metrics
from shardcache.origins.base import Timeouts
from shardcache.origins.listing import Listing, ListQuery
from shardcache.origins.receivers import ReceiverPool
from tests.unit.fakes import FakeOrigin


@dataclass
class ListingOrigin(FakeOrigin):
    """A fake S3 origin whose bucket exists unless its name is in `missing`."""

    missing: set[str] = field(default_factory=set)
    made: list[str] = field(default_factory=list)

    async def list_objects(self, query: ListQuery) -> Listing:
        await asyncio.sleep(0)  # a real listing gives other requests a turn
        if self.name in self.missing:
            raise BucketNotFound(f"no such bucket: {self.name}")
        return Listing()


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[ListingOrigin]:
    origins: list[ListingOrigin] = []

    def make(spec, timeouts, receivers):  # type: ignore[no-untyped-def]
        origin = ListingOrigin(name=spec.name, missing={"gone"})
        origins.append(origin)
        return origin

    monkeypatch.setattr(buckets, "make_origin", make)
    return origins


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _on_demand(limit: int, clock: Clock | None = None) -> tuple[BucketsOnDemand, OriginTable]:
    metrics = Metrics(CollectorRegistry(), [])
    table = OriginTable({}, metrics)
    pool = ReceiverPool(1)  # never started: `make_origin` is replaced
    return BucketsOnDemand(limit, table, Timeouts(1, 1), pool, metrics, clock or Clock()), table


async def test_a_bucket_is_made_once_however_many_ask(made: list[ListingOrigin]) -> None:
    on_demand, table = _on_demand(2)
    assert all(await asyncio.gather(*(on_demand.add("data-1") for _ in range(5))))
    assert [o.name for o in made] == ["data-1"] and table.get("data-1") is not None
    assert table.specs["data-1"].url == "s3://data-1"


async def test_never_past_the_limit(made: list[ListingOrigin]) -> None:
    on_demand, table = _on_demand(1)
    assert await on_demand.add("data-1")
    with pytest.raises(UnknownOrigin, match="taken"):
        await on_demand.add("data-2")
    assert len(table) == 1


async def test_off_and_names_no_bucket_can_have(made: list[ListingOrigin]) -> None:
    off, _ = _on_demand(0)
    assert not await off.add("data-1")
    on_demand, _ = _on_demand(5)
    for name in ("Data", "a", "_", "a_b", "x" * 64, "-ab", "metrics.", "healthz"):
        with pytest.raises(UnknownOrigin):
            await on_demand.add(name)
    assert made == []


async def test_a_refused_bucket_is_not_asked_again_for_a_minute(
    made: list[ListingOrigin],
) -> None:
    clock = Clock()
    on_demand, table = _on_demand(5, clock)
    with pytest.raises(BucketNotFound):
        await on_demand.add("gone")
    with pytest.raises(UnknownOrigin, match="refused"):
        await on_demand.add("gone")
    assert len(made) == 1 and len(table) == 0
    clock.now = REFUSED_FOR_S + 1
    with pytest.raises(BucketNotFound):
        await on_demand.add("gone")
    assert len(made) == 2


async def test_a_reload_keeps_them_unless_it_names_them(made: list[ListingOrigin]) -> None:
    on_demand, _ = _on_demand(5)
    await on_demand.add("data-1")
    await on_demand.add("data-2")
    configured = {"data-2": ConfiguredOrigin(FakeOrigin(name="data-2"))}
    kept = on_demand.kept_over(configured)
    assert set(kept) == {"data-1", "data-2"} and kept["data-2"] is configured["data-2"]
    assert set(on_demand.made) == {"data-1"}


async def test_new_names_are_tried_at_most_so_many_a_minute(made: list[ListingOrigin]) -> None:
    """A client naming made-up buckets buys at most TRIES_PER_MINUTE origin builds (a boto3
    client and a listing each) a minute; past it SlowDown, and a minute later it may try
    again. Names already refused or already made cost nothing and are not counted."""
    clock = Clock()
    on_demand, _ = _on_demand(1000, clock)
    for n in range(buckets.TRIES_PER_MINUTE):
        assert await on_demand.add(f"bucket-{n:03d}")
    with pytest.raises(QueueFull):
        await on_demand.add("one-too-many")
    assert await on_demand.add("bucket-000")  # made already: no try
    assert len(made) == buckets.TRIES_PER_MINUTE
    clock.now += 60.0
    assert await on_demand.add("one-too-many")
