"""An operator's fixed caps on one origin (`fetch.capped.CappedOrigin`): requests at once and
requests a second, each bounded by how long a request may wait. In memory, no sockets."""

from __future__ import annotations

import asyncio

import pytest

from shardcache.errors import OriginBusy
from shardcache.fetch.capped import CappedOrigin
from shardcache.origins.base import CONTINUED_REQUEST
from tests.unit.fakes import FakeOrigin


class Clock:
    """The cap's clock, advanced by the sleeps the cap asks for (and recorded)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def origin() -> FakeOrigin:
    fake = FakeOrigin()
    fake.put("a.tar", b"x" * 10_000)
    return fake


async def test_requests_a_second_are_spaced_evenly_heads_included(
    origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.slept.append(seconds)

    monkeypatch.setattr("shardcache.fetch.capped.asyncio.sleep", sleep)
    capped = CappedOrigin(origin, max_requests_per_second=4, max_wait_s=30, clock=clock)
    await capped.head("a.tar")
    for _ in range(3):
        stream = await capped.open("a.tar")
        await stream.aclose()
    assert clock.slept == [0.25, 0.5, 0.75]  # booked ahead: 4 a second, all asked at once
    assert origin.heads["a.tar"] == 1 and len(origin.opens) == 3


async def test_a_turn_booked_past_the_wait_bound_is_shed_with_its_distance(
    origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.slept.append(seconds)

    monkeypatch.setattr("shardcache.fetch.capped.asyncio.sleep", sleep)
    capped = CappedOrigin(origin, max_requests_per_second=1, max_wait_s=2.5, clock=clock)
    for _ in range(3):
        await capped.head("a.tar")
    with pytest.raises(OriginBusy, match="booked 3 s ahead") as refused:
        await capped.head("a.tar")
    assert refused.value.retry_after_s == 3.0 and origin.heads["a.tar"] == 3


async def test_a_get_holds_its_place_until_its_body_is_read(origin: FakeOrigin) -> None:
    capped = CappedOrigin(origin, max_requests=1, max_wait_s=0.2)
    first = await capped.open("a.tar")
    await capped.head("a.tar")  # a HEAD takes no place: a fill asks one beside its GET
    with pytest.raises(OriginBusy, match="1 requests at once stayed busy for 0.2 s"):
        await capped.open("a.tar")
    assert b"".join([chunk async for chunk in first]) == b"x" * 10_000
    second = await asyncio.wait_for(capped.open("a.tar"), 1)  # the place came back
    await second.aclose()
    third = await asyncio.wait_for(capped.open("a.tar"), 1)  # and again, after a close
    await third.aclose()


async def test_a_request_continuing_an_answer_waits_for_its_turn_and_place_unshed(
    origin: FakeOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shedding it would cut off a 200 a client is reading: its `RequestContext` says so."""
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.slept.append(seconds)

    monkeypatch.setattr("shardcache.fetch.capped.asyncio.sleep", sleep)
    paced = CappedOrigin(origin, max_requests_per_second=1, max_wait_s=2.5, clock=clock)
    for _ in range(3):
        await paced.head("a.tar")
    await paced.head("a.tar", context=CONTINUED_REQUEST)  # booked 3 s ahead: waited out
    stream = await paced.open("a.tar", context=CONTINUED_REQUEST)
    await stream.aclose()
    assert clock.slept == [1.0, 2.0, 3.0, 4.0]
    assert origin.contexts[-2:] == [CONTINUED_REQUEST, CONTINUED_REQUEST]  # passed on
    monkeypatch.undo()

    held = CappedOrigin(origin, max_requests=1, max_wait_s=0.05)
    first = await held.open("a.tar")
    continuing = asyncio.create_task(held.open("a.tar", context=CONTINUED_REQUEST))
    await asyncio.sleep(0)  # it waits for the place from now on
    with pytest.raises(OriginBusy):  # a new request asked after it, with the same bound
        await held.open("a.tar")
    assert not continuing.done()  # past its bound, still waiting
    await first.aclose()
    second = await asyncio.wait_for(continuing, 1)
    await second.aclose()
